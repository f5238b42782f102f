// horovod_cpp — Apache-2.0
#include "common/negotiation/controller.h"

#include <algorithm>
#include <sstream>

#include <unistd.h>

#include "base/logging.h"
#include "common/protocol/reserved_names.h"
#include "common/protocol/wire.h"

namespace hvd {
namespace {

// Status word bits. Stored inverted (set = "no") so that the AND across ranks yields
// "no rank has ..." and a cleared bit means "some rank has ...".
constexpr uint64_t kNoShutdown = 1u << 0;
constexpr uint64_t kNoMisses = 1u << 1;
constexpr uint64_t kNoOutstanding = 1u << 2;
constexpr uint64_t kNoInvalid = 1u << 3;
constexpr uint64_t kNoJoined = 1u << 4;
constexpr uint64_t kNoFresh = 1u << 5;
// Not inverted: the AND says "every rank is blocked waiting".
constexpr uint64_t kBlocked = 1u << 6;
constexpr uint64_t kNoDeadlockDue = 1u << 7;

bool TestBit(const uint64_t* words, uint32_t bit) { return (words[bit / 64] >> (bit % 64)) & 1u; }
void SetBit(uint64_t* words, uint32_t bit) { words[bit / 64] |= uint64_t{1} << (bit % 64); }
void ClearBit(uint64_t* words, uint32_t bit) { words[bit / 64] &= ~(uint64_t{1} << (bit % 64)); }

// What a rank outside a response's process set remembers in its cache: the key and kind,
// enough to keep bit numbering identical everywhere; it never looks the entry up.
Request Placeholder(const Response& r) {
  Request q;
  q.type = r.type;
  q.dtype = r.dtype;
  q.process_set_id = r.process_set_id;
  q.tensor_name = r.tensor_names.front();
  return q;
}

}  // namespace

Controller::Controller(ops::Backend* backend, const Config& config, ProcessSetTable* sets,
                       Counters* counters, timeline::Timeline* timeline)
    : backend_(backend),
      sets_(sets),
      counters_(counters),
      cache_(static_cast<uint32_t>(config.cache_capacity)),
      stall_(config.stall_check_time_seconds, config.stall_shutdown_time_seconds),
      rank_(backend->topology().rank),
      timeline_(timeline),
      deadlock_grace_seconds_(config.deadlock_grace_seconds) {
  if (rank_ == 0) {
    coordinator_ = std::make_unique<Coordinator>([sets](int32_t id) { return sets->Ranks(id); });
  }
}

Result<CycleOutcome> Controller::RunCycle(std::vector<Request> new_requests,
                                          bool shutdown_requested, size_t outstanding,
                                          bool blocked, const BlockedOnFn& blocked_on) {
  counters_->cycles.fetch_add(1, std::memory_order_relaxed);
  const Clock::time_point now = Clock::now();
  CycleOutcome outcome;
  const size_t new_requests_count = new_requests.size();
  if (coordinator_) InspectStalls(now);
  const bool recording = Recording();
  if (recording) timeline_->MarkCycleStart();

  // 1. Classify.
  std::vector<PendingHit> candidates = std::move(pending_hits_);
  pending_hits_.clear();
  for (Request& r : new_requests) {
    if (r.type == OpType::kJoin) joined_ = true;
    if (recording) NegotiationSeen(r, rank_);
    candidates.push_back({std::move(r), now});
  }
  std::vector<Request> misses;
  std::vector<std::pair<uint32_t, PendingHit>> hits;
  std::set<uint32_t> my_invalid;
  for (PendingHit& c : candidates) {
    const ResponseCache::Lookup found = cache_.Find(c.request);
    const bool stalled = stall_.enabled() && now - c.since >= stall_.check_time();
    if (found.state == ResponseCache::State::kHit && !stalled) {
      hits.emplace_back(found.bit, std::move(c));
      continue;
    }
    if (found.state != ResponseCache::State::kMiss) my_invalid.insert(found.bit);
    misses.push_back(std::move(c.request));
  }

  // 2. Vote.
  const uint32_t num_bits = cache_.num_bits();
  const size_t bit_words = (num_bits + 63) / 64;
  std::vector<uint64_t> words(1 + 3 * bit_words, 0);
  uint64_t* status = &words[0];
  uint64_t* hit_words = words.data() + 1;
  uint64_t* invalid_words = words.data() + 1 + bit_words;        // inverted
  uint64_t* requested_words = words.data() + 1 + 2 * bit_words;  // inverted
  if (!shutdown_requested && !stall_shutdown_) *status |= kNoShutdown;
  if (misses.empty()) *status |= kNoMisses;
  if (outstanding == 0) *status |= kNoOutstanding;
  if (my_invalid.empty()) *status |= kNoInvalid;
  if (!joined_) *status |= kNoJoined;
  if (new_requests_count == 0) *status |= kNoFresh;
  if (blocked) *status |= kBlocked;
  const bool due = deadlock_grace_seconds_ > 0 && stuck_since_ &&
                   now - *stuck_since_ >= std::chrono::duration<double>(deadlock_grace_seconds_);
  if (!due) *status |= kNoDeadlockDue;
  for (size_t i = 0; i < bit_words; ++i) invalid_words[i] = requested_words[i] = ~uint64_t{0};
  for (const auto& [bit, hit] : hits) {
    SetBit(hit_words, bit);
    ClearBit(requested_words, bit);
  }
  for (uint32_t bit : my_invalid) ClearBit(invalid_words, bit);
  const std::vector<int32_t> my_sets = sets_->IdsIncluding(rank_);
  for (uint32_t bit = 0; bit < num_bits; ++bit) {
    if (!cache_.in_use(bit)) continue;
    const Request& p = cache_.params(bit);
    const bool member = std::binary_search(my_sets.begin(), my_sets.end(), p.process_set_id);
    const bool zeros =
        joined_ && p.type == OpType::kAllreduce && p.process_set_id == kGlobalProcessSetId;
    if (!member || zeros) SetBit(hit_words, bit);  // neutral: "ready as far as I am concerned"
  }
  HVD_RETURN_IF_ERROR(backend_->AllreduceBitsAnd(words.data(), static_cast<int>(words.size())));

  const bool any_shutdown = !(*status & kNoShutdown);
  const bool any_misses = !(*status & kNoMisses);
  const bool any_invalid = !(*status & kNoInvalid);
  const bool any_joined = !(*status & kNoJoined);
  const bool any_fresh = !(*status & kNoFresh);
  const bool all_blocked = (*status & kBlocked) != 0;
  const bool any_due = !(*status & kNoDeadlockDue);
  outcome.idle = (*status & kNoOutstanding) != 0;

  // 3. Invalidate, identically on every rank.
  auto invalidated = [&](uint32_t bit) { return any_invalid && !TestBit(invalid_words, bit); };
  if (any_invalid) {
    for (uint32_t bit = 0; bit < num_bits; ++bit) {
      if (invalidated(bit)) cache_.Erase(bit);
    }
  }

  // 4. Fast path. Read the released responses before the slow path's Puts can evict them.
  auto released = [&](uint32_t bit) {
    if (!TestBit(hit_words, bit) || TestBit(requested_words, bit) || invalidated(bit)) return false;
    if (!any_joined) return true;
    const Request& p = cache_.params(bit);
    return p.type == OpType::kAllreduce && p.process_set_id == kGlobalProcessSetId;
  };
  for (auto& [bit, hit] : hits) {
    if (invalidated(bit)) {
      misses.push_back(std::move(hit.request));
    } else if (!released(bit)) {
      if (any_joined && hit.request.type != OpType::kAllreduce) {
        misses.push_back(std::move(hit.request));  // rank 0 reports it: unsupported with Join
      } else {
        pending_hits_.push_back(std::move(hit));
      }
    }
  }
  // A tensor some rank asked for that is not released is partly ready: its other ranks are
  // probably submitting it right now.
  bool partial = false;
  for (uint32_t bit = 0; bit < num_bits; ++bit) {
    if (!TestBit(requested_words, bit) && !released(bit)) partial = true;
    if (released(bit)) {
      outcome.responses.push_back(cache_.Touch(bit));
      counters_->cache_hits.fetch_add(1, std::memory_order_relaxed);
      if (recording) NegotiationDone(outcome.responses.back());
    }
  }

  // 5. Slow path.
  const bool slow = any_misses || any_invalid || any_shutdown || any_joined;
  if (slow) {
    HVD_RETURN_IF_ERROR(SlowPath(std::move(misses), shutdown_requested, any_joined, &outcome));
  }
  // 6. Deadlock: every rank blocked, nothing new anywhere and nothing released.
  const bool quiet = all_blocked && !any_fresh && !slow && outcome.responses.empty();
  HVD_RETURN_IF_ERROR(TrackDeadlock(quiet, any_due, blocked_on, now, &outcome));
  // Only after fresh submissions (so a stalled tensor cannot spin the loop).
  outcome.follow_up = any_fresh && (partial || any_misses);
  counters_->cache_entries.store(cache_.size(), std::memory_order_relaxed);
  if (coordinator_) {
    counters_->coordinator_pending.store(coordinator_->pending_count(), std::memory_order_relaxed);
  }
  return outcome;
}

void Controller::ResetCache(uint32_t capacity) {
  cache_ = ResponseCache(capacity);
  counters_->cache_entries.store(0, std::memory_order_relaxed);
}

bool Controller::Recording() {
  if (timeline_ == nullptr || !timeline_->enabled()) return false;
  if (timeline_->session() != timeline_session_) {  // a new file: earlier spans are closed
    negotiating_.clear();
    timeline_session_ = timeline_->session();
  }
  return true;
}

void Controller::NegotiationSeen(const Request& request, int rank) {
  const TensorKey key = request.key();
  auto [it, fresh] = negotiating_.try_emplace(key, 0);
  if (fresh) {
    it->second = timeline_->Row(TimelineRow(key));
    timeline_->Begin(it->second, NegotiateName(request.type));
  }
  timeline_->RankReady(it->second, rank);
}

void Controller::NegotiationDone(const Response& response) {
  for (const std::string& name : response.tensor_names) {
    auto it = negotiating_.find(TensorKey{response.process_set_id, name});
    if (it == negotiating_.end()) continue;
    timeline_->End(it->second);
    negotiating_.erase(it);
  }
}

namespace {

// "barrier", "allgather 'allgather.x'", "allreduce 'g' (process set 2)".
std::string DescribeWait(const Request& q) {
  const bool internal = q.tensor_name.rfind(kReservedPrefix, 0) == 0;
  std::string s = OpTypeLowerName(q.type);
  if (q.type == OpType::kProcessSetAdd || q.type == OpType::kProcessSetRemove) {
    s = "a process-set change";
  } else if (!internal) {
    s += " '" + q.tensor_name + "'";
  }
  if (q.process_set_id != kGlobalProcessSetId) {
    s += " (process set " + std::to_string(q.process_set_id) + ")";
  }
  if (!q.call_site.empty()) s += " called at " + q.call_site;
  return s;
}

std::string HostName() {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) return "unknown host";
  return host;
}

}  // namespace

Status Controller::TrackDeadlock(bool quiet, bool due, const BlockedOnFn& blocked_on,
                                 Clock::time_point now, CycleOutcome* outcome) {
  if (deadlock_grace_seconds_ <= 0 || !quiet) {
    stuck_since_.reset();
    return Status::OK();
  }
  if (!due) {  // identical on every rank: the clocks start in the same cycle
    if (!stuck_since_) stuck_since_ = now;
    return Status::OK();
  }
  stuck_since_.reset();
  // Every rank says what it waits for; rank 0 writes the one message all ranks report.
  // "host\n" then what this rank waits for.
  std::string mine = HostName() + "\n";
  if (blocked_on) {
    size_t n = 0;
    for (const Request& q : blocked_on()) mine += (n++ ? ", " : "") + DescribeWait(q);
  }
  std::vector<std::vector<uint8_t>> gathered;
  HVD_RETURN_IF_ERROR(
      backend_->GatherBytes(std::vector<uint8_t>(mine.begin(), mine.end()), &gathered));
  std::vector<uint8_t> message;
  if (coordinator_) {
    std::ostringstream text;
    text << "deadlock: every rank is blocked waiting and none of the operations they wait for "
            "can complete (nothing was submitted or completed for "
         << deadlock_grace_seconds_ << " s, HOROVOD_DEADLOCK_GRACE_SECONDS): ";
    for (size_t r = 0; r < gathered.size(); ++r) {
      const std::string sent(gathered[r].begin(), gathered[r].end());
      const size_t cut = sent.find('\n');
      const std::string host = cut == std::string::npos ? "" : sent.substr(0, cut);
      const std::string what = cut == std::string::npos ? sent : sent.substr(cut + 1);
      text << (r ? "; " : "") << "rank " << r << " (" << host << ") waits for "
           << (what.empty() ? "nothing of its own" : what);
    }
    text << ". Every operation still pending on any rank fails; check that all ranks submit "
            "the same operations in the same order.";
    const std::string t = text.str();
    message.assign(t.begin(), t.end());
    coordinator_->Clear();
  }
  HVD_RETURN_IF_ERROR(backend_->BroadcastBytes(&message, 0));
  outcome->deadlock.assign(message.begin(), message.end());
  HVD_LOG(ERROR) << outcome->deadlock;
  for (const PendingHit& h : pending_hits_) outcome->deadlocked.push_back(h.request.key());
  for (const auto& [key, q] : sent_) outcome->deadlocked.push_back(key);
  pending_hits_.clear();
  sent_.clear();
  negotiating_.clear();
  return Status::OK();
}

void Controller::InspectStalls(Clock::time_point now) {
  StallInspector::Verdict v = stall_.Check(coordinator_->PendingSince(now), now);
  if (!v.warning.empty()) {
    if (v.shutdown) {
      HVD_LOG(ERROR) << v.warning;
    } else {
      HVD_LOG(WARNING) << v.warning;
    }
  }
  if (v.shutdown && !stall_shutdown_) {
    stall_shutdown_ = true;
    stall_reason_ = v.shutdown_reason;
  }
}

Status Controller::SlowPath(std::vector<Request> misses, bool shutdown_requested, bool any_joined,
                            CycleOutcome* outcome) {
  counters_->coordinator_rounds.fetch_add(1, std::memory_order_relaxed);
  RequestList mine;
  mine.shutdown = shutdown_requested;
  if (shutdown_requested) mine.shutdown_host = HostName();
  for (Request& r : misses) {
    sent_[r.key()] = r;
    mine.requests.push_back(std::move(r));
  }
  std::vector<std::vector<uint8_t>> gathered;
  HVD_RETURN_IF_ERROR(backend_->GatherBytes(SerializeRequestList(mine), &gathered));

  std::vector<uint8_t> answer;
  if (coordinator_) {
    ResponseList list;
    std::vector<std::string> shutdown_ranks;  // "rank 1 (host)"
    const auto now = Clock::now();
    for (size_t rank = 0; rank < gathered.size(); ++rank) {
      Result<RequestList> parsed = ParseRequestList(gathered[rank].data(), gathered[rank].size());
      if (!parsed.ok()) {
        return Status::Internal(
            "rank " + std::to_string(rank) +
            " sent an unreadable negotiation message: " + parsed.status().message());
      }
      coordinator_->AddRequests(static_cast<int>(rank), parsed->requests, now);
      if (Recording() && rank != 0) {  // rank 0's own were recorded when it enqueued them
        for (const Request& r : parsed->requests) NegotiationSeen(r, static_cast<int>(rank));
      }
      if (parsed->shutdown) {
        shutdown_ranks.push_back("rank " + std::to_string(rank) + " (" + parsed->shutdown_host +
                                 ")");
      }
    }
    list.responses = coordinator_->TakeReadyResponses();
    if (stall_shutdown_) {
      list.shutdown = list.shutdown_after_stall = true;
      list.shutdown_reason = stall_reason_;
    } else if (!shutdown_ranks.empty()) {
      list.shutdown = true;
      list.shutdown_reason = "shutdown requested by ";
      for (size_t i = 0; i < shutdown_ranks.size(); ++i) {
        list.shutdown_reason += (i ? ", " : "") + shutdown_ranks[i];
      }
    }
    answer = SerializeResponseList(list);
  }
  HVD_RETURN_IF_ERROR(backend_->BroadcastBytes(&answer, 0));
  Result<ResponseList> list = ParseResponseList(answer.data(), answer.size());
  if (!list.ok()) {
    return Status::Internal("unreadable response list from rank 0: " + list.status().message());
  }
  for (Response& resp : list->responses) {
    if (Recording()) NegotiationDone(resp);
    Absorb(resp, any_joined);
    outcome->responses.push_back(std::move(resp));
  }
  outcome->shutdown = list->shutdown;
  outcome->shutdown_after_stall = list->shutdown_after_stall;
  outcome->shutdown_reason = list->shutdown_reason;
  return Status::OK();
}

void Controller::Absorb(const Response& resp, bool any_joined) {
  if (resp.type == OpType::kJoin) joined_ = false;
  if (resp.type == OpType::kProcessSetRemove && !resp.rank_sizes.empty()) {
    const int32_t removed = static_cast<int32_t>(resp.rank_sizes.front());
    cache_.EraseProcessSet(removed);
    if (coordinator_) coordinator_->DropProcessSet(removed);
    auto in_set = [removed](const Request& r) { return r.process_set_id == removed; };
    pending_hits_.erase(std::remove_if(pending_hits_.begin(), pending_hits_.end(),
                                       [&](const PendingHit& h) { return in_set(h.request); }),
                        pending_hits_.end());
    for (auto it = sent_.begin(); it != sent_.end();) {
      it = in_set(it->second) ? sent_.erase(it) : std::next(it);
    }
  }
  // Cache what was agreed, on every rank in the same order. Nothing is cached while a rank
  // has joined (it has no request to remember), which every rank knows from the vote.
  if (resp.type != OpType::kError && !any_joined && ResponseCache::Cacheable(resp)) {
    auto it = sent_.find(TensorKey{resp.process_set_id, resp.tensor_names.front()});
    cache_.Put(resp, it != sent_.end() ? it->second : Placeholder(resp));
  }
  for (const std::string& name : resp.tensor_names) {
    sent_.erase(TensorKey{resp.process_set_id, name});
  }
}

bool Controller::RunsHere(const Response& group) const {
  if (group.type == OpType::kProcessSetAdd || group.type == OpType::kProcessSetRemove) return true;
  Result<ProcessSetInfo> set = sets_->Get(group.process_set_id);
  // A removed set's entries were failed at removal; another set's operation is run by its
  // members (error responses are delivered to whoever has the tensor).
  return set.ok() && (set->included || group.type == OpType::kError);
}

Result<std::vector<TensorTableEntry>> Controller::EntriesToRun(
    const Response& group, std::vector<std::optional<TensorTableEntry>> taken) const {
  std::vector<TensorTableEntry> entries;
  for (size_t i = 0; i < taken.size(); ++i) {
    if (taken[i]) {
      entries.push_back(std::move(*taken[i]));
    } else if (group.type == OpType::kAllreduce) {
      // This rank has joined: it contributes zeros of the agreed size.
      TensorTableEntry zeros;
      zeros.input = zeros.output = TensorView{nullptr, group.dtype, {group.tensor_sizes[i]}};
      entries.push_back(std::move(zeros));
    } else if (group.type != OpType::kError) {
      return Status::Internal(std::string("rank has no entry for ") + OpTypeLowerName(group.type) +
                              " '" + group.tensor_names[i] + "'");
    }
  }
  return entries;
}

Status Controller::CreateStaticProcessSets(const std::vector<std::vector<int>>& sets) {
  auto encode = [](const std::vector<std::vector<int>>& list) {
    wire::Writer w;
    w.U32(static_cast<uint32_t>(list.size()));
    for (const auto& ranks : list) w.I64Vec(std::vector<int64_t>(ranks.begin(), ranks.end()));
    return w.bytes();
  };
  auto describe = [](const std::vector<std::vector<int>>& list) {
    std::string s = "[";
    for (size_t i = 0; i < list.size(); ++i) s += (i ? ", " : "") + RanksToString(list[i]);
    return s + "]";
  };
  const std::vector<uint8_t> mine = encode(sets);
  std::vector<uint8_t> root = mine;
  HVD_RETURN_IF_ERROR(backend_->BroadcastBytes(&root, 0));
  uint64_t same = root == mine ? 1 : 0;
  HVD_RETURN_IF_ERROR(backend_->AllreduceBitsAnd(&same, 1));
  if (!same) {
    return Status::InvalidArgument(
        "every rank must pass the same process sets to Init; this rank passed " +
        describe(sets) +
        (root == mine ? " like rank 0, but another rank did not"
                      : ", which differs from rank 0's"));
  }
  for (const std::vector<int>& ranks : sets) {
    HVD_ASSIGN_OR_RETURN(int32_t id, sets_->Add(ranks));
    HVD_RETURN_IF_ERROR(backend_->AddProcessSet(id, ranks));
  }
  return Status::OK();
}

Result<int32_t> Controller::ChangeProcessSets(const Response& group) {
  if (group.type == OpType::kProcessSetAdd) {
    const std::vector<int> ranks(group.rank_sizes.begin(), group.rank_sizes.end());
    HVD_ASSIGN_OR_RETURN(int32_t id, sets_->Add(ranks));
    HVD_RETURN_IF_ERROR(backend_->AddProcessSet(id, ranks));
    return id;
  }
  const int32_t id = static_cast<int32_t>(group.rank_sizes.front());
  HVD_RETURN_IF_ERROR(sets_->Remove(id));
  HVD_RETURN_IF_ERROR(backend_->RemoveProcessSet(id));
  return id;
}

}  // namespace hvd
