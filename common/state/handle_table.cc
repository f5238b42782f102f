// horovod_cpp — Apache-2.0
#include "common/state/handle_table.h"

#include <algorithm>

namespace hvd {

namespace {
// Per thread: how many DeferWakeups are open, and the tables owing their waiters a wake-up.
thread_local int t_defer_depth = 0;
thread_local std::vector<HandleTable*> t_deferred;
}  // namespace

HandleTable::DeferWakeups::DeferWakeups() {
  ++t_defer_depth;
}

HandleTable::DeferWakeups::~DeferWakeups() {
  if (--t_defer_depth > 0) return;
  std::vector<HandleTable*> owed;
  owed.swap(t_deferred);
  for (HandleTable* table : owed) table->WakeWaiters();
}

void HandleTable::WakeWaiters() { cv_.NotifyAll(); }

Status HandleTable::Unknown(Handle handle) {
  return Status::InvalidArgument("unknown handle " + std::to_string(handle) +
                                 " (never issued, or already waited on)");
}

Handle HandleTable::Allocate() {
  MutexLock lock(mu_);
  Handle h = next_++;
  states_.emplace(h, State{});
  return h;
}

void HandleTable::Complete(Handle handle, const Status& status, std::vector<Output> outputs) {
  bool awaited = false;
  {
    MutexLock lock(mu_);
    auto it = states_.find(handle);
    HVD_CHECK(it != states_.end() && !it->second.done);
    it->second.done = true;
    it->second.status = status;
    it->second.outputs = std::move(outputs);
    awaited = it->second.waiters > 0;
  }
  // Only a handle someone waits on wakes the waiters: a fused buffer of 100 tensors completes
  // 100 handles, and the thread waiting on one of them should wake once, not 100 times.
  if (!awaited) return;
  if (t_defer_depth == 0) {
    WakeWaiters();
  } else if (std::find(t_deferred.begin(), t_deferred.end(), this) == t_deferred.end()) {
    t_deferred.push_back(this);
  }
}

void HandleTable::Release(Handle handle) {
  MutexLock lock(mu_);
  states_.erase(handle);
}

Result<bool> HandleTable::Poll(Handle handle) const {
  MutexLock lock(mu_);
  auto it = states_.find(handle);
  if (it == states_.end()) return Unknown(handle);
  return it->second.done;
}

Status HandleTable::Wait(Handle handle) {
  Result<std::vector<Output>> r = WaitOutputs(handle);
  return r.ok() ? Status::OK() : r.status();
}

Result<std::vector<Output>> HandleTable::WaitOutputs(Handle handle) {
  UniqueLock lock(mu_);
  if (states_.find(handle) == states_.end()) return Unknown(handle);
  // Another thread waiting on the same handle may release it first.
  for (auto i = states_.find(handle); i != states_.end() && !i->second.done;
       i = states_.find(handle)) {
    ++i->second.waiters;
    cv_.Wait(lock);
    auto again = states_.find(handle);
    if (again != states_.end()) --again->second.waiters;
  }
  auto it = states_.find(handle);
  if (it == states_.end()) return Unknown(handle);
  State state = std::move(it->second);
  states_.erase(it);
  if (!state.status.ok()) return state.status;
  return std::move(state.outputs);
}

size_t HandleTable::size() const {
  MutexLock lock(mu_);
  return states_.size();
}

}  // namespace hvd
