// horovod_cpp — Apache-2.0
#pragma once
// Negotiation messages and their wire format.
//
// A Request is what one rank says about one tensor ("I have 'grad.w', ALLREDUCE, float32,
// [128, 64], Sum"). Ranks send RequestLists to the coordinator, global rank 0 for every
// process set (one control plane, common/negotiation/controller.h), which answers with a ResponseList: one
// Response per tensor that every member of its set has asked for, or an ERROR Response naming
// the tensor and what each rank sent.
//
// Wire format (version 2: the request's call site), little-endian:
//   magic "HVDW" | u16 version | u16 kind (1 = RequestList, 2 = ResponseList)
//   | u32 payload length | u32 CRC-32 of payload | payload
// Parsing checks every length against the bytes that remain and validates enum values, so a
// truncated, corrupted or hostile buffer yields an error Status, never a crash or an over-read.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "base/status.h"
#include "base/types.h"

namespace hvd {

// A tensor is identified by its process set and its name.
struct TensorKey {
  int32_t process_set_id = kGlobalProcessSetId;
  std::string name;
  bool operator==(const TensorKey& o) const {
    return process_set_id == o.process_set_id && name == o.name;
  }
  bool operator<(const TensorKey& o) const {
    return process_set_id != o.process_set_id ? process_set_id < o.process_set_id : name < o.name;
  }
};
// The tensor's row in the timeline: its name, plus the process set when not the global one.
std::string TimelineRow(const TensorKey& key);

struct TensorKeyHash {
  size_t operator()(const TensorKey& k) const {
    return std::hash<std::string>()(k.name) * 31u + static_cast<size_t>(k.process_set_id);
  }
};

struct Request {
  int32_t request_rank = 0;
  OpType type = OpType::kAllreduce;
  DataType dtype = DataType::kFloat32;
  ReduceOp reduce_op = ReduceOp::kSum;
  int32_t root_rank = -1;  // broadcast only
  int32_t device = kCpuDevice;
  int32_t process_set_id = kGlobalProcessSetId;
  // Grouped ops: every member carries the group's name and size; the coordinator releases
  // the members together once all of them are ready on every rank.
  int32_t group_size = 0;
  std::string group_name;
  double prescale_factor = 1.0;
  double postscale_factor = 1.0;
  std::string tensor_name;
  TensorShape shape;
  // ALLTOALL: elements of dim 0 sent to each rank of the set. PROCESS_SET_ADD: the ranks.
  // PROCESS_SET_REMOVE: the id to remove.
  std::vector<int64_t> splits;
  // Where the caller submitted it ("train.py:42"; empty when unknown): the Python binding
  // takes it from the caller's frame, C++ callers pass it (hvd::CallSite). Only messages use
  // it: mismatch errors, stall warnings, deadlock and collective-timeout reports.
  std::string call_site;

  TensorKey key() const { return {process_set_id, tensor_name}; }
  bool operator==(const Request& o) const;
};

struct Response {
  OpType type = OpType::kAllreduce;
  DataType dtype = DataType::kFloat32;
  ReduceOp reduce_op = ReduceOp::kSum;
  int32_t root_rank = -1;
  int32_t device = kCpuDevice;
  int32_t process_set_id = kGlobalProcessSetId;
  int32_t last_joined_rank = -1;
  int32_t group_size = 0;  // > 0: members of a grouped op (never cached)
  double prescale_factor = 1.0;
  double postscale_factor = 1.0;
  std::vector<std::string> tensor_names;
  // Per tensor, in tensor_names order: ALLREDUCE/BROADCAST/REDUCESCATTER: elements;
  // ALLGATHER/ALLTOALL: elements of one row (product of the dims after the first).
  std::vector<int64_t> tensor_sizes;
  // ALLGATHER: first dimension of every rank of the set, for each tensor in turn.
  // ALLTOALL: the set-size x set-size split matrix (row r: what rank r sends to each rank).
  // PROCESS_SET_ADD: the ranks of the new set; PROCESS_SET_REMOVE: the id.
  std::vector<int64_t> rank_sizes;
  std::string error_message;  // ERROR responses only

  bool operator==(const Response& o) const;
};

struct RequestList {
  std::vector<Request> requests;
  bool shutdown = false;
  std::string shutdown_host;  // with shutdown: the requesting rank's host, for the message
  bool operator==(const RequestList& o) const {
    return requests == o.requests && shutdown == o.shutdown && shutdown_host == o.shutdown_host;
  }
};

struct ResponseList {
  std::vector<Response> responses;
  bool shutdown = false;
  bool shutdown_after_stall = false;  // the stall inspector, not a Shutdown() call
  std::string shutdown_reason;        // why, when shutdown is set (e.g. "requested by rank 1")
  bool operator==(const ResponseList& o) const {
    return responses == o.responses && shutdown == o.shutdown &&
           shutdown_after_stall == o.shutdown_after_stall && shutdown_reason == o.shutdown_reason;
  }
};

constexpr uint16_t kWireVersion = 2;
// Limits enforced by the parser (a real message is far below them).
constexpr size_t kMaxNameBytes = 1 << 20;
constexpr size_t kMaxTensorRank = 64;
constexpr size_t kMaxSplits = size_t{1} << 24;  // e.g. a 4096 x 4096 alltoall matrix
constexpr size_t kMaxErrorBytes = 1 << 20;
constexpr size_t kMaxCallSiteBytes = 4096;

// "ranks 0, 1 at train.py:42; rank 2 at train.py:57": the requests' ranks grouped by call
// site, groups in order of their lowest rank; "" when no request has one.
std::string CallSitesByRank(const std::vector<const Request*>& requests);

std::vector<uint8_t> SerializeRequestList(const RequestList& list);
std::vector<uint8_t> SerializeResponseList(const ResponseList& list);
Result<RequestList> ParseRequestList(const uint8_t* data, size_t size);
Result<ResponseList> ParseResponseList(const uint8_t* data, size_t size);

}  // namespace hvd
