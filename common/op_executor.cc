// horovod_cpp — Apache-2.0
#include "common/op_executor.h"

#include <cstdlib>
#include <cstring>

#include "ops/reduce_kernels.h"

namespace hvd {

void OpExecutor::FreeDeleter::operator()(uint8_t* p) const { std::free(p); }

OpExecutor::OpExecutor(ops::Backend* backend, Counters* counters)
    : backend_(backend), counters_(counters) {}

uint8_t* OpExecutor::FusionBuffer(int64_t bytes) {
  if (bytes > buffer_bytes_) {
    constexpr int64_t kAlign = 64;
    const int64_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
    buffer_.reset(static_cast<uint8_t*>(std::aligned_alloc(kAlign, static_cast<size_t>(rounded))));
    HVD_CHECK(buffer_ != nullptr);
    buffer_bytes_ = rounded;
    counters_->fusion_buffer_bytes.store(static_cast<uint64_t>(rounded));
  }
  return buffer_.get();
}

Status OpExecutor::Execute(const Response& response, std::vector<TensorTableEntry>& entries) {
  switch (response.type) {
    case OpType::kError:
      return Status::FailedPrecondition(response.error_message);
    case OpType::kAllreduce:
      return ExecuteAllreduce(response, entries);
    case OpType::kBroadcast:
      return ExecuteBroadcast(response, entries);
    case OpType::kBarrier:
      counters_->barrier_calls.fetch_add(1, std::memory_order_relaxed);
      return backend_->Barrier();
    default:
      return Status::Internal(std::string("no executor for ") + OpTypeName(response.type));
  }
}

Status OpExecutor::ExecuteAllreduce(const Response& r, std::vector<TensorTableEntry>& entries) {
  const DataType dtype = r.dtype;
  const int64_t elem = DataTypeSize(dtype);
  // Average = Sum, then an exact division by the number of ranks, then the postscale.
  const bool average = r.reduce_op == ReduceOp::kAverage;
  const ReduceOp op = average ? ReduceOp::kSum : r.reduce_op;
  const int64_t ranks = backend_->topology().size;
  auto finish = [&](void* buf, int64_t n) {
    if (average) ops::DivideBuffer(buf, n, dtype, ranks);
    ops::ScaleBuffer(buf, n, dtype, r.postscale_factor);
  };

  if (entries.size() == 1) {
    TensorTableEntry& e = entries.front();
    const int64_t n = NumElements(e.output.shape);
    if (n == 0) return Status::OK();
    const bool aliased = e.input.data == e.output.data;
    const void* send = aliased ? nullptr : e.input.data;
    if (r.prescale_factor != 1.0) {
      // Scale a copy, never the caller's input.
      if (!aliased) std::memcpy(e.output.data, e.input.data, static_cast<size_t>(n * elem));
      ops::ScaleBuffer(e.output.data, n, dtype, r.prescale_factor);
      send = nullptr;
    }
    counters_->allreduce_calls.fetch_add(1, std::memory_order_relaxed);
    HVD_RETURN_IF_ERROR(backend_->Allreduce(send, e.output.data, n, dtype, op));
    finish(e.output.data, n);
    return Status::OK();
  }

  int64_t total = 0;
  for (const TensorTableEntry& e : entries) total += NumElements(e.input.shape);
  if (total == 0) return Status::OK();
  uint8_t* buf = FusionBuffer(total * elem);
  int64_t offset = 0;
  for (const TensorTableEntry& e : entries) {
    const int64_t bytes = NumElements(e.input.shape) * elem;
    std::memcpy(buf + offset, e.input.data, static_cast<size_t>(bytes));
    offset += bytes;
  }
  ops::ScaleBuffer(buf, total, dtype, r.prescale_factor);
  counters_->allreduce_calls.fetch_add(1, std::memory_order_relaxed);
  HVD_RETURN_IF_ERROR(backend_->Allreduce(nullptr, buf, total, dtype, op));
  finish(buf, total);
  offset = 0;
  for (TensorTableEntry& e : entries) {
    const int64_t bytes = NumElements(e.output.shape) * elem;
    std::memcpy(e.output.data, buf + offset, static_cast<size_t>(bytes));
    offset += bytes;
  }
  return Status::OK();
}

Status OpExecutor::ExecuteBroadcast(const Response& r, std::vector<TensorTableEntry>& entries) {
  const int64_t elem = DataTypeSize(r.dtype);
  const bool is_root = backend_->topology().rank == r.root_rank;

  if (entries.size() == 1) {
    TensorTableEntry& e = entries.front();
    const int64_t bytes = NumElements(e.output.shape) * elem;
    if (bytes == 0) return Status::OK();
    if (is_root && e.input.data != e.output.data) {
      std::memcpy(e.output.data, e.input.data, static_cast<size_t>(bytes));
    }
    counters_->broadcast_calls.fetch_add(1, std::memory_order_relaxed);
    return backend_->Broadcast(e.output.data, bytes, r.root_rank);
  }

  int64_t total = 0;
  for (const TensorTableEntry& e : entries) total += NumElements(e.output.shape) * elem;
  if (total == 0) return Status::OK();
  uint8_t* buf = FusionBuffer(total);
  if (is_root) {
    int64_t offset = 0;
    for (const TensorTableEntry& e : entries) {
      const int64_t bytes = NumElements(e.input.shape) * elem;
      std::memcpy(buf + offset, e.input.data, static_cast<size_t>(bytes));
      offset += bytes;
    }
  }
  counters_->broadcast_calls.fetch_add(1, std::memory_order_relaxed);
  HVD_RETURN_IF_ERROR(backend_->Broadcast(buf, total, r.root_rank));
  int64_t offset = 0;
  for (TensorTableEntry& e : entries) {
    const int64_t bytes = NumElements(e.output.shape) * elem;
    std::memcpy(e.output.data, buf + offset, static_cast<size_t>(bytes));
    offset += bytes;
  }
  return Status::OK();
}

}  // namespace hvd
