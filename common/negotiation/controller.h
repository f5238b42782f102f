// horovod_cpp — Apache-2.0
#pragma once
// Controller: one negotiation cycle, the protocol that makes every rank agree on which
// tensors to run next and in what order. One control plane serves every process set.
//
// Each cycle:
//  1. Classify this rank's pending requests against the ResponseCache: HIT (cached with the
//     same parameters), INVALID (cached, but this request differs), or MISS. A hit that has
//     waited longer than the stall check time is treated as INVALID, so the tensor falls back
//     to rank 0, where the stall inspector can see and report it.
//  2. Vote: one bitwise-AND allreduce of
//        [status word | hit bits | inverted invalid bits | inverted requested bits].
//     The status word is stored inverted, so the AND yields "some rank has a miss / wants to
//     shut down / has work outstanding / has an invalid entry / has joined". A rank also sets
//     the hit bit of every cached tensor it has no part in (a process set it is not in; an
//     allreduce of the global set while it has joined), so the AND means "every member is
//     ready"; the requested bits (an OR, through inversion) make sure somebody really asked.
//  3. Drop invalidated entries from every cache (same bits everywhere); a hit whose entry was
//     dropped becomes a miss.
//  4. Fast path: released bits, ascending, use their cached responses. While a rank has
//     joined, only global-set allreduces are released this way; other hits go to rank 0,
//     which reports them as unsupported with Join.
//  5. Slow path, only if some rank has a miss, an invalidation, a shutdown request or has
//     joined: misses are gathered at global rank 0, whose Coordinator validates them and
//     answers with the tensors that are now ready; the ResponseList is broadcast. Those
//     responses are put into the cache in the same order on every rank.
// The steady state of a training loop is one small allreduce per cycle, with no round trip
// through rank 0. Rank 0 also runs the stall inspector every cycle.
//
// Owned and called by the background thread only.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/config/config.h"
#include "common/negotiation/coordinator.h"
#include "common/state/counters.h"
#include "common/protocol/message.h"
#include "common/state/process_set.h"
#include "common/negotiation/response_cache.h"
#include "common/negotiation/stall_inspector.h"
#include "common/state/tensor_queue.h"
#include "ops/backend.h"
#include "timeline/timeline.h"

namespace hvd {

struct CycleOutcome {
  // Agreed, unfused responses in execution order (identical on every rank).
  std::vector<Response> responses;
  // Some rank asked to shut down (or the stall inspector did): run `responses`, then stop.
  bool shutdown = false;
  bool shutdown_after_stall = false;
  std::string shutdown_reason;
  // No rank had outstanding work when the cycle started.
  bool idle = false;
  // Some rank submitted something this cycle that is not agreed yet (ranks submit the same
  // tensor microseconds apart, and each rank's cycle starts when its own work arrives): run
  // the next cycle at once instead of after HOROVOD_CYCLE_TIME. Identical on every rank.
  bool follow_up = false;
  // A deadlock was declared (on every rank in the same cycle): this rank's pending operations
  // to fail, with `deadlock` as the message.
  std::vector<TensorKey> deadlocked;
  std::string deadlock;
};

class Controller {
 public:
  using Clock = std::chrono::steady_clock;

  // `timeline` is null except on the rank that records one (global rank 0).
  Controller(ops::Backend* backend, const Config& config, ProcessSetTable* sets,
             Counters* counters, timeline::Timeline* timeline);
  Controller(const Controller&) = delete;
  Controller& operator=(const Controller&) = delete;

  // Runs one cycle. `new_requests`: enqueued on this rank since the last cycle.
  // `outstanding`: this rank's operations not yet completed (new ones included).
  // `blocked`: a thread of this rank is blocked waiting on an operation that has not started
  // (TensorQueue::Blocked); `blocked_on` lists what it waits for, asked only when a deadlock
  // is declared (TensorQueue::BlockedOn).
  using BlockedOnFn = std::function<std::vector<Request>()>;
  Result<CycleOutcome> RunCycle(std::vector<Request> new_requests, bool shutdown_requested,
                                size_t outstanding, bool blocked = false,
                                const BlockedOnFn& blocked_on = nullptr);

  // ---- what the agreed responses mean for this rank ----
  // Whether this rank takes part in `group`: a member of its set (and the set still there),
  // an error to deliver, or a process-set change (every rank applies those).
  bool RunsHere(const Response& group) const;
  // The entries this rank runs for `group`, given what it had queued (`taken`, in
  // tensor_names order): its own, plus for an allreduce a zero stand-in (null data, the
  // agreed size) for each tensor it did not submit because it has joined.
  Result<std::vector<TensorTableEntry>> EntriesToRun(
      const Response& group, std::vector<std::optional<TensorTableEntry>> taken) const;

  // ---- process sets: identical on every rank, in the same order ----
  // The sets passed to Init. Every rank must pass the same list: rank 0's is broadcast, each
  // rank compares, and one AND vote makes every rank fail together with the same message.
  Status CreateStaticProcessSets(const std::vector<std::vector<int>>& sets);
  // Applies an agreed kProcessSetAdd or kProcessSetRemove to the table and the host backend.
  // Returns the id added or removed; the caller drops what else belongs to a removed set.
  Result<int32_t> ChangeProcessSets(const Response& group);
  // Replaces the response cache with an empty one of `capacity` entries (0: off). Every rank
  // calls it between the same two cycles (the autotuner's exchange); a tensor waiting on the
  // fast path is then negotiated through rank 0 in the next cycle, on every rank alike.
  void ResetCache(uint32_t capacity);

 private:
  struct PendingHit {
    Request request;
    Clock::time_point since;
  };

  Status SlowPath(std::vector<Request> misses, bool shutdown_requested, bool any_joined,
                  CycleOutcome* outcome);
  // Cache bookkeeping for the agreed slow-path responses, in order (identical on all ranks).
  void Absorb(const Response& response, bool any_joined);
  void InspectStalls(Clock::time_point now);
  // Deadlock detection: every rank blocked, nothing new and nothing released for the grace.
  // `quiet`: this cycle (identical on every rank) had all ranks blocked and no progress.
  Status TrackDeadlock(bool quiet, bool due, const BlockedOnFn& blocked_on,
                       Clock::time_point now, CycleOutcome* outcome);
  // Timeline: a NEGOTIATE span per tensor from the first request seen to its release, with an
  // instant for each rank's request (on the fast path, only this rank's is visible).
  bool Recording();
  void NegotiationSeen(const Request& request, int rank);
  void NegotiationDone(const Response& response);

  ops::Backend* backend_;
  ProcessSetTable* sets_;
  Counters* counters_;
  ResponseCache cache_;
  StallInspector stall_;
  int rank_;
  // This rank has called Join and the other ranks have not all joined yet.
  bool joined_ = false;
  // This rank's requests that hit the cache but are not yet released.
  std::vector<PendingHit> pending_hits_;
  // This rank's requests sent to the coordinator and not yet answered.
  std::unordered_map<TensorKey, Request, TensorKeyHash> sent_;
  std::unique_ptr<Coordinator> coordinator_;  // global rank 0 only
  timeline::Timeline* timeline_;
  uint32_t timeline_session_ = 0;
  // Tensors with a NEGOTIATE span open in the timeline -> their timeline row.
  std::unordered_map<TensorKey, int32_t, TensorKeyHash> negotiating_;
  // Deadlock detection: the grace in seconds (0 = off) and since when every rank has been
  // stuck.
  double deadlock_grace_seconds_;
  std::optional<Clock::time_point> stuck_since_;
  // Rank 0: the stall inspector asked for a shutdown; voted in the next cycle.
  bool stall_shutdown_ = false;
  std::string stall_reason_;
};

}  // namespace hvd
