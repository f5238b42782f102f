// horovod_cpp — Apache-2.0
#pragma once
// The client of the launcher's rendezvous store (horovod_cpp/runner/rendezvous.py): a small
// key-value service over TCP that ranks of the Gloo backend meet through. Only processes that
// hold the job's secret may use it: the server sends a random nonce, the client answers with
// HMAC-SHA256(secret, nonce), and the server closes the connection on a wrong answer.
//
// Wire format (big-endian lengths):
//   server hello:  "HVDS" nonce[16]            client: hmac[32]    server: 1 (accepted)
//   set:  'S' u32 keylen key u32 vallen val   ->  1
//   get:  'G' u32 keylen key                  ->  0 (absent) | 1 u32 vallen val
// Not thread-safe: the Gloo backend uses it from its background thread only.

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"

namespace hvd {
namespace ops {

class RendezvousClient {
 public:
  RendezvousClient(std::string host, int port, std::string secret);
  ~RendezvousClient();
  RendezvousClient(const RendezvousClient&) = delete;
  RendezvousClient& operator=(const RendezvousClient&) = delete;

  Status Set(const std::string& key, const std::vector<char>& value);
  // The value of `key`, waiting (polling with backoff) until some rank has set it or `timeout`
  // passes (DeadlineExceeded, naming the key).
  Result<std::vector<char>> Get(const std::string& key, std::chrono::milliseconds timeout);
  // Whether `key` is set now; its value in *value when it is.
  Result<bool> TryGet(const std::string& key, std::vector<char>* value);

  std::string Where() const { return host_ + ":" + std::to_string(port_); }

 private:
  Status Connect();
  Status ConnectOnce(bool* before_hello);
  Status SendAll(const void* data, size_t n);
  Status RecvAll(void* data, size_t n);
  void Close();

  std::string host_;
  int port_;
  std::string secret_;
  int fd_ = -1;
};

}  // namespace ops
}  // namespace hvd
