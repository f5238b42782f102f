// horovod_cpp — Apache-2.0
// Deadlock detection (HOROVOD_DEADLOCK_GRACE_SECONDS, 1 s in these jobs): every rank blocked in
// a wait with nothing able to complete fails on every rank with one message naming what each
// rank waits for, and the job goes on; a rank that computes (not waits) for longer than the
// grace before submitting is never a deadlock.

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "common/horovod.h"
#include "tests/mpi/test_util.h"

namespace hvd {
namespace {

using namespace test;  // NOLINT
using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

// Rank 0 waits in a barrier while every other rank waits in an allgather: neither can ever
// complete. Both fail, with the same message everywhere, and the next collective works.
TEST(Deadlock, BarrierAgainstAllgatherFailsOnEveryRank) {
  const auto start = Clock::now();
  std::vector<float> x(3, static_cast<float>(R()));
  const int line = __LINE__ + 1;  // the call site the allgather's ranks give
  auto gather = [&] { CallSiteScope at(CallSite::Here()); return Allgather(View(x.data(), {1, 3}), "deadlock.gather").status(); };  // NOLINT
  const Status s = R() == 0 ? Barrier() : gather();  // the barrier gives none
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kAborted) << s.ToString();
  // Every rank's line names its host, and the call site where the caller gave one.
  char host[256] = {};
  ASSERT_EQ(gethostname(host, sizeof host - 1), 0);
  std::string want = "rank 0 (" + std::string(host) + ") waits for barrier";
  for (int r = 1; r < N(); ++r) {
    want += "; rank " + std::to_string(r) + " (" + host +
            ") waits for allgather 'deadlock.gather' called at deadlock_test.cc:" +
            std::to_string(line);
  }
  EXPECT_NE(s.message().find("deadlock: every rank is blocked waiting"), std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find(want), std::string::npos) << s.message();
  EXPECT_GE(Seconds(start), 0.9);   // not before the grace
  EXPECT_LT(Seconds(start), 30.0);  // and not much after it
  // Nothing is left behind: the same names work again, on every rank.
  ASSERT_TRUE(Barrier().ok());
  Result<Output> again = Allgather(View(x.data(), {1, 3}), "deadlock.gather");
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->shape, (TensorShape{N(), 3}));
  const Stats stats = *GetStats();
  EXPECT_EQ(stats.queued_tensors, 0u);
  EXPECT_EQ(stats.reserved_names, 0u);
}

// Pending async work that no blocked rank's peers will submit fails too, with the same message;
// the ranks then realign.
TEST(Deadlock, AsyncWorkPendingOnABlockedRankFailsWithTheWaits) {
  std::vector<float> a(2, 1.0f);
  Result<Handle> pending = Status::Internal("unused");
  Status s;
  if (R() == 0) {
    pending = EnqueueAllreduce(View(a.data(), {2}), View(a.data(), {2}), "deadlock.only0",
                               {ReduceOp::kSum});
    ASSERT_TRUE(pending.ok());
    s = Barrier();
  } else {
    s = Allreduce(View(a.data(), {2}), View(a.data(), {2}), "deadlock.others", {ReduceOp::kSum});
  }
  EXPECT_EQ(s.code(), StatusCode::kAborted) << s.ToString();
  if (R() == 0) {
    const Status p = Wait(*pending);
    EXPECT_EQ(p.code(), StatusCode::kAborted);
    EXPECT_EQ(p.message(), s.message());
  }
  std::vector<float> b(2, 1.0f);
  ASSERT_TRUE(Allreduce(View(b.data(), {2}), View(b.data(), {2}), "deadlock.after", {ReduceOp::kSum}).ok());
  EXPECT_EQ(b[0], static_cast<float>(N()));
}

// The last rank computes for three graces before it submits: the others wait all that time,
// but a rank that is not waiting can still submit, so this is no deadlock.
TEST(Deadlock, ARankComputingLongerThanTheGraceIsNotADeadlock) {
  std::vector<float> a(4, 1.0f);
  if (R() == N() - 1) std::this_thread::sleep_for(std::chrono::seconds(3));
  const Status s =
      Allreduce(View(a.data(), {4}), View(a.data(), {4}), "deadlock.late", {ReduceOp::kSum});
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(a[0], static_cast<float>(N()));
  // A barrier some ranks reach only after a long computation is no deadlock either.
  if (R() == 0) std::this_thread::sleep_for(std::chrono::seconds(3));
  ASSERT_TRUE(Barrier().ok());
}

}  // namespace
}  // namespace hvd
