// horovod_cpp — Apache-2.0
// Timelines recorded by a real mpirun job (rank 0 writes them into $HVD_TEST_TIMELINE_DIR).
// tests/timeline/check_timeline.py then parses the files and checks rows, phases and nesting.
// ctest runs this with HOROVOD_FUSION_THRESHOLD=4096 so that "big" travels alone.

#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "common/horovod.h"
#include "tests/mpi/test_util.h"

namespace hvd {
namespace {

using namespace test;  // NOLINT

std::string Dir() {
  const char* d = std::getenv("HVD_TEST_TIMELINE_DIR");
  return d ? d : "/tmp";
}

void SumAndCheck(std::vector<float>& x, const std::string& name) {
  std::fill(x.begin(), x.end(), 1.0f);
  ASSERT_TRUE(Allreduce(View(x.data(), {static_cast<int64_t>(x.size())}),
                        View(x.data(), {static_cast<int64_t>(x.size())}), name, {ReduceOp::kSum})
                  .ok());
  ASSERT_EQ(x.back(), static_cast<float>(N()));
}

TEST(Timeline, FusedAndUnfusedTensorsAllgatherAndBroadcast) {
  ASSERT_TRUE(StartTimeline(Dir() + "/run.json").ok());
  // The other ranks cannot ask for "small" before rank 0 records (their ready instants, which
  // the check expects, would be missed): "started" completes only after rank 0 has started.
  std::vector<float> sync(1);
  SumAndCheck(sync, "started");
  for (int iter = 0; iter < 2; ++iter) {  // the second time round, the cache answers
    // A group is released in one cycle, so its members are certainly fused together.
    std::vector<std::vector<float>> small(8, std::vector<float>(16, 1.0f));
    std::vector<TensorView> views;
    for (auto& t : small) views.push_back(View(t.data(), {16}));
    std::vector<float> big(4096, 1.0f);  // 16 KiB: above the 4 KiB fusion threshold
    std::vector<Handle> hs;
    hs.push_back(*EnqueueGroupedAllreduce(views, views, "small", {ReduceOp::kSum}));
    hs.push_back(*EnqueueAllreduce(View(big.data(), {4096}), View(big.data(), {4096}), "big",
                                   {ReduceOp::kSum}));
    for (Handle h : hs) ASSERT_TRUE(Wait(h).ok());
    EXPECT_EQ(small[7][0], static_cast<float>(N()));
    EXPECT_EQ(big[4095], static_cast<float>(N()));
    std::vector<int32_t> row(2, R());
    Result<Output> g = Allgather(View(row.data(), {1, 2}), "gathered");
    ASSERT_TRUE(g.ok());
    double b = R();
    ASSERT_TRUE(Broadcast(View(&b, {1}), View(&b, {1}), N() - 1, "bcast").ok());
    EXPECT_EQ(b, N() - 1);
  }
  ASSERT_TRUE(StopTimeline().ok());
}

TEST(Timeline, DynamicStartAndStopTwice) {
  std::vector<float> x(8);
  ASSERT_TRUE(StartTimeline(Dir() + "/phase1.json", /*mark_cycles=*/true).ok());
  SumAndCheck(x, "phase1");
  ASSERT_TRUE(StopTimeline().ok());
  SumAndCheck(x, "between");  // not recorded anywhere
  ASSERT_TRUE(StartTimeline(Dir() + "/phase2.json").ok());
  SumAndCheck(x, "phase2");
  ASSERT_TRUE(StopTimeline().ok());
  ASSERT_TRUE(StopTimeline().ok());  // stopping twice is harmless
}

TEST(Timeline, ABadPathIsAClearErrorOnTheRecordingRank) {
  Status s = StartTimeline("/nonexistent-hvd-dir/t.json");
  if (R() == 0) {
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(s.message(),
              "cannot open timeline file '/nonexistent-hvd-dir/t.json': No such file or directory");
  } else {
    EXPECT_TRUE(s.ok());  // only rank 0 records
  }
  std::vector<float> x(4);
  SumAndCheck(x, "after.bad.path");  // training goes on
}

// Run on its own (ctest filter): rank 0 dies by SIGKILL while recording.
TEST(TimelineKill, RankZeroIsKilledWhileRecording) {
  ASSERT_TRUE(StartTimeline(Dir() + "/killed.json").ok());
  std::vector<float> x(64);
  for (int i = 0; i < 20; ++i) SumAndCheck(x, "killed." + std::to_string(i));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // let the writer catch up
  if (R() == 0) std::raise(SIGKILL);
  SumAndCheck(x, "never");  // the others wait here until mpirun takes the job down
}

}  // namespace
}  // namespace hvd
