// horovod_cpp — Apache-2.0
#pragma once
// Counters the background thread bumps and any thread may read (relaxed atomics).

#include <atomic>
#include <cstdint>

#include "common/horovod.h"
#include "common/state/grad_stats.h"

namespace hvd {

struct Counters {
  std::atomic<uint64_t> cycles{0};
  std::atomic<uint64_t> cache_hits{0};
  std::atomic<uint64_t> coordinator_rounds{0};
  std::atomic<uint64_t> allreduce_calls{0};
  std::atomic<uint64_t> hierarchical_allreduce_calls{0};
  std::atomic<uint64_t> broadcast_calls{0};
  std::atomic<uint64_t> allgather_calls{0};
  std::atomic<uint64_t> alltoall_calls{0};
  std::atomic<uint64_t> reducescatter_calls{0};
  std::atomic<uint64_t> barrier_calls{0};
  std::atomic<uint64_t> tensors_completed{0};
  std::atomic<uint64_t> fusion_buffer_bytes{0};
  std::atomic<uint64_t> cache_entries{0};        // gauges, set after every cycle
  std::atomic<uint64_t> coordinator_pending{0};
  // What the loop runs with (gauges; the autotuner changes them): see Stats.
  std::atomic<uint64_t> autotune_samples{0};
  std::atomic<int64_t> fusion_threshold_bytes{-1};
  std::atomic<int64_t> collective_chunk_bytes{-1};
  std::atomic<int64_t> cycle_time_us{-1};
  std::atomic<int64_t> cache_on{-1};
  std::atomic<int64_t> hierarchical_allreduce{-1};
  // The squared norms of tensors enqueued with a stats group (adaptive training).
  GradStatsTable grad_stats;

  template <typename Knobs>
  void PublishKnobs(const Knobs& k, uint64_t samples) {
    constexpr auto relaxed = std::memory_order_relaxed;
    autotune_samples.store(samples, relaxed);
    fusion_threshold_bytes.store(k.fusion_threshold_bytes, relaxed);
    collective_chunk_bytes.store(k.chunk_bytes, relaxed);
    cycle_time_us.store(static_cast<int64_t>(k.cycle_time_ms * 1000 + 0.5), relaxed);
    cache_on.store(k.cache ? 1 : 0, relaxed);
    hierarchical_allreduce.store(k.hierarchical_allreduce ? 1 : 0, relaxed);
  }

  Stats Snapshot() const {
    auto get = [](const std::atomic<uint64_t>& c) { return c.load(std::memory_order_relaxed); };
    Stats s;
    s.cycles = get(cycles);
    s.cache_hits = get(cache_hits);
    s.coordinator_rounds = get(coordinator_rounds);
    s.allreduce_calls = get(allreduce_calls);
    s.hierarchical_allreduce_calls = get(hierarchical_allreduce_calls);
    s.broadcast_calls = get(broadcast_calls);
    s.allgather_calls = get(allgather_calls);
    s.alltoall_calls = get(alltoall_calls);
    s.reducescatter_calls = get(reducescatter_calls);
    s.barrier_calls = get(barrier_calls);
    s.tensors_completed = get(tensors_completed);
    s.fusion_buffer_bytes = get(fusion_buffer_bytes);
    s.cache_entries = get(cache_entries);
    s.coordinator_pending = get(coordinator_pending);
    auto knob = [](const std::atomic<int64_t>& c) { return c.load(std::memory_order_relaxed); };
    s.autotune_samples = get(autotune_samples);
    s.fusion_threshold_bytes = knob(fusion_threshold_bytes);
    s.collective_chunk_bytes = knob(collective_chunk_bytes);
    s.cycle_time_us = knob(cycle_time_us);
    s.cache_on = knob(cache_on);
    s.hierarchical_allreduce = knob(hierarchical_allreduce);
    return s;
  }
  void Reset() {
    for (auto* c : {&cycles, &cache_hits, &coordinator_rounds, &allreduce_calls,
                    &hierarchical_allreduce_calls, &broadcast_calls,
                    &allgather_calls, &alltoall_calls, &reducescatter_calls, &barrier_calls,
                    &tensors_completed, &fusion_buffer_bytes, &cache_entries, &coordinator_pending,
                    &autotune_samples}) {
      c->store(0);
    }
    for (auto* c : {&fusion_threshold_bytes, &collective_chunk_bytes, &cycle_time_us, &cache_on,
                    &hierarchical_allreduce}) {
      c->store(-1);
    }
  }
};

}  // namespace hvd
