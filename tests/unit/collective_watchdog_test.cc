// horovod_cpp — Apache-2.0
// The collective timeout's watchdog, with several "ranks" in one process talking over real
// loopback sockets: who it names, what it says the others do, and when it stays quiet.
#include "common/collective_watchdog.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <vector>

namespace hvd {
namespace {

using Clock = std::chrono::steady_clock;

std::string HostName() {
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  return host;
}

struct Rank {
  std::unique_ptr<CollectiveWatchdog> dog;
  std::shared_ptr<std::promise<std::string>> report = std::make_shared<std::promise<std::string>>();
  std::future<std::string> future = report->get_future();
};

// `n` watchdogs that exchanged endpoints like ranks at Init (tables[i] for rank i: the same
// table for all unless a test gives one rank another job's).
std::vector<Rank> MakeRanks(int n, double timeout, double probe) {
  std::vector<Rank> ranks(static_cast<size_t>(n));
  std::vector<std::vector<uint8_t>> endpoints;
  for (int r = 0; r < n; ++r) {
    CollectiveWatchdog::Options o;
    o.timeout_seconds = timeout;
    o.probe_seconds = probe;
    o.rank = r;
    auto promise = ranks[static_cast<size_t>(r)].report;
    o.on_timeout = [promise](const std::string& report) { promise->set_value(report); };
    auto dog = CollectiveWatchdog::Create(std::move(o));
    EXPECT_TRUE(dog.ok()) << dog.status().message();
    ranks[static_cast<size_t>(r)].dog = std::move(*dog);
    endpoints.push_back(ranks[static_cast<size_t>(r)].dog->Endpoint());
  }
  const std::vector<uint8_t> table = CollectiveWatchdog::MakeTable(endpoints);
  for (Rank& r : ranks) EXPECT_TRUE(r.dog->SetTable(table).ok());
  return ranks;
}

Response Allreduce(const std::string& name, int32_t process_set = 0) {
  Response r;
  r.type = OpType::kAllreduce;
  r.tensor_names = {name};
  r.process_set_id = process_set;
  return r;
}

TEST(CollectiveWatchdog, NamesTheRanksThatDoNotAnswerAndWhatTheOthersWaitIn) {
  std::vector<Rank> ranks = MakeRanks(3, 0.5, 1.0);
  const Response group = Allreduce("grad.w");
  ranks[2].dog.reset();  // rank 2 is gone: nothing listens on its port
  const auto start = Clock::now();
  auto watch0 = ranks[0].dog->Watch(&group);
  auto watch1 = ranks[1].dog->Watch(&group);

  ASSERT_EQ(ranks[0].future.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  const double took = std::chrono::duration<double>(Clock::now() - start).count();
  const std::string report = ranks[0].future.get();
  const std::string host = HostName();
  EXPECT_NE(report.find("collective timeout: rank 0 (" + host + ") has waited"), std::string::npos)
      << report;
  EXPECT_NE(report.find("in allreduce of 'grad.w' on process set 0"), std::string::npos) << report;
  EXPECT_NE(report.find("HOROVOD_COLLECTIVE_TIMEOUT_SECONDS=0.5"), std::string::npos) << report;
  EXPECT_NE(report.find("no answer within 1 s from rank 2 on host " + host), std::string::npos)
      << report;
  EXPECT_NE(report.find("rank 1 (" + host + ") answered: waiting"), std::string::npos) << report;
  EXPECT_EQ(report.find("rank 0 (" + host + ") answered"), std::string::npos) << report;
  // The timeout, a tick, and the probe of a refused connection (no need to wait it out).
  EXPECT_GE(took, 0.5);
  EXPECT_LT(took, 0.5 + 0.25 + 1.0 + 1.0);

  // Rank 1 timed out too, and names rank 0 as waiting in the same allreduce.
  ASSERT_EQ(ranks[1].future.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  const std::string other = ranks[1].future.get();
  EXPECT_NE(other.find("rank 0 (" + host + ") answered: waiting"), std::string::npos) << other;
  EXPECT_NE(other.find("from rank 2 on host"), std::string::npos) << other;
}

TEST(CollectiveWatchdog, NegotiationRoundsAreNamedAndSilentRanksGroupedByHost) {
  std::vector<Rank> ranks = MakeRanks(4, 0.3, 0.5);
  ranks[2].dog.reset();  // gone before rank 0 starts waiting (each takes up to a tick)
  ranks[3].dog.reset();
  auto watch = ranks[0].dog->Watch(nullptr);
  ASSERT_EQ(ranks[0].future.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  const std::string report = ranks[0].future.get();
  EXPECT_NE(report.find("in a negotiation round"), std::string::npos) << report;
  EXPECT_NE(report.find("from ranks 2, 3 on host " + HostName()), std::string::npos) << report;
  EXPECT_NE(report.find("rank 1 (" + HostName() + ") answered: not in a collective"),
            std::string::npos)
      << report;
}

TEST(CollectiveWatchdog, QuietWhileEveryCallFinishesInTime) {
  std::vector<Rank> ranks = MakeRanks(2, 0.3, 0.5);
  const Response group = Allreduce("t");
  for (int i = 0; i < 20; ++i) {  // 1 s of calls, each well within the timeout
    auto watch = ranks[0].dog->Watch(i % 2 ? &group : nullptr);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  // Time outside a collective does not count, however long.
  EXPECT_EQ(ranks[0].future.wait_for(std::chrono::milliseconds(800)), std::future_status::timeout);
  EXPECT_EQ(ranks[0].dog->Activity(), "not in a collective");
  auto watch = ranks[0].dog->Watch(&group);
  EXPECT_EQ(ranks[0].dog->Activity(), "waiting 0 s in allreduce of 't' on process set 0");
}

TEST(CollectiveWatchdog, ARankOfAnotherJobIsNotTakenForOne) {
  // Rank 1 listens, but holds another job's token: it does not answer rank 0's questions.
  std::vector<Rank> ranks = MakeRanks(2, 0.3, 0.5);
  const std::vector<uint8_t> other_job =
      CollectiveWatchdog::MakeTable({ranks[0].dog->Endpoint(), ranks[1].dog->Endpoint()});
  ASSERT_TRUE(ranks[1].dog->SetTable(other_job).ok());
  auto watch = ranks[0].dog->Watch(nullptr);
  ASSERT_EQ(ranks[0].future.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  const std::string report = ranks[0].future.get();
  EXPECT_NE(report.find("no answer within 0.5 s from rank 1"), std::string::npos) << report;
}

TEST(CollectiveWatchdog, DescribesGroups) {
  Response r;
  r.type = OpType::kAllgather;
  r.tensor_names = {"a", "b", "c", "d", "e"};
  r.process_set_id = 2;
  EXPECT_EQ(DescribeGroup(&r), "allgather of 'a', 'b', 'c' (+2 more) on process set 2");
  EXPECT_EQ(DescribeGroup(nullptr),
            "a negotiation round (the control collective of every cycle)");
}

TEST(CollectiveWatchdog, RejectsATableWithoutThisRank) {
  std::vector<Rank> ranks = MakeRanks(2, 10, 1);
  const std::vector<uint8_t> one = CollectiveWatchdog::MakeTable({ranks[0].dog->Endpoint()});
  EXPECT_FALSE(ranks[1].dog->SetTable(one).ok());
  const std::vector<uint8_t> junk = {1, 2, 3};
  EXPECT_FALSE(ranks[0].dog->SetTable(junk).ok());
}

}  // namespace
}  // namespace hvd
