// horovod_cpp — Apache-2.0
#include "common/execution/fusion_planner.h"

#include <map>
#include <tuple>

namespace hvd {
namespace {

// Everything two responses must share to be fused; the first field says which kind of fusion.
using FusionKey = std::tuple<OpType, DataType, ReduceOp, double, double, int32_t, int32_t, int32_t>;

bool Fusable(const Response& r) {
  return r.type == OpType::kAllreduce || r.type == OpType::kBroadcast ||
         r.type == OpType::kAllgather || r.type == OpType::kReducescatter;
}

// Operations that order everything around them: nothing is fused across them.
bool IsFence(const Response& r) {
  return r.type == OpType::kBarrier || r.type == OpType::kJoin ||
         r.type == OpType::kProcessSetAdd || r.type == OpType::kProcessSetRemove;
}

FusionKey KeyOf(const Response& r) {
  switch (r.type) {
    case OpType::kAllreduce:
    case OpType::kReducescatter:
      return {r.type,   r.dtype,          r.reduce_op, r.prescale_factor, r.postscale_factor,
              r.device, r.process_set_id, -1};
    case OpType::kBroadcast:
      return {r.type, r.dtype, ReduceOp::kSum, 1.0, 1.0, r.device, r.process_set_id, r.root_rank};
    default:  // allgather
      return {r.type, r.dtype, ReduceOp::kSum, 1.0, 1.0, r.device, r.process_set_id, -1};
  }
}

}  // namespace

int64_t ResponseBytes(const Response& response) {
  int64_t elements = 0;
  if (response.type == OpType::kAllgather && !response.tensor_sizes.empty()) {
    // Rows of every rank times the row size, tensor by tensor.
    const size_t ranks = response.rank_sizes.size() / response.tensor_sizes.size();
    for (size_t t = 0; t < response.tensor_sizes.size(); ++t) {
      for (size_t r = 0; r < ranks; ++r) {
        elements += response.rank_sizes[t * ranks + r] * response.tensor_sizes[t];
      }
    }
  } else if (response.type == OpType::kAlltoall && !response.tensor_sizes.empty()) {
    for (int64_t rows : response.rank_sizes) elements += rows * response.tensor_sizes.front();
  } else {
    for (int64_t n : response.tensor_sizes) elements += n;
  }
  return elements * DataTypeSize(response.dtype);
}

std::vector<Response> FuseResponses(const std::vector<Response>& responses,
                                    int64_t threshold_bytes) {
  std::vector<Response> groups;
  std::vector<int64_t> group_bytes;
  std::map<FusionKey, size_t> open;  // key -> index of the group still accepting tensors

  for (const Response& r : responses) {
    if (IsFence(r)) open.clear();
    if (threshold_bytes <= 0 || !Fusable(r) || r.tensor_names.size() != 1) {
      groups.push_back(r);
      group_bytes.push_back(ResponseBytes(r));
      continue;
    }
    const int64_t bytes = ResponseBytes(r);
    const FusionKey key = KeyOf(r);
    auto it = open.find(key);
    if (it != open.end() && group_bytes[it->second] + bytes <= threshold_bytes) {
      Response& g = groups[it->second];
      g.tensor_names.push_back(r.tensor_names.front());
      g.tensor_sizes.push_back(r.tensor_sizes.front());
      g.rank_sizes.insert(g.rank_sizes.end(), r.rank_sizes.begin(), r.rank_sizes.end());
      group_bytes[it->second] += bytes;
      continue;
    }
    // A tensor above the threshold travels alone and leaves the open group open.
    if (bytes <= threshold_bytes) open[key] = groups.size();
    groups.push_back(r);
    group_bytes.push_back(bytes);
  }
  return groups;
}

}  // namespace hvd
