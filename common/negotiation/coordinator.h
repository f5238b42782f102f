// horovod_cpp — Apache-2.0
#pragma once
// The coordinator's message table: global rank 0 records every rank's Requests by
// (process set, tensor name). A tensor is ready once every member of its process set has
// asked for it (for the global set, ranks that called Join count as present: they will
// contribute zeros). Ready tensors are validated across ranks and turned into Responses:
// either the agreed operation, or an ERROR Response whose text names the tensor and what
// each rank sent. The text is built here, once, and broadcast, so every rank reports the
// identical message.
//
// Also decided here: JOIN (ready when every rank has joined; carries the last rank to join),
// grouped ops (members are released together once all are ready), agreement on process-set
// additions and removals, and "crossed" process-set mismatches (two ranks of both sets
// submitted the same name to different sets).
//
// Pure logic: no MPI and no clock of its own (the caller passes time). Owned by the background
// thread of global rank 0; not thread-safe.

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/protocol/message.h"

namespace hvd {

class Coordinator {
 public:
  using Clock = std::chrono::steady_clock;
  // Global ranks of a process set (sorted), or empty if the set is unknown.
  using MembersFn = std::function<std::vector<int>(int32_t process_set_id)>;

  explicit Coordinator(MembersFn members);

  // Records `rank`'s requests (`rank` is a global rank).
  void AddRequests(int rank, const std::vector<Request>& requests, Clock::time_point now);

  // Removes and returns a Response for every tensor that is ready, in the order the tensors
  // were first seen (grouped tensors: when the last member is ready, all of them in member
  // order). Deterministic for a given sequence of AddRequests.
  std::vector<Response> TakeReadyResponses();

  // Forgets a removed process set's pending tensors.
  void DropProcessSet(int32_t process_set_id);
  // Forgets every pending tensor (a deadlock failed them on every rank).
  void Clear();

  // Tensors some but not all ranks have requested.
  size_t pending_count() const { return table_.size(); }

  struct Pending {
    TensorKey key;
    std::vector<int> missing_ranks;  // global ranks
    Clock::time_point first_seen;
    std::string submitted_at;  // the submitting ranks' call sites (CallSitesByRank), or ""
  };
  // Pending tensors first seen at or before `cutoff`, in first-seen order.
  std::vector<Pending> PendingSince(Clock::time_point cutoff) const;

  // Ranks (global) that have called Join and are waiting for the others.
  std::vector<int> joined_ranks() const;

 private:
  struct Entry {
    uint64_t seq = 0;  // first-seen order
    Clock::time_point first_seen;
    std::vector<int> members;        // global ranks of the set
    std::map<int, Request> by_rank;  // global rank -> request
    std::string forced_error;        // decided early (duplicate submission, crossed sets)
    bool queued = false;             // already in ready_
  };

  bool IsReady(const TensorKey& key, const Entry& e) const;
  void MarkReadyIfComplete(const TensorKey& key, Entry& e);
  void CheckCrossedSets(const std::string& name);
  Response Build(const TensorKey& key, const Entry& e) const;

  MembersFn members_;
  uint64_t next_seq_ = 0;
  std::map<TensorKey, Entry> table_;
  std::unordered_map<std::string, std::set<int32_t>> sets_by_name_;
  std::map<uint64_t, TensorKey> ready_;  // seq -> key
  // Grouped responses waiting for the rest of their group: (set, group name) -> responses.
  std::map<TensorKey, std::vector<std::pair<uint64_t, Response>>> held_groups_;
  int last_joined_ = -1;
};

// Validates one tensor's requests (one per submitting rank, ascending rank) and builds its
// Response. `joined` lists ranks that called Join instead of submitting. Exposed for tests.
Response ConstructResponse(const std::vector<Request>& requests,
                           const std::vector<int>& joined = {});

}  // namespace hvd
