// horovod_cpp — Apache-2.0
#include "common/controller.h"

#include <set>

namespace hvd {
namespace {

// Status word bits. Stored inverted (set = "no") so that the AND across ranks yields
// "no rank has ..." and a cleared bit means "some rank has ...".
constexpr uint64_t kNoShutdown = 1u << 0;
constexpr uint64_t kNoMisses = 1u << 1;
constexpr uint64_t kNoOutstanding = 1u << 2;
constexpr uint64_t kNoInvalid = 1u << 3;

bool TestBit(const uint64_t* words, uint32_t bit) { return (words[bit / 64] >> (bit % 64)) & 1u; }
void SetBit(uint64_t* words, uint32_t bit) { words[bit / 64] |= uint64_t{1} << (bit % 64); }
void ClearBit(uint64_t* words, uint32_t bit) { words[bit / 64] &= ~(uint64_t{1} << (bit % 64)); }

std::string RankList(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(ranks[i]);
  }
  return s;
}

}  // namespace

Controller::Controller(ops::Backend* backend, const Config& config, Counters* counters)
    : backend_(backend),
      counters_(counters),
      cache_(static_cast<uint32_t>(config.cache_capacity)) {
  if (backend_->topology().rank == 0) {
    coordinator_ = std::make_unique<Coordinator>(backend_->topology().size);
  }
}

Result<CycleOutcome> Controller::RunCycle(std::vector<Request> new_requests,
                                          bool shutdown_requested, size_t outstanding) {
  counters_->cycles.fetch_add(1, std::memory_order_relaxed);
  CycleOutcome outcome;

  // 1. Classify.
  std::vector<Request> candidates = std::move(pending_hits_);
  pending_hits_.clear();
  for (Request& r : new_requests) candidates.push_back(std::move(r));
  std::vector<Request> misses;
  std::vector<std::pair<uint32_t, Request>> hits;
  std::set<uint32_t> my_invalid;
  for (Request& r : candidates) {
    if (cache_.capacity() == 0 || !ResponseCache::Cacheable(r)) {
      misses.push_back(std::move(r));
      continue;
    }
    const ResponseCache::Lookup found = cache_.Find(r);
    switch (found.state) {
      case ResponseCache::State::kHit:
        hits.emplace_back(found.bit, std::move(r));
        break;
      case ResponseCache::State::kInvalid:
        my_invalid.insert(found.bit);
        misses.push_back(std::move(r));
        break;
      case ResponseCache::State::kMiss:
        misses.push_back(std::move(r));
        break;
    }
  }

  // 2. Vote.
  const uint32_t num_bits = cache_.num_bits();
  const size_t bit_words = (num_bits + 63) / 64;
  std::vector<uint64_t> words(1 + 2 * bit_words, 0);
  uint64_t* status = &words[0];
  uint64_t* hit_words = words.data() + 1;
  uint64_t* invalid_words = words.data() + 1 + bit_words;  // inverted
  if (!shutdown_requested) *status |= kNoShutdown;
  if (misses.empty()) *status |= kNoMisses;
  if (outstanding == 0) *status |= kNoOutstanding;
  if (my_invalid.empty()) *status |= kNoInvalid;
  for (const auto& [bit, r] : hits) SetBit(hit_words, bit);
  for (size_t i = 0; i < bit_words; ++i) invalid_words[i] = ~uint64_t{0};
  for (uint32_t bit : my_invalid) ClearBit(invalid_words, bit);
  HVD_RETURN_IF_ERROR(backend_->AllreduceBitsAnd(words.data(), static_cast<int>(words.size())));

  const bool any_shutdown = !(*status & kNoShutdown);
  const bool any_misses = !(*status & kNoMisses);
  const bool any_invalid = !(*status & kNoInvalid);
  outcome.idle = (*status & kNoOutstanding) != 0;

  // 3. Invalidate, identically on every rank.
  if (any_invalid) {
    for (uint32_t bit = 0; bit < num_bits; ++bit) {
      if (!TestBit(invalid_words, bit)) cache_.Erase(bit);
    }
  }

  // 4. Fast path: bits every rank set, ascending. Read them before the slow path's Puts can
  // evict anything.
  for (auto& [bit, r] : hits) {
    if (any_invalid && !TestBit(invalid_words, bit)) {
      misses.push_back(std::move(r));
    } else if (!TestBit(hit_words, bit)) {
      pending_hits_.push_back(std::move(r));
    }
  }
  for (uint32_t bit = 0; bit < num_bits; ++bit) {
    if (TestBit(hit_words, bit) && (!any_invalid || TestBit(invalid_words, bit))) {
      outcome.responses.push_back(cache_.Touch(bit));
      counters_->cache_hits.fetch_add(1, std::memory_order_relaxed);
    }
  }

  // 5. Slow path.
  if (any_misses || any_invalid || any_shutdown) {
    HVD_RETURN_IF_ERROR(SlowPath(std::move(misses), shutdown_requested, &outcome));
  }
  return outcome;
}

Status Controller::SlowPath(std::vector<Request> misses, bool shutdown_requested,
                            CycleOutcome* outcome) {
  counters_->coordinator_rounds.fetch_add(1, std::memory_order_relaxed);
  RequestList mine;
  mine.shutdown = shutdown_requested;
  for (Request& r : misses) {
    sent_[r.tensor_name] = r;
    mine.requests.push_back(std::move(r));
  }
  std::vector<std::vector<uint8_t>> gathered;
  HVD_RETURN_IF_ERROR(backend_->GatherBytes(SerializeRequestList(mine), &gathered));

  std::vector<uint8_t> answer;
  if (coordinator_) {
    ResponseList list;
    std::vector<int> shutdown_ranks;
    const auto now = Coordinator::Clock::now();
    for (size_t rank = 0; rank < gathered.size(); ++rank) {
      Result<RequestList> parsed = ParseRequestList(gathered[rank].data(), gathered[rank].size());
      if (!parsed.ok()) {
        return Status::Internal("rank " + std::to_string(rank) +
                                " sent an unreadable negotiation message: " +
                                parsed.status().message());
      }
      coordinator_->AddRequests(static_cast<int>(rank), parsed->requests, now);
      if (parsed->shutdown) shutdown_ranks.push_back(static_cast<int>(rank));
    }
    list.responses = coordinator_->TakeReadyResponses();
    list.shutdown = !shutdown_ranks.empty();
    if (list.shutdown) list.shutdown_reason = "shutdown requested by " + RankList(shutdown_ranks);
    answer = SerializeResponseList(list);
  }
  HVD_RETURN_IF_ERROR(backend_->BroadcastBytes(&answer, 0));
  Result<ResponseList> list = ParseResponseList(answer.data(), answer.size());
  if (!list.ok()) {
    return Status::Internal("unreadable response list from rank 0: " + list.status().message());
  }

  for (Response& resp : list->responses) {
    auto it = sent_.find(resp.tensor_names.front());
    if (it == sent_.end()) {
      return Status::Internal("rank 0 answered for tensor '" + resp.tensor_names.front() +
                              "', which this rank never sent");
    }
    if (resp.type != OpType::kError && ResponseCache::Cacheable(it->second)) {
      cache_.Put(resp, it->second);
    }
    sent_.erase(it);
    outcome->responses.push_back(std::move(resp));
  }
  outcome->shutdown = list->shutdown;
  outcome->shutdown_reason = list->shutdown_reason;
  return Status::OK();
}

}  // namespace hvd
