// horovod_cpp — Apache-2.0
// libFuzzer target for the wire format (common/protocol/message.h): messages arrive from other ranks,
// so any bytes must give a message or an error Status, never a crash, an over-read (ASan) or
// undefined behaviour (UBSan). A parsed message must also survive a round trip: serializing
// it and parsing that again gives the same bytes.
//
// The first input byte picks the parser (even: RequestList, odd: ResponseList).

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "common/protocol/message.h"

namespace {

template <typename List, typename Parse, typename Serialize>
void RoundTrip(const uint8_t* data, size_t size, Parse parse, Serialize serialize) {
  hvd::Result<List> first = parse(data, size);
  if (!first.ok()) {
    if (first.status().message().empty()) std::abort();  // every error says what is wrong
    return;
  }
  const std::vector<uint8_t> bytes = serialize(*first);
  hvd::Result<List> second = parse(bytes.data(), bytes.size());
  if (!second.ok()) std::abort();  // what we wrote, we must read back
  if (serialize(*second) != bytes) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t* body = data + 1;
  const size_t n = size - 1;
  if (data[0] % 2 == 0) {
    RoundTrip<hvd::RequestList>(body, n, hvd::ParseRequestList, hvd::SerializeRequestList);
  } else {
    RoundTrip<hvd::ResponseList>(body, n, hvd::ParseResponseList, hvd::SerializeResponseList);
  }
  return 0;
}
