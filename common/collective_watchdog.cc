// horovod_cpp — Apache-2.0
#include "common/collective_watchdog.h"

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
#include <map>
#include <random>
#include <sstream>

#include "base/types.h"
#include "common/wire.h"

namespace hvd {
namespace {

constexpr size_t kMaxText = 4096;      // longest host name, address or answer accepted
constexpr size_t kRequestBytes = 12;   // token (8) + asking rank (4)
constexpr size_t kMaxListed = 16;      // ranks listed one by one in a report

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
  std::random_device random;
  const uint64_t token = (uint64_t{random()} << 32) ^ random() ^
                         static_cast<uint64_t>(
                             std::chrono::steady_clock::now().time_since_epoch().count());
  wire::Writer w;
  w.I64(static_cast<int64_t>(token));
  w.U32(static_cast<uint32_t>(endpoints.size()));
  for (const std::vector<uint8_t>& e : endpoints) w.Str(std::string(e.begin(), e.end()));
  return std::move(w.bytes());
}

Status CollectiveWatchdog::SetTable(const std::vector<uint8_t>& table) {
  wire::Reader r(table.data(), table.size());
  int64_t token = 0;
  uint32_t count = 0;
  HVD_RETURN_IF_ERROR(r.I64(&token, "watchdog token"));
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
  peers_ = std::move(peers);
  token_.store(static_cast<uint64_t>(token));
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
  while (!stop_.load()) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(kTick.count())) > 0) {
      const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd >= 0) {
        Serve(fd);
        ::close(fd);
      }
    }
    if (fired_) continue;
    double waited = 0;
    {
      MutexLock lock(mu_);
      if (!watching_) continue;
      const auto elapsed = std::chrono::steady_clock::now() - since_;
      if (elapsed <= timeout) continue;
      waited = Seconds(elapsed);
    }
    fired_ = true;
    // Reported from another thread: this one goes on answering the other ranks' probes.
    reporter_ = std::thread([this, waited] { options_.on_timeout(Report(waited)); });
  }
}

void CollectiveWatchdog::Serve(int fd) {
  uint8_t request[kRequestBytes];
  size_t got = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(500);
  while (got < kRequestBytes) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    pollfd p{fd, POLLIN, 0};
    if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0) return;
    const ssize_t n = ::recv(fd, request + got, kRequestBytes - got, 0);
    if (n <= 0) return;
    got += static_cast<size_t>(n);
  }
  uint64_t token = 0;
  std::memcpy(&token, request, sizeof token);
  if (token != token_.load() || token == 0) return;  // not one of this job's ranks
  wire::Writer body;
  body.I32(options_.rank);
  body.Str(Activity().substr(0, kMaxText));
  wire::Writer framed;
  framed.U32(static_cast<uint32_t>(body.bytes().size()));
  std::vector<uint8_t> out = std::move(framed.bytes());
  out.insert(out.end(), body.bytes().begin(), body.bytes().end());
  SendAll(fd, out);
}

std::vector<std::string> CollectiveWatchdog::Probe() {
  struct Conn {
    int fd;
    int rank;
    bool sent = false;
    std::vector<uint8_t> in;
  };
  std::vector<std::string> answers(peers_.size());
  std::vector<Conn> conns;
  uint8_t request[kRequestBytes];
  const uint64_t token = token_.load();
  const int32_t me = options_.rank;
  std::memcpy(request, &token, sizeof token);
  std::memcpy(request + sizeof token, &me, sizeof me);
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
      conns.push_back(Conn{fd, r, false, {}});
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
      fds.push_back(pollfd{c.fd, static_cast<short>(c.sent ? POLLIN : POLLOUT), 0});
      owners.push_back(&c);
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (fds.empty() || left.count() <= 0) break;
    if (::poll(fds.data(), fds.size(), static_cast<int>(left.count())) <= 0) continue;
    for (size_t i = 0; i < fds.size(); ++i) {
      Conn& c = *owners[i];
      if (fds[i].revents == 0) continue;
      if (!c.sent) {
        int error = 0;
        socklen_t len = sizeof error;
        ::getsockopt(c.fd, SOL_SOCKET, SO_ERROR, &error, &len);
        if (error != 0 || (fds[i].revents & (POLLERR | POLLHUP))) {
          drop(c);
          continue;
        }
        SendAll(c.fd, std::vector<uint8_t>(request, request + kRequestBytes));
        c.sent = true;
        continue;
      }
      uint8_t buf[1024];
      const ssize_t n = ::recv(c.fd, buf, sizeof buf, 0);
      if (n <= 0) {
        drop(c);
        continue;
      }
      c.in.insert(c.in.end(), buf, buf + n);
      if (c.in.size() > kMaxText * 2) {
        drop(c);
        continue;
      }
      uint32_t size = 0;
      if (c.in.size() < 4) continue;
      std::memcpy(&size, c.in.data(), 4);
      if (c.in.size() < 4 + size) continue;
      wire::Reader r(c.in.data() + 4, size);
      int32_t rank = -1;
      std::string activity;
      if (r.I32(&rank, "rank").ok() && rank == c.rank &&
          r.Str(&activity, kMaxText, "activity").ok()) {
        answers[static_cast<size_t>(c.rank)] = activity.empty() ? "answered" : activity;
      }
      drop(c);
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
