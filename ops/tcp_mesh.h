// horovod_cpp — Apache-2.0
#pragma once
// The Gloo backend's control plane: a full mesh of TCP connections between the ranks of a job,
// over which the background thread itself sends the negotiation's messages and the global
// set's small collectives.
//
// Why not Gloo: each Gloo message is a rendezvous (the receiver announces its buffer, then the
// sender sends) handled by Gloo's event-loop thread, which hands the result to the waiting
// thread; a 16-float allreduce took ~1 ms at np 2 and ~5 ms at np 4 on 2 cores (MPI: 36 us and
// 0.5 ms), and the loop thread spun in epoll_wait (~0.8 M calls a second) while the pair's lock
// was taken, stealing the core the other ranks needed. Here a message is one write by its
// sender into the socket's buffer and one read by its receiver when poll() says it is there.
//
// Set-up goes through the job's rendezvous store (authenticated with the job's secret): each
// rank listens on its Gloo address, publishes that address with a random token, connects to
// every lower rank and accepts every higher one. A connection opens with the acceptor's token,
// so only a process that could read the store joins; anything else is closed. The listening
// socket is closed once the mesh is complete: no port stays open while the job trains.
//
// Every call is collective over all ranks, in the same order on every rank (the background
// thread is the only caller); each message carries the call's sequence number, so a rank that
// got out of step is an error, not a wrong result. A call waits up to the timeout; a peer
// whose process ended closes its sockets, which fails the call at once; a rank that stops after
// an error first tells its peers why (Leave), so their errors name the cause. After a failure
// every later call fails with the same error: the background loop ends on the first one.

#include <sys/socket.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"

namespace hvd {
namespace ops {

class TcpMesh {
 public:
  using SetFn = std::function<Status(const std::string& key, const std::vector<char>& value)>;
  using GetFn = std::function<Result<std::vector<char>>(const std::string& key)>;

  // Listens on `addr` (any port), publishes "<rank>" through `set`, reads lower ranks' entries
  // through `get` (which waits for a key), and connects the mesh within `timeout`.
  static Result<std::unique_ptr<TcpMesh>> Connect(const sockaddr_storage& addr, socklen_t len,
                                                  int rank, int size,
                                                  std::chrono::milliseconds timeout,
                                                  const SetFn& set, const GetFn& get);
  ~TcpMesh();
  TcpMesh(const TcpMesh&) = delete;
  TcpMesh& operator=(const TcpMesh&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }

  // Every rank's `bytes` at out + r * bytes (this rank's copied from `mine` unless in place).
  Status Allgather(const void* mine, size_t bytes, char* out, const char* what);
  // Rank r's lens[r] bytes at out + at[r] on every rank (every rank knows every length).
  Status AllgatherInto(const void* mine, const std::vector<size_t>& lens,
                       const std::vector<size_t>& at, char* out, const char* what);
  // Every rank's message, of any length, in rank order.
  Status AllgatherV(const std::vector<uint8_t>& mine, std::vector<std::vector<uint8_t>>* all,
                    const char* what);
  // Every rank's message at `root` (empty elsewhere).
  Status Gather(const std::vector<uint8_t>& mine, int root,
                std::vector<std::vector<uint8_t>>* at_root, const char* what);
  // `root`'s message, of any length, into *bytes on every rank.
  Status Broadcast(std::vector<uint8_t>* bytes, int root, const char* what);

  // Tells every peer why this rank stops (once, best effort, without waiting): a peer's next
  // call fails naming this rank and `why`, instead of only seeing the connection close. A
  // failed call does this itself.
  void Leave(const std::string& why);

 private:
  TcpMesh(int rank, int size, std::chrono::milliseconds timeout)
      : rank_(rank),
        size_(size),
        timeout_(timeout),
        fds_(static_cast<size_t>(size), -1),
        partial_(static_cast<size_t>(size), false) {}

  // One message out to each rank r where out[r] is set, one in from each rank r where in[r] is
  // set (into the vector, or into `fixed` when a length is required), all at once.
  struct Out {
    const void* data = nullptr;
    size_t len = 0;
    bool set = false;
  };
  struct In {
    std::vector<uint8_t>* vec = nullptr;
    char* fixed = nullptr;
    size_t fixed_len = 0;
    bool set = false;
  };
  Status Transfer(const std::vector<Out>& out, const std::vector<In>& in, const char* what);
  Status Fail(Status s);

  int rank_;
  int size_;
  std::chrono::milliseconds timeout_;
  std::vector<int> fds_;       // fds_[r]: the connection to rank r (-1 for this rank)
  std::vector<bool> partial_;  // a failed call stopped in the middle of a message to rank r
  uint32_t seq_ = 0;
  Status broken_;
  bool left_ = false;
};

}  // namespace ops
}  // namespace hvd
