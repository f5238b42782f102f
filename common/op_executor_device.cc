// horovod_cpp — Apache-2.0
// OpExecutor's path for CUDA tensors (see op_executor.h): the same agreed responses as the
// host path, run by the device backend on its own stream without waiting for the GPU.
#include <algorithm>
#include <string>

#include "common/coordinator.h"
#include "common/op_executor.h"

namespace hvd {

Status OpExecutor::ExecuteOnDevice(const Response& r, const Set& set,
                                   std::vector<TensorTableEntry>& entries) {
  if (device_ == nullptr) {
    return Status::FailedPrecondition(
        std::string(OpTypeLowerName(r.type)) +
        ": CUDA tensors need a horovod_cpp built with NCCL (-DHVD_WITH_NCCL=ON)");
  }
  for (const TensorTableEntry& e : entries) {
    if (e.input.data == nullptr && r.type == OpType::kAllreduce) {
      return Status::FailedPrecondition(
          "allreduce of CUDA tensors while a rank has joined is not supported; join with CPU "
          "tensors, or keep every rank training");
    }
  }
  if (entries.empty()) return Status::OK();
  const int device = entries.front().input.device;
  void* stream = entries.front().input.stream;
  for (const TensorTableEntry& e : entries) {
    if (e.input.device != device) {
      return Status::InvalidArgument(std::string(OpTypeLowerName(r.type)) +
                                     ": tensors fused together are on different GPUs of this "
                                     "rank (" +
                                     DeviceToString(device) + ", " +
                                     DeviceToString(e.input.device) + ")");
    }
  }
  const int64_t elem = DataTypeSize(r.dtype);
  auto done = [&](const Result<ops::Event>& ev, size_t first, size_t last) {
    if (!ev.ok()) return ev.status();
    for (size_t i = first; i < last; ++i) entries[i].result->ready_event = *ev;
    return Status::OK();
  };
  // Linear scaling folds into one factor; Average with a factor becomes Sum times factor/size.
  ReduceOp op = r.reduce_op;
  double scale = r.prescale_factor * r.postscale_factor;
  if (op == ReduceOp::kAverage && scale != 1.0) {
    op = ReduceOp::kSum;
    scale /= set.size;
  }

  switch (r.type) {
    case OpType::kAllreduce: {
      std::vector<ops::DeviceTensor> tensors;
      for (size_t i = 0; i < entries.size(); ++i) {
        tensors.push_back({entries[i].input.data, entries[i].output.data, r.tensor_sizes[i]});
      }
      counters_->allreduce_calls.fetch_add(1, std::memory_order_relaxed);
      auto scope = Activity(this, device_->ActivityName(r.type));
      return done(device_->Allreduce(r.process_set_id, set.size, set.rank, device, stream, tensors,
                                     r.dtype, op, scale),
                  0, entries.size());
    }
    case OpType::kBroadcast: {
      const auto pos = std::lower_bound(set.ranks.begin(), set.ranks.end(), r.root_rank);
      const int root = static_cast<int>(pos - set.ranks.begin());
      for (size_t i = 0; i < entries.size(); ++i) {
        counters_->broadcast_calls.fetch_add(1, std::memory_order_relaxed);
        auto scope = Activity(this, device_->ActivityName(r.type), i, i + 1);
        HVD_RETURN_IF_ERROR(
            done(device_->Broadcast(r.process_set_id, set.size, set.rank, device, stream,
                                    entries[i].input.data, entries[i].output.data,
                                    r.tensor_sizes[i] * elem, root),
                 i, i + 1));
      }
      return Status::OK();
    }
    case OpType::kAllgather: {
      const size_t n = static_cast<size_t>(set.size);
      for (size_t t = 0; t < entries.size(); ++t) {
        TensorTableEntry& e = entries[t];
        std::vector<int64_t> counts(n);
        int64_t dim0 = 0;
        for (size_t q = 0; q < n; ++q) {
          const int64_t rows = r.rank_sizes[t * n + q];
          counts[q] = rows * r.tensor_sizes[t];
          dim0 += rows;
        }
        TensorShape shape = e.input.shape;
        shape[0] = dim0;
        HVD_ASSIGN_OR_RETURN(e.result->data, device_->Allocate(device, NumElements(shape) * elem));
        e.result->dtype = r.dtype;
        e.result->shape = shape;
        counters_->allgather_calls.fetch_add(1, std::memory_order_relaxed);
        auto scope = Activity(this, device_->ActivityName(r.type), t, t + 1);
        HVD_RETURN_IF_ERROR(done(
            device_->Allgatherv(r.process_set_id, set.size, set.rank, device, stream, e.input.data,
                                e.result->data.get(), counts, Displacements(counts), r.dtype),
            t, t + 1));
      }
      return Status::OK();
    }
    case OpType::kAlltoall: {
      const size_t n = static_cast<size_t>(set.size), me = static_cast<size_t>(set.rank);
      const int64_t row = r.tensor_sizes.front();
      TensorTableEntry& e = entries.front();
      std::vector<int64_t> send_counts(n), recv_counts(n), received(n);
      int64_t rows_in = 0;
      for (size_t d = 0; d < n; ++d) {
        send_counts[d] = r.rank_sizes[me * n + d] * row;
        received[d] = r.rank_sizes[d * n + me];
        recv_counts[d] = received[d] * row;
        rows_in += received[d];
      }
      TensorShape shape = e.input.shape;
      shape[0] = rows_in;
      HVD_ASSIGN_OR_RETURN(e.result->data, device_->Allocate(device, NumElements(shape) * elem));
      e.result->dtype = r.dtype;
      e.result->shape = shape;
      e.result->received_splits = received;
      counters_->alltoall_calls.fetch_add(1, std::memory_order_relaxed);
      auto scope = Activity(this, device_->ActivityName(r.type));
      return done(
          device_->Alltoallv(r.process_set_id, set.size, set.rank, device, stream, e.input.data,
                             send_counts, Displacements(send_counts), e.result->data.get(),
                             recv_counts, Displacements(recv_counts), r.dtype),
          0, 1);
    }
    case OpType::kReducescatter: {
      for (size_t t = 0; t < entries.size(); ++t) {
        TensorTableEntry& e = entries[t];
        std::vector<int64_t> recv_counts(static_cast<size_t>(set.size));
        for (int q = 0; q < set.size; ++q) {
          recv_counts[static_cast<size_t>(q)] =
              ReducescatterRows(e.input.shape[0], set.size, q) * RowElements(e.input.shape);
        }
        counters_->reducescatter_calls.fetch_add(1, std::memory_order_relaxed);
        auto scope = Activity(this, device_->ActivityName(r.type), t, t + 1);
        HVD_RETURN_IF_ERROR(done(
            device_->ReduceScatter(r.process_set_id, set.size, set.rank, device, stream,
                                   e.input.data, e.output.data, recv_counts, r.dtype, op, scale),
            t, t + 1));
      }
      return Status::OK();
    }
    default:
      return Status::Internal(std::string("no device executor for ") + OpTypeName(r.type));
  }
}

}  // namespace hvd
