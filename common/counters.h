// horovod_cpp — Apache-2.0
#pragma once
// Counters the background thread bumps and any thread may read (relaxed atomics).

#include <atomic>
#include <cstdint>

#include "common/horovod.h"

namespace hvd {

struct Counters {
  std::atomic<uint64_t> cycles{0};
  std::atomic<uint64_t> cache_hits{0};
  std::atomic<uint64_t> coordinator_rounds{0};
  std::atomic<uint64_t> allreduce_calls{0};
  std::atomic<uint64_t> broadcast_calls{0};
  std::atomic<uint64_t> barrier_calls{0};
  std::atomic<uint64_t> tensors_completed{0};
  std::atomic<uint64_t> fusion_buffer_bytes{0};

  Stats Snapshot() const {
    Stats s;
    s.cycles = cycles.load(std::memory_order_relaxed);
    s.cache_hits = cache_hits.load(std::memory_order_relaxed);
    s.coordinator_rounds = coordinator_rounds.load(std::memory_order_relaxed);
    s.allreduce_calls = allreduce_calls.load(std::memory_order_relaxed);
    s.broadcast_calls = broadcast_calls.load(std::memory_order_relaxed);
    s.barrier_calls = barrier_calls.load(std::memory_order_relaxed);
    s.tensors_completed = tensors_completed.load(std::memory_order_relaxed);
    s.fusion_buffer_bytes = fusion_buffer_bytes.load(std::memory_order_relaxed);
    return s;
  }
  void Reset() {
    for (auto* c : {&cycles, &cache_hits, &coordinator_rounds, &allreduce_calls, &broadcast_calls,
                    &barrier_calls, &tensors_completed, &fusion_buffer_bytes}) {
      c->store(0);
    }
  }
};

}  // namespace hvd
