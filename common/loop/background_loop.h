// horovod_cpp — Apache-2.0
#pragma once
// The background loop: the one thread per process that negotiates and communicates.
//
// Threading model of the core
//  * Framework threads call the public API: they validate input, put entries into the
//    TensorQueue, and wait on the HandleTable. They never call MPI.
//  * The background thread ("hvd-bg", this class) initialises the backend (MPI_Init_thread if
//    the program has not; Open MPI then provides MPI_THREAD_MULTIPLE), and then, once per
//    cycle: waits for work, runs the Controller's negotiation, plans fusion, executes the
//    agreed responses through the OpExecutor and fires the callbacks. It is the only thread
//    that calls the Backend; the Controller, Coordinator, ResponseCache and OpExecutor are
//    owned by it.
//  * Shared state between the two kinds of thread lives only in TensorQueue and HandleTable
//    (each behind one mutex) and in relaxed atomic counters.
//
// Waiting: the thread sleeps on the TensorQueue's condition variable. Enqueueing wakes it at
// once, so a lone small tensor is not held for a cycle; it then gathers the rest of a burst
// (more submissions less than kBurstGap apart, nobody waiting on a handle yet, for
// HOROVOD_CYCLE_TIME at most), so that a loop of submissions is negotiated in one cycle and
// the thread does not compete for the CPU with the thread that is submitting. A cycle in which some rank submitted
// something that is not yet agreed is followed at once by another (the other ranks' copies are
// usually microseconds behind, and their threads may already be waiting in the next cycle's
// vote). Otherwise it wakes after HOROVOD_CYCLE_TIME while any rank has work outstanding, and
// after kIdleWait when no rank has: an idle job costs a few negotiation rounds per second, not
// a thousand, and a stalled tensor never spins the loop (follow-ups need fresh submissions).
//
// Stopping: Stop() asks for a negotiated shutdown; the request rides the next cycle's vote,
// every rank leaves the loop after that cycle, and every entry still queued completes with
// ABORTED. A transport error also ends the loop (with that error on every pending entry).

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "base/mutex.h"
#include "common/config/autotune.h"
#include "common/loop/collective_watchdog.h"
#include "common/config/config.h"
#include "common/state/counters.h"
#include "common/horovod.h"
#include "common/state/process_set.h"
#include "common/state/tensor_queue.h"
#include "ops/factory.h"
#include "timeline/timeline.h"

namespace hvd {

class Controller;
class OpExecutor;

class BackgroundLoop {
 public:
  // How long an idle rank (no work outstanding on any rank) sleeps between cycles. It bounds
  // how long a shutdown on another rank takes to propagate to an idle rank.
  static constexpr std::chrono::milliseconds kIdleWait{100};
  // The pause in submissions that ends a burst (a Python allreduce_async_ takes ~5 us).
  static constexpr std::chrono::microseconds kBurstGap{100};
  // A collective timeout ends the process with this code when the backend's abort (which
  // normally ends it at once) has not within kAbortGrace.
  static constexpr int kCollectiveTimeoutExitCode = 75;
  static constexpr std::chrono::seconds kAbortGrace{10};

  BackgroundLoop(TensorQueue* queue, ProcessSetTable* sets, Counters* counters);
  ~BackgroundLoop();
  BackgroundLoop(const BackgroundLoop&) = delete;
  BackgroundLoop& operator=(const BackgroundLoop&) = delete;

  // Starts the thread, which initialises the host backend, agrees on the configuration with
  // the other ranks (rank 0's values win) and creates the process sets of `options` (every
  // rank must pass the same). Blocks until that is done; returns its status. `backends` come
  // from ops::CreateBackends (tests pass their own).
  Status Start(const Config& config, const InitOptions& options, ops::Backends backends);
  // Requests a negotiated shutdown, joins the thread and finalises the backend.
  void Stop();
  // The loop is running (started, and not ended by a shutdown or an error).
  bool running() const;
  // Valid after a successful Start.
  const ops::Topology& topology() const { return topology_; }
  // The host backend's name ("MPI", "Gloo"); kept after Stop, like the topology.
  const char* backend_name() const { return backend_name_; }
  // Why the loop ended (empty while running).
  std::string end_reason() const;

  // Timeline control (recorded on global rank 0; a no-op elsewhere). Callers serialise these
  // with Start/Stop.
  Status StartTimeline(const std::string& path, bool mark_cycles);
  void StopTimeline();
  // A counter event (timeline::Timeline::Counter); a no-op where no timeline records.
  void TimelineCounter(const std::string& name,
                       std::vector<std::pair<std::string, double>> values);

 private:
  void ThreadMain();
  // Initialises the backend and the protocol state, on the background thread.
  Status Initialize();
  Status Loop();
  // HOROVOD_COLLECTIVE_TIMEOUT_SECONDS: starts the watchdog and exchanges its endpoints.
  Status StartWatchdog();
  // The watchdog's mark around a negotiation round (nullptr) or a group; none without one.
  std::optional<CollectiveWatchdog::Scope> Watch(const Response* group) {
    if (!watchdog_) return std::nullopt;
    return watchdog_->Watch(group);
  }
  // Runs one agreed group; returns how many of this rank's entries it completed.
  Result<size_t> Execute(const Response& group, const std::vector<int32_t>* rows);
  // HOROVOD_AUTOTUNE: makes the autotuner (collective: every rank asks the backend whether
  // the hosts allow hierarchical allreduce).
  Status StartAutotune();
  // At the end of an autotune sample, between cycles (collective): takes rank 0's knobs and
  // applies them.
  Status ApplyTunedKnobs();
  void Finish(const Status& why);

  TensorQueue* queue_;
  ProcessSetTable* sets_;
  Counters* counters_;
  Config config_;
  InitOptions options_;
  std::unique_ptr<ops::Backend> backend_;
  std::unique_ptr<ops::DeviceCollectives> device_;  // CUDA tensors; null without one
  ops::Topology topology_;
  const char* backend_name_ = "";
  std::unique_ptr<timeline::Timeline> timeline_;  // global rank 0 only
  // Made on the background thread once the backend is up; used by it only.
  std::unique_ptr<Controller> controller_;
  std::unique_ptr<OpExecutor> executor_;
  std::unique_ptr<CollectiveWatchdog> watchdog_;  // null when the timeout is off or size is 1
  std::unique_ptr<Autotuner> autotuner_;          // null unless HOROVOD_AUTOTUNE
  TunedKnobs running_knobs_;                      // what the loop runs with (autotune)
  std::thread thread_;

  mutable Mutex mu_;
  CondVar cv_;
  bool init_done_ HVD_GUARDED_BY(mu_) = false;
  Status init_status_ HVD_GUARDED_BY(mu_);
  bool running_ HVD_GUARDED_BY(mu_) = false;
  std::string end_reason_ HVD_GUARDED_BY(mu_);
};

}  // namespace hvd
