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
  std::atomic<uint64_t> allgather_calls{0};
  std::atomic<uint64_t> alltoall_calls{0};
  std::atomic<uint64_t> reducescatter_calls{0};
  std::atomic<uint64_t> barrier_calls{0};
  std::atomic<uint64_t> tensors_completed{0};
  std::atomic<uint64_t> fusion_buffer_bytes{0};
  std::atomic<uint64_t> cache_entries{0};        // gauges, set after every cycle
  std::atomic<uint64_t> coordinator_pending{0};

  Stats Snapshot() const {
    auto get = [](const std::atomic<uint64_t>& c) { return c.load(std::memory_order_relaxed); };
    Stats s;
    s.cycles = get(cycles);
    s.cache_hits = get(cache_hits);
    s.coordinator_rounds = get(coordinator_rounds);
    s.allreduce_calls = get(allreduce_calls);
    s.broadcast_calls = get(broadcast_calls);
    s.allgather_calls = get(allgather_calls);
    s.alltoall_calls = get(alltoall_calls);
    s.reducescatter_calls = get(reducescatter_calls);
    s.barrier_calls = get(barrier_calls);
    s.tensors_completed = get(tensors_completed);
    s.fusion_buffer_bytes = get(fusion_buffer_bytes);
    s.cache_entries = get(cache_entries);
    s.coordinator_pending = get(coordinator_pending);
    return s;
  }
  void Reset() {
    for (auto* c : {&cycles, &cache_hits, &coordinator_rounds, &allreduce_calls, &broadcast_calls,
                    &allgather_calls, &alltoall_calls, &reducescatter_calls, &barrier_calls,
                    &tensors_completed, &fusion_buffer_bytes, &cache_entries, &coordinator_pending}) {
      c->store(0);
    }
  }
};

}  // namespace hvd
