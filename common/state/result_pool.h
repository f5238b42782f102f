// horovod_cpp — Apache-2.0
#pragma once
// Host memory for results the runtime allocates (allgather and alltoall outputs, whose size is
// known only once negotiated). A block released by its last user (the framework's tensor, on
// any thread) goes back to a bounded cache instead of the allocator, and the next result of
// the same size reuses it. Fresh large blocks come from mmap and cost a page fault per 4 KiB
// on first touch: 4 allgathers of 4 MiB on 2 ranks took 27 ms with them and 12 ms without
// (docs/performance.md). Small blocks (< 64 KiB) go straight to malloc.
//
// Thread-safe. The cache lives until its last block is released, so results may outlive the
// runtime.

#include <cstdint>
#include <memory>

namespace hvd {

class ResultPool {
 public:
  // At most `max_cached_bytes` are kept for reuse; more released memory is freed.
  explicit ResultPool(int64_t max_cached_bytes);
  // At least one byte, so that an empty result has an address; 64-byte aligned.
  std::shared_ptr<void> Allocate(int64_t bytes);
  // Bytes held for reuse now (for tests and statistics).
  int64_t cached_bytes() const;

  static constexpr int64_t kMinPooledBytes = 64 << 10;

 private:
  struct Cache;
  std::shared_ptr<Cache> cache_;
};

}  // namespace hvd
