// horovod_cpp — Apache-2.0
// Shutdown semantics under mpirun: a shutdown on one rank stops every rank, every pending
// handle completes exactly once with ABORTED naming the rank that asked, later calls fail
// clearly, and (because this program, not horovod_cpp, owns MPI) Init works again afterwards.

#include <gtest/gtest.h>
#include <mpi.h>

#include <atomic>
#include <string>
#include <vector>

#include <unistd.h>

#include "common/horovod.h"
#include "tests/mpi/mpi_wait.h"

namespace hvd {
namespace {

TEST(Shutdown, OneRankStopsEveryRankAndPendingHandlesFailOnce) {
  const int rank = *Rank(), size = *Size();
  // A tensor only this rank submits: it can never become ready.
  std::vector<float> x(4, 1.0f);
  std::atomic<int> callbacks{0};
  Status from_callback;
  auto h =
      EnqueueAllreduce(View(x.data(), {4}), View(x.data(), {4}), "pending." + std::to_string(rank),
                       {ReduceOp::kSum}, [&](const Status& s) {
                         from_callback = s;
                         ++callbacks;
                       });
  ASSERT_TRUE(h.ok());
  hvd::test::SleepingBarrier();  // every rank has its pending op before anyone shuts down
  if (rank == 0) {
    ASSERT_TRUE(Shutdown().ok());
  }
  const Status s = Wait(*h);
  EXPECT_EQ(s.code(), StatusCode::kAborted);
  char host[256] = {};
  ASSERT_EQ(gethostname(host, sizeof host - 1), 0);
  // The rank that shut down, and its host.
  EXPECT_NE(s.message().find("horovod_cpp has been shut down (shutdown requested by rank 0 (" +
                             std::string(host) + "))"),
            std::string::npos)
      << s.message();
  EXPECT_EQ(callbacks.load(), 1);
  EXPECT_EQ(from_callback, s);
  EXPECT_EQ(x[0], 1.0f);  // never reduced

  // Later calls fail clearly on every rank, whether or not it called Shutdown itself.
  auto later = EnqueueAllreduce(View(x.data(), {4}), View(x.data(), {4}), "later");
  EXPECT_FALSE(later.ok());
  if (rank == 0) {
    EXPECT_EQ(later.status().code(), StatusCode::kFailedPrecondition);  // not initialized
  } else {
    EXPECT_EQ(later.status().code(), StatusCode::kAborted);
    EXPECT_NE(later.status().message().find("shutdown requested by rank 0"), std::string::npos);
    EXPECT_FALSE(IsInitialized());
    // What was fixed at Init stays answerable until this rank shuts down itself.
    ASSERT_TRUE(Rank().ok());
    EXPECT_EQ(*Rank(), rank);
    EXPECT_EQ(*Size(), size);
    ASSERT_TRUE(GetProcessSet(0).ok());
    EXPECT_EQ(GetProcessSet(0)->size, size);
    ASSERT_TRUE(Shutdown().ok());
  }
  EXPECT_FALSE(Rank().ok());

  // MPI belongs to this program, so the runtime can start again.
  ASSERT_TRUE(Init().ok());
  EXPECT_EQ(*Size(), size);
  std::vector<int64_t> y(3, rank + 1);
  ASSERT_TRUE(
      Allreduce(View(y.data(), {3}), View(y.data(), {3}), "after.reinit", {ReduceOp::kSum}).ok());
  EXPECT_EQ(y[2], size * (size + 1) / 2);
}

TEST(Shutdown, EveryRankAtOnceWithManyPendingOps) {
  const int rank = *Rank();
  std::atomic<int> callbacks{0};
  std::vector<std::vector<double>> bufs(50, std::vector<double>(8, 1.0));
  std::vector<Handle> hs;
  for (int i = 0; i < 50; ++i) {
    // Half the names are shared (these may complete), half are unique to this rank (never).
    const std::string name = i % 2 ? "lonely." + std::to_string(rank) + "." + std::to_string(i)
                                   : "shared." + std::to_string(i);
    auto h = EnqueueAllreduce(View(bufs[i].data(), {8}), View(bufs[i].data(), {8}), name,
                              {ReduceOp::kSum}, [&](const Status&) { ++callbacks; });
    ASSERT_TRUE(h.ok()) << i << ": " << h.status().ToString();
    hs.push_back(*h);
  }
  // Every rank has its 50 operations pending before any rank shuts down: a fast rank's
  // Shutdown() would otherwise stop a slow rank's runtime before it has enqueued them all.
  hvd::test::SleepingBarrier();
  ASSERT_TRUE(Shutdown().ok());
  int aborted = 0;
  for (int i = 0; i < 50; ++i) {
    Status s = Wait(hs[i]);
    if (i % 2) {
      EXPECT_EQ(s.code(), StatusCode::kAborted) << i;
    }
    if (!s.ok()) ++aborted;
  }
  EXPECT_EQ(callbacks.load(), 50);  // each exactly once
  EXPECT_GE(aborted, 25);
}

}  // namespace
}  // namespace hvd
