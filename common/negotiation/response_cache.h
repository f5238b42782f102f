// horovod_cpp — Apache-2.0
#pragma once
// The response cache behind the negotiation fast path.
//
// Once a tensor has been negotiated through rank 0, every rank stores its single-tensor
// Response under a *bit* (a slot number). Next time the same tensor arrives with the same
// parameters, a rank only sets that bit; one bitwise-AND allreduce of the bit vectors tells
// every rank which tensors all ranks have, with no gather to rank 0.
//
// Every rank must perform the same sequence of Put/Touch/Erase calls so that names map to the
// same bits everywhere: bits are assigned deterministically (lowest free slot), and eviction is
// least-recently-used. The background loop guarantees the identical call sequence because it
// derives every call from data all ranks share (the agreed bit vector and rank 0's responses).
//
// Owned by the background thread; not thread-safe.

#include <cstdint>
#include <list>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/protocol/message.h"

namespace hvd {

class ResponseCache {
 public:
  explicit ResponseCache(uint32_t capacity);

  enum class State { kMiss, kHit, kInvalid };
  struct Lookup {
    State state = State::kMiss;
    uint32_t bit = 0;  // valid for kHit and kInvalid
  };

  // Whether an agreed response of this kind is cached. Decided from the response alone, so
  // every rank decides the same.
  static bool Cacheable(const Response& response);

  // kHit: the name is cached with identical parameters. kInvalid: the name is cached but
  // this request differs (shape, dtype, op, ...), so the entry must be dropped on all ranks.
  Lookup Find(const Request& request) const;

  // Caches the single-tensor `response` agreed for `request` (this rank's own request, or, on a
  // rank outside the response's process set, a placeholder carrying only its key). Evicts the
  // least recently used entry when full. No-op when capacity is 0.
  void Put(const Response& response, const Request& request);

  // The cached response of `bit`; marks it most recently used.
  const Response& Touch(uint32_t bit);

  void Erase(uint32_t bit);
  // Erases every entry of a process set (ascending bits, so identically on every rank).
  void EraseProcessSet(int32_t process_set_id);
  bool in_use(uint32_t bit) const { return bit < slots_.size() && slots_[bit].used; }
  // The request this rank cached under `bit` (valid while the bit is in use).
  const Request& params(uint32_t bit) const { return slots_.at(bit).params; }

  // Bits in use are all below this; identical on every rank.
  uint32_t num_bits() const { return high_water_; }
  uint32_t size() const { return static_cast<uint32_t>(by_name_.size()); }
  uint32_t capacity() const { return capacity_; }
  // Entries evicted to make room (a sign the capacity is too small).
  uint64_t evictions() const { return evictions_; }

 private:
  struct Slot {
    Response response;
    Request params;  // the request this rank cached it with
    std::list<uint32_t>::iterator lru_pos;
    bool used = false;
  };

  uint32_t capacity_;
  uint32_t high_water_ = 0;
  uint64_t evictions_ = 0;
  std::vector<Slot> slots_;
  std::set<uint32_t> free_;  // freed slots below high_water_
  std::list<uint32_t> lru_;  // front = least recently used
  std::unordered_map<TensorKey, uint32_t, TensorKeyHash> by_name_;
};

}  // namespace hvd
