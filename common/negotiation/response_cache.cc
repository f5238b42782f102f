// horovod_cpp — Apache-2.0
#include "common/negotiation/response_cache.h"

#include "base/logging.h"

namespace hvd {
namespace {

// Parameters that must match for a cached response to be reused (request_rank does not).
bool SameParams(const Request& a, const Request& b) {
  return a.type == b.type && a.dtype == b.dtype && a.reduce_op == b.reduce_op &&
         a.root_rank == b.root_rank && a.device == b.device &&
         a.process_set_id == b.process_set_id && a.prescale_factor == b.prescale_factor &&
         a.postscale_factor == b.postscale_factor && a.shape == b.shape && a.splits == b.splits &&
         a.group_size == b.group_size && a.group_name == b.group_name;
}

}  // namespace

ResponseCache::ResponseCache(uint32_t capacity) : capacity_(capacity) {}

bool ResponseCache::Cacheable(const Response& response) {
  // Grouped members are released together by the coordinator, so they always go through it.
  if (response.group_size > 0 || response.tensor_names.size() != 1) return false;
  switch (response.type) {
    case OpType::kAllreduce:
    case OpType::kBroadcast:
    case OpType::kAllgather:
    case OpType::kAlltoall:
    case OpType::kReducescatter:
      return true;
    default:
      return false;
  }
}

ResponseCache::Lookup ResponseCache::Find(const Request& request) const {
  auto it = by_name_.find(request.key());
  if (it == by_name_.end()) return {State::kMiss, 0};
  const Slot& slot = slots_[it->second];
  return {SameParams(slot.params, request) ? State::kHit : State::kInvalid, it->second};
}

void ResponseCache::Put(const Response& response, const Request& request) {
  if (capacity_ == 0) return;
  auto existing = by_name_.find(request.key());
  if (existing != by_name_.end()) Erase(existing->second);

  uint32_t bit;
  if (!free_.empty()) {
    bit = *free_.begin();
    free_.erase(free_.begin());
  } else if (high_water_ < capacity_) {
    bit = high_water_++;
    slots_.resize(high_water_);
  } else {
    bit = lru_.front();
    if (evictions_++ == 0) {
      HVD_LOG(WARNING) << "the response cache is full (HOROVOD_CACHE_CAPACITY=" << capacity_
                       << ") and started evicting entries, which sends more tensors through "
                          "the slower rank-0 negotiation; consider a larger capacity";
    }
    Erase(bit);
    free_.erase(bit);
  }
  Slot& slot = slots_[bit];
  slot.response = response;
  slot.params = request;
  slot.used = true;
  slot.lru_pos = lru_.insert(lru_.end(), bit);
  by_name_[request.key()] = bit;
}

const Response& ResponseCache::Touch(uint32_t bit) {
  Slot& slot = slots_.at(bit);
  lru_.splice(lru_.end(), lru_, slot.lru_pos);
  return slot.response;
}

void ResponseCache::Erase(uint32_t bit) {
  if (bit >= slots_.size() || !slots_[bit].used) return;
  Slot& slot = slots_[bit];
  by_name_.erase(slot.params.key());
  lru_.erase(slot.lru_pos);
  slot.used = false;
  slot.response = Response();
  slot.params = Request();
  free_.insert(bit);
}

void ResponseCache::EraseProcessSet(int32_t process_set_id) {
  for (uint32_t bit = 0; bit < slots_.size(); ++bit) {
    if (slots_[bit].used && slots_[bit].params.process_set_id == process_set_id) Erase(bit);
  }
}

}  // namespace hvd
