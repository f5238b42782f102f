// horovod_cpp — Apache-2.0
#pragma once
// Stall inspector: notices tensors that some ranks submitted and others did not.
//
// Run by the coordinator (global rank 0) every cycle over the message table's pending
// tensors. After HOROVOD_STALL_CHECK_TIME_SECONDS it returns one warning naming the missing
// ranks and their tensors (repeated at most once per check period while the stall lasts);
// with HOROVOD_STALL_SHUTDOWN_TIME_SECONDS > 0, once a tensor has waited that long it asks
// for a shutdown, whose reason every pending operation then reports.
//
// Pure: the caller passes the time, so tests use a fake clock. Not thread-safe.

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "common/negotiation/coordinator.h"

namespace hvd {

class StallInspector {
 public:
  using Clock = std::chrono::steady_clock;

  // 0 seconds disables the check (respectively the shutdown).
  StallInspector(double check_seconds, double shutdown_seconds);

  struct Verdict {
    std::string warning;  // empty: nothing to report now
    bool shutdown = false;
    std::string shutdown_reason;  // set with shutdown
  };

  bool enabled() const { return check_ > Clock::duration::zero(); }
  Clock::duration check_time() const { return check_; }

  // `pending`: every tensor still waiting (Coordinator::PendingSince(now)).
  Verdict Check(const std::vector<Coordinator::Pending>& pending, Clock::time_point now);

 private:
  Clock::duration check_;
  Clock::duration shutdown_;
  double check_seconds_;
  double shutdown_seconds_;
  std::optional<Clock::time_point> last_warning_;
};

}  // namespace hvd
