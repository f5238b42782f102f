// horovod_cpp — Apache-2.0
// The threaded core with its ranks simulated in one process (tests/unit/local_backend.h):
// N background loops, each with its own tensor queue, fed concurrently by several framework
// threads per rank, with the timeline writer running on rank 0. Results are checked exactly.
// This is the test ThreadSanitizer runs (./test.sh's thread-sanitizer build): MPI's
// cross-process transport is invisible to it, an in-process exchange is not.

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/loop/background_loop.h"
#include "common/config/config.h"
#include "common/state/counters.h"
#include "common/state/process_set.h"
#include "common/state/tensor_queue.h"
#include "tests/unit/local_backend.h"

namespace hvd {
namespace {

struct SimRank {
  TensorQueue queue;
  ProcessSetTable sets;
  Counters counters;
  BackgroundLoop loop{&queue, &sets, &counters};
};

// Counts completions and lets a thread wait for a number of them.
class Completions {
 public:
  StatusCallback Callback(std::atomic<int>* times, Status* status) {
    return [this, times, status](const Status& s) {
      *status = s;
      times->fetch_add(1);
      std::lock_guard<std::mutex> lock(mu_);
      ++done_;
      cv_.notify_all();
    };
  }
  void WaitFor(int n) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_ >= n; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int done_ = 0;
};

TensorTableEntry Entry(OpType type, int rank, const std::string& name, float* in, float* out,
                       int64_t n) {
  TensorTableEntry e;
  e.input = TensorView{in, DataType::kFloat32, {n}};
  e.output = TensorView{out, DataType::kFloat32, {n}};
  e.result = std::make_shared<Output>();
  e.request.request_rank = rank;
  e.request.type = type;
  e.request.dtype = DataType::kFloat32;
  e.request.reduce_op = ReduceOp::kSum;
  e.request.tensor_name = name;
  e.request.shape = {n};
  return e;
}

// Starts every rank's background loop at once (Start blocks until the ranks have met).
::testing::AssertionResult StartLoops(const std::vector<std::unique_ptr<SimRank>>& ranks,
                                      const std::shared_ptr<test::LocalWorld>& world,
                                      const Config& config) {
  std::vector<std::thread> starters;
  std::vector<Status> started(ranks.size());
  for (size_t r = 0; r < ranks.size(); ++r) {
    starters.emplace_back([&, r] {
      ops::Backends backends;
      backends.host = test::CreateLocalBackend(world, static_cast<int>(r));
      started[r] = ranks[r]->loop.Start(config, {}, std::move(backends));
    });
  }
  for (auto& t : starters) t.join();
  for (const Status& s : started) {
    if (!s.ok()) return ::testing::AssertionFailure() << s.ToString();
  }
  return ::testing::AssertionSuccess();
}

void RunJob(int size, int threads_per_rank, int ops_per_thread, const std::string& timeline) {
  auto world = std::make_shared<test::LocalWorld>(size);
  std::vector<std::unique_ptr<SimRank>> ranks;
  for (int r = 0; r < size; ++r) ranks.push_back(std::make_unique<SimRank>());
  Config config;
  config.cycle_time_ms = 0.5;
  config.fusion_threshold_bytes = 64 << 10;
  config.collective_chunk_bytes = 4 << 10;  // chunked paths too
  config.timeline_path = timeline;
  ASSERT_TRUE(StartLoops(ranks, world, config));

  // Every framework thread of every rank submits the same named tensors (in its own random
  // order, some allreduces, some broadcasts), then waits for all of them.
  constexpr int64_t kElems = 300;
  std::vector<std::thread> workers;
  std::atomic<int> wrong{0}, not_once{0}, failed{0};
  for (int r = 0; r < size; ++r) {
    for (int t = 0; t < threads_per_rank; ++t) {
      workers.emplace_back([&, r, t] {
        Completions completions;
        std::vector<std::vector<float>> in(static_cast<size_t>(ops_per_thread)),
            out(static_cast<size_t>(ops_per_thread));
        std::vector<std::atomic<int>> times(static_cast<size_t>(ops_per_thread));
        std::vector<Status> status(static_cast<size_t>(ops_per_thread));
        std::vector<int> order(static_cast<size_t>(ops_per_thread));
        for (int i = 0; i < ops_per_thread; ++i) order[static_cast<size_t>(i)] = i;
        std::mt19937 g(static_cast<unsigned>(r * 100 + t));
        std::shuffle(order.begin(), order.end(), g);
        for (int i : order) {
          const size_t k = static_cast<size_t>(i);
          in[k].assign(kElems, static_cast<float>(r + 1 + i));
          out[k].assign(kElems, -1.0f);
          const bool broadcast = i % 4 == 3;
          const std::string name = "t" + std::to_string(t) + ".op" + std::to_string(i);
          TensorTableEntry e = Entry(broadcast ? OpType::kBroadcast : OpType::kAllreduce, r, name,
                                     in[k].data(), out[k].data(), kElems);
          if (broadcast) e.request.root_rank = i % size;
          e.callback = completions.Callback(&times[k], &status[k]);
          std::vector<TensorTableEntry> one;
          one.push_back(std::move(e));
          const Status added = ranks[static_cast<size_t>(r)]->queue.Add(
              std::move(one), static_cast<Handle>(t * ops_per_thread + i + 1));
          if (!added.ok()) {
            ADD_FAILURE() << added.ToString();
            return;
          }
        }
        completions.WaitFor(ops_per_thread);
        for (int i = 0; i < ops_per_thread; ++i) {
          const size_t k = static_cast<size_t>(i);
          if (times[k].load() != 1) ++not_once;
          if (!status[k].ok()) ++failed;
          float want = 0;
          if (i % 4 == 3) {
            want = static_cast<float>(i % size + 1 + i);
          } else {
            for (int q = 0; q < size; ++q) want += static_cast<float>(q + 1 + i);
          }
          for (float v : out[k]) wrong += v != want;
        }
      });
    }
  }
  for (auto& w : workers) w.join();
  EXPECT_EQ(not_once.load(), 0);
  EXPECT_EQ(failed.load(), 0);
  EXPECT_EQ(wrong.load(), 0);

  // A shutdown from one rank ends every loop; the others' Stop() only joins.
  std::vector<std::thread> stoppers;
  for (int r = 0; r < size; ++r) {
    stoppers.emplace_back([&, r] { ranks[static_cast<size_t>(r)]->loop.Stop(); });
  }
  for (auto& t : stoppers) t.join();
  for (auto& rank : ranks) EXPECT_FALSE(rank->loop.running());
}

TEST(SimulatedRanks, ConcurrentSubmittersOnTwoRanks) { RunJob(2, 3, 40, ""); }

TEST(SimulatedRanks, ConcurrentSubmittersOnThreeRanksWithTimeline) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("hvd_sim_timeline_" + std::to_string(::getpid()) + ".json"))
                               .string();
  RunJob(3, 2, 40, path);
  EXPECT_GT(std::filesystem::file_size(path), 100u);  // the writer thread wrote events
  std::filesystem::remove(path);
}

TEST(SimulatedRanks, FourRanksMoreThreadsThanCores) { RunJob(4, 2, 25, ""); }

// The interleaving behind the soak's occasional "coordinator pending 1": a rank that has
// finished a round is already in its next collective (a miss, sent to rank 0) while rank 0 is
// still reading its statistics. Rank 0's table then holds that live request, which completes
// as soon as rank 0 submits too: nothing stays behind. Cache hits and evictions (a cache of
// one entry, two alternating names) run in between, as in the soak.
TEST(SimulatedRanks, CoordinatorTableHoldsOnlyRequestsStillAwaitingARank) {
  constexpr int kSize = 2;
  auto world = std::make_shared<test::LocalWorld>(kSize);
  std::vector<std::unique_ptr<SimRank>> ranks;
  for (int r = 0; r < kSize; ++r) ranks.push_back(std::make_unique<SimRank>());
  Config config;
  config.cycle_time_ms = 0.5;
  config.cache_capacity = 1;  // every Put evicts the other name
  ASSERT_TRUE(StartLoops(ranks, world, config));
  constexpr int64_t kElems = 8;
  Handle next_handle = 1;
  struct Op {
    std::vector<float> in, out;
    std::atomic<int> times{0};
    Status status;
    Completions done;
  };
  auto submit = [&](int r, const std::string& name, Op& op) {
    op.in.assign(kElems, static_cast<float>(r + 1));
    op.out.assign(kElems, 0.0f);
    TensorTableEntry e =
        Entry(OpType::kAllreduce, r, name, op.in.data(), op.out.data(), kElems);
    e.callback = op.done.Callback(&op.times, &op.status);
    std::vector<TensorTableEntry> one;
    one.push_back(std::move(e));
    const Handle h = next_handle++;
    EXPECT_TRUE(ranks[static_cast<size_t>(r)]->queue.Add(std::move(one), h).ok());
    return h;
  };
  auto finish = [&](int r, Op& op, Handle h) {
    op.done.WaitFor(1);
    EXPECT_EQ(op.times.load(), 1);
    EXPECT_TRUE(op.status.ok()) << op.status.ToString();
    for (float v : op.out) EXPECT_EQ(v, 3.0f);  // 1 + 2
    ranks[static_cast<size_t>(r)]->queue.ReleaseNames(h);
  };
  auto pending_at_rank0 = [&] { return ranks[0]->counters.coordinator_pending.load(); };

  // Rounds of "a" and "b" on both ranks: misses, then hits, evictions and misses again.
  for (int round = 0; round < 6; ++round) {
    for (const char* name : {"a", "a", "b", "b"}) {  // a miss, then a hit, per name
      Op op[kSize];
      Handle h[kSize];
      for (int r = 0; r < kSize; ++r) h[r] = submit(r, name, op[r]);
      for (int r = 0; r < kSize; ++r) finish(r, op[r], h[r]);
      EXPECT_EQ(pending_at_rank0(), 0u) << "round " << round << ", " << name;
    }
  }
  // Rank 1 runs ahead into its next collective; rank 0 has not submitted it yet.
  Op ahead[kSize];
  Handle h1 = submit(1, "next", ahead[1]);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (pending_at_rank0() != 1 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(pending_at_rank0(), 1u);  // a live request, not a leak
  EXPECT_EQ(ahead[1].times.load(), 0);
  Handle h0 = submit(0, "next", ahead[0]);
  finish(0, ahead[0], h0);
  finish(1, ahead[1], h1);
  EXPECT_EQ(pending_at_rank0(), 0u);  // counted when rank 0's cycle took the response

  std::vector<std::thread> stoppers;
  for (int r = 0; r < kSize; ++r) {
    stoppers.emplace_back([&, r] { ranks[static_cast<size_t>(r)]->loop.Stop(); });
  }
  for (auto& t : stoppers) t.join();
  for (int r = 0; r < kSize; ++r) {
    EXPECT_EQ(ranks[static_cast<size_t>(r)]->queue.reserved(), 0u);
  }
}

}  // namespace
}  // namespace hvd
