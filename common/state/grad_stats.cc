// horovod_cpp — Apache-2.0
#include "common/state/grad_stats.h"

#include <cstdint>

namespace hvd {

void GradStatsTable::Add(int32_t process_set_id, int32_t group, double local_sq, double reduced_sq,
                         int64_t elements, int64_t tensors) {
  MutexLock lock(mu_);
  GradStats& s = sums_[{process_set_id, group}];
  s.local_sq += local_sq;
  s.reduced_sq += reduced_sq;
  s.elements += elements;
  s.tensors += tensors;
}

GradStats GradStatsTable::Take(int32_t process_set_id, int32_t group) {
  MutexLock lock(mu_);
  auto it = sums_.find({process_set_id, group});
  if (it == sums_.end()) return GradStats{};
  GradStats s = it->second;
  sums_.erase(it);
  return s;
}

std::vector<std::pair<int32_t, GradStats>> GradStatsTable::TakeAll(int32_t process_set_id) {
  MutexLock lock(mu_);
  std::vector<std::pair<int32_t, GradStats>> out;
  auto it = sums_.lower_bound({process_set_id, INT32_MIN});
  while (it != sums_.end() && it->first.first == process_set_id) {
    out.emplace_back(it->first.second, it->second);
    it = sums_.erase(it);
  }
  return out;
}

void GradStatsTable::Clear() {
  MutexLock lock(mu_);
  sums_.clear();
}

}  // namespace hvd
