// horovod_cpp — Apache-2.0
#pragma once
// HandleTable: the completion state behind the Handles returned by Enqueue*.
//
// The background thread calls Complete() exactly once per handle; framework threads Poll()
// or Wait(). Wait() blocks on a condition variable (no polling) and releases the handle.

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "common/horovod.h"
#include "base/mutex.h"

namespace hvd {

class HandleTable {
 public:
  HandleTable() = default;
  HandleTable(const HandleTable&) = delete;
  HandleTable& operator=(const HandleTable&) = delete;

  // Any thread. A fresh handle in the "pending" state.
  Handle Allocate();
  // Background thread (or whoever completes the operation). Must be called once per handle.
  // `outputs`: runtime-allocated results (allgather, alltoall, join, ...), if any.
  void Complete(Handle handle, const Status& status, std::vector<Output> outputs = {});
  // Any thread. Forgets a handle that was never handed out (its enqueue failed).
  void Release(Handle handle);
  // Any thread. INVALID_ARGUMENT for an unknown (never issued or already waited) handle.
  Result<bool> Poll(Handle handle) const;
  // Any thread. Blocks until complete; returns the operation's status and releases the handle.
  Status Wait(Handle handle);
  // As Wait, returning the outputs on success.
  Result<std::vector<Output>> WaitOutputs(Handle handle);

  size_t size() const;

  // While one of these lives on a thread, the Completes that thread makes wake no waiter until
  // it ends (then one wake-up per table). The background thread completes a fused group's
  // handles under one: a thread waiting on the first of 100 handles would otherwise be woken,
  // preempt the background thread on a shared core, find the next handle not yet complete and
  // sleep again, 100 times over.
  class DeferWakeups {
   public:
    DeferWakeups();
    ~DeferWakeups();
    DeferWakeups(const DeferWakeups&) = delete;
    DeferWakeups& operator=(const DeferWakeups&) = delete;
  };

 private:
  void WakeWaiters();

  struct State {
    bool done = false;
    int waiters = 0;  // threads blocked in WaitOutputs on this handle
    Status status;
    std::vector<Output> outputs;
  };
  static Status Unknown(Handle handle);

  mutable Mutex mu_;
  CondVar cv_;
  Handle next_ HVD_GUARDED_BY(mu_) = 1;
  std::unordered_map<Handle, State> states_ HVD_GUARDED_BY(mu_);
};

}  // namespace hvd
