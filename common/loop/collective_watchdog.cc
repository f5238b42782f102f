// horovod_cpp — Apache-2.0
#include "common/loop/collective_watchdog.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <array>
#include <map>
#include <random>
#include <sstream>

#include "base/types.h"
#include "common/protocol/wire.h"

namespace hvd {
namespace {

constexpr size_t kMaxText = 4096;      // longest host name, address or answer accepted
constexpr size_t kRequestBytes = 12;   // asking rank (4) + tag (8)
constexpr size_t kMaxListed = 16;      // ranks listed one by one in a report
constexpr size_t kMaxIncoming = 64;    // questions being read at once; more are refused
constexpr auto kServeTime = std::chrono::milliseconds(500);  // to ask, once connected

// SipHash-2-4 (Aumasson and Bernstein): a keyed MAC, here over the connection's nonce, so a
// recorded question or answer is worth nothing on another connection.
uint64_t Rotl(uint64_t x, int b) { return (x << b) | (x >> (64 - b)); }
uint64_t Load64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
uint64_t SipHash(const std::array<uint8_t, CollectiveWatchdog::kKeyBytes>& key,
                 const std::vector<uint8_t>& in) {
  const uint64_t k0 = Load64(key.data()), k1 = Load64(key.data() + 8);
  uint64_t v0 = 0x736f6d6570736575ULL ^ k0, v1 = 0x646f72616e646f6dULL ^ k1;
  uint64_t v2 = 0x6c7967656e657261ULL ^ k0, v3 = 0x7465646279746573ULL ^ k1;
  auto round = [&] {
    v0 += v1; v1 = Rotl(v1, 13); v1 ^= v0; v0 = Rotl(v0, 32);
    v2 += v3; v3 = Rotl(v3, 16); v3 ^= v2;
    v0 += v3; v3 = Rotl(v3, 21); v3 ^= v0;
    v2 += v1; v1 = Rotl(v1, 17); v1 ^= v2; v2 = Rotl(v2, 32);
  };
  const size_t n = in.size(), whole = n / 8 * 8;
  for (size_t i = 0; i < whole; i += 8) {
    const uint64_t m = Load64(in.data() + i);
    v3 ^= m;
    round();
    round();
    v0 ^= m;
  }
  uint64_t last = static_cast<uint64_t>(n & 0xff) << 56;
  for (size_t i = whole; i < n; ++i) last |= static_cast<uint64_t>(in[i]) << (8 * (i - whole));
  v3 ^= last;
  round();
  round();
  v0 ^= last;
  v2 ^= 0xff;
  for (int i = 0; i < 4; ++i) round();
  return v0 ^ v1 ^ v2 ^ v3;
}

// The tag of a question ('Q': nonce, asking rank) or an answer ('A': nonce, body).
uint64_t Tag(const std::array<uint8_t, CollectiveWatchdog::kKeyBytes>& key, char kind,
             const uint8_t* nonce, const uint8_t* data, size_t size) {
  std::vector<uint8_t> in{static_cast<uint8_t>(kind)};
  in.insert(in.end(), nonce, nonce + CollectiveWatchdog::kNonceBytes);
  in.insert(in.end(), data, data + size);
  return SipHash(key, in);
}

double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

std::string Int(double v) { return std::to_string(static_cast<long long>(std::llround(v))); }

// Sends all of `bytes` on a socket that has room for them (a few hundred bytes, fresh socket).
void SendAll(int fd, const std::vector<uint8_t>& bytes) {
  size_t at = 0;
  while (at < bytes.size()) {
    const ssize_t n = ::send(fd, bytes.data() + at, bytes.size() - at, MSG_NOSIGNAL);
    if (n <= 0) return;
    at += static_cast<size_t>(n);
  }
}

std::string LowerOpName(OpType type) {
  std::string op = OpTypeName(type);
  std::transform(op.begin(), op.end(), op.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return op;
}

}  // namespace

std::string DescribeGroup(const Response* group) {
  if (group == nullptr) return "a negotiation round (the control collective of every cycle)";
  std::string out = LowerOpName(group->type);
  const size_t n = group->tensor_names.size();
  for (size_t i = 0; i < std::min<size_t>(n, 3); ++i) {
    out += (i == 0 ? " of '" : ", '") + group->tensor_names[i] + "'";
  }
  if (n > 3) out += " (+" + std::to_string(n - 3) + " more)";
  out += " on process set " + std::to_string(group->process_set_id);
  return out;
}

Result<std::unique_ptr<CollectiveWatchdog>> CollectiveWatchdog::Create(Options options) {
  std::unique_ptr<CollectiveWatchdog> dog(new CollectiveWatchdog(std::move(options)));
  dog->listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (dog->listen_fd_ < 0) {
    return Status::Unavailable(std::string("collective timeout: socket: ") + std::strerror(errno));
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t len = sizeof addr;
  if (::bind(dog->listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::listen(dog->listen_fd_, 128) != 0 ||
      ::getsockname(dog->listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    return Status::Unavailable(std::string("collective timeout: cannot listen for the other "
                                           "ranks' questions: ") + std::strerror(errno));
  }
  dog->port_ = ntohs(addr.sin_port);
  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  dog->host_ = host;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) == 0) {
    for (ifaddrs* i = list; i; i = i->ifa_next) {
      if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP) ||
          (i->ifa_flags & IFF_LOOPBACK)) {
        continue;
      }
      char text[INET_ADDRSTRLEN];
      const auto* in = reinterpret_cast<const sockaddr_in*>(i->ifa_addr);
      if (::inet_ntop(AF_INET, &in->sin_addr, text, sizeof text)) dog->addresses_.push_back(text);
    }
    ::freeifaddrs(list);
  }
  dog->thread_ = std::thread(&CollectiveWatchdog::Run, dog.get());
  return dog;
}

CollectiveWatchdog::~CollectiveWatchdog() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
  if (reporter_.joinable()) reporter_.join();
  if (listen_fd_ >= 0) ::close(listen_fd_);
}

std::vector<uint8_t> CollectiveWatchdog::Endpoint() const {
  wire::Writer w;
  w.Str(host_);
  w.U32(static_cast<uint32_t>(addresses_.size()));
  for (const std::string& a : addresses_) w.Str(a);
  w.U16(port_);
  return std::move(w.bytes());
}

std::vector<uint8_t> CollectiveWatchdog::MakeTable(
    const std::vector<std::vector<uint8_t>>& endpoints) {
  std::random_device random;  // the kernel's random source
  wire::Writer w;
  for (size_t i = 0; i < kKeyBytes; ++i) w.U8(static_cast<uint8_t>(random()));
  w.U32(static_cast<uint32_t>(endpoints.size()));
  for (const std::vector<uint8_t>& e : endpoints) w.Str(std::string(e.begin(), e.end()));
  return std::move(w.bytes());
}

Status CollectiveWatchdog::SetTable(const std::vector<uint8_t>& table) {
  wire::Reader r(table.data(), table.size());
  std::array<uint8_t, kKeyBytes> key{};
  uint32_t count = 0;
  for (uint8_t& b : key) HVD_RETURN_IF_ERROR(r.U8(&b, "watchdog key"));
  HVD_RETURN_IF_ERROR(r.Count(&count, 4, "watchdog endpoints"));
  std::vector<Peer> peers(count);
  for (Peer& p : peers) {
    std::string bytes;
    HVD_RETURN_IF_ERROR(r.Str(&bytes, 1 << 20, "watchdog endpoint"));
    if (bytes.empty()) {  // that rank could not listen: it never answers
      p.host = "unknown host";
      continue;
    }
    wire::Reader e(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    uint32_t n = 0;
    HVD_RETURN_IF_ERROR(e.Str(&p.host, kMaxText, "host name"));
    HVD_RETURN_IF_ERROR(e.Count(&n, 4, "addresses"));
    p.addresses.resize(n);
    for (std::string& a : p.addresses) HVD_RETURN_IF_ERROR(e.Str(&a, kMaxText, "address"));
    HVD_RETURN_IF_ERROR(e.U16(&p.port, "port"));
  }
  if (options_.rank < 0 || options_.rank >= static_cast<int>(peers.size())) {
    return Status::InvalidArgument("collective timeout: rank outside the endpoint table");
  }
  if (keyed_.load(std::memory_order_acquire)) {
    return Status::FailedPrecondition("collective timeout: the endpoint table is set once");
  }
  peers_ = std::move(peers);
  key_ = key;
  keyed_.store(true, std::memory_order_release);
  return Status::OK();
}

CollectiveWatchdog::Scope CollectiveWatchdog::Watch(const Response* group) {
  MutexLock lock(mu_);
  watching_ = true;
  group_ = group;
  since_ = std::chrono::steady_clock::now();
  ++serial_;
  return Scope(this);
}

void CollectiveWatchdog::End() {
  MutexLock lock(mu_);
  watching_ = false;
  group_ = nullptr;
}

std::string CollectiveWatchdog::BlockedOn() const {
  if (!options_.pending) return "";
  const std::vector<Request> pending = options_.pending();
  std::ostringstream out;
  for (size_t i = 0; i < std::min<size_t>(pending.size(), 3); ++i) {
    out << (i ? ", " : "") << LowerOpName(pending[i].type) << " '" << pending[i].tensor_name
        << "' on process set " << pending[i].process_set_id;
    if (!pending[i].call_site.empty()) out << " called at " << pending[i].call_site;
  }
  if (pending.size() > 3) out << " (+" << pending.size() - 3 << " more)";
  return out.str();
}

std::string CollectiveWatchdog::Activity() {
  const std::string waits = BlockedOn();  // the queue's lock, never under mu_
  MutexLock lock(mu_);
  std::string activity = ActivityLocked();
  if (!waits.empty()) activity += "; waits for " + waits;
  return activity;
}

std::string CollectiveWatchdog::ActivityLocked() {
  if (!watching_) return "not in a collective";
  return "waiting " + Int(Seconds(std::chrono::steady_clock::now() - since_)) + " s in " +
         DescribeGroup(group_);
}

void CollectiveWatchdog::Run() {
  const auto timeout = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(options_.timeout_seconds));
  // Questions being read: every connection gets a fresh nonce at once and kServeTime to ask,
  // all served together, so a client that connects and says nothing (or hundreds of them)
  // delays neither the other ranks' questions nor this rank's own timeout.
  std::vector<Incoming> incoming;
  while (!stop_.load()) {
    std::vector<pollfd> fds{pollfd{listen_fd_, POLLIN, 0}};
    for (const Incoming& c : incoming) fds.push_back(pollfd{c.fd, POLLIN, 0});
    if (::poll(fds.data(), fds.size(), static_cast<int>(kTick.count())) > 0) {
      for (size_t i = 1; i < fds.size(); ++i) {
        if (fds[i].revents != 0) Read(incoming[i - 1]);
      }
      if (fds[0].revents & POLLIN) Accept(&incoming);
    }
    const auto now = std::chrono::steady_clock::now();
    for (Incoming& c : incoming) {
      if (c.fd >= 0 && now > c.deadline) {
        ::close(c.fd);
        c.fd = -1;
        refused_.fetch_add(1);
      }
    }
    incoming.erase(std::remove_if(incoming.begin(), incoming.end(),
                                  [](const Incoming& c) { return c.fd < 0; }),
                   incoming.end());
    if (fired_) continue;
    double waited = 0;
    {
      MutexLock lock(mu_);
      if (!watching_) continue;
      const auto elapsed = now - since_;
      if (elapsed <= timeout) continue;
      waited = Seconds(elapsed);
    }
    fired_ = true;
    // Reported from another thread: this one goes on answering the other ranks' probes.
    reporter_ = std::thread([this, waited] { options_.on_timeout(Report(waited)); });
  }
  for (Incoming& c : incoming) ::close(c.fd);
}

void CollectiveWatchdog::Accept(std::vector<Incoming>* incoming) {
  std::random_device random;
  while (true) {
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;
    if (incoming->size() >= kMaxIncoming) {
      // A flood: the oldest connection goes (a rank asks as soon as it has the nonce, within
      // milliseconds; what has said nothing for longest is the least likely to be one).
      auto oldest = std::min_element(
          incoming->begin(), incoming->end(),
          [](const Incoming& a, const Incoming& b) { return a.deadline < b.deadline; });
      ::close(oldest->fd);
      incoming->erase(oldest);
      refused_.fetch_add(1);
    }
    Incoming c;
    c.fd = fd;
    for (uint8_t& b : c.nonce) b = static_cast<uint8_t>(random());
    c.deadline = std::chrono::steady_clock::now() + kServeTime;
    SendAll(fd, std::vector<uint8_t>(c.nonce.begin(), c.nonce.end()));
    incoming->push_back(std::move(c));
  }
}

std::vector<uint8_t> CollectiveWatchdog::Question(const std::array<uint8_t, kKeyBytes>& key,
                                                  const uint8_t* nonce, int32_t rank) {
  std::vector<uint8_t> q(4);  // rank, then Tag('Q', nonce, rank); host byte order
  std::memcpy(q.data(), &rank, 4);
  const uint64_t tag = Tag(key, 'Q', nonce, q.data(), 4);
  const auto* t = reinterpret_cast<const uint8_t*>(&tag);
  q.insert(q.end(), t, t + sizeof tag);
  return q;
}

CollectiveWatchdog::AnswerStatus CollectiveWatchdog::ParseAnswer(
    const std::array<uint8_t, kKeyBytes>& key, const uint8_t* nonce,
    const std::vector<uint8_t>& in, int rank) {
  AnswerStatus a;
  if (in.size() > kMaxText * 2 + 12) {  // longer than any answer: not one
    a.complete = true;
    return a;
  }
  uint32_t size = 0;
  if (in.size() < 4) return a;
  std::memcpy(&size, in.data(), 4);
  if (size > kMaxText * 2) {
    a.complete = true;
    return a;
  }
  if (in.size() < 4 + size + sizeof(uint64_t)) return a;
  a.complete = true;
  uint64_t tag = 0;
  std::memcpy(&tag, in.data() + 4 + size, sizeof tag);
  if (tag != Tag(key, 'A', nonce, in.data() + 4, size)) return a;
  wire::Reader r(in.data() + 4, size);
  int32_t from = -1;
  a.valid = r.I32(&from, "rank").ok() && from == rank &&
            r.Str(&a.activity, kMaxText, "activity").ok();
  return a;
}

void CollectiveWatchdog::Read(Incoming& c) {
  uint8_t buf[kRequestBytes];
  const ssize_t n = ::recv(c.fd, buf, kRequestBytes - c.in.size(), 0);
  if (n <= 0) {
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    ::close(c.fd);
    c.fd = -1;
    return;
  }
  c.in.insert(c.in.end(), buf, buf + n);
  if (c.in.size() < kRequestBytes) return;
  int32_t asking = 0;
  std::memcpy(&asking, c.in.data(), 4);
  const bool ours = keyed_.load(std::memory_order_acquire) &&
                    c.in == Question(key_, c.nonce.data(), asking);
  if (ours) {
    wire::Writer body;
    body.I32(options_.rank);
    body.Str(Activity().substr(0, kMaxText));
    const std::vector<uint8_t>& b = body.bytes();
    wire::Writer framed;
    framed.U32(static_cast<uint32_t>(b.size()));
    std::vector<uint8_t> out = std::move(framed.bytes());
    out.insert(out.end(), b.begin(), b.end());
    const uint64_t answer = Tag(key_, 'A', c.nonce.data(), b.data(), b.size());
    const auto* t = reinterpret_cast<const uint8_t*>(&answer);
    out.insert(out.end(), t, t + sizeof answer);
    SendAll(c.fd, out);
  } else {
    refused_.fetch_add(1);  // not one of this job's ranks (no key, or a replayed question)
  }
  ::close(c.fd);
  c.fd = -1;
}

std::vector<std::string> CollectiveWatchdog::Probe() {
  // Per connection: connect, read the answering rank's nonce, ask (this rank, Tag('Q')),
  // read the answer and check its Tag('A') over the same nonce.
  enum Stage { kConnecting, kNonce, kAnswer };
  struct Conn {
    int fd;
    int rank;
    Stage stage = kConnecting;
    std::vector<uint8_t> in;
    std::vector<uint8_t> nonce;
  };
  std::vector<std::string> answers(peers_.size());
  std::vector<Conn> conns;
  const int32_t me = options_.rank;
  for (int r = 0; r < static_cast<int>(peers_.size()); ++r) {
    if (r == me) continue;
    const Peer& peer = peers_[static_cast<size_t>(r)];
    std::vector<std::string> candidates = peer.addresses;
    if (peer.host == host_ || candidates.empty()) candidates.insert(candidates.begin(), "127.0.0.1");
    for (const std::string& a : candidates) {
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_port = htons(peer.port);
      if (::inet_pton(AF_INET, a.c_str(), &addr.sin_addr) != 1) continue;
      const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
      if (fd < 0) continue;
      if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 &&
          errno != EINPROGRESS) {
        ::close(fd);
        continue;
      }
      conns.push_back(Conn{fd, r, kConnecting, {}, {}});
    }
  }
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(options_.probe_seconds));
  auto drop = [](Conn& c) {
    if (c.fd >= 0) ::close(c.fd);
    c.fd = -1;
  };
  while (true) {
    std::vector<pollfd> fds;
    std::vector<Conn*> owners;
    for (Conn& c : conns) {
      if (c.fd < 0) continue;
      if (!answers[static_cast<size_t>(c.rank)].empty()) {
        drop(c);
        continue;
      }
      fds.push_back(pollfd{c.fd, static_cast<short>(c.stage == kConnecting ? POLLOUT : POLLIN), 0});
      owners.push_back(&c);
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (fds.empty() || left.count() <= 0) break;
    if (::poll(fds.data(), fds.size(), static_cast<int>(left.count())) <= 0) continue;
    for (size_t i = 0; i < fds.size(); ++i) {
      Conn& c = *owners[i];
      if (fds[i].revents == 0) continue;
      if (c.stage == kConnecting) {
        int error = 0;
        socklen_t len = sizeof error;
        ::getsockopt(c.fd, SOL_SOCKET, SO_ERROR, &error, &len);
        if (error != 0 || (fds[i].revents & (POLLERR | POLLHUP))) {
          drop(c);
          continue;
        }
        c.stage = kNonce;
        continue;
      }
      uint8_t buf[1024];
      const size_t want = c.stage == kNonce ? kNonceBytes - c.in.size() : sizeof buf;
      const ssize_t n = ::recv(c.fd, buf, want, 0);
      if (n <= 0) {
        drop(c);
        continue;
      }
      c.in.insert(c.in.end(), buf, buf + n);
      if (c.stage == kNonce) {
        if (c.in.size() < kNonceBytes) continue;
        c.nonce = std::move(c.in);
        c.in.clear();
        SendAll(c.fd, Question(key_, c.nonce.data(), me));
        c.stage = kAnswer;
        continue;
      }
      const AnswerStatus a = ParseAnswer(key_, c.nonce.data(), c.in, c.rank);
      if (a.complete) {
        if (a.valid) answers[static_cast<size_t>(c.rank)] = a.activity.empty() ? "answered" : a.activity;
        drop(c);
      }
    }
  }
  for (Conn& c : conns) drop(c);
  return answers;
}

std::string CollectiveWatchdog::Report(double waited) {
  std::string what;
  {
    MutexLock lock(mu_);
    what = DescribeGroup(group_);
  }
  std::ostringstream out;
  out << "collective timeout: rank " << options_.rank << " (" << host_ << ") has waited "
      << Int(waited) << " s in " << what
      << ", longer than HOROVOD_COLLECTIVE_TIMEOUT_SECONDS=" << options_.timeout_seconds;
  const std::string waits = BlockedOn();
  if (!waits.empty()) out << "; this rank waits for " << waits;
  const std::vector<std::string> answers = Probe();
  // Ranks that did not answer, by host, in the order their hosts first appear.
  std::vector<std::string> hosts;
  std::map<std::string, std::vector<int>> silent;
  size_t listed = 0;
  std::ostringstream others;
  for (size_t r = 0; r < answers.size(); ++r) {
    if (static_cast<int>(r) == options_.rank) continue;
    if (answers[r].empty()) {
      const std::string& h = peers_[r].host;
      if (!silent.count(h)) hosts.push_back(h);
      silent[h].push_back(static_cast<int>(r));
      continue;
    }
    if (listed++ < kMaxListed) {
      others << "\n  rank " << r << " (" << peers_[r].host << ") answered: " << answers[r];
    }
  }
  if (hosts.empty()) {
    out << ".\n  every other rank answered within " << options_.probe_seconds << " s";
  } else {
    out << ".\n  no answer within " << options_.probe_seconds << " s from ";
    for (size_t i = 0; i < hosts.size(); ++i) {
      const std::vector<int>& ranks = silent[hosts[i]];
      out << (i ? "; " : "") << (ranks.size() == 1 ? "rank " : "ranks ");
      for (size_t j = 0; j < ranks.size(); ++j) out << (j ? ", " : "") << ranks[j];
      out << " on host " << hosts[i];
    }
    out << " (a dead link, or a host that is gone or stopped)";
  }
  out << others.str();
  if (listed > kMaxListed) out << "\n  ... and " << (listed - kMaxListed) << " more ranks";
  return out.str();
}

}  // namespace hvd
