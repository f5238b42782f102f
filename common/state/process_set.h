// horovod_cpp — Apache-2.0
#pragma once
// ProcessSetTable: which process sets exist and who belongs to them.
//
// Set 0 is the global set (every rank). Further sets are fixed at Init (InitOptions) or, with
// HOROVOD_DYNAMIC_PROCESS_SETS=1, added and removed at run time by all ranks collectively; ids
// are handed out in order and never reused, identically on every rank. Framework threads read
// the table to validate calls; the background thread changes it when an add or remove is
// agreed. One mutex guards it.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/horovod.h"
#include "base/status.h"
#include "base/mutex.h"

namespace hvd {

// Sorted, distinct ranks in [0, world_size), at least one. Returns a message naming the
// problem ("" when valid).
std::string ValidateRankList(const std::vector<int>& ranks, int world_size);

class ProcessSetTable {
 public:
  // Forgets everything but the global set of `world_size` ranks, as seen by `my_rank`.
  void Reset(int world_size, int my_rank);

  // Registers `ranks` (validated) under the next id. Fails if a set with exactly these ranks
  // exists already.
  Result<int32_t> Add(const std::vector<int>& ranks);
  // Fails for the global set and for unknown ids.
  Status Remove(int32_t id);

  Result<ProcessSetInfo> Get(int32_t id) const;
  std::vector<int32_t> Ids() const;
  // Ids of the sets `rank` belongs to, ascending.
  std::vector<int32_t> IdsIncluding(int rank) const;
  // Ranks of set `id`, or an empty vector if unknown.
  std::vector<int> Ranks(int32_t id) const;
  int world_size() const;

 private:
  mutable Mutex mu_;
  int world_size_ HVD_GUARDED_BY(mu_) = 0;
  int my_rank_ HVD_GUARDED_BY(mu_) = 0;
  int32_t next_id_ HVD_GUARDED_BY(mu_) = 1;
  std::map<int32_t, std::vector<int>> sets_ HVD_GUARDED_BY(mu_);
};

// "[0, 2, 3]"
std::string RanksToString(const std::vector<int>& ranks);

}  // namespace hvd
