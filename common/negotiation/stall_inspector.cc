// horovod_cpp — Apache-2.0
#include "common/negotiation/stall_inspector.h"

#include <map>
#include <sstream>

namespace hvd {
namespace {

std::chrono::steady_clock::duration ToDuration(double s) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(s));
}

std::string FormatSeconds(double s) {
  std::ostringstream o;
  o << s;
  return o.str();
}

std::string Describe(const TensorKey& key) {
  if (key.process_set_id == kGlobalProcessSetId) return key.name;
  return key.name + " (process set " + std::to_string(key.process_set_id) + ")";
}

constexpr size_t kMaxNamesPerRank = 6;

}  // namespace

StallInspector::StallInspector(double check_seconds, double shutdown_seconds)
    : check_(ToDuration(check_seconds)),
      shutdown_(ToDuration(shutdown_seconds)),
      check_seconds_(check_seconds),
      shutdown_seconds_(shutdown_seconds) {}

StallInspector::Verdict StallInspector::Check(const std::vector<Coordinator::Pending>& pending,
                                              Clock::time_point now) {
  Verdict v;
  if (!enabled()) return v;
  std::map<int, std::vector<std::string>> missing;  // rank -> stalled tensor names
  std::map<int, bool> over_shutdown;                // rank -> stalled past the shutdown time
  const Coordinator::Pending* worst = nullptr;
  for (const Coordinator::Pending& p : pending) {
    const auto waited = now - p.first_seen;
    if (waited < check_ || p.missing_ranks.empty()) continue;
    const bool past = shutdown_ > Clock::duration::zero() && waited >= shutdown_;
    for (int r : p.missing_ranks) {
      missing[r].push_back(Describe(p.key));
      over_shutdown[r] = over_shutdown[r] || past;
    }
    if (past && (worst == nullptr || p.first_seen < worst->first_seen)) worst = &p;
  }
  if (missing.empty()) {
    last_warning_.reset();
    return v;
  }
  if (worst != nullptr) {
    v.shutdown = true;
    std::string ranks;
    for (size_t i = 0; i < worst->missing_ranks.size(); ++i) {
      ranks += (i ? ", " : "") + std::to_string(worst->missing_ranks[i]);
    }
    v.shutdown_reason =
        "stalled: tensor '" + Describe(worst->key) + "' waited more than " +
        FormatSeconds(shutdown_seconds_) + " s for " +
        (worst->missing_ranks.size() == 1 ? "rank " : "ranks ") + ranks +
        " (HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=" + FormatSeconds(shutdown_seconds_) + ")" +
        (worst->submitted_at.empty() ? "" : "; submitted by " + worst->submitted_at);
  }
  if (!v.shutdown && last_warning_ && now - *last_warning_ < check_) return v;
  last_warning_ = now;

  std::ostringstream w;
  w << "One or more tensors were submitted to be reduced, gathered or broadcasted by subset of "
       "ranks and are waiting for remainder of ranks for more than "
    << check_seconds_
    << " seconds. This may indicate that different ranks are trying to submit different "
       "tensors or that only subset of ranks is submitting tensors, which will cause deadlock.\n"
       "Missing ranks:";
  for (const auto& [rank, names] : missing) {
    w << "\n" << rank << (over_shutdown[rank] ? "!" : "") << ": [";
    for (size_t i = 0; i < names.size() && i < kMaxNamesPerRank; ++i) {
      w << (i ? ", " : "") << names[i];
    }
    if (names.size() > kMaxNamesPerRank) w << ", ... (" << names.size() << " in all)";
    w << "]";
  }
  // Where the ranks that did submit called from: the code the missing ranks did not reach.
  size_t sites = 0;
  for (const Coordinator::Pending& p : pending) {
    if (now - p.first_seen < check_ || p.missing_ranks.empty() || p.submitted_at.empty()) continue;
    if (sites++ == 0) w << "\nSubmitted at:";
    if (sites > kMaxNamesPerRank) {
      w << "\n...";
      break;
    }
    w << "\n" << Describe(p.key) << ": " << p.submitted_at;
  }
  if (v.shutdown) {
    w << "\nOne or more rank (marked by \"!\") is stalled for longer than " << shutdown_seconds_
      << " seconds. Will shutdown.";
  }
  v.warning = w.str();
  return v;
}

}  // namespace hvd
