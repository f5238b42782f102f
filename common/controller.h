// horovod_cpp — Apache-2.0
#pragma once
// Controller: one negotiation cycle, the protocol that makes every rank agree on which
// tensors to run next and in what order.
//
// Each cycle:
//  1. Classify this rank's pending requests against the ResponseCache: HIT (cached with the
//     same parameters), INVALID (cached, but this request differs), or MISS.
//  2. Vote: one bitwise-AND allreduce of [status word | hit bits | inverted invalid bits].
//     The AND gives the bits every rank hit; inverted bits give the OR of "some rank has a
//     miss / an invalid entry / wants to shut down / has work outstanding".
//  3. Drop invalidated entries from every cache (same bits everywhere); a hit whose entry was
//     dropped becomes a miss.
//  4. Fast path: tensors whose bit all ranks set are ready; their cached responses are used
//     in ascending bit order. A rank's hits that are not yet common wait for the next cycle.
//  5. Slow path, only if some rank has a miss, an invalidation or a shutdown request: misses
//     are gathered at rank 0, whose Coordinator validates them and answers with the tensors
//     every rank has now asked for; the ResponseList is broadcast. Those responses are put
//     into the cache in the same order on every rank.
// The steady state of a training loop (the same tensors every step) is therefore one small
// allreduce per cycle, with no round trip through rank 0.
//
// Owned and called by the background thread only.

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/config.h"
#include "common/coordinator.h"
#include "common/counters.h"
#include "common/message.h"
#include "common/response_cache.h"
#include "ops/backend.h"

namespace hvd {

struct CycleOutcome {
  // Agreed, unfused responses in execution order (identical on every rank).
  std::vector<Response> responses;
  // Some rank asked to shut down: run `responses`, then stop.
  bool shutdown = false;
  std::string shutdown_reason;
  // No rank had outstanding work when the cycle started.
  bool idle = false;
};

class Controller {
 public:
  Controller(ops::Backend* backend, const Config& config, Counters* counters);
  Controller(const Controller&) = delete;
  Controller& operator=(const Controller&) = delete;

  // Runs one cycle. `new_requests`: enqueued on this rank since the last cycle.
  // `outstanding`: this rank's operations not yet completed (new ones included).
  Result<CycleOutcome> RunCycle(std::vector<Request> new_requests, bool shutdown_requested,
                                size_t outstanding);

 private:
  Status SlowPath(std::vector<Request> misses, bool shutdown_requested, CycleOutcome* outcome);

  ops::Backend* backend_;
  Counters* counters_;
  ResponseCache cache_;
  // This rank's requests that hit the cache but are not yet common to all ranks.
  std::vector<Request> pending_hits_;
  // This rank's requests sent to the coordinator and not yet answered, by name.
  std::unordered_map<std::string, Request> sent_;
  std::unique_ptr<Coordinator> coordinator_;  // rank 0 only
};

}  // namespace hvd
