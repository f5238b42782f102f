// horovod_cpp — Apache-2.0
#pragma once
// TensorQueue: the hand-off between framework threads and the background thread.
//
// Framework threads Add() entries (tensor views, callback, and the negotiation Request);
// the background thread pops the new Requests each cycle and later Take()s the entries of
// the tensors it is about to run. All state is behind one mutex. Adding wakes the background
// thread at once.
//
// Names are unique per process set while in flight: adding a name that is still pending is
// rejected. Close() fails every entry still queued and makes later Add()s fail, so no entry
// is ever lost or completed twice.

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/horovod.h"
#include "common/message.h"
#include "common/thread_annotations.h"

namespace hvd {

struct TensorTableEntry {
  TensorView input;
  TensorView output;
  Request request;          // what this rank says about the tensor
  StatusCallback callback;  // called exactly once, on completion
};

class TensorQueue {
 public:
  using Clock = std::chrono::steady_clock;

  TensorQueue() = default;
  TensorQueue(const TensorQueue&) = delete;
  TensorQueue& operator=(const TensorQueue&) = delete;

  // Any thread. Adds all entries or none: fails if the queue is closed or any name is already
  // in flight (or repeated within `entries`). Wakes the background thread.
  Status Add(std::vector<TensorTableEntry> entries);

  // Background thread. Moves out the Requests added since the last call.
  std::vector<Request> PopNewRequests();

  // Background thread. Removes and returns the entries for `names` of a process set, in the
  // order given. Every name must be present (the loop only asks for names it has seen).
  std::vector<TensorTableEntry> Take(int32_t process_set_id, const std::vector<std::string>& names);

  // Background thread. Blocks until new requests arrive, shutdown is requested, or `deadline`.
  void WaitForWork(Clock::time_point deadline);

  // Any thread. Asks the background thread to start a negotiated shutdown.
  void RequestShutdown();
  bool shutdown_requested() const;

  // Rejects later Adds with `status` and completes every queued entry with it (callbacks run
  // on the calling thread, outside the lock).
  void Close(const Status& status);
  // Re-opens a closed queue for a new Init.
  void Reset();

  size_t size() const;

 private:
  struct Key {
    int32_t process_set_id;
    std::string name;
    bool operator==(const Key& o) const {
      return process_set_id == o.process_set_id && name == o.name;
    }
  };
  struct KeyHash {
    size_t operator()(const Key& k) const {
      return std::hash<std::string>()(k.name) ^ (static_cast<size_t>(k.process_set_id) << 1);
    }
  };

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::unordered_map<Key, TensorTableEntry, KeyHash> table_ HVD_GUARDED_BY(mu_);
  std::vector<Request> new_requests_ HVD_GUARDED_BY(mu_);
  bool shutdown_requested_ HVD_GUARDED_BY(mu_) = false;
  bool closed_ HVD_GUARDED_BY(mu_) = false;
  Status closed_status_ HVD_GUARDED_BY(mu_);
};

}  // namespace hvd
