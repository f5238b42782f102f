// horovod_cpp — Apache-2.0
#pragma once
// The coordinator's message table: rank 0 of a process set records every rank's Requests by
// tensor name, and a tensor is ready once every rank of the set has asked for it. Ready
// tensors are validated across ranks (op, dtype, device, reduction, scaling, shape, root) and
// turned into Responses: either the agreed operation, or an ERROR Response whose text names
// the tensor and what each rank sent. The text is built here, once, and broadcast, so every
// rank reports the identical message.
//
// Pure logic: no MPI, no clock of its own (the caller passes time). Owned by the background
// thread of the coordinating rank; not thread-safe.

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/message.h"

namespace hvd {

class Coordinator {
 public:
  using Clock = std::chrono::steady_clock;

  // `set_size` ranks take part (ranks are numbered 0 .. set_size-1 within the set).
  explicit Coordinator(int set_size);

  // Records `rank`'s requests. A request for a name this rank already has pending is a
  // protocol violation and becomes an ERROR response for that name.
  void AddRequests(int rank, const std::vector<Request>& requests, Clock::time_point now);

  // Removes and returns a Response for every tensor that all ranks have requested, in the
  // order the tensors were first seen. Deterministic for a given sequence of AddRequests.
  std::vector<Response> TakeReadyResponses();

  // Tensors some but not all ranks have requested.
  size_t pending_count() const { return table_.size(); }

  // A tensor that has been waiting for the remaining ranks.
  struct Pending {
    std::string name;
    std::vector<int> missing_ranks;
    Clock::time_point first_seen;
  };
  // Pending tensors first seen at or before `cutoff`, in first-seen order.
  std::vector<Pending> PendingSince(Clock::time_point cutoff) const;

 private:
  struct Entry {
    uint64_t seq = 0;  // first-seen order
    Clock::time_point first_seen;
    int count = 0;
    std::vector<Request> by_rank;  // by_rank[r].tensor_name empty until rank r asks
    std::vector<bool> present;
    std::string protocol_error;
  };

  int size_;
  uint64_t next_seq_ = 0;
  std::unordered_map<std::string, Entry> table_;
  std::map<uint64_t, std::string> ready_;  // seq -> name, filled as tensors become ready
};

// Validates one tensor's requests (one per rank, rank order) and builds its Response.
// Exposed for tests.
Response ConstructResponse(const std::vector<Request>& requests_by_rank);

}  // namespace hvd
