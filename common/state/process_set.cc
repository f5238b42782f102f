// horovod_cpp — Apache-2.0
#include "common/state/process_set.h"

#include <algorithm>

namespace hvd {

std::string RanksToString(const std::vector<int>& ranks) {
  std::string s = "[";
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s + "]";
}

std::string ValidateRankList(const std::vector<int>& ranks, int world_size) {
  if (ranks.empty()) return "a process set needs at least one rank";
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] < 0 || ranks[i] >= world_size) {
      return "rank " + std::to_string(ranks[i]) + " is out of range (the job has " +
             std::to_string(world_size) + " ranks)";
    }
    if (i > 0 && ranks[i] <= ranks[i - 1]) {
      return "ranks must be sorted and distinct, got " + RanksToString(ranks);
    }
  }
  return "";
}

void ProcessSetTable::Reset(int world_size, int my_rank) {
  MutexLock lock(mu_);
  world_size_ = world_size;
  my_rank_ = my_rank;
  next_id_ = 1;
  sets_.clear();
  std::vector<int> all(world_size);
  for (int r = 0; r < world_size; ++r) all[r] = r;
  sets_[kGlobalProcessSetId] = std::move(all);
}

Result<int32_t> ProcessSetTable::Add(const std::vector<int>& ranks) {
  MutexLock lock(mu_);
  std::string problem = ValidateRankList(ranks, world_size_);
  if (!problem.empty()) return Status::InvalidArgument("process set " + problem);
  for (const auto& [id, members] : sets_) {
    if (members == ranks) {
      return Status::InvalidArgument("a process set with ranks " + RanksToString(ranks) +
                                     " already exists (id " + std::to_string(id) + ")");
    }
  }
  const int32_t id = next_id_++;
  sets_[id] = ranks;
  return id;
}

Status ProcessSetTable::Remove(int32_t id) {
  MutexLock lock(mu_);
  if (id == kGlobalProcessSetId) {
    return Status::InvalidArgument("the global process set (id 0) cannot be removed");
  }
  if (sets_.erase(id) == 0) {
    return Status::InvalidArgument("unknown process set " + std::to_string(id) +
                                   " (never added, or already removed)");
  }
  return Status::OK();
}

Result<ProcessSetInfo> ProcessSetTable::Get(int32_t id) const {
  MutexLock lock(mu_);
  auto it = sets_.find(id);
  if (it == sets_.end()) {
    return Status::InvalidArgument("unknown process set " + std::to_string(id) +
                                   " (never added, or already removed)");
  }
  ProcessSetInfo info;
  info.id = id;
  info.ranks = it->second;
  info.size = static_cast<int>(it->second.size());
  auto pos = std::lower_bound(it->second.begin(), it->second.end(), my_rank_);
  info.included = pos != it->second.end() && *pos == my_rank_;
  info.rank = info.included ? static_cast<int>(pos - it->second.begin()) : -1;
  return info;
}

std::vector<int32_t> ProcessSetTable::Ids() const {
  MutexLock lock(mu_);
  std::vector<int32_t> ids;
  for (const auto& [id, members] : sets_) ids.push_back(id);
  return ids;
}

std::vector<int32_t> ProcessSetTable::IdsIncluding(int rank) const {
  MutexLock lock(mu_);
  std::vector<int32_t> ids;
  for (const auto& [id, members] : sets_) {
    if (std::binary_search(members.begin(), members.end(), rank)) ids.push_back(id);
  }
  return ids;
}

std::vector<int> ProcessSetTable::Ranks(int32_t id) const {
  MutexLock lock(mu_);
  auto it = sets_.find(id);
  return it == sets_.end() ? std::vector<int>{} : it->second;
}

int ProcessSetTable::world_size() const {
  MutexLock lock(mu_);
  return world_size_;
}

}  // namespace hvd
