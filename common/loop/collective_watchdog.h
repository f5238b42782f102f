// horovod_cpp — Apache-2.0
#pragma once
// The collective timeout (HOROVOD_COLLECTIVE_TIMEOUT_SECONDS): no rank waits for ever in a
// collective that cannot finish. A blocking MPI call over a dead TCP link, or to a host whose
// processes are stopped, can wait for many minutes or for good; the stall inspector cannot
// help, because it runs on the background thread that is blocked.
//
// The background thread marks what it waits in (Watch: a negotiation round, or an agreed
// group it executes). A thread of this class ("hvd-watchdog") looks every kTick; when one
// mark has lasted longer than the timeout, it asks every other rank what it is doing over a
// side channel that does not go through the backend: each rank listens on an ephemeral TCP
// port, and the endpoints (host name, IPv4 addresses, port) and a job key were exchanged at
// Init. Ranks that do not answer within the probe time are named with their hosts (a dead
// link, a lost or stopped host); the others say what they wait in. The report goes to the
// on_timeout callback once (the background loop logs it and ends the job).
//
// The listening thread keeps answering while this rank reports, so ranks that time out
// together name each other correctly. The channel is authenticated: the answering side sends
// a fresh nonce on every connection, the question carries the asking rank and a SipHash-2-4
// tag over (nonce, rank) under the job's 16-byte key (rank 0's table), the answer a tag over
// (nonce, answer). A client without the key, a replayed question (another nonce), a stray
// listener on a reused port: none is answered or believed. Connections are served together,
// each given 500 ms to ask, at most 64 at once: silent or flooding clients delay nothing.

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "base/mutex.h"
#include "base/status.h"
#include "common/protocol/message.h"

namespace hvd {

class CollectiveWatchdog {
 public:
  struct Options {
    double timeout_seconds = 300;
    double probe_seconds = 5;  // how long the other ranks have to answer
    int rank = 0;
    // Called once, on a thread of the watchdog, with the report. It may not return.
    std::function<void(const std::string& report)> on_timeout;
    // Optional, any thread: the requests this rank's threads are blocked on (named in the
    // report when it times out in a negotiation round).
    std::function<std::vector<Request>()> pending;
  };
  static constexpr std::chrono::milliseconds kTick{250};
  static constexpr size_t kKeyBytes = 16;    // the job's key (SipHash-2-4), from rank 0's table
  static constexpr size_t kNonceBytes = 16;  // per connection, from the answering rank

  // Listens on an ephemeral port of every address and starts the thread.
  static Result<std::unique_ptr<CollectiveWatchdog>> Create(Options options);
  ~CollectiveWatchdog();
  CollectiveWatchdog(const CollectiveWatchdog&) = delete;
  CollectiveWatchdog& operator=(const CollectiveWatchdog&) = delete;

  // This rank's host name, IPv4 addresses and port, for the exchange at Init.
  std::vector<uint8_t> Endpoint() const;
  // Rank 0: the table every rank receives (a fresh key and every rank's Endpoint).
  static std::vector<uint8_t> MakeTable(const std::vector<std::vector<uint8_t>>& endpoints);
  // Every rank: adopts the table (before the first Watch).
  Status SetTable(const std::vector<uint8_t>& table);

  // Marks, on the background thread, that it waits in `group` (nullptr: a negotiation round)
  // until the returned scope ends. `group` must outlive the scope.
  class Scope {
   public:
    explicit Scope(CollectiveWatchdog* dog) : dog_(dog) {}
    Scope(Scope&& o) noexcept : dog_(o.dog_) { o.dog_ = nullptr; }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;
    ~Scope() {
      if (dog_) dog_->End();
    }

   private:
    CollectiveWatchdog* dog_;
  };
  Scope Watch(const Response* group);

  // The question a rank sends on a connection whose nonce is `nonce` (rank, SipHash tag).
  static std::vector<uint8_t> Question(const std::array<uint8_t, kKeyBytes>& key,
                                       const uint8_t* nonce, int32_t rank);
  // An answer read so far (`in`) from `rank` on a connection with `nonce`: complete once all
  // of it (or too much) arrived; valid when its tag and rank check out.
  struct AnswerStatus {
    bool complete = false;
    bool valid = false;
    std::string activity;
  };
  static AnswerStatus ParseAnswer(const std::array<uint8_t, kKeyBytes>& key,
                                  const uint8_t* nonce, const std::vector<uint8_t>& in, int rank);

  uint16_t port() const { return port_; }  // where this rank listens for probes

  // Connections refused so far (a foreign or hostile client, a replayed question, a silent
  // one, more at once than kMaxIncoming): for tests.
  uint64_t refused() const { return refused_.load(); }

  // What this rank waits in now, as a probe answers ("waiting 61 s in allreduce of 'w'
  // (process set 0)" or "not in a collective").
  std::string Activity();
  // What the threads blocked on this rank wait for, with their call sites ("" when none).
  std::string BlockedOn() const;

 private:
  struct Peer {
    std::string host;
    std::vector<std::string> addresses;
    uint16_t port = 0;
  };
  // A connection asking this rank (Run's poll loop serves all of them together).
  struct Incoming {
    int fd = -1;
    std::array<uint8_t, kNonceBytes> nonce{};
    std::vector<uint8_t> in;
    std::chrono::steady_clock::time_point deadline;
  };
  explicit CollectiveWatchdog(Options options) : options_(std::move(options)) {}
  void Run();
  void Accept(std::vector<Incoming>* incoming);
  void Read(Incoming& c);
  std::string Report(double waited);
  // rank -> answer ("" for none) of every other rank, within probe_seconds.
  std::vector<std::string> Probe();
  std::string ActivityLocked() HVD_REQUIRES(mu_);
  void End();

  const Options options_;
  int listen_fd_ = -1;
  uint16_t port_ = 0;
  std::string host_;
  std::vector<std::string> addresses_;
  std::array<uint8_t, kKeyBytes> key_{};  // set once by SetTable, before keyed_
  std::atomic<bool> keyed_{false};         // the listening thread reads key_ after this
  std::atomic<uint64_t> refused_{0};       // connections dropped: no key, silent, flooding
  std::vector<Peer> peers_;          // by rank, set before the first Watch

  Mutex mu_;
  bool watching_ HVD_GUARDED_BY(mu_) = false;
  const Response* group_ HVD_GUARDED_BY(mu_) = nullptr;
  std::chrono::steady_clock::time_point since_ HVD_GUARDED_BY(mu_);
  uint64_t serial_ HVD_GUARDED_BY(mu_) = 0;  // one per Watch

  std::atomic<bool> stop_{false};
  bool fired_ = false;  // watchdog thread only
  std::thread thread_;
  std::thread reporter_;
};

// "allreduce of 'a', 'b' (+3 more) on process set 1" (group) or "a negotiation round".
std::string DescribeGroup(const Response* group);

}  // namespace hvd
