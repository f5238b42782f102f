// horovod_cpp — Apache-2.0
#include "common/protocol/message.h"

#include <algorithm>
#include <cstring>

#include "common/protocol/wire.h"

namespace hvd {
namespace {

constexpr uint8_t kMagic[4] = {'H', 'V', 'D', 'W'};
constexpr size_t kHeaderBytes = 16;
enum class Kind : uint16_t { kRequestList = 1, kResponseList = 2 };

// Smallest encodings, used to reject counts that cannot fit in the remaining bytes.
constexpr size_t kMinRequestBytes = 4 + 4 + 4 * 4 + 8 * 2 + 4 * 5;
constexpr size_t kMinResponseBytes = 4 + 5 * 4 + 8 * 2 + 4 * 4;

void WriteEnums(wire::Writer& w, OpType type, DataType dtype, ReduceOp op) {
  w.U8(static_cast<uint8_t>(type));
  w.U8(static_cast<uint8_t>(dtype));
  w.U8(static_cast<uint8_t>(op));
  w.U8(0);  // reserved
}

void WriteRequest(wire::Writer& w, const Request& r) {
  w.I32(r.request_rank);
  WriteEnums(w, r.type, r.dtype, r.reduce_op);
  w.I32(r.root_rank);
  w.I32(r.device);
  w.I32(r.process_set_id);
  w.I32(r.group_size);
  w.F64(r.prescale_factor);
  w.F64(r.postscale_factor);
  w.Str(r.group_name);
  w.Str(r.tensor_name);
  w.I64Vec(r.shape);
  w.I64Vec(r.splits);
  w.Str(r.call_site);
}

void WriteResponse(wire::Writer& w, const Response& r) {
  WriteEnums(w, r.type, r.dtype, r.reduce_op);
  w.I32(r.root_rank);
  w.I32(r.device);
  w.I32(r.process_set_id);
  w.I32(r.last_joined_rank);
  w.I32(r.group_size);
  w.F64(r.prescale_factor);
  w.F64(r.postscale_factor);
  w.U32(static_cast<uint32_t>(r.tensor_names.size()));
  for (const std::string& n : r.tensor_names) w.Str(n);
  w.I64Vec(r.tensor_sizes);
  w.I64Vec(r.rank_sizes);
  w.Str(r.error_message);
}

Status ReadEnums(wire::Reader& rd, OpType* type, DataType* dtype, ReduceOp* op) {
  uint8_t t = 0, d = 0, o = 0, reserved = 0;
  HVD_RETURN_IF_ERROR(rd.U8(&t, "op type"));
  HVD_RETURN_IF_ERROR(rd.U8(&d, "dtype"));
  HVD_RETURN_IF_ERROR(rd.U8(&o, "reduce op"));
  HVD_RETURN_IF_ERROR(rd.U8(&reserved, "reserved byte"));
  *type = static_cast<OpType>(t);
  *dtype = static_cast<DataType>(d);
  *op = static_cast<ReduceOp>(o);
  if (!IsValid(*type))
    return Status::InvalidArgument("corrupt message: op type " + std::to_string(t));
  if (!IsValid(*dtype))
    return Status::InvalidArgument("corrupt message: dtype " + std::to_string(d));
  if (!IsValid(*op))
    return Status::InvalidArgument("corrupt message: reduce op " + std::to_string(o));
  return Status::OK();
}

Status ReadRequest(wire::Reader& rd, Request* r) {
  HVD_RETURN_IF_ERROR(rd.I32(&r->request_rank, "request rank"));
  HVD_RETURN_IF_ERROR(ReadEnums(rd, &r->type, &r->dtype, &r->reduce_op));
  HVD_RETURN_IF_ERROR(rd.I32(&r->root_rank, "root rank"));
  HVD_RETURN_IF_ERROR(rd.I32(&r->device, "device"));
  HVD_RETURN_IF_ERROR(rd.I32(&r->process_set_id, "process set id"));
  HVD_RETURN_IF_ERROR(rd.I32(&r->group_size, "group size"));
  HVD_RETURN_IF_ERROR(rd.F64(&r->prescale_factor, "prescale factor"));
  HVD_RETURN_IF_ERROR(rd.F64(&r->postscale_factor, "postscale factor"));
  HVD_RETURN_IF_ERROR(rd.Str(&r->group_name, kMaxNameBytes, "group name"));
  HVD_RETURN_IF_ERROR(rd.Str(&r->tensor_name, kMaxNameBytes, "tensor name"));
  HVD_RETURN_IF_ERROR(rd.I64Vec(&r->shape, kMaxTensorRank, "tensor shape"));
  for (int64_t d : r->shape) {
    if (d < 0) return Status::InvalidArgument("corrupt message: negative dimension in shape");
  }
  HVD_RETURN_IF_ERROR(rd.I64Vec(&r->splits, kMaxSplits, "alltoall splits"));
  return rd.Str(&r->call_site, kMaxCallSiteBytes, "call site");
}

Status ReadResponse(wire::Reader& rd, Response* r) {
  HVD_RETURN_IF_ERROR(ReadEnums(rd, &r->type, &r->dtype, &r->reduce_op));
  HVD_RETURN_IF_ERROR(rd.I32(&r->root_rank, "root rank"));
  HVD_RETURN_IF_ERROR(rd.I32(&r->device, "device"));
  HVD_RETURN_IF_ERROR(rd.I32(&r->process_set_id, "process set id"));
  HVD_RETURN_IF_ERROR(rd.I32(&r->last_joined_rank, "last joined rank"));
  HVD_RETURN_IF_ERROR(rd.I32(&r->group_size, "group size"));
  HVD_RETURN_IF_ERROR(rd.F64(&r->prescale_factor, "prescale factor"));
  HVD_RETURN_IF_ERROR(rd.F64(&r->postscale_factor, "postscale factor"));
  uint32_t n = 0;
  HVD_RETURN_IF_ERROR(rd.Count(&n, 4, "tensor name count"));
  r->tensor_names.resize(n);
  for (uint32_t i = 0; i < n; ++i) {
    HVD_RETURN_IF_ERROR(rd.Str(&r->tensor_names[i], kMaxNameBytes, "tensor name"));
  }
  HVD_RETURN_IF_ERROR(rd.I64Vec(&r->tensor_sizes, kMaxSplits, "tensor sizes"));
  HVD_RETURN_IF_ERROR(rd.I64Vec(&r->rank_sizes, kMaxSplits, "per-rank sizes"));
  return rd.Str(&r->error_message, kMaxErrorBytes, "error message");
}

std::vector<uint8_t> Frame(Kind kind, std::vector<uint8_t> payload) {
  wire::Writer header;
  for (uint8_t b : kMagic) header.U8(b);
  header.U16(kWireVersion);
  header.U16(static_cast<uint16_t>(kind));
  header.U32(static_cast<uint32_t>(payload.size()));
  header.U32(wire::Crc32(payload.data(), payload.size()));
  std::vector<uint8_t> out = std::move(header.bytes());
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

// Checks the header and returns a reader positioned on the payload.
Result<wire::Reader> Unframe(Kind kind, const uint8_t* data, size_t size) {
  if (data == nullptr && size > 0) return Status::InvalidArgument("null message buffer");
  wire::Reader rd(data, size);
  uint8_t magic[4];
  for (uint8_t& b : magic) HVD_RETURN_IF_ERROR(rd.U8(&b, "magic"));
  if (std::memcmp(magic, kMagic, 4) != 0) {
    return Status::InvalidArgument("corrupt message: bad magic (not a horovod_cpp message)");
  }
  uint16_t version = 0, got_kind = 0;
  uint32_t length = 0, crc = 0;
  HVD_RETURN_IF_ERROR(rd.U16(&version, "version"));
  if (version != kWireVersion) {
    return Status::InvalidArgument("unsupported wire version " + std::to_string(version) +
                                   " (this build speaks " + std::to_string(kWireVersion) +
                                   "); are all ranks running the same horovod_cpp?");
  }
  HVD_RETURN_IF_ERROR(rd.U16(&got_kind, "kind"));
  if (got_kind != static_cast<uint16_t>(kind)) {
    return Status::InvalidArgument("corrupt message: kind " + std::to_string(got_kind) +
                                   ", expected " + std::to_string(static_cast<int>(kind)));
  }
  HVD_RETURN_IF_ERROR(rd.U32(&length, "payload length"));
  HVD_RETURN_IF_ERROR(rd.U32(&crc, "checksum"));
  if (length != rd.remaining()) {
    return Status::InvalidArgument("corrupt message: payload length " + std::to_string(length) +
                                   " but " + std::to_string(rd.remaining()) + " bytes follow");
  }
  if (wire::Crc32(data + kHeaderBytes, length) != crc) {
    return Status::InvalidArgument("corrupt message: checksum mismatch");
  }
  return wire::Reader(data + kHeaderBytes, length);
}

Status ExpectEnd(const wire::Reader& rd) {
  if (rd.remaining() != 0) {
    return Status::InvalidArgument("corrupt message: " + std::to_string(rd.remaining()) +
                                   " unexpected trailing bytes");
  }
  return Status::OK();
}

}  // namespace

std::string TimelineRow(const TensorKey& key) {
  if (key.process_set_id == kGlobalProcessSetId) return key.name;
  return key.name + " (process set " + std::to_string(key.process_set_id) + ")";
}

bool Request::operator==(const Request& o) const {
  return request_rank == o.request_rank && type == o.type && dtype == o.dtype &&
         reduce_op == o.reduce_op && root_rank == o.root_rank && device == o.device &&
         process_set_id == o.process_set_id && group_size == o.group_size &&
         group_name == o.group_name && prescale_factor == o.prescale_factor &&
         postscale_factor == o.postscale_factor && tensor_name == o.tensor_name &&
         shape == o.shape && splits == o.splits && call_site == o.call_site;
}

std::string CallSitesByRank(const std::vector<const Request*>& requests) {
  std::vector<std::pair<std::string, std::vector<int>>> groups;
  for (const Request* q : requests) {
    if (q->call_site.empty()) continue;
    auto it = std::find_if(groups.begin(), groups.end(),
                           [&](const auto& g) { return g.first == q->call_site; });
    if (it == groups.end()) {
      groups.push_back({q->call_site, {q->request_rank}});
    } else {
      it->second.push_back(q->request_rank);
    }
  }
  std::string out;
  for (size_t i = 0; i < groups.size(); ++i) {
    const std::vector<int>& ranks = groups[i].second;
    out += (i ? "; " : "") + std::string(ranks.size() == 1 ? "rank " : "ranks ");
    for (size_t j = 0; j < ranks.size(); ++j) out += (j ? ", " : "") + std::to_string(ranks[j]);
    out += " at " + groups[i].first;
  }
  return out;
}

bool Response::operator==(const Response& o) const {
  return type == o.type && dtype == o.dtype && reduce_op == o.reduce_op &&
         root_rank == o.root_rank && device == o.device && process_set_id == o.process_set_id &&
         last_joined_rank == o.last_joined_rank && group_size == o.group_size &&
         prescale_factor == o.prescale_factor && postscale_factor == o.postscale_factor &&
         tensor_names == o.tensor_names && tensor_sizes == o.tensor_sizes &&
         rank_sizes == o.rank_sizes && error_message == o.error_message;
}

std::vector<uint8_t> SerializeRequestList(const RequestList& list) {
  wire::Writer w;
  w.U8(list.shutdown ? 1 : 0);
  if (list.shutdown) w.Str(list.shutdown_host);
  w.U32(static_cast<uint32_t>(list.requests.size()));
  for (const Request& r : list.requests) WriteRequest(w, r);
  return Frame(Kind::kRequestList, std::move(w.bytes()));
}

std::vector<uint8_t> SerializeResponseList(const ResponseList& list) {
  wire::Writer w;
  w.U8(static_cast<uint8_t>((list.shutdown ? 1 : 0) | (list.shutdown_after_stall ? 2 : 0)));
  w.Str(list.shutdown_reason);
  w.U32(static_cast<uint32_t>(list.responses.size()));
  for (const Response& r : list.responses) WriteResponse(w, r);
  return Frame(Kind::kResponseList, std::move(w.bytes()));
}

Result<RequestList> ParseRequestList(const uint8_t* data, size_t size) {
  HVD_ASSIGN_OR_RETURN(wire::Reader rd, Unframe(Kind::kRequestList, data, size));
  RequestList list;
  uint8_t shutdown = 0;
  HVD_RETURN_IF_ERROR(rd.U8(&shutdown, "shutdown flag"));
  if (shutdown > 1) return Status::InvalidArgument("corrupt message: shutdown flag");
  list.shutdown = shutdown == 1;
  if (list.shutdown) HVD_RETURN_IF_ERROR(rd.Str(&list.shutdown_host, kMaxNameBytes, "host"));
  uint32_t n = 0;
  HVD_RETURN_IF_ERROR(rd.Count(&n, kMinRequestBytes, "request count"));
  list.requests.resize(n);
  for (uint32_t i = 0; i < n; ++i) HVD_RETURN_IF_ERROR(ReadRequest(rd, &list.requests[i]));
  HVD_RETURN_IF_ERROR(ExpectEnd(rd));
  return list;
}

Result<ResponseList> ParseResponseList(const uint8_t* data, size_t size) {
  HVD_ASSIGN_OR_RETURN(wire::Reader rd, Unframe(Kind::kResponseList, data, size));
  ResponseList list;
  uint8_t shutdown = 0;
  HVD_RETURN_IF_ERROR(rd.U8(&shutdown, "shutdown flags"));
  if (shutdown > 3) return Status::InvalidArgument("corrupt message: shutdown flags");
  list.shutdown = (shutdown & 1) != 0;
  list.shutdown_after_stall = (shutdown & 2) != 0;
  HVD_RETURN_IF_ERROR(rd.Str(&list.shutdown_reason, kMaxErrorBytes, "shutdown reason"));
  uint32_t n = 0;
  HVD_RETURN_IF_ERROR(rd.Count(&n, kMinResponseBytes, "response count"));
  list.responses.resize(n);
  for (uint32_t i = 0; i < n; ++i) HVD_RETURN_IF_ERROR(ReadResponse(rd, &list.responses[i]));
  HVD_RETURN_IF_ERROR(ExpectEnd(rd));
  return list;
}

}  // namespace hvd
