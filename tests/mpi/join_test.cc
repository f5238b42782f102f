// horovod_cpp — Apache-2.0
// Join under mpirun: ranks with different numbers of batches, zeros from joined ranks (on the
// response-cache fast path too), Average over the full size, errors for other operations while
// a rank has joined, and the last rank to join reported everywhere.

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/horovod.h"
#include "tests/mpi/test_util.h"

namespace hvd {
namespace {

using namespace test;  // NOLINT

TEST(Join, UnevenBatchesAverageOverTheFullSize) {
  // Rank r has 2 * (r + 1) batches. Step k averages the contributions (r + 1) * (k + 1) of the
  // ranks still active and divides by N: joined ranks count as zeros.
  const int steps = 2 * (R() + 1);
  for (int k = 0; k < steps; ++k) {
    std::vector<double> g(16, (R() + 1.0) * (k + 1));
    ASSERT_TRUE(Allreduce(View(g.data(), {16}), View(g.data(), {16}), "grad").ok());
    double active_sum = 0;
    for (int r = 0; r < N(); ++r) {
      if (2 * (r + 1) > k) active_sum += (r + 1.0) * (k + 1);
    }
    ASSERT_DOUBLE_EQ(g[15], active_sum / N()) << "step " << k;
  }
  Result<int> last = Join();
  ASSERT_TRUE(last.ok()) << last.status().ToString();
  EXPECT_EQ(*last, N() - 1);  // the rank with the most batches joins last
  // Afterwards everything is back to normal.
  std::vector<double> g(4, 1.0);
  ASSERT_TRUE(Allreduce(View(g.data(), {4}), View(g.data(), {4}), "grad", {ReduceOp::kSum}).ok());
  EXPECT_EQ(g[0], N());
}

TEST(Join, OtherOperationsFailWhileARankHasJoined) {
  if (N() < 2) GTEST_SKIP() << "needs two ranks";
  if (R() == 0) {
    Result<int> last = Join();
    ASSERT_TRUE(last.ok());
    EXPECT_NE(*last, 0);
    return;
  }
  std::vector<float> x(2, 1.0f);
  Result<Output> out = Allgather(View(x.data(), {2}), "gather.while.joined");
  EXPECT_EQ(out.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(out.status().message(),
            "allgather 'gather.while.joined': not supported while rank 0 has called Join; only "
            "allreduce accepts joined ranks (they contribute zeros). With DistributedOptimizer, "
            "use sparse_as_dense=True");
  Status b = Broadcast(View(x.data(), {2}), View(x.data(), {2}), 1, "bcast.while.joined");
  EXPECT_NE(b.message().find("not supported while rank 0 has called Join"), std::string::npos);
  ASSERT_TRUE(
      Allreduce(View(x.data(), {2}), View(x.data(), {2}), "ok.while.joined", {ReduceOp::kSum})
          .ok());
  EXPECT_EQ(x[0], static_cast<float>(N() - 1));
  Result<int> last = Join();
  ASSERT_TRUE(last.ok());
  EXPECT_NE(*last, 0);
}

TEST(Join, JoinTwiceInARow) {
  for (int round = 0; round < 2; ++round) {
    Result<int> last = Join();
    ASSERT_TRUE(last.ok()) << last.status().ToString();
    EXPECT_GE(*last, 0);
    EXPECT_LT(*last, N());
  }
}

}  // namespace
}  // namespace hvd
