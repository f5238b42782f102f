// horovod_cpp — Apache-2.0
#pragma once
// Fusion planning: which ready tensors travel together in one collective.
//
// Allreduce and reducescatter responses fuse when they agree on dtype, reduction, prescale,
// postscale, device and process set; broadcasts when they agree on dtype, root, device and
// process set; allgathers on dtype, device and process set. A group grows until adding the
// next tensor would exceed the threshold (a single tensor larger than the threshold goes
// alone; for allgather the size counts every rank's rows). Alltoall is never fused, and a
// BARRIER, JOIN or process-set change closes every open group, so nothing moves across it.
//
// Deterministic and pure: every rank plans the same groups from the same ordered responses,
// so ranks that enqueued in different orders still run the same collectives in the same order.
// Groups run in the order of their first tensor.

#include <cstdint>
#include <vector>

#include "common/protocol/message.h"

namespace hvd {

// Bytes a single-tensor or fused response moves (elements x dtype size).
int64_t ResponseBytes(const Response& response);

// `threshold_bytes` == 0 disables fusion.
std::vector<Response> FuseResponses(const std::vector<Response>& responses,
                                    int64_t threshold_bytes);

}  // namespace hvd
