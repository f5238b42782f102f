// horovod_cpp — Apache-2.0
#pragma once
// TensorQueue: the hand-off between framework threads and the background thread.
//
// Framework threads Add() entries (tensor views, callback, and the negotiation Request);
// the background thread pops the new Requests each cycle and later Take()s the entries of
// the tensors it is about to run. All state is behind one mutex. Adding wakes the background
// thread at once.
//
// Names are unique per process set until their handle is released: a name is reserved from
// Add() until the caller has waited for its handle (ReleaseNames), not merely until its
// collective has run, so submitting a name again before synchronizing the first handle is
// rejected whatever the timing. Close() fails every entry still queued and makes later Add()s
// fail, so no entry is ever lost or completed twice.

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/horovod.h"
#include "common/protocol/message.h"
#include "base/mutex.h"

namespace hvd {

struct TensorTableEntry {
  TensorView input;
  TensorView output;
  Request request;          // what this rank says about the tensor
  StatusCallback callback;  // called exactly once, on completion
  // Where the executor leaves a runtime-allocated result (allgather, alltoall, join, ...);
  // shared with the callback that hands it to the handle.
  std::shared_ptr<Output> result;
  // Local only, never negotiated: the stats group this rank measures the tensor into
  // (AllreduceOptions::stats_group; -1 = none).
  int32_t stats_group = -1;
};

class TensorQueue {
 public:
  using Clock = std::chrono::steady_clock;

  TensorQueue() = default;
  TensorQueue(const TensorQueue&) = delete;
  TensorQueue& operator=(const TensorQueue&) = delete;

  // Any thread. Adds all entries or none under `handle`: fails if the queue is closed or any
  // name is still reserved (or repeated within `entries`). Wakes the background thread.
  Status Add(std::vector<TensorTableEntry> entries, Handle handle);

  // Any thread: a framework thread starts / stops blocking in a wait on `handle`. `call_site`:
  // where the waiter was called from (CallSiteScope), named in BlockedOn for requests that
  // were submitted without one (e.g. by a C++ optimizer's gradient hook).
  void BeginWait(Handle handle, const std::string& call_site = "");
  void EndWait(Handle handle);
  // Background thread. Whether a thread of this rank is blocked waiting on an operation that
  // has not started running (still queued): the deadlock vote, asked every cycle.
  bool Blocked() const;
  // Any thread. The requests those blocked threads wait for (for the deadlock message and the
  // collective timeout's report).
  std::vector<Request> BlockedOn() const;
  // Background thread. Completes the queued entries of `keys` with `status` (callbacks
  // outside the lock); returns how many there were.
  size_t FailKeys(const std::vector<TensorKey>& keys, const Status& status);

  // Any thread. Frees the names reserved under `handle` (its caller has waited for it).
  // Idempotent; a handle of an earlier Init (before Reset) reserves nothing.
  void ReleaseNames(Handle handle);

  // Background thread. Moves out the Requests added since the last call.
  std::vector<Request> PopNewRequests();

  // Background thread. Removes and returns the entries for `names` of a process set, in the
  // order given; a name this rank does not have yields nullopt (a joined rank, or an error
  // about a tensor only some ranks submitted).
  std::vector<std::optional<TensorTableEntry>> Take(int32_t process_set_id,
                                                    const std::vector<std::string>& names);

  // Background thread. Blocks until new requests arrive, shutdown is requested, or `deadline`;
  // then, unless `gap` is zero, goes on collecting requests while they keep arriving less than
  // `gap` apart and no thread waits on a handle, for `longest_gather` at most.
  // (It spins, yielding, for up to kGatherSpin of that first.)
  static constexpr std::chrono::microseconds kGatherSpin{30};
  void WaitForWork(Clock::time_point deadline, Clock::duration gap = Clock::duration::zero(),
                   Clock::duration longest_gather = Clock::duration::zero());

  // Any thread. Asks the background thread to start a negotiated shutdown.
  void RequestShutdown();
  bool shutdown_requested() const;

  // Rejects later Adds with `status` and completes every queued entry with it (callbacks run
  // on the calling thread, outside the lock).
  void Close(const Status& status);
  // Re-opens a closed queue for a new Init.
  void Reset();

  // Completes every entry of a removed process set with `status` (callbacks outside the
  // lock). Returns how many of them the background thread had already popped.
  size_t FailProcessSet(int32_t process_set_id, const Status& status);

  size_t size() const;
  // Names reserved (queued, running, or completed but not yet waited for).
  size_t reserved() const;

 private:
  mutable Mutex mu_;
  CondVar cv_;
  // Calls visit(request, waiter's call site) for each queued request a blocked thread waits
  // for, until it returns true; returns whether it did.
  template <typename Visit>
  bool VisitBlockedLocked(const Visit& visit) const HVD_REQUIRES(mu_);

  std::unordered_map<TensorKey, TensorTableEntry, TensorKeyHash> table_ HVD_GUARDED_BY(mu_);
  std::vector<Request> new_requests_ HVD_GUARDED_BY(mu_);
  // Names reserved until their handle is released, and each handle's names.
  std::unordered_set<TensorKey, TensorKeyHash> reserved_ HVD_GUARDED_BY(mu_);
  std::unordered_map<Handle, std::vector<TensorKey>> reserved_by_handle_ HVD_GUARDED_BY(mu_);
  // Handles some thread is blocked on -> how many threads wait on each, and the latest
  // waiter's call site.
  struct Waiters {
    int threads = 0;
    std::string call_site;
  };
  std::unordered_map<Handle, Waiters> waiting_ HVD_GUARDED_BY(mu_);
  bool shutdown_requested_ HVD_GUARDED_BY(mu_) = false;
  bool closed_ HVD_GUARDED_BY(mu_) = false;
  // Removed process sets (ids are never reused): adds for them fail, so no entry can slip in
  // after FailProcessSet has run.
  std::unordered_set<int32_t> removed_sets_ HVD_GUARDED_BY(mu_);
  Status closed_status_ HVD_GUARDED_BY(mu_);
};

}  // namespace hvd
