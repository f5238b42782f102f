// horovod_cpp — Apache-2.0
// HOROVOD_AUTOTUNE=1 on real ranks (ctest sets it, with 2-step samples and one warm-up sample
// so that the search runs through many settings in a short loop): every result stays right
// while the knobs change under the loop (chunk sizes below and above the tensors, fusion on
// and off, the cache dropped and rebuilt), every rank ends on rank 0's knobs, rank 0 writes
// the log, and a knob set in the environment stays as set.

#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "common/horovod.h"
#include "mpi_wait.h"
#include "test_util.h"

namespace hvd {
namespace {

using test::N;
using test::R;

// A training-like step: tensors of 300 floats to 3 M (12 MiB: over every candidate chunk,
// under some fusion thresholds and over others), and a float16 one, each summed.
struct Tensor {
  std::string name;
  DataType dtype;
  int64_t n;
  std::vector<uint8_t> in, out;
};

std::vector<Tensor> MakeStep() {
  std::vector<Tensor> ts = {{"small", DataType::kFloat32, 300, {}, {}},
                            {"medium", DataType::kFloat32, 700000, {}, {}},
                            {"large", DataType::kFloat32, 3000000, {}, {}},
                            {"half", DataType::kFloat16, 5000, {}, {}},
                            {"wide", DataType::kFloat64, 40000, {}, {}}};
  for (Tensor& t : ts) {
    t.in.resize(static_cast<size_t>(t.n * DataTypeSize(t.dtype)));
    t.out.resize(t.in.size());
  }
  return ts;
}

TEST(Autotune, ResultsStayRightWhileTheKnobsChangeAndEveryRankEndsOnRankZeros) {
  std::vector<Tensor> ts = MakeStep();
  const int steps = 120;
  int64_t last_samples = 0;
  for (int step = 0; step < steps; ++step) {
    std::vector<Handle> handles;
    for (Tensor& t : ts) {
      for (int64_t i = 0; i < t.n; i += std::max<int64_t>(1, t.n / 997)) {
        test::WriteAs(t.dtype, t.in.data(), i, (R() + 1) * ((i + step) % 5 + 1));
      }
      Result<Handle> h = EnqueueAllreduce(TensorView{t.in.data(), t.dtype, {t.n}},
                                          TensorView{t.out.data(), t.dtype, {t.n}},
                                          "autotune." + t.name, {ReduceOp::kSum});
      ASSERT_TRUE(h.ok()) << h.status().ToString();
      handles.push_back(*h);
    }
    for (Handle h : handles) ASSERT_TRUE(Wait(h).ok());
    const double ranks = N() * (N() + 1) / 2.0;
    for (const Tensor& t : ts) {
      for (int64_t i = 0; i < t.n; i += std::max<int64_t>(1, t.n / 997)) {
        ASSERT_EQ(test::ReadAs(t.dtype, t.out.data(), i), ranks * ((i + step) % 5 + 1))
            << t.name << "[" << i << "] at step " << step;
      }
    }
    Result<Stats> s = GetStats();
    ASSERT_TRUE(s.ok());
    EXPECT_GE(static_cast<int64_t>(s->autotune_samples), last_samples);
    last_samples = static_cast<int64_t>(s->autotune_samples);
  }
  // 120 steps of 2-step samples: ~60 samples (the search's budget is 20 after one warm-up).
  EXPECT_GE(last_samples, 40);

  // Quiet now: once every rank has ended the same number of samples, all run the same knobs.
  std::vector<int64_t> all;
  for (int attempt = 0; attempt < 200; ++attempt) {
    Result<Stats> s = GetStats();
    ASSERT_TRUE(s.ok());
    const int64_t mine[6] = {static_cast<int64_t>(s->autotune_samples), s->fusion_threshold_bytes,
                             s->collective_chunk_bytes, s->cycle_time_us, s->cache_on,
                             s->hierarchical_allreduce};
    all.assign(static_cast<size_t>(6 * N()), 0);
    hvd::test::SleepingAllgather(mine, 6, MPI_INT64_T, all.data(), 6, MPI_INT64_T);
    bool same_count = true;
    for (int r = 1; r < N(); ++r) same_count = same_count && all[6 * r] == all[0];
    if (same_count) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (int r = 1; r < N(); ++r) {
    for (int j = 0; j < 6; ++j) {
      EXPECT_EQ(all[static_cast<size_t>(6 * r + j)], all[static_cast<size_t>(j)])
          << "rank " << r << ", field " << j;
    }
  }
  EXPECT_GT(all[1], 0);  // a fusion threshold, a chunk and a cycle time are set
  EXPECT_GT(all[2], 0);
  EXPECT_GT(all[3], 0);
  const char* fixed = std::getenv("HOROVOD_FUSION_THRESHOLD");
  if (fixed != nullptr) {
    EXPECT_EQ(all[1], std::atoll(fixed));  // set: never tuned
  }

  const char* log = std::getenv("HOROVOD_AUTOTUNE_LOG");
  if (R() == 0 && log != nullptr) {
    std::ifstream in(log);
    ASSERT_TRUE(in.good()) << log;
    std::string line;
    int samples = 0, header = 0, best = 0;
    while (std::getline(in, line)) {
      if (line.rfind("sample,", 0) == 0) ++header;
      if (!line.empty() && std::isdigit(static_cast<unsigned char>(line[0]))) ++samples;
      if (line.rfind("# best: ", 0) == 0) ++best;
      if (fixed != nullptr && !line.empty() &&
          std::isdigit(static_cast<unsigned char>(line[0]))) {
        EXPECT_NE(line.find("," + std::string(fixed) + ","), std::string::npos) << line;
      }
    }
    EXPECT_EQ(header, 1);
    EXPECT_GE(samples, 40);
    EXPECT_GE(best, 1);  // the search ended and said so
  }
}

}  // namespace
}  // namespace hvd
