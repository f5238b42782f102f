// horovod_cpp — Apache-2.0
#include "common/fusion_planner.h"

#include <map>
#include <tuple>

namespace hvd {
namespace {

// Everything two responses must share to be fused; the first field says which kind of fusion.
using FusionKey =
    std::tuple<OpType, DataType, ReduceOp, double, double, int32_t, int32_t, int32_t>;

bool Fusable(const Response& r) {
  return r.type == OpType::kAllreduce || r.type == OpType::kBroadcast;
}

FusionKey KeyOf(const Response& r) {
  if (r.type == OpType::kAllreduce) {
    return {r.type, r.dtype, r.reduce_op, r.prescale_factor, r.postscale_factor, r.device,
            r.process_set_id, -1};
  }
  return {r.type, r.dtype, ReduceOp::kSum, 1.0, 1.0, r.device, r.process_set_id, r.root_rank};
}

}  // namespace

int64_t ResponseBytes(const Response& response) {
  int64_t elements = 0;
  for (int64_t n : response.tensor_sizes) elements += n;
  return elements * DataTypeSize(response.dtype);
}

std::vector<Response> FuseResponses(const std::vector<Response>& responses,
                                    int64_t threshold_bytes) {
  std::vector<Response> groups;
  std::vector<int64_t> group_bytes;
  std::map<FusionKey, size_t> open;  // key -> index of the group still accepting tensors

  for (const Response& r : responses) {
    if (r.type == OpType::kBarrier || r.type == OpType::kJoin) open.clear();
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
