// horovod_cpp — Apache-2.0
// Where the background thread runs (HOROVOD_THREAD_AFFINITY, docs/config.md): a rank bound to
// one CPU (as plain mpirun binds) lets it out onto the CPUs no rank is bound to, and keeps the
// binding when there are none; HOROVOD_THREAD_AFFINITY pins it to its local rank's entry. The thread's CPUs are read from /proc (Cpus_allowed_list of the task
// named hvd-bg), independently of the code that set them.

#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "base/affinity.h"
#include "common/horovod.h"
#include "tests/mpi/test_util.h"

namespace hvd {
namespace {

std::string ReadLine(const std::string& path, const std::string& prefix = "") {
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(prefix, 0) == 0) return line.substr(prefix.size());
  }
  return "";
}

// "0-2,5" -> {0, 1, 2, 5}
std::vector<int> ParseCpuRanges(const std::string& text) {
  std::vector<int> cpus;
  std::stringstream ss(text);
  for (std::string part; std::getline(ss, part, ',');) {
    const size_t dash = part.find('-');
    const int lo = std::stoi(part.substr(0, dash));
    const int hi = dash == std::string::npos ? lo : std::stoi(part.substr(dash + 1));
    for (int c = lo; c <= hi; ++c) cpus.push_back(c);
  }
  return cpus;
}

// The CPUs of this process's background thread, from /proc.
std::vector<int> BackgroundThreadCpus() {
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    if (ReadLine(task.path() / "comm") == "hvd-bg") {
      std::string list = ReadLine(task.path() / "status", "Cpus_allowed_list:");
      list.erase(0, list.find_first_not_of(" \t"));
      return ParseCpuRanges(list);
    }
  }
  ADD_FAILURE() << "no thread named hvd-bg in /proc/self/task";
  return {};
}

std::vector<int> AllCpus() {
  std::vector<int> all;
  for (int c = 0; c < OnlineCpus(); ++c) all.push_back(c);
  return all;
}

// Init again with this thread bound to `cpus` (the background thread inherits it).
void RestartBoundTo(const std::vector<int>& cpus) {
  ASSERT_TRUE(Shutdown().ok());
  ASSERT_TRUE(SetThreadCpus(cpus).ok());
  ASSERT_TRUE(Init().ok());
  ASSERT_TRUE(SetThreadCpus(AllCpus()).ok());  // this thread only; the loop's keeps its own
}

TEST(Affinity, RanksBoundToOneCpuLetTheirBackgroundThreadsOntoTheCpusNoRankIsBoundTo) {
  if (OnlineCpus() < 2) GTEST_SKIP() << "one CPU: nothing to widen";
  RestartBoundTo({0});  // every rank on CPU 0: all the others are free
  EXPECT_EQ(BackgroundThreadCpus(), AllCpus());
}

TEST(Affinity, ABackgroundThreadKeepsItsRanksCpuWhenNoCpuIsFree) {
  // Rank r on CPU r % n, as mpirun binds: free are the CPUs no rank got (none once np >= n).
  const int n = OnlineCpus(), mine = test::R() % n;
  RestartBoundTo({mine});
  std::vector<int> expected;
  for (int c = 0; c < n; ++c) {
    if (c == mine || c >= test::N()) expected.push_back(c);
  }
  EXPECT_EQ(BackgroundThreadCpus(), expected) << "rank bound to CPU " << mine;
  int32_t x = 1;
  AllreduceOptions sum;
  sum.op = ReduceOp::kSum;
  ASSERT_TRUE(Wait(*EnqueueAllreduce(TensorView{&x, DataType::kInt32, {1}},
                                     TensorView{&x, DataType::kInt32, {1}}, "aff.one", sum))
                  .ok());
  EXPECT_EQ(x, test::N());
}

TEST(Affinity, ARankBoundToSeveralCpusKeepsItsBinding) {
  if (OnlineCpus() < 3) GTEST_SKIP() << "needs 3 CPUs to bind to 2 of them";
  RestartBoundTo({0, 1});
  EXPECT_EQ(BackgroundThreadCpus(), (std::vector<int>{0, 1}));
}

TEST(Affinity, ThreadAffinityPinsTheBackgroundThreadToItsLocalRanksEntry) {
  // Local rank i gets the last CPU minus i (wrapping), so entries differ between ranks.
  const int n = OnlineCpus();
  std::string list;
  for (int i = 0; i < 8; ++i) list += (i ? "," : "") + std::to_string(((n - 1 - i) % n + n) % n);
  ASSERT_EQ(setenv("HOROVOD_THREAD_AFFINITY", list.c_str(), 1), 0);
  RestartBoundTo(AllCpus());
  unsetenv("HOROVOD_THREAD_AFFINITY");
  const int local = *LocalRank();
  EXPECT_EQ(BackgroundThreadCpus(), (std::vector<int>{((n - 1 - local) % n + n) % n}))
      << "HOROVOD_THREAD_AFFINITY=" << list << ", local rank " << local;
  RestartBoundTo(AllCpus());  // back to the default for whatever runs next
  EXPECT_EQ(BackgroundThreadCpus(), AllCpus());
}

}  // namespace
}  // namespace hvd
