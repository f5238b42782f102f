// horovod_cpp — Apache-2.0
// The collective timeout's watchdog, with several "ranks" in one process talking over real
// loopback sockets: who it names, what it says the others do, and when it stays quiet.
#include "common/loop/collective_watchdog.h"

#include <gtest/gtest.h>
#include <unistd.h>
#include <sys/time.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>

#include <algorithm>
#include <array>
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
std::vector<Rank> MakeRanks(int n, double timeout, double probe, int other_job_rank = -1,
                            std::vector<uint8_t>* table_out = nullptr) {
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
  const std::vector<uint8_t> other = CollectiveWatchdog::MakeTable(endpoints);
  for (int r = 0; r < n; ++r) {
    EXPECT_TRUE(ranks[static_cast<size_t>(r)].dog->SetTable(r == other_job_rank ? other : table).ok());
  }
  if (table_out) *table_out = table;
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
  std::vector<Rank> ranks = MakeRanks(2, 0.3, 0.5, /*other_job_rank=*/1);
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
  CollectiveWatchdog::Options o;
  o.rank = 1;
  auto dog = CollectiveWatchdog::Create(o);
  ASSERT_TRUE(dog.ok());
  const std::vector<uint8_t> one = CollectiveWatchdog::MakeTable({(*dog)->Endpoint()});
  EXPECT_FALSE((*dog)->SetTable(one).ok());
  const std::vector<uint8_t> junk = {1, 2, 3};
  EXPECT_FALSE((*dog)->SetTable(junk).ok());
  std::vector<Rank> ranks = MakeRanks(2, 10, 1);
  const std::vector<uint8_t> again =
      CollectiveWatchdog::MakeTable({ranks[0].dog->Endpoint(), ranks[1].dog->Endpoint()});
  EXPECT_FALSE(ranks[0].dog->SetTable(again).ok());  // set once
}

// ---- foreign and hostile clients on the side channel --------------------------------------

// A raw client of a rank's side channel: connects to its port on loopback.
struct Client {
  int fd = -1;
  explicit Client(uint16_t port) {
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    timeval tv{2, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  }
  ~Client() { close(fd); }
  std::vector<uint8_t> Read(size_t n) {  // up to n bytes, until EOF or 2 s
    std::vector<uint8_t> out;
    uint8_t buf[512];
    while (out.size() < n) {
      const ssize_t got = recv(fd, buf, std::min(sizeof buf, n - out.size()), 0);
      if (got <= 0) break;
      out.insert(out.end(), buf, buf + got);
    }
    return out;
  }
  void Send(const std::vector<uint8_t>& bytes) {
    ASSERT_EQ(send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(bytes.size()));
  }
};

uint16_t PortOf(const CollectiveWatchdog& dog) {
  const std::vector<uint8_t> e = dog.Endpoint();  // host, addresses, then the port (u16 LE)
  return static_cast<uint16_t>(e[e.size() - 2] | (e[e.size() - 1] << 8));
}

std::array<uint8_t, CollectiveWatchdog::kKeyBytes> KeyOf(const std::vector<uint8_t>& table) {
  std::array<uint8_t, CollectiveWatchdog::kKeyBytes> key{};
  std::copy(table.begin(), table.begin() + key.size(), key.begin());
  return key;
}

TEST(CollectiveWatchdogHostile, AnsweredOnlyWithTheKeyAndNeverToAReplay) {
  std::vector<uint8_t> table;
  std::vector<Rank> ranks = MakeRanks(2, 60, 1, -1, &table);
  const auto key = KeyOf(table);
  const uint16_t port = PortOf(*ranks[1].dog);
  // With the key: an answer, tagged over this connection's nonce, from rank 1.
  std::vector<uint8_t> recorded;
  {
    Client c(port);
    const std::vector<uint8_t> nonce = c.Read(CollectiveWatchdog::kNonceBytes);
    ASSERT_EQ(nonce.size(), CollectiveWatchdog::kNonceBytes);
    recorded = CollectiveWatchdog::Question(key, nonce.data(), 0);
    c.Send(recorded);
    const std::vector<uint8_t> answer = c.Read(1 << 14);
    const auto a = CollectiveWatchdog::ParseAnswer(key, nonce.data(), answer, 1);
    EXPECT_TRUE(a.complete && a.valid);
    EXPECT_EQ(a.activity, "not in a collective");
    // Not believed under another nonce (a stray or forged answer).
    std::vector<uint8_t> other_nonce(nonce);
    other_nonce[0] ^= 1;
    EXPECT_FALSE(CollectiveWatchdog::ParseAnswer(key, other_nonce.data(), answer, 1).valid);
  }
  const uint64_t refused = ranks[1].dog->refused();
  {  // The same question replayed on a new connection (a new nonce): no answer.
    Client c(port);
    ASSERT_EQ(c.Read(CollectiveWatchdog::kNonceBytes).size(), CollectiveWatchdog::kNonceBytes);
    c.Send(recorded);
    EXPECT_TRUE(c.Read(1 << 14).empty());
  }
  {  // Without the key (another key), and garbage.
    Client c(port);
    const std::vector<uint8_t> nonce = c.Read(CollectiveWatchdog::kNonceBytes);
    std::array<uint8_t, CollectiveWatchdog::kKeyBytes> wrong = key;
    wrong[3] ^= 0x40;
    c.Send(CollectiveWatchdog::Question(wrong, nonce.data(), 0));
    EXPECT_TRUE(c.Read(1 << 14).empty());
  }
  {
    Client c(port);
    c.Read(CollectiveWatchdog::kNonceBytes);
    c.Send(std::vector<uint8_t>(12, 0xff));
    EXPECT_TRUE(c.Read(1 << 14).empty());
  }
  {  // Truncated: half a question, then the client goes.
    Client c(port);
    c.Read(CollectiveWatchdog::kNonceBytes);
    c.Send({1, 2, 3, 4, 5});
  }
  EXPECT_GE(ranks[1].dog->refused(), refused + 3);
}

TEST(CollectiveWatchdogHostile, SilentAndFloodingClientsDelayNeitherAnswersNorTheTimeout) {
  // More connections than a rank serves at once (kMaxIncoming, 64), saying nothing, held
  // open, before and while rank 0 times out: rank 1 still answers rank 0's probe (named as
  // answering, not silent) and rank 0's own timeout fires on time. (Loopback here: the floods
  // of a few hundred connections run on the test bed, tests/multihost/hostile.)
  std::vector<Rank> ranks = MakeRanks(2, 1.0, 2.0);
  std::vector<std::unique_ptr<Client>> silent;
  for (int i = 0; i < 80; ++i) silent.push_back(std::make_unique<Client>(PortOf(*ranks[1].dog)));
  for (int i = 0; i < 80; ++i) silent.push_back(std::make_unique<Client>(PortOf(*ranks[0].dog)));
  const auto start = Clock::now();
  Response group = Allreduce("t");
  auto watch = ranks[0].dog->Watch(&group);
  ASSERT_EQ(ranks[0].future.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  const std::string report = ranks[0].future.get();
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 1.0 + 2.0 + 1.5)
      << report;
  EXPECT_NE(report.find("rank 1 (" + HostName() + ") answered: not in a collective"),
            std::string::npos)
      << report;
  EXPECT_GE(ranks[1].dog->refused(), 16u);  // dropped: evicted or timed out
}

}  // namespace
}  // namespace hvd
