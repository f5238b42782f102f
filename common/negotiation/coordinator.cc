// horovod_cpp — Apache-2.0
#include "common/negotiation/coordinator.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "common/protocol/reserved_names.h"

namespace hvd {
namespace {

// Shortest decimal text that reads back as exactly `v`.
std::string FormatDouble(double v) {
  char buf[64];
  for (int precision = 6; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof buf, "%.*g", precision, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

std::string JoinInts(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

std::string RankWord(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

// "rank 0 sent [2, 3]; ranks 1, 2 sent [4]": ranks grouped by the value they sent, groups in
// order of their lowest rank.
std::string DescribeByRank(const std::vector<const Request*>& reqs,
                           const std::function<std::string(const Request&)>& value) {
  std::vector<std::pair<std::string, std::vector<int>>> groups;
  for (const Request* q : reqs) {
    std::string v = value(*q);
    auto it =
        std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == v; });
    if (it == groups.end()) {
      groups.push_back({v, {q->request_rank}});
    } else {
      it->second.push_back(q->request_rank);
    }
  }
  std::string out;
  for (size_t i = 0; i < groups.size(); ++i) {
    out += (i ? "; " : "") + RankWord(groups[i].second) + " sent " + groups[i].first;
  }
  return out;
}

// ". Called from: ranks 0, 1 at train.py:42; rank 2 at train.py:57", or "" when no rank said.
std::string CalledFrom(const std::vector<const Request*>& reqs) {
  const std::string sites = CallSitesByRank(reqs);
  return sites.empty() ? sites : ". Called from: " + sites;
}

Response ErrorResponse(const Request& first, std::string message) {
  Response r;
  r.type = OpType::kError;
  r.dtype = first.dtype;
  r.device = first.device;
  r.process_set_id = first.process_set_id;
  r.tensor_names = {first.tensor_name};
  r.error_message = std::move(message);
  return r;
}

bool IsReduction(OpType t) {
  return t == OpType::kAllreduce || t == OpType::kReducescatter || t == OpType::kAdasum;
}
bool SameShapeRequired(OpType t) { return IsReduction(t) || t == OpType::kBroadcast; }
bool FirstDimMayDiffer(OpType t) { return t == OpType::kAllgather || t == OpType::kAlltoall; }
bool HasTensor(OpType t) {
  return t != OpType::kBarrier && t != OpType::kJoin && t != OpType::kProcessSetAdd &&
         t != OpType::kProcessSetRemove;
}

// "[*, 4, 5]" for [3, 4, 5]: the dimensions that must agree for allgather and alltoall.
std::string DimsAfterFirst(const Request& q) {
  if (q.shape.empty()) return "[]";
  std::string s = "[*";
  for (size_t i = 1; i < q.shape.size(); ++i) s += ", " + std::to_string(q.shape[i]);
  return s + "]";
}

}  // namespace


Response ConstructResponse(const std::vector<Request>& requests, const std::vector<int>& joined) {
  std::vector<const Request*> reqs;
  for (const Request& q : requests) reqs.push_back(&q);
  const Request& first = *reqs.front();
  const OpType type = first.type;
  const std::string prefix =
      std::string(OpTypeLowerName(type)) + " '" + first.tensor_name + "': mismatched ";

  // Each check: does every rank agree on this property? If not, the error lists each rank's
  // value. The first disagreement wins; the order puts the most fundamental first.
  struct Check {
    const char* what;
    bool applies;
    std::function<std::string(const Request&)> value;
  };
  const Check checks[] = {
      {"operations", true, [](const Request& q) { return std::string(OpTypeName(q.type)); }},
      {"data types", HasTensor(type),
       [](const Request& q) { return std::string(DataTypeName(q.dtype)); }},
      // CPU on one rank and a GPU on another is an error; GPU 0 here and GPU 1 there is the
      // usual one-GPU-per-rank layout.
      {"devices (CPU vs GPU)", HasTensor(type),
       [](const Request& q) { return std::string(q.device == kCpuDevice ? "CPU" : "GPU"); }},
      {"reduction ops", IsReduction(type),
       [](const Request& q) { return std::string(ReduceOpName(q.reduce_op)); }},
      {"prescale factors", IsReduction(type),
       [](const Request& q) { return FormatDouble(q.prescale_factor); }},
      {"postscale factors", IsReduction(type),
       [](const Request& q) { return FormatDouble(q.postscale_factor); }},
      {"groups", true,
       [](const Request& q) {
         return q.group_size > 0 ? "group '" + q.group_name + "' of " + std::to_string(q.group_size)
                                 : std::string("no group");
       }},
      {"shapes", SameShapeRequired(type), [](const Request& q) { return ShapeToString(q.shape); }},
      {"number of dimensions", FirstDimMayDiffer(type),
       [](const Request& q) { return std::to_string(q.shape.size()); }},
      {"shapes beyond the first dimension", FirstDimMayDiffer(type), DimsAfterFirst},
      {"root ranks", type == OpType::kBroadcast,
       [](const Request& q) { return std::to_string(q.root_rank); }},
      {"process set ranks", type == OpType::kProcessSetAdd,
       [](const Request& q) { return JoinInts(q.splits); }},
      {"process set ids", type == OpType::kProcessSetRemove,
       [](const Request& q) { return JoinInts(q.splits); }},
  };
  for (const Check& check : checks) {
    if (!check.applies) continue;
    const std::string v0 = check.value(first);
    for (const Request* q : reqs) {
      if (check.value(*q) != v0) {
        return ErrorResponse(first, prefix + check.what + ": " + DescribeByRank(reqs, check.value) +
                                        CalledFrom(reqs));
      }
    }
  }
  if (!joined.empty() && type != OpType::kAllreduce && type != OpType::kJoin) {
    return ErrorResponse(
        first, std::string(OpTypeLowerName(type)) + " '" + first.tensor_name +
                   "': not supported while " + RankWord(joined) +
                   (joined.size() == 1 ? " has" : " have") +
                   " called Join; only allreduce accepts joined ranks (they contribute zeros). "
                   "With DistributedOptimizer, use sparse_as_dense=True" + CalledFrom(reqs));
  }

  Response r;
  r.type = type;
  r.dtype = first.dtype;
  r.reduce_op = first.reduce_op;
  r.root_rank = first.root_rank;
  r.device = first.device;
  r.process_set_id = first.process_set_id;
  r.prescale_factor = first.prescale_factor;
  r.postscale_factor = first.postscale_factor;
  r.group_size = first.group_size;
  r.tensor_names = {first.tensor_name};
  switch (type) {
    case OpType::kAllreduce:
    case OpType::kBroadcast:
    case OpType::kReducescatter:
    case OpType::kAdasum:
      r.tensor_sizes = {NumElements(first.shape)};
      break;
    case OpType::kAllgather:
      r.tensor_sizes = {RowElements(first.shape)};
      for (const Request* q : reqs) r.rank_sizes.push_back(q->shape.empty() ? 0 : q->shape[0]);
      break;
    case OpType::kAlltoall:
      r.tensor_sizes = {RowElements(first.shape)};
      for (const Request* q : reqs) {
        r.rank_sizes.insert(r.rank_sizes.end(), q->splits.begin(), q->splits.end());
      }
      break;
    case OpType::kProcessSetAdd:
    case OpType::kProcessSetRemove:
      r.rank_sizes = first.splits;
      break;
    default:
      break;
  }
  return r;
}

Coordinator::Coordinator(MembersFn members) : members_(std::move(members)) {}

bool Coordinator::IsReady(const TensorKey& key, const Entry& e) const {
  if (!e.forced_error.empty()) return true;
  const bool joins_count = key.process_set_id == kGlobalProcessSetId && key.name != kJoinName;
  const Entry* join = nullptr;
  if (joins_count) {
    auto it = table_.find(TensorKey{kGlobalProcessSetId, kJoinName});
    if (it != table_.end()) join = &it->second;
  }
  for (int m : e.members) {
    if (e.by_rank.count(m)) continue;
    if (join != nullptr && join->by_rank.count(m)) continue;
    return false;
  }
  // A tensor only joined ranks would "contribute" to is not an operation anyone asked for.
  return !e.by_rank.empty();
}

void Coordinator::MarkReadyIfComplete(const TensorKey& key, Entry& e) {
  if (e.queued || !IsReady(key, e)) return;
  e.queued = true;
  ready_.emplace(e.seq, key);
}

void Coordinator::AddRequests(int rank, const std::vector<Request>& requests,
                              Clock::time_point now) {
  for (const Request& req : requests) {
    const TensorKey key = req.key();
    auto it = table_.find(key);
    if (it == table_.end()) {
      Entry e;
      e.seq = next_seq_++;
      e.first_seen = now;
      e.members = members_(key.process_set_id);
      if (e.members.empty()) {
        e.members = {rank};
        e.forced_error = std::string(OpTypeLowerName(req.type)) + " '" + req.tensor_name +
                         "': process set " + std::to_string(key.process_set_id) +
                         " does not exist (it was removed while the operation was in flight)";
      }
      it = table_.emplace(key, std::move(e)).first;
      sets_by_name_[key.name].insert(key.process_set_id);
    }
    Entry& e = it->second;
    if (e.by_rank.count(rank)) {
      e.forced_error = "tensor '" + req.tensor_name + "' was submitted twice by rank " +
                       std::to_string(rank) + " before the first submission completed";
    } else {
      e.by_rank.emplace(rank, req);
    }
    if (req.type == OpType::kJoin) {
      last_joined_ = rank;
      // A new joined rank may complete tensors of the global set.
      for (auto& [k, other] : table_) {
        if (k.process_set_id == kGlobalProcessSetId) MarkReadyIfComplete(k, other);
      }
    }
    MarkReadyIfComplete(key, e);
    if (sets_by_name_[key.name].size() > 1) CheckCrossedSets(key.name);
  }
}

// Two ranks that belong to both sets S and T, one of which submitted the name to S only and
// the other to T only, cannot both be right: neither tensor can ever complete. Once every
// member of S and T has submitted the name to one of them, both become errors instead of a
// stall.
void Coordinator::CheckCrossedSets(const std::string& name) {
  const std::set<int32_t>& sets = sets_by_name_[name];
  for (auto s = sets.begin(); s != sets.end(); ++s) {
    for (auto t = std::next(s); t != sets.end(); ++t) {
      Entry& es = table_.at(TensorKey{*s, name});
      Entry& et = table_.at(TensorKey{*t, name});
      bool only_s = false, only_t = false;
      for (int m : es.members) {
        if (!std::binary_search(et.members.begin(), et.members.end(), m)) continue;
        const bool in_s = es.by_rank.count(m) > 0, in_t = et.by_rank.count(m) > 0;
        only_s |= in_s && !in_t;
        only_t |= in_t && !in_s;
      }
      if (!only_s || !only_t) continue;
      // Decide only once every member of either set has submitted to one of the two, so the
      // message lists every rank and no late request starts a fresh (doomed) entry.
      bool complete = true;
      for (const Entry* e : {&es, &et}) {
        for (int m : e->members) complete &= es.by_rank.count(m) > 0 || et.by_rank.count(m) > 0;
      }
      if (!complete) continue;
      std::vector<Request> all;
      for (const auto& [r, q] : es.by_rank) all.push_back(q);
      for (const auto& [r, q] : et.by_rank) all.push_back(q);
      std::sort(all.begin(), all.end(),
                [](const Request& a, const Request& b) { return a.request_rank < b.request_rank; });
      std::vector<const Request*> ptrs;
      for (const Request& q : all) ptrs.push_back(&q);
      const std::string message =
          std::string(OpTypeLowerName(all.front().type)) + " '" + name +
          "': mismatched process sets: " +
          DescribeByRank(ptrs, [](const Request& q) { return std::to_string(q.process_set_id); }) +
          CalledFrom(ptrs);
      es.forced_error = et.forced_error = message;
      MarkReadyIfComplete(TensorKey{*s, name}, es);
      MarkReadyIfComplete(TensorKey{*t, name}, et);
    }
  }
}

Response Coordinator::Build(const TensorKey& key, const Entry& e) const {
  const Request& first = e.by_rank.begin()->second;
  if (!e.forced_error.empty()) {
    Response r = ErrorResponse(first, e.forced_error);
    r.process_set_id = key.process_set_id;
    return r;
  }
  std::vector<Request> reqs;
  for (const auto& [rank, q] : e.by_rank) reqs.push_back(q);
  std::vector<int> joined;
  if (key.process_set_id == kGlobalProcessSetId && key.name != kJoinName) {
    for (int m : e.members) {
      if (!e.by_rank.count(m)) joined.push_back(m);
    }
  }
  Response r = ConstructResponse(reqs, joined);
  if (r.type == OpType::kJoin) r.last_joined_rank = last_joined_;
  return r;
}

std::vector<Response> Coordinator::TakeReadyResponses() {
  std::vector<Response> out;
  std::vector<Response> joins;  // after everything else: joined ranks still contribute zeros
  for (const auto& [seq, key] : ready_) {
    auto it = table_.find(key);
    if (it == table_.end()) continue;  // dropped with its process set
    Response r = Build(key, it->second);
    const Request& first = it->second.by_rank.begin()->second;
    const int32_t group_size = first.group_size;
    const std::string group_name = first.group_name;
    table_.erase(it);
    auto names = sets_by_name_.find(key.name);
    names->second.erase(key.process_set_id);
    if (names->second.empty()) sets_by_name_.erase(names);

    if (r.type == OpType::kJoin) {
      joins.push_back(std::move(r));
    } else if (group_size > 1) {
      auto& held = held_groups_[TensorKey{key.process_set_id, group_name}];
      held.emplace_back(seq, std::move(r));
      if (static_cast<int32_t>(held.size()) >= group_size) {
        std::sort(held.begin(), held.end(),
                  [](const auto& a, const auto& b) { return a.first < b.first; });
        for (auto& [s, resp] : held) out.push_back(std::move(resp));
        held_groups_.erase(TensorKey{key.process_set_id, group_name});
      }
    } else {
      out.push_back(std::move(r));
    }
  }
  ready_.clear();
  for (Response& j : joins) out.push_back(std::move(j));
  return out;
}

void Coordinator::DropProcessSet(int32_t process_set_id) {
  for (auto it = table_.begin(); it != table_.end();) {
    if (it->first.process_set_id != process_set_id) {
      ++it;
      continue;
    }
    auto names = sets_by_name_.find(it->first.name);
    names->second.erase(process_set_id);
    if (names->second.empty()) sets_by_name_.erase(names);
    it = table_.erase(it);
  }
  for (auto it = held_groups_.begin(); it != held_groups_.end();) {
    it = it->first.process_set_id == process_set_id ? held_groups_.erase(it) : std::next(it);
  }
}

void Coordinator::Clear() {
  table_.clear();
  sets_by_name_.clear();
  ready_.clear();
  held_groups_.clear();
}

std::vector<Coordinator::Pending> Coordinator::PendingSince(Clock::time_point cutoff) const {
  std::map<uint64_t, Pending> ordered;
  const std::vector<int> joined = joined_ranks();
  for (const auto& [key, e] : table_) {
    if (e.first_seen > cutoff || e.queued) continue;
    Pending p{key, {}, e.first_seen, {}};
    const bool joins_count = key.process_set_id == kGlobalProcessSetId && key.name != kJoinName;
    for (int m : e.members) {
      if (e.by_rank.count(m)) continue;
      if (joins_count && std::binary_search(joined.begin(), joined.end(), m)) continue;
      p.missing_ranks.push_back(m);
    }
    if (!p.missing_ranks.empty()) {
      std::vector<const Request*> submitted;
      for (const auto& [rank, q] : e.by_rank) submitted.push_back(&q);
      p.submitted_at = CallSitesByRank(submitted);
    }
    ordered.emplace(e.seq, std::move(p));
  }
  std::vector<Pending> out;
  for (auto& [seq, p] : ordered) out.push_back(std::move(p));
  return out;
}

std::vector<int> Coordinator::joined_ranks() const {
  std::vector<int> out;
  auto it = table_.find(TensorKey{kGlobalProcessSetId, kJoinName});
  if (it == table_.end()) return out;
  for (const auto& [rank, q] : it->second.by_rank) out.push_back(rank);
  return out;
}

}  // namespace hvd
