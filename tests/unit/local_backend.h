// horovod_cpp — Apache-2.0
#pragma once
// An in-process Backend: N "ranks" are N background loops in one process, and every
// collective is an exchange of pointers through a shared LocalWorld (post, barrier, read the
// others', barrier). It lets the threaded core (tensor queue, background loop, controller,
// executor, timeline writer) run under ThreadSanitizer, which cannot follow MPI's
// shared-memory transport across processes.

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "ops/backend.h"

namespace hvd {
namespace test {

// A barrier plus one posted pointer per member, for one group of ranks (the world or a set).
class LocalGroup {
 public:
  explicit LocalGroup(std::vector<int> ranks) : ranks_(std::move(ranks)), slots_(ranks_.size()) {}
  int size() const { return static_cast<int>(ranks_.size()); }
  // Index of global `rank` within the group, or -1.
  int IndexOf(int rank) const;
  // Posts `mine` for `index`, waits for every member, runs `read(slots)`, waits again (so no
  // member's posted memory is reused before every member has read it).
  template <typename Read>
  void Exchange(int index, const void* mine, Read read) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      slots_[static_cast<size_t>(index)] = mine;
    }
    Wait();
    read(slots_);
    Wait();
  }
  void Wait();

 private:
  const std::vector<int> ranks_;
  std::vector<const void*> slots_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
};

// What the ranks of one simulated job share.
class LocalWorld {
 public:
  explicit LocalWorld(int size);
  int size() const { return size_; }
  std::shared_ptr<LocalGroup> Group(int32_t id);
  // Called by every rank at the same point; the first creates the group.
  std::shared_ptr<LocalGroup> AddGroup(int32_t id, const std::vector<int>& ranks);
  void RemoveGroup(int32_t id);

 private:
  const int size_;
  std::mutex mu_;
  std::map<int32_t, std::shared_ptr<LocalGroup>> groups_;
};

std::unique_ptr<ops::Backend> CreateLocalBackend(std::shared_ptr<LocalWorld> world, int rank);

}  // namespace test
}  // namespace hvd
