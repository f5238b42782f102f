// horovod_cpp — Apache-2.0
#include "common/coordinator.h"

#include <cstdlib>
#include <cstdio>
#include <functional>
#include <utility>

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

// "rank 0 sent [2, 3]; ranks 1, 2 sent [4]": ranks grouped by the value they sent, groups in
// order of the lowest rank.
std::string DescribeByRank(const std::vector<Request>& reqs,
                           const std::function<std::string(const Request&)>& value) {
  std::vector<std::pair<std::string, std::vector<int>>> groups;
  for (size_t r = 0; r < reqs.size(); ++r) {
    std::string v = value(reqs[r]);
    bool placed = false;
    for (auto& g : groups) {
      if (g.first == v) {
        g.second.push_back(static_cast<int>(r));
        placed = true;
        break;
      }
    }
    if (!placed) groups.push_back({v, {static_cast<int>(r)}});
  }
  std::string out;
  for (size_t i = 0; i < groups.size(); ++i) {
    if (i) out += "; ";
    out += groups[i].second.size() == 1 ? "rank " : "ranks ";
    for (size_t k = 0; k < groups[i].second.size(); ++k) {
      if (k) out += ", ";
      out += std::to_string(groups[i].second[k]);
    }
    out += " sent " + groups[i].first;
  }
  return out;
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

}  // namespace

Response ConstructResponse(const std::vector<Request>& reqs) {
  const Request& first = reqs.front();
  const std::string prefix =
      std::string(OpTypeLowerName(first.type)) + " '" + first.tensor_name + "': mismatched ";

  // Each check: does every rank agree on this property? If not, the error lists each rank's
  // value. The first disagreement wins; the order puts the most fundamental first.
  struct Check {
    const char* what;
    bool applies;
    std::function<std::string(const Request&)> value;
  };
  const bool is_reduce = first.type == OpType::kAllreduce ||
                         first.type == OpType::kReducescatter || first.type == OpType::kAdasum;
  const bool same_shape = is_reduce || first.type == OpType::kBroadcast;
  const Check checks[] = {
      {"operations", true, [](const Request& q) { return std::string(OpTypeName(q.type)); }},
      {"data types", first.type != OpType::kBarrier,
       [](const Request& q) { return std::string(DataTypeName(q.dtype)); }},
      {"devices", first.type != OpType::kBarrier,
       [](const Request& q) { return DeviceToString(q.device); }},
      {"reduction ops", is_reduce,
       [](const Request& q) { return std::string(ReduceOpName(q.reduce_op)); }},
      {"prescale factors", is_reduce,
       [](const Request& q) { return FormatDouble(q.prescale_factor); }},
      {"postscale factors", is_reduce,
       [](const Request& q) { return FormatDouble(q.postscale_factor); }},
      {"shapes", same_shape, [](const Request& q) { return ShapeToString(q.shape); }},
      {"root ranks", first.type == OpType::kBroadcast,
       [](const Request& q) { return std::to_string(q.root_rank); }},
  };
  for (const Check& check : checks) {
    if (!check.applies) continue;
    const std::string v0 = check.value(first);
    for (const Request& q : reqs) {
      if (check.value(q) != v0) {
        return ErrorResponse(first, prefix + check.what + ": " + DescribeByRank(reqs, check.value));
      }
    }
  }

  Response r;
  r.type = first.type;
  r.dtype = first.dtype;
  r.reduce_op = first.reduce_op;
  r.root_rank = first.root_rank;
  r.device = first.device;
  r.process_set_id = first.process_set_id;
  r.prescale_factor = first.prescale_factor;
  r.postscale_factor = first.postscale_factor;
  r.tensor_names = {first.tensor_name};
  if (first.type != OpType::kBarrier) r.tensor_sizes = {NumElements(first.shape)};
  return r;
}

Coordinator::Coordinator(int set_size) : size_(set_size) {}

void Coordinator::AddRequests(int rank, const std::vector<Request>& requests,
                              Clock::time_point now) {
  for (const Request& req : requests) {
    auto it = table_.find(req.tensor_name);
    if (it == table_.end()) {
      Entry e;
      e.seq = next_seq_++;
      e.first_seen = now;
      e.by_rank.resize(size_);
      e.present.assign(size_, false);
      it = table_.emplace(req.tensor_name, std::move(e)).first;
    }
    Entry& e = it->second;
    if (rank < 0 || rank >= size_) continue;  // cannot happen: ranks come from the transport
    if (e.present[rank]) {
      e.protocol_error = "tensor '" + req.tensor_name + "' was submitted twice by rank " +
                         std::to_string(rank) + " before the first submission completed";
      continue;
    }
    e.by_rank[rank] = req;
    e.present[rank] = true;
    if (++e.count == size_) ready_.emplace(e.seq, req.tensor_name);
  }
}

std::vector<Response> Coordinator::TakeReadyResponses() {
  std::vector<Response> out;
  out.reserve(ready_.size());
  for (const auto& [seq, name] : ready_) {
    auto it = table_.find(name);
    Entry& e = it->second;
    if (!e.protocol_error.empty()) {
      out.push_back(ErrorResponse(e.by_rank.front(), e.protocol_error));
    } else {
      out.push_back(ConstructResponse(e.by_rank));
    }
    table_.erase(it);
  }
  ready_.clear();
  return out;
}

std::vector<Coordinator::Pending> Coordinator::PendingSince(Clock::time_point cutoff) const {
  std::map<uint64_t, Pending> ordered;
  for (const auto& [name, e] : table_) {
    if (e.first_seen > cutoff) continue;
    Pending p{name, {}, e.first_seen};
    for (int r = 0; r < size_; ++r) {
      if (!e.present[r]) p.missing_ranks.push_back(r);
    }
    ordered.emplace(e.seq, std::move(p));
  }
  std::vector<Pending> out;
  for (auto& [seq, p] : ordered) out.push_back(std::move(p));
  return out;
}

}  // namespace hvd
