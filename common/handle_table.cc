// horovod_cpp — Apache-2.0
#include "common/handle_table.h"

namespace hvd {

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
  {
    MutexLock lock(mu_);
    auto it = states_.find(handle);
    HVD_CHECK(it != states_.end() && !it->second.done);
    it->second.done = true;
    it->second.status = status;
    it->second.outputs = std::move(outputs);
  }
  cv_.NotifyAll();
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
    cv_.Wait(lock);
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
