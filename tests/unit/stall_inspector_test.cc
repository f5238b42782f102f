// horovod_cpp — Apache-2.0
// The stall inspector with a fake clock.
#include "common/negotiation/stall_inspector.h"

#include <gtest/gtest.h>

namespace hvd {
namespace {

using Clock = StallInspector::Clock;
using std::chrono::milliseconds;
using std::chrono::seconds;

Coordinator::Pending P(const std::string& name, std::vector<int> missing, Clock::time_point since,
                       int32_t set = 0, std::string submitted_at = "") {
  return Coordinator::Pending{TensorKey{set, name}, std::move(missing), since,
                              std::move(submitted_at)};
}

TEST(StallInspector, NamesWhereTheSubmittingRanksCalledFrom) {
  StallInspector s(5, 10);
  const auto t0 = Clock::now();
  const auto v = s.Check({P("grad.w", {2}, t0, 0, "ranks 0, 1 at train.py:42")}, t0 + seconds(11));
  ASSERT_TRUE(v.shutdown);
  EXPECT_NE(v.warning.find("\nSubmitted at:\ngrad.w: ranks 0, 1 at train.py:42"),
            std::string::npos)
      << v.warning;
  EXPECT_NE(v.shutdown_reason.find("for rank 2 (HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=10); "
                                   "submitted by ranks 0, 1 at train.py:42"),
            std::string::npos)
      << v.shutdown_reason;
}

TEST(StallInspector, WarnsAfterTheCheckTimeNamingMissingRanks) {
  StallInspector s(5, 0);
  const Clock::time_point t0 = Clock::now();
  std::vector<Coordinator::Pending> pending = {P("a", {1}, t0), P("b", {1, 2}, t0 + seconds(3))};
  EXPECT_TRUE(s.Check(pending, t0 + seconds(4)).warning.empty());
  StallInspector::Verdict v = s.Check(pending, t0 + milliseconds(5500));
  EXPECT_FALSE(v.shutdown);
  EXPECT_EQ(v.warning,
            "One or more tensors were submitted to be reduced, gathered or broadcasted by subset "
            "of ranks and are waiting for remainder of ranks for more than 5 seconds. This may "
            "indicate that different ranks are trying to submit different tensors or that only "
            "subset of ranks is submitting tensors, which will cause deadlock.\n"
            "Missing ranks:\n1: [a]");
  // Not repeated within the check period, then repeated with what is stalled by then.
  EXPECT_TRUE(s.Check(pending, t0 + seconds(8)).warning.empty());
  v = s.Check(pending, t0 + seconds(11));
  EXPECT_NE(v.warning.find("Missing ranks:\n1: [a, b]\n2: [b]"), std::string::npos) << v.warning;
}

TEST(StallInspector, ShutsDownAfterTheShutdownTime) {
  StallInspector s(2, 10);
  const Clock::time_point t0 = Clock::now();
  std::vector<Coordinator::Pending> pending = {P("w", {3}, t0, 1), P("v", {0}, t0 + seconds(8))};
  EXPECT_FALSE(s.Check(pending, t0 + seconds(9)).shutdown);
  StallInspector::Verdict v = s.Check(pending, t0 + seconds(10));
  EXPECT_TRUE(v.shutdown);
  EXPECT_EQ(v.shutdown_reason,
            "stalled: tensor 'w (process set 1)' waited more than 10 s for rank 3 "
            "(HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=10)");
  EXPECT_NE(v.warning.find("\n0: [v]\n3!: [w (process set 1)]"), std::string::npos) << v.warning;
  EXPECT_NE(v.warning.find("One or more rank (marked by \"!\") is stalled for longer than 10 "
                           "seconds. Will shutdown."),
            std::string::npos);
}

TEST(StallInspector, DisabledWithZeroAndSilentWhenNothingWaits) {
  StallInspector off(0, 0);
  const Clock::time_point t0 = Clock::now();
  EXPECT_FALSE(off.enabled());
  EXPECT_TRUE(off.Check({P("a", {1}, t0)}, t0 + seconds(1000)).warning.empty());
  StallInspector on(1, 0);
  EXPECT_TRUE(on.Check({}, t0 + seconds(1000)).warning.empty());
}

TEST(StallInspector, LongListsAreShortened) {
  StallInspector s(1, 0);
  const Clock::time_point t0 = Clock::now();
  std::vector<Coordinator::Pending> pending;
  for (int i = 0; i < 8; ++i) pending.push_back(P("t" + std::to_string(i), {1}, t0));
  StallInspector::Verdict v = s.Check(pending, t0 + seconds(2));
  EXPECT_NE(v.warning.find("1: [t0, t1, t2, t3, t4, t5, ... (8 in all)]"), std::string::npos)
      << v.warning;
}

}  // namespace
}  // namespace hvd
