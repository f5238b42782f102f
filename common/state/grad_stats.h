// horovod_cpp — Apache-2.0
#pragma once
// Gradient statistics for adaptive training (horovod_cpp/adaptive): the squared norms that the
// executor measures while it reduces tensors enqueued with a stats group
// (AllreduceOptions::stats_group >= 0), summed per (process set, group) until taken.
//
// The executor adds on the background thread as each response completes; a framework thread
// takes a group's sums once the step's handles have completed, which resets them. Thread-safe.

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "base/mutex.h"
#include "common/horovod.h"

namespace hvd {

class GradStatsTable {
 public:
  // Adds one tensor's (or one chunk's) norms to the group's sums; `tensors` is 1 for the
  // chunk that completes a tensor, else 0.
  void Add(int32_t process_set_id, int32_t group, double local_sq, double reduced_sq,
           int64_t elements, int64_t tensors);
  // The group's sums since the last Take (zeros when nothing was added), then resets them.
  GradStats Take(int32_t process_set_id, int32_t group);
  // Every group of the set with sums, in group order, then resets them.
  std::vector<std::pair<int32_t, GradStats>> TakeAll(int32_t process_set_id);
  // Forgets every group (a new Init).
  void Clear();

 private:
  mutable Mutex mu_;
  std::map<std::pair<int32_t, int32_t>, GradStats> sums_ HVD_GUARDED_BY(mu_);
};

}  // namespace hvd
