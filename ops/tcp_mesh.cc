// horovod_cpp — Apache-2.0
#include "ops/tcp_mesh.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <random>

#include "base/logging.h"

namespace hvd {
namespace ops {
namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kTokenBytes = 16;
constexpr char kHelloMagic[4] = {'H', 'V', 'D', 'M'};
// The hello a connecting rank sends: magic, its rank (u32), the acceptor's token.
constexpr size_t kHelloBytes = sizeof(kHelloMagic) + sizeof(uint32_t) + kTokenBytes;
// A message's header: the call's sequence number and the payload's length.
struct Header {
  uint32_t seq;
  uint32_t zero;
  uint64_t len;
};
constexpr uint64_t kMaxMessage = uint64_t{1} << 40;
// The sequence number of a rank's last message: why it stopped (TcpMesh::Leave).
constexpr uint32_t kLeaveSeq = 0xffffffffu;
constexpr uint64_t kMaxLeaveText = 64 * 1024;

// What a closed or reset connection to a rank means.
constexpr char kGone[] = " (the rank's process ended, or its horovod_cpp stopped)";

std::string Why(int error) {
  std::string why = std::strerror(error);
  if (error == ECONNRESET || error == EPIPE) why += kGone;
  return why;
}

int RemainingMs(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(left.count(), 1 << 30)));
}

std::string Seconds(std::chrono::milliseconds t) {
  const double s = static_cast<double>(t.count()) / 1000.0;
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g s", s);
  return buf;
}

void SetNonBlocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

void SetNoDelay(int fd) {
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

void SetPort(sockaddr_storage* addr, uint16_t port) {
  if (addr->ss_family == AF_INET6) {
    reinterpret_cast<sockaddr_in6*>(addr)->sin6_port = htons(port);
  } else {
    reinterpret_cast<sockaddr_in*>(addr)->sin_port = htons(port);
  }
}

// Reads or writes exactly `n` bytes on a non-blocking socket before `deadline`.
Status IoAll(int fd, char* p, size_t n, bool write, Clock::time_point deadline,
             const std::string& what) {
  while (n > 0) {
    const ssize_t k = write ? ::send(fd, p, n, MSG_NOSIGNAL) : ::recv(fd, p, n, 0);
    if (k > 0) {
      p += k;
      n -= static_cast<size_t>(k);
      continue;
    }
    if (k == 0) return Status::Unavailable(what + ": the connection was closed");
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      return Status::Unavailable(what + ": " + std::strerror(errno));
    }
    pollfd pfd{fd, static_cast<short>(write ? POLLOUT : POLLIN), 0};
    const int rc = ::poll(&pfd, 1, RemainingMs(deadline));
    if (rc == 0) return Status::Unavailable(what + ": timed out");
    if (rc < 0 && errno != EINTR) return Status::Unavailable(what + ": " + std::strerror(errno));
  }
  return Status::OK();
}

}  // namespace

Result<std::unique_ptr<TcpMesh>> TcpMesh::Connect(const sockaddr_storage& addr_in,
                                                  socklen_t len, int rank, int size,
                                                  std::chrono::milliseconds timeout,
                                                  const SetFn& set, const GetFn& get) {
  std::unique_ptr<TcpMesh> mesh(new TcpMesh(rank, size, timeout));
  if (size == 1) return mesh;
  const Clock::time_point deadline = Clock::now() + timeout;

  sockaddr_storage addr = addr_in;
  SetPort(&addr, 0);
  const int listener = ::socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listener < 0) return Status::Unavailable(std::string("control mesh: socket: ") +
                                               std::strerror(errno));
  struct CloseListener {
    int fd;
    ~CloseListener() { ::close(fd); }
  } close_listener{listener};
  if (::bind(listener, reinterpret_cast<const sockaddr*>(&addr), len) != 0 ||
      ::listen(listener, size) != 0 ||
      ::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    return Status::Unavailable(std::string("control mesh: listening: ") + std::strerror(errno));
  }
  SetNonBlocking(listener);

  std::array<char, kTokenBytes> token;
  std::random_device random;
  for (char& c : token) c = static_cast<char>(random());
  std::vector<char> entry(reinterpret_cast<const char*>(&addr),
                          reinterpret_cast<const char*>(&addr) + len);
  entry.insert(entry.end(), token.begin(), token.end());
  HVD_RETURN_IF_ERROR(set(std::to_string(rank), entry));

  // Connect to every lower rank; each answers one byte once it has checked the hello.
  for (int q = 0; q < rank; ++q) {
    const std::string who = "control mesh: rank " + std::to_string(q);
    HVD_ASSIGN_OR_RETURN(std::vector<char> theirs, get(std::to_string(q)));
    if (theirs.size() <= kTokenBytes || theirs.size() - kTokenBytes > sizeof(sockaddr_storage)) {
      return Status::Internal(who + " published an unreadable address");
    }
    sockaddr_storage peer{};
    const socklen_t peer_len = static_cast<socklen_t>(theirs.size() - kTokenBytes);
    std::memcpy(&peer, theirs.data(), peer_len);
    const int fd = ::socket(peer.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return Status::Unavailable(who + ": socket: " + std::strerror(errno));
    mesh->fds_[static_cast<size_t>(q)] = fd;
    SetNonBlocking(fd);
    SetNoDelay(fd);
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&peer), peer_len) != 0) {
      if (errno != EINPROGRESS) return Status::Unavailable(who + ": connect: " +
                                                           std::strerror(errno));
      pollfd pfd{fd, POLLOUT, 0};
      if (::poll(&pfd, 1, RemainingMs(deadline)) != 1) {
        return Status::Unavailable(who + ": connecting timed out");
      }
      int err = 0;
      socklen_t err_len = sizeof(err);
      ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &err_len);
      if (err != 0) return Status::Unavailable(who + ": connect: " + std::strerror(err));
    }
    char hello[kHelloBytes];
    const uint32_t me = static_cast<uint32_t>(rank);
    std::memcpy(hello, kHelloMagic, sizeof(kHelloMagic));
    std::memcpy(hello + sizeof(kHelloMagic), &me, sizeof(me));
    std::memcpy(hello + sizeof(kHelloMagic) + sizeof(me), theirs.data() + peer_len, kTokenBytes);
    HVD_RETURN_IF_ERROR(IoAll(fd, hello, sizeof(hello), true, deadline, who));
    char ack = 0;
    HVD_RETURN_IF_ERROR(IoAll(fd, &ack, 1, false, deadline, who + " (its answer)"));
    if (ack != 1) return Status::Unavailable(who + " refused this rank");
  }

  // Accept every higher rank. Connections in the middle of their hello are polled together,
  // so a stranger that connects and stays silent delays nobody.
  struct Pending {
    int fd;
    std::array<char, kHelloBytes> hello;
    size_t got = 0;
  };
  std::vector<Pending> pending;
  int missing = size - 1 - rank;
  while (missing > 0) {
    std::vector<pollfd> pfds{{listener, POLLIN, 0}};
    for (const Pending& p : pending) pfds.push_back({p.fd, POLLIN, 0});
    const int rc = ::poll(pfds.data(), pfds.size(), RemainingMs(deadline));
    if (rc == 0) {
      for (const Pending& p : pending) ::close(p.fd);
      std::string who;
      for (int r = rank + 1; r < size; ++r) {
        if (mesh->fds_[static_cast<size_t>(r)] < 0) who += " " + std::to_string(r);
      }
      return Status::Unavailable("control mesh: ranks" + who + " did not connect within " +
                                 Seconds(timeout));
    }
    if (rc < 0) continue;  // EINTR
    for (size_t i = pending.size(); i-- > 0;) {
      Pending& p = pending[i];
      if (pfds[i + 1].revents == 0) continue;
      const ssize_t k = ::recv(p.fd, p.hello.data() + p.got, kHelloBytes - p.got, 0);
      if (k < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      bool keep = k > 0;
      if (keep) p.got += static_cast<size_t>(k);
      if (keep && p.got == kHelloBytes) {
        uint32_t who = 0;
        std::memcpy(&who, p.hello.data() + sizeof(kHelloMagic), sizeof(who));
        const bool ok = std::memcmp(p.hello.data(), kHelloMagic, sizeof(kHelloMagic)) == 0 &&
                        std::memcmp(p.hello.data() + sizeof(kHelloMagic) + sizeof(who),
                                    token.data(), kTokenBytes) == 0 &&
                        static_cast<int>(who) > rank && static_cast<int>(who) < size &&
                        mesh->fds_[who] < 0;
        const char ack = 1;
        if (ok && ::send(p.fd, &ack, 1, MSG_NOSIGNAL) == 1) {
          SetNoDelay(p.fd);
          mesh->fds_[who] = p.fd;
          --missing;
        } else {
          HVD_LOG(WARNING) << "control mesh: closed a connection that did not present this "
                              "job's token for a rank still expected";
          ::close(p.fd);
        }
        pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
      } else if (!keep) {
        ::close(p.fd);
        pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
      }
    }
    if (pfds[0].revents != 0) {
      const int fd = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd >= 0) pending.push_back({fd, {}, 0});
    }
  }
  for (const Pending& p : pending) ::close(p.fd);
  return mesh;
}

TcpMesh::~TcpMesh() {
  for (int fd : fds_) {
    if (fd >= 0) ::close(fd);
  }
}

Status TcpMesh::Fail(Status s) {
  broken_ = s;
  Leave(s.message());
  return s;
}

void TcpMesh::Leave(const std::string& why) {
  if (left_) return;
  left_ = true;
  const std::string text = why.substr(0, kMaxLeaveText);
  Header header{kLeaveSeq, 0, text.size()};
  for (size_t r = 0; r < fds_.size(); ++r) {
    if (fds_[r] < 0 || partial_[r]) continue;  // mid-message: the peer could not read it
    iovec iov[2] = {{&header, sizeof(header)}, {const_cast<char*>(text.data()), text.size()}};
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = 2;
    // Best effort, never waiting: a peer that is gone or not reading misses it.
    (void)::sendmsg(fds_[r], &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
  }
}

Status TcpMesh::Transfer(const std::vector<Out>& out, const std::vector<In>& in,
                         const char* what) {
  if (!broken_.ok()) return broken_;
  seq_ = seq_ + 1 == kLeaveSeq ? 1 : seq_ + 1;  // equal on every rank; never a leave's number
  const uint32_t seq = seq_;
  const size_t n = static_cast<size_t>(size_);
  struct Sending {
    Header header;
    size_t done = 0;  // bytes of header + payload written
  };
  struct Receiving {
    Header header;
    size_t done = 0;  // bytes of header + payload read
    std::string leave;  // a leave message's text
  };
  std::vector<Sending> sending(n);
  std::vector<Receiving> receiving(n);
  for (size_t r = 0; r < n; ++r) {
    if (out[r].set) sending[r].header = {seq, 0, out[r].len};
  }
  const Clock::time_point deadline = Clock::now() + timeout_;
  // Fails the mesh, noting which streams stopped in the middle of a message.
  auto fail = [&](Status s) {
    for (size_t r = 0; r < n; ++r) {
      partial_[r] = out[r].set && sending[r].done > 0 &&
                    sending[r].done < sizeof(Header) + out[r].len;
    }
    return Fail(std::move(s));
  };
  auto failure = [&](size_t r, const std::string& why) {
    return fail(Status::Unavailable(std::string("control mesh ") + what + " with rank " +
                                    std::to_string(r) + " failed: " + why));
  };
  // Writes what the socket takes; true when the message is out.
  auto push = [&](size_t r) -> Result<bool> {
    Sending& s = sending[r];
    const size_t total = sizeof(Header) + out[r].len;
    while (s.done < total) {
      iovec iov[2];
      int count = 0;
      if (s.done < sizeof(Header)) {
        iov[count++] = {reinterpret_cast<char*>(&s.header) + s.done, sizeof(Header) - s.done};
      }
      const size_t payload_done = s.done > sizeof(Header) ? s.done - sizeof(Header) : 0;
      if (out[r].len > payload_done) {
        iov[count++] = {const_cast<char*>(static_cast<const char*>(out[r].data)) + payload_done,
                        out[r].len - payload_done};
      }
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = static_cast<size_t>(count);
      const ssize_t k = ::sendmsg(fds_[r], &msg, MSG_NOSIGNAL);
      if (k < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return false;
        return failure(r, Why(errno));
      }
      s.done += static_cast<size_t>(k);
    }
    return true;
  };
  // Reads what has arrived; true when the message is in.
  auto pull = [&](size_t r) -> Result<bool> {
    Receiving& v = receiving[r];
    while (true) {
      char* p;
      size_t want;
      if (v.done < sizeof(Header)) {
        p = reinterpret_cast<char*>(&v.header) + v.done;
        want = sizeof(Header) - v.done;
      } else {
        const size_t payload_done = v.done - sizeof(Header);
        const bool leaving = v.header.seq == kLeaveSeq;
        if (payload_done == v.header.len) {
          if (!leaving) return true;
          return failure(r, "it stopped after an error: " + v.leave);
        }
        char* base = leaving               ? &v.leave[0]
                     : in[r].fixed != nullptr ? in[r].fixed
                                              : reinterpret_cast<char*>(in[r].vec->data());
        p = base + payload_done;
        want = static_cast<size_t>(v.header.len) - payload_done;
      }
      const ssize_t k = ::recv(fds_[r], p, want, 0);
      if (k == 0) return failure(r, "the connection was closed" + std::string(kGone));
      if (k < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return false;
        return failure(r, Why(errno));
      }
      v.done += static_cast<size_t>(k);
      if (v.done == sizeof(Header)) {
        if (v.header.seq == kLeaveSeq && v.header.zero == 0 && v.header.len <= kMaxLeaveText) {
          v.leave.resize(static_cast<size_t>(v.header.len));
          continue;
        }
        if (v.header.seq != seq || v.header.zero != 0 || v.header.len > kMaxMessage) {
          return failure(r, "out of step (message " + std::to_string(v.header.seq) +
                                " while this rank is at " + std::to_string(seq) + ")");
        }
        if (in[r].fixed != nullptr) {
          if (v.header.len != in[r].fixed_len) {
            return failure(r, "sent " + std::to_string(v.header.len) + " bytes where " +
                                  std::to_string(in[r].fixed_len) + " were expected");
          }
        } else {
          in[r].vec->resize(static_cast<size_t>(v.header.len));
        }
      }
    }
  };

  std::vector<bool> out_done(n, true), in_done(n, true);
  for (size_t r = 0; r < n; ++r) {
    if (out[r].set) {
      HVD_ASSIGN_OR_RETURN(out_done[r], push(r));
    }
    in_done[r] = !in[r].set;
  }
  std::vector<pollfd> pfds;
  std::vector<size_t> peer;
  while (true) {
    pfds.clear();
    peer.clear();
    for (size_t r = 0; r < n; ++r) {
      const short events = static_cast<short>((out_done[r] ? 0 : POLLOUT) |
                                              (in_done[r] ? 0 : POLLIN));
      if (events == 0) continue;
      pfds.push_back({fds_[r], events, 0});
      peer.push_back(r);
    }
    if (pfds.empty()) return Status::OK();  // every message out and in
    const int rc = ::poll(pfds.data(), pfds.size(), RemainingMs(deadline));
    if (rc < 0) {
      if (errno == EINTR) continue;
      return fail(Status::Unavailable(std::string("control mesh ") + what + ": poll: " +
                                      std::strerror(errno)));
    }
    if (rc == 0) {
      std::string who;
      for (size_t r = 0; r < n; ++r) {
        if (!out_done[r] || !in_done[r]) who += " " + std::to_string(r);
      }
      return fail(Status::Unavailable(std::string("control mesh ") + what +
                                      ": no progress with ranks" + who + " within " +
                                      Seconds(timeout_) + " (HOROVOD_GLOO_TIMEOUT_SECONDS)"));
    }
    for (size_t i = 0; i < pfds.size(); ++i) {
      if (pfds[i].revents == 0) continue;
      const size_t r = peer[i];
      if (!in_done[r]) {
        HVD_ASSIGN_OR_RETURN(in_done[r], pull(r));
      }
      if (!out_done[r]) {
        HVD_ASSIGN_OR_RETURN(out_done[r], push(r));
      }
    }
  }
}

Status TcpMesh::Allgather(const void* mine, size_t bytes, char* out, const char* what) {
  const size_t n = static_cast<size_t>(size_);
  std::vector<size_t> lens(n, bytes), at(n);
  for (size_t r = 0; r < n; ++r) at[r] = r * bytes;
  return AllgatherInto(mine, lens, at, out, what);
}

Status TcpMesh::AllgatherInto(const void* mine, const std::vector<size_t>& lens,
                              const std::vector<size_t>& at, char* out, const char* what) {
  const size_t n = static_cast<size_t>(size_);
  const size_t me = static_cast<size_t>(rank_);
  std::vector<Out> outs(n);
  std::vector<In> ins(n);
  for (size_t r = 0; r < n; ++r) {
    if (r == me) continue;
    outs[r] = {mine, lens[me], true};
    ins[r].fixed = out + at[r];
    ins[r].fixed_len = lens[r];
    ins[r].set = true;
  }
  if (lens[me] > 0 && out + at[me] != mine) std::memcpy(out + at[me], mine, lens[me]);
  return Transfer(outs, ins, what);
}

Status TcpMesh::AllgatherV(const std::vector<uint8_t>& mine,
                           std::vector<std::vector<uint8_t>>* all, const char* what) {
  const size_t n = static_cast<size_t>(size_);
  all->assign(n, {});
  std::vector<Out> outs(n);
  std::vector<In> ins(n);
  for (size_t r = 0; r < n; ++r) {
    if (static_cast<int>(r) == rank_) continue;
    outs[r] = {mine.data(), mine.size(), true};
    ins[r].vec = &(*all)[r];
    ins[r].set = true;
  }
  (*all)[static_cast<size_t>(rank_)] = mine;
  return Transfer(outs, ins, what);
}

Status TcpMesh::Gather(const std::vector<uint8_t>& mine, int root,
                       std::vector<std::vector<uint8_t>>* at_root, const char* what) {
  const size_t n = static_cast<size_t>(size_);
  std::vector<Out> outs(n);
  std::vector<In> ins(n);
  if (rank_ == root) {
    at_root->assign(n, {});
    (*at_root)[static_cast<size_t>(root)] = mine;
    for (size_t r = 0; r < n; ++r) {
      if (static_cast<int>(r) == root) continue;
      ins[r].vec = &(*at_root)[r];
      ins[r].set = true;
    }
  } else {
    outs[static_cast<size_t>(root)] = {mine.data(), mine.size(), true};
  }
  return Transfer(outs, ins, what);
}

Status TcpMesh::Broadcast(std::vector<uint8_t>* bytes, int root, const char* what) {
  const size_t n = static_cast<size_t>(size_);
  std::vector<Out> outs(n);
  std::vector<In> ins(n);
  if (rank_ == root) {
    for (size_t r = 0; r < n; ++r) {
      if (static_cast<int>(r) != root) outs[r] = {bytes->data(), bytes->size(), true};
    }
  } else {
    ins[static_cast<size_t>(root)].vec = bytes;
    ins[static_cast<size_t>(root)].set = true;
  }
  return Transfer(outs, ins, what);
}

}  // namespace ops
}  // namespace hvd
