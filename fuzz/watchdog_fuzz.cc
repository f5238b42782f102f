// horovod_cpp — Apache-2.0
// libFuzzer target for the collective watchdog's side channel (common/loop/collective_watchdog.h):
// the bytes a prober reads as an answer from another rank's port (anyone may listen there),
// and the endpoint table rank 0 broadcasts. Any bytes must give "not an answer" or an error,
// never a crash, an over-read or undefined behaviour; and what is accepted as an answer must
// carry a tag that verifies under the key and nonce (so random bytes essentially never do).
//
// Input: key (16) | nonce (16) | rank (1) | the bytes read.

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "common/loop/collective_watchdog.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using hvd::CollectiveWatchdog;
  if (size < CollectiveWatchdog::kKeyBytes + CollectiveWatchdog::kNonceBytes + 1) return 0;
  std::array<uint8_t, CollectiveWatchdog::kKeyBytes> key{};
  std::memcpy(key.data(), data, key.size());
  const uint8_t* nonce = data + key.size();
  const int rank = data[key.size() + CollectiveWatchdog::kNonceBytes] % 8;
  const size_t at = key.size() + CollectiveWatchdog::kNonceBytes + 1;
  const std::vector<uint8_t> in(data + at, data + size);
  const CollectiveWatchdog::AnswerStatus a = CollectiveWatchdog::ParseAnswer(key, nonce, in, rank);
  if (a.valid && !a.complete) std::abort();
  // The same bytes as an endpoint table (a watchdog that was never given one parses it; the
  // first table it accepts is kept, later ones still go through the parser).
  static std::unique_ptr<CollectiveWatchdog> dog = [] {
    CollectiveWatchdog::Options o;
    o.timeout_seconds = 0;
    auto made = CollectiveWatchdog::Create(o);
    return made.ok() ? std::move(*made) : nullptr;
  }();
  if (dog) dog->SetTable(in).IgnoreError();
  return 0;
}
