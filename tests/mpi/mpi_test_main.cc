// horovod_cpp — Apache-2.0
// main() for GoogleTest binaries run under mpirun.
//
//  * MPI is initialised here (MPI_THREAD_MULTIPLE), so tests may use MPI_COMM_WORLD for
//    independent cross-checks while horovod_cpp's background thread uses its own communicator.
//  * hvd::Init() runs once before the tests; hvd::Shutdown() after.
//  * Only rank 0 prints GoogleTest's normal output; every rank prints its own failures with a
//    "[rank r]" prefix.
//  * A watchdog thread calls MPI_Abort once this rank has made no progress for
//    HVD_TEST_WATCHDOG_SECONDS (default 90), naming the test that was running, so a rank stuck
//    in a collective (because a peer failed an assertion and moved on) ends the whole job
//    quickly. Progress is a tensor that horovod_cpp completed (its tensors_completed counter)
//    or a test that started or ended: a suite that is slow (a sanitizer build on a loaded
//    machine) but still completes collectives is not hung, and runs until ctest's TIMEOUT.
//  * All ranks agree on the exit code (an allreduce MIN of "passed", polled: mpi_wait.h).

#include <gtest/gtest.h>
#include <mpi.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "common/horovod.h"
#include "tests/mpi/mpi_wait.h"

namespace {

int g_rank = 0;

class RankFailurePrinter : public ::testing::EmptyTestEventListener {
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", g_rank,
                 r.file_name() ? r.file_name() : "?", r.line_number(), r.message());
  }
};

std::mutex g_watch_mu;
std::condition_variable g_watch_cv;
bool g_done = false;
std::atomic<uint64_t> g_test_events{0};

class ProgressListener : public ::testing::EmptyTestEventListener {
  void OnTestStart(const ::testing::TestInfo&) override { g_test_events.fetch_add(1); }
  void OnTestEnd(const ::testing::TestInfo&) override { g_test_events.fetch_add(1); }
};

// What moves while this rank gets anywhere: tests started and ended, and tensors that
// horovod_cpp completed (0 while it is not initialised: a test between Shutdown and Init).
std::pair<uint64_t, uint64_t> ProgressMark() {
  auto stats = hvd::GetStats();
  return {g_test_events.load(), stats.ok() ? stats->tensors_completed : 0};
}

void Watchdog(int seconds) {
  using Clock = std::chrono::steady_clock;
  auto mark = ProgressMark();
  auto last_progress = Clock::now();
  std::unique_lock<std::mutex> lock(g_watch_mu);
  while (!g_watch_cv.wait_for(lock, std::chrono::seconds(1), [] { return g_done; })) {
    const auto now_mark = ProgressMark();
    const auto now = Clock::now();
    if (now_mark != mark) {
      mark = now_mark;
      last_progress = now;
      continue;
    }
    if (now - last_progress < std::chrono::seconds(seconds)) continue;
    const ::testing::TestInfo* t = ::testing::UnitTest::GetInstance()->current_test_info();
    std::fprintf(stderr,
                 "[rank %d] watchdog: no progress for %d s (no tensor completed, no test started "
                 "or ended; test %s.%s); calling MPI_Abort\n",
                 g_rank, seconds, t ? t->test_suite_name() : "-", t ? t->name() : "-");
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 3);
  }
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  ::testing::InitGoogleTest(&argc, argv);

  ::testing::TestEventListeners& listeners = ::testing::UnitTest::GetInstance()->listeners();
  if (g_rank != 0) delete listeners.Release(listeners.default_result_printer());
  listeners.Append(new RankFailurePrinter);
  listeners.Append(new ProgressListener);

  const char* env = std::getenv("HVD_TEST_WATCHDOG_SECONDS");
  const int seconds = env ? std::atoi(env) : 90;
  std::thread watchdog(Watchdog, seconds > 0 ? seconds : 90);

  // The suites on the Gloo backend (tests/with_rendezvous.py): mpirun numbers the ranks.
  const char* controller = std::getenv("HOROVOD_CONTROLLER");
  if (controller != nullptr && std::string(controller) == "gloo") {
    int size = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    setenv("HOROVOD_RANK", std::to_string(g_rank).c_str(), 1);
    setenv("HOROVOD_SIZE", std::to_string(size).c_str(), 1);
  }
  hvd::Status init = hvd::Init();
  if (!init.ok()) {
    std::fprintf(stderr, "[rank %d] hvd::Init failed: %s\n", g_rank, init.ToString().c_str());
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  const int rc = RUN_ALL_TESTS();
  int passed = rc == 0 ? 1 : 0, all_passed = 0;
  hvd::test::SleepingAllreduce(&passed, &all_passed, 1, MPI_INT, MPI_MIN);
  hvd::Shutdown().IgnoreError();

  {
    std::lock_guard<std::mutex> lock(g_watch_mu);
    g_done = true;
  }
  g_watch_cv.notify_all();
  watchdog.join();
  if (g_rank == 0 && !all_passed && passed) {
    std::fprintf(stderr, "[rank 0] another rank failed (see its [rank r] lines above)\n");
  }
  MPI_Finalize();
  return all_passed ? 0 : 1;
}
