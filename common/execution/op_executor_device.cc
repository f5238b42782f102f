// horovod_cpp — Apache-2.0
// OpExecutor's methods for CUDA tensors (see op_executor.h): the same agreed responses and
// layouts as the host methods, run by the device backend on its own stream without waiting
// for the GPU. Each entry's result carries the completion event.
#include <string>

#include "common/execution/collective_layout.h"
#include "common/execution/op_executor.h"

namespace hvd {
namespace {

int DeviceOf(const std::vector<TensorTableEntry>& entries) { return entries.front().input.device; }
void* StreamOf(const std::vector<TensorTableEntry>& entries) {
  return entries.front().input.stream;
}

// Linear scaling folds into one factor; Average with a factor becomes Sum times factor/size.
std::pair<ReduceOp, double> FoldScaling(const Response& r, int set_size) {
  ReduceOp op = r.reduce_op;
  double scale = r.prescale_factor * r.postscale_factor;
  if (op == ReduceOp::kAverage && scale != 1.0) {
    op = ReduceOp::kSum;
    scale /= set_size;
  }
  return {op, scale};
}

}  // namespace

Status OpExecutor::CheckDeviceEntries(const Response& r,
                                      const std::vector<TensorTableEntry>& entries) const {
  const std::string what = OpTypeLowerName(r.type);
  if (device_ == nullptr) {
    return Status::FailedPrecondition(
        what + ": CUDA tensors need a horovod_cpp built with NCCL (-DHVD_WITH_NCCL=ON)");
  }
  for (const TensorTableEntry& e : entries) {
    if (e.input.data == nullptr && r.type == OpType::kAllreduce) {
      return Status::FailedPrecondition(
          "allreduce of CUDA tensors while a rank has joined is not supported; join with CPU "
          "tensors, or keep every rank training");
    }
  }
  if (entries.empty()) return Status::Internal(what + ": no entries to run on the device");
  for (const TensorTableEntry& e : entries) {
    if (e.input.device != DeviceOf(entries)) {
      return Status::InvalidArgument(what +
                                     ": tensors fused together are on different GPUs of this "
                                     "rank (" +
                                     DeviceToString(DeviceOf(entries)) + ", " +
                                     DeviceToString(e.input.device) + ")");
    }
  }
  return Status::OK();
}

Status OpExecutor::Completed(const Result<ops::Event>& event,
                             std::vector<TensorTableEntry>& entries, size_t first, size_t last) {
  if (!event.ok()) return event.status();
  for (size_t i = first; i < last; ++i) entries[i].result->ready_event = *event;
  return Status::OK();
}

Status OpExecutor::DeviceAllreduce(const Response& r, const Set& set,
                                   std::vector<TensorTableEntry>& entries) {
  const auto [op, scale] = FoldScaling(r, set.size);
  std::vector<ops::DeviceTensor> tensors;
  for (size_t i = 0; i < entries.size(); ++i) {
    tensors.push_back({entries[i].input.data, entries[i].output.data, r.tensor_sizes[i]});
  }
  counters_->allreduce_calls.fetch_add(1, std::memory_order_relaxed);
  auto scope = Activity(this, device_->ActivityName(r.type));
  return Completed(device_->Allreduce(r.process_set_id, set.size, set.rank, DeviceOf(entries),
                                      StreamOf(entries), tensors, r.dtype, op, scale),
                   entries, 0, entries.size());
}

Status OpExecutor::DeviceBroadcast(const Response& r, const Set& set,
                                   std::vector<TensorTableEntry>& entries) {
  const int64_t elem = DataTypeSize(r.dtype);
  const int root = RootInSet(set.ranks, r.root_rank);
  for (size_t i = 0; i < entries.size(); ++i) {
    counters_->broadcast_calls.fetch_add(1, std::memory_order_relaxed);
    auto scope = Activity(this, device_->ActivityName(r.type), i, i + 1);
    HVD_RETURN_IF_ERROR(Completed(
        device_->Broadcast(r.process_set_id, set.size, set.rank, DeviceOf(entries),
                           StreamOf(entries), entries[i].input.data, entries[i].output.data,
                           r.tensor_sizes[i] * elem, root),
        entries, i, i + 1));
  }
  return Status::OK();
}

Status OpExecutor::DeviceAllgather(const Response& r, const Set& set,
                                   std::vector<TensorTableEntry>& entries) {
  for (size_t t = 0; t < entries.size(); ++t) {
    TensorTableEntry& e = entries[t];
    const Layout l = AllgatherTensor(r, t, set.size);
    HVD_ASSIGN_OR_RETURN(e.result->data,
                         device_->Allocate(DeviceOf(entries),
                                           ShapeResult(e, r.dtype, AllgatherRows(r, t, set.size))));
    counters_->allgather_calls.fetch_add(1, std::memory_order_relaxed);
    auto scope = Activity(this, device_->ActivityName(r.type), t, t + 1);
    HVD_RETURN_IF_ERROR(Completed(
        device_->Allgatherv(r.process_set_id, set.size, set.rank, DeviceOf(entries),
                            StreamOf(entries), e.input.data, e.result->data.get(), l.counts,
                            l.displs, r.dtype),
        entries, t, t + 1));
  }
  return Status::OK();
}

Status OpExecutor::DeviceAlltoall(const Response& r, const Set& set,
                                  std::vector<TensorTableEntry>& entries) {
  const AlltoallLayout l = AlltoallOf(r, set.size, set.rank);
  TensorTableEntry& e = entries.front();
  HVD_ASSIGN_OR_RETURN(e.result->data,
                       device_->Allocate(DeviceOf(entries), ShapeResult(e, r.dtype, l.rows_in)));
  e.result->received_splits = l.received_rows;
  counters_->alltoall_calls.fetch_add(1, std::memory_order_relaxed);
  auto scope = Activity(this, device_->ActivityName(r.type));
  return Completed(device_->Alltoallv(r.process_set_id, set.size, set.rank, DeviceOf(entries),
                                      StreamOf(entries), e.input.data, l.send.counts,
                                      l.send.displs, e.result->data.get(), l.recv.counts,
                                      l.recv.displs, r.dtype),
                   entries, 0, 1);
}

Status OpExecutor::DeviceReducescatter(const Response& r, const Set& set,
                                       std::vector<TensorTableEntry>& entries) {
  const auto [op, scale] = FoldScaling(r, set.size);
  for (size_t t = 0; t < entries.size(); ++t) {
    TensorTableEntry& e = entries[t];
    const Layout l = ReducescatterTensor(e.input.shape, set.size);
    counters_->reducescatter_calls.fetch_add(1, std::memory_order_relaxed);
    auto scope = Activity(this, device_->ActivityName(r.type), t, t + 1);
    HVD_RETURN_IF_ERROR(Completed(
        device_->ReduceScatter(r.process_set_id, set.size, set.rank, DeviceOf(entries),
                               StreamOf(entries), e.input.data, e.output.data, l.counts, r.dtype,
                               op, scale),
        entries, t, t + 1));
  }
  return Status::OK();
}

}  // namespace hvd
