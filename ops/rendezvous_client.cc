// horovod_cpp — Apache-2.0
#include "ops/rendezvous_client.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

namespace hvd {
namespace ops {
namespace {

constexpr char kHello[4] = {'H', 'V', 'D', 'S'};
constexpr size_t kNonceSize = 16;
constexpr size_t kMacSize = 32;
// How long connecting may keep being retried while the store sheds a flood of connections.
constexpr int kConnectRetrySeconds = 15;  // the store's 10 s to answer, and some
// How long one connection attempt (and one reply) may take before it counts as failed.
constexpr int kIoTimeoutSeconds = 30;

void PutU32(std::vector<char>* out, uint32_t v) {
  const uint32_t be = htonl(v);
  const char* p = reinterpret_cast<const char*>(&be);
  out->insert(out->end(), p, p + 4);
}

}  // namespace

RendezvousClient::RendezvousClient(std::string host, int port, std::string secret)
    : host_(std::move(host)), port_(port), secret_(std::move(secret)) {}

RendezvousClient::~RendezvousClient() { Close(); }

void RendezvousClient::Close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

Status RendezvousClient::SendAll(const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t k = ::send(fd_, p, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) {
      const std::string why = std::strerror(errno);
      Close();
      return Status::Unavailable("rendezvous store " + Where() + ": send failed: " + why);
    }
    p += k;
    n -= static_cast<size_t>(k);
  }
  return Status::OK();
}

Status RendezvousClient::RecvAll(void* data, size_t n) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t k = ::recv(fd_, p, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) {
      const std::string why = k == 0 ? std::string("the store closed the connection (a wrong "
                                                   "HOROVOD_GLOO_SECRET, or the launcher ended)")
                                     : std::string(std::strerror(errno));
      Close();
      return Status::Unavailable("rendezvous store " + Where() + ": " + why);
    }
    p += k;
    n -= static_cast<size_t>(k);
  }
  return Status::OK();
}

// A store that closes a new connection before its hello is one shedding a flood of other
// clients (job/rendezvous.py closes all but 128 handshakes at once): try again, for up to
// kConnectRetrySeconds. A refusal after the hello (a wrong secret) is final.
Status RendezvousClient::Connect() {
  if (fd_ >= 0) return Status::OK();
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(kConnectRetrySeconds);
  auto pause = std::chrono::milliseconds(10);
  while (true) {
    bool before_hello = false;
    Status s = ConnectOnce(&before_hello);
    if (s.ok() || !before_hello || std::chrono::steady_clock::now() >= deadline) return s;
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(500));
  }
}

Status RendezvousClient::ConnectOnce(bool* before_hello) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(host_.c_str(), std::to_string(port_).c_str(), &hints, &found);
  if (rc != 0) {
    return Status::Unavailable("rendezvous store " + Where() + ": " + gai_strerror(rc));
  }
  std::string last_error = "no address";
  for (addrinfo* a = found; a != nullptr && fd_ < 0; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    timeval tv{kIoTimeoutSeconds, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
      fd_ = fd;
    } else {
      last_error = std::strerror(errno);
      ::close(fd);
    }
  }
  ::freeaddrinfo(found);
  if (fd_ < 0) return Status::Unavailable("rendezvous store " + Where() + ": " + last_error);
  char hello[sizeof(kHello) + kNonceSize];
  if (Status s = RecvAll(hello, sizeof(hello)); !s.ok()) {
    *before_hello = true;
    return s;
  }
  if (std::memcmp(hello, kHello, sizeof(kHello)) != 0) {
    Close();
    return Status::Unavailable("rendezvous store " + Where() +
                               ": not a horovod_cpp rendezvous store");
  }
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int mac_len = 0;
  HMAC(EVP_sha256(), secret_.data(), static_cast<int>(secret_.size()),
       reinterpret_cast<const unsigned char*>(hello + sizeof(kHello)), kNonceSize, mac, &mac_len);
  HVD_RETURN_IF_ERROR(SendAll(mac, kMacSize));
  char accepted = 0;
  HVD_RETURN_IF_ERROR(RecvAll(&accepted, 1));
  if (accepted != 1) {
    Close();
    return Status::Unavailable("rendezvous store " + Where() + " refused this process");
  }
  return Status::OK();
}

Status RendezvousClient::Set(const std::string& key, const std::vector<char>& value) {
  HVD_RETURN_IF_ERROR(Connect());
  std::vector<char> msg{'S'};
  PutU32(&msg, static_cast<uint32_t>(key.size()));
  msg.insert(msg.end(), key.begin(), key.end());
  PutU32(&msg, static_cast<uint32_t>(value.size()));
  msg.insert(msg.end(), value.begin(), value.end());
  HVD_RETURN_IF_ERROR(SendAll(msg.data(), msg.size()));
  char ok = 0;
  HVD_RETURN_IF_ERROR(RecvAll(&ok, 1));
  if (ok != 1) return Status::Unavailable("rendezvous store " + Where() + " did not store " + key);
  return Status::OK();
}

Result<bool> RendezvousClient::TryGet(const std::string& key, std::vector<char>* value) {
  HVD_RETURN_IF_ERROR(Connect());
  std::vector<char> msg{'G'};
  PutU32(&msg, static_cast<uint32_t>(key.size()));
  msg.insert(msg.end(), key.begin(), key.end());
  HVD_RETURN_IF_ERROR(SendAll(msg.data(), msg.size()));
  char found = 0;
  HVD_RETURN_IF_ERROR(RecvAll(&found, 1));
  if (found != 1) return false;
  uint32_t be = 0;
  HVD_RETURN_IF_ERROR(RecvAll(&be, 4));
  value->resize(ntohl(be));
  HVD_RETURN_IF_ERROR(RecvAll(value->data(), value->size()));
  return true;
}

Result<std::vector<char>> RendezvousClient::Get(const std::string& key,
                                                std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto sleep = std::chrono::milliseconds(1);
  std::vector<char> value;
  while (true) {
    HVD_ASSIGN_OR_RETURN(bool found, TryGet(key, &value));
    if (found) return value;
    if (std::chrono::steady_clock::now() >= deadline) {
      return Status::DeadlineExceeded("rendezvous store " + Where() + ": '" + key +
                                      "' was not set within " +
                                      std::to_string(timeout.count() / 1000) +
                                      " s (a rank that never started, or started late)");
    }
    std::this_thread::sleep_for(sleep);
    sleep = std::min(sleep * 2, std::chrono::milliseconds(100));
  }
}

}  // namespace ops
}  // namespace hvd
