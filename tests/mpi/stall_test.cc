// horovod_cpp — Apache-2.0
// The stall inspector under mpirun. ctest runs each test in its own job with short
// HOROVOD_STALL_* times and checks rank 0's log for the warning.

#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

#include "common/horovod.h"
#include "tests/mpi/test_util.h"

namespace hvd {
namespace {

using namespace test;  // NOLINT

// The last rank submits 2.5 s late (HOROVOD_STALL_CHECK_TIME_SECONDS=1): rank 0 warns, then
// the operation completes normally. Done twice: the second time the tensor is cached, so the
// late rank's peers wait on the fast path until their hits fall back to rank 0.
TEST(Stall, ALateRankIsReportedAndTheJobGoesOn) {
  for (int round = 0; round < 2; ++round) {
    if (R() == N() - 1) std::this_thread::sleep_for(std::chrono::milliseconds(2500));
    std::vector<float> x(4, 1.0f);
    ASSERT_TRUE(
        Allreduce(View(x.data(), {4}), View(x.data(), {4}), "stall.late", {ReduceOp::kSum}).ok());
    EXPECT_EQ(x[0], static_cast<float>(N()));
  }
}

// The last rank never submits "stall.doomed" (HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=2): the job
// shuts down and every pending operation reports why.
TEST(Stall, ARankThatNeverSubmitsShutsTheJobDown) {
  std::vector<float> x(4, 1.0f);
  const char* name = R() == N() - 1 ? "stall.other" : "stall.doomed";
  auto h = EnqueueAllreduce(View(x.data(), {4}), View(x.data(), {4}), name, {ReduceOp::kSum});
  ASSERT_TRUE(h.ok());
  Status s = Wait(*h);
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(s.message().find("horovod_cpp shut down after a stall (stalled: tensor '"),
            std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("(HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=2)"), std::string::npos);
  EXPECT_FALSE(IsInitialized());
}

}  // namespace
}  // namespace hvd
