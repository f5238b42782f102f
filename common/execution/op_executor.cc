// horovod_cpp — Apache-2.0
#include "common/execution/op_executor.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <numeric>

#include "common/execution/collective_layout.h"
#include "ops/reduce_kernels.h"

namespace hvd {
namespace {

void Copy(void* dst, const void* src, int64_t bytes) {
  if (bytes > 0) std::memcpy(dst, src, static_cast<size_t>(bytes));
}

}  // namespace

void OpExecutor::FreeDeleter::operator()(uint8_t* p) const { std::free(p); }

OpExecutor::OpExecutor(ops::Backend* backend, const ProcessSetTable* sets, Counters* counters,
                       timeline::Timeline* timeline, int64_t chunk_bytes,
                       ops::DeviceCollectives* device)
    : backend_(backend),
      device_(device),
      sets_(sets),
      counters_(counters),
      timeline_(timeline),
      chunk_bytes_(chunk_bytes) {}

OpExecutor::Activity::Activity(const OpExecutor* ex, const char* activity, size_t first,
                               size_t last)
    : ex_(ex->rows_ != nullptr && ex->timeline_ != nullptr ? ex : nullptr) {
  if (!ex_) return;
  const std::vector<int32_t>& all = *ex_->rows_;
  last = std::min(last, all.size());
  if (first >= last) {
    ex_ = nullptr;
    return;
  }
  rows_.assign(all.begin() + static_cast<std::ptrdiff_t>(first),
               all.begin() + static_cast<std::ptrdiff_t>(last));
  ex_->timeline_->Begin(rows_, activity);
}

OpExecutor::Activity::~Activity() {
  if (ex_) ex_->timeline_->End(rows_);
}

bool OpExecutor::RunsAlone(int64_t elements, size_t tensors, DataType dtype) const {
  return tensors == 1 || elements >= ChunkElements(dtype);
}

int64_t OpExecutor::ChunkElements(DataType dtype) const {
  if (chunk_bytes_ <= 0) return INT64_MAX;
  return std::max<int64_t>(1, chunk_bytes_ / DataTypeSize(dtype));
}

void OpExecutor::AddStats(const Response& r, const TensorTableEntry& e, double local_sq,
                          double reduced_sq, int64_t elements) {
  if (e.stats_group < 0 || e.input.data == nullptr) return;
  counters_->grad_stats.Add(r.process_set_id, e.stats_group, local_sq, reduced_sq, elements, 1);
}

void OpExecutor::CountAllreduce(int32_t ps) {
  counters_->allreduce_calls.fetch_add(1, std::memory_order_relaxed);
  if (backend_->HierarchicalAllreduce(ps)) {
    counters_->hierarchical_allreduce_calls.fetch_add(1, std::memory_order_relaxed);
  }
}

uint8_t* OpExecutor::Buffer(int which, int64_t bytes) {
  if (bytes > buffer_bytes_[which]) {
    constexpr int64_t kAlign = 64;
    const int64_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
    buffers_[which].reset(
        static_cast<uint8_t*>(std::aligned_alloc(kAlign, static_cast<size_t>(rounded))));
    HVD_CHECK(buffers_[which] != nullptr);
    buffer_bytes_[which] = rounded;
    counters_->fusion_buffer_bytes.store(
        static_cast<uint64_t>(buffer_bytes_[0] + buffer_bytes_[1]));
  }
  return buffers_[which].get();
}

Result<OpExecutor::Set> OpExecutor::SetOf(int32_t process_set_id) const {
  HVD_ASSIGN_OR_RETURN(ProcessSetInfo info, sets_->Get(process_set_id));
  if (!info.included) {
    return Status::Internal("asked to run an operation of process set " +
                            std::to_string(process_set_id) + ", which this rank is not in");
  }
  return Set{info.size, info.rank, std::move(info.ranks)};
}

Status OpExecutor::Execute(const Response& response, std::vector<TensorTableEntry>& entries,
                           const std::vector<int32_t>* rows) {
  rows_ = rows;
  if (response.type == OpType::kError) return Status::FailedPrecondition(response.error_message);
  if (response.type == OpType::kJoin) return Status::OK();
  HVD_ASSIGN_OR_RETURN(Set set, SetOf(response.process_set_id));
  // CUDA tensors (the same on every rank) run on the device backend: one method per op on
  // each side, with the layouts of collective_layout.h.
  const bool device = response.device != kCpuDevice && response.type != OpType::kBarrier;
  if (device) HVD_RETURN_IF_ERROR(CheckDeviceEntries(response, entries));
  switch (response.type) {
    case OpType::kAllreduce:
      return device ? DeviceAllreduce(response, set, entries)
                    : ExecuteAllreduce(response, set, entries);
    case OpType::kBroadcast:
      return device ? DeviceBroadcast(response, set, entries)
                    : ExecuteBroadcast(response, set, entries);
    case OpType::kAllgather:
      return device ? DeviceAllgather(response, set, entries)
                    : ExecuteAllgather(response, set, entries);
    case OpType::kAlltoall:
      return device ? DeviceAlltoall(response, set, entries)
                    : ExecuteAlltoall(response, set, entries);
    case OpType::kReducescatter:
      return device ? DeviceReducescatter(response, set, entries)
                    : ExecuteReducescatter(response, set, entries);
    case OpType::kBarrier: {
      counters_->barrier_calls.fetch_add(1, std::memory_order_relaxed);
      auto scope = Collective(OpType::kBarrier);
      return backend_->Barrier(response.process_set_id);
    }
    default:
      return Status::Internal(std::string("no executor for ") + OpTypeName(response.type));
  }
}

int64_t OpExecutor::ShapeResult(TensorTableEntry& e, DataType dtype, int64_t dim0) {
  TensorShape shape = e.input.shape;
  shape[0] = dim0;
  e.result->dtype = dtype;
  e.result->shape = shape;
  return NumElements(shape) * DataTypeSize(dtype);
}

void OpExecutor::FinishReduction(const Response& r, const Set& set, void* buf, int64_t n) {
  if (r.reduce_op == ReduceOp::kAverage) ops::DivideBuffer(buf, n, r.dtype, set.size);
  ops::ScaleBuffer(buf, n, r.dtype, r.postscale_factor);
}

double OpExecutor::FinishReductionSquaredNorm(const Response& r, const Set& set, void* buf,
                                              int64_t n) {
  if (r.reduce_op == ReduceOp::kAverage && r.postscale_factor == 1.0) {
    return ops::DivideBufferSquaredNorm(buf, n, r.dtype, set.size);  // one pass
  }
  FinishReduction(r, set, buf, n);
  return ops::SquaredNorm(buf, n, r.dtype);
}

// Tensors of at least one chunk are reduced where they live, so only small tensors pay for
// the fusion copies; the fusion buffer is then reduced chunk by chunk, each chunk copied in,
// reduced and copied out while it is still in cache. The call sequence depends only on the
// agreed sizes, so every rank (joined ones included) issues the same collectives.
Status OpExecutor::ExecuteAllreduce(const Response& r, const Set& set,
                                    std::vector<TensorTableEntry>& entries) {
  const ReduceOp op = r.reduce_op == ReduceOp::kAverage ? ReduceOp::kSum : r.reduce_op;
  std::vector<size_t> packed;
  for (size_t i = 0; i < entries.size(); ++i) {
    const int64_t n = r.tensor_sizes[i];
    if (n == 0) continue;
    if (RunsAlone(n, entries.size(), r.dtype)) {
      HVD_RETURN_IF_ERROR(ReduceDirect(r, set, i, entries[i], n, op));
    } else {
      packed.push_back(i);
    }
  }
  if (packed.empty()) return Status::OK();
  return ReducePacked(r, set, packed, entries, op);
}

Status OpExecutor::ReduceDirect(const Response& r, const Set& set, size_t index,
                                TensorTableEntry& e, int64_t n, ReduceOp op) {
  const DataType dtype = r.dtype;
  const int64_t elem = DataTypeSize(dtype), chunk = ChunkElements(dtype);
  if (e.input.data == nullptr) {  // joined: contribute zeros, keep nothing
    const int64_t len = std::min(n, chunk);
    uint8_t* zeros = Buffer(1, len * elem);
    for (int64_t off = 0; off < n; off += chunk) {
      const int64_t m = std::min(chunk, n - off);
      std::memset(zeros, 0, static_cast<size_t>(m * elem));
      CountAllreduce(r.process_set_id);
      auto scope = Collective(OpType::kAllreduce, index, index + 1);
      HVD_RETURN_IF_ERROR(backend_->Allreduce(r.process_set_id, nullptr, zeros, m, dtype, op));
    }
    return Status::OK();
  }
  auto* in = static_cast<const uint8_t*>(e.input.data);
  auto* out = static_cast<uint8_t*>(e.output.data);
  const bool aliased = in == out;
  // With a prescale, a copy is scaled and reduced in place: never the caller's input.
  const bool scale = r.prescale_factor != 1.0;
  // Gradient statistics, chunk by chunk while each chunk is in cache: the input just before
  // the collective (or during the prescale's copy), the result just after it is finished.
  const bool measure = e.stats_group >= 0;
  double local_sq = 0, reduced_sq = 0;
  for (int64_t off = 0; off < n; off += chunk) {
    const int64_t m = std::min(chunk, n - off);
    const int64_t at = off * elem;
    if (scale) {
      if (!aliased && measure) {
        local_sq += ops::CopySquaredNorm(out + at, in + at, m, dtype);
      } else {
        if (measure) local_sq += ops::SquaredNorm(in + at, m, dtype);
        if (!aliased) Copy(out + at, in + at, m * elem);
      }
      ops::ScaleBuffer(out + at, m, dtype, r.prescale_factor);
    } else if (measure) {
      local_sq += ops::SquaredNorm(in + at, m, dtype);
    }
    CountAllreduce(r.process_set_id);
    {
      auto scope = Collective(OpType::kAllreduce, index, index + 1);
      HVD_RETURN_IF_ERROR(backend_->Allreduce(
          r.process_set_id, aliased || scale ? nullptr : in + at, out + at, m, dtype, op));
    }
    if (measure) {
      reduced_sq += FinishReductionSquaredNorm(r, set, out + at, m);
    } else {
      FinishReduction(r, set, out + at, m);
    }
  }
  AddStats(r, e, local_sq, reduced_sq, n);
  return Status::OK();
}

Status OpExecutor::ReducePacked(const Response& r, const Set& set,
                                const std::vector<size_t>& packed,
                                std::vector<TensorTableEntry>& entries, ReduceOp op) {
  const DataType dtype = r.dtype;
  const int64_t elem = DataTypeSize(dtype), chunk = ChunkElements(dtype);
  std::vector<int64_t> start(packed.size() + 1, 0);  // element offsets in the packed buffer
  for (size_t k = 0; k < packed.size(); ++k) start[k + 1] = start[k] + r.tensor_sizes[packed[k]];
  const int64_t total = start.back();
  uint8_t* buf = Buffer(0, std::min(total, chunk) * elem);
  // Gradient statistics of packed tensor k, measured by the copies in and out.
  std::vector<double> local_sq(packed.size(), 0.0), reduced_sq(packed.size(), 0.0);
  size_t first = 0;  // first packed tensor overlapping the current chunk
  for (int64_t lo = 0; lo < total; lo += chunk) {
    const int64_t hi = std::min(total, lo + chunk);
    while (start[first + 1] <= lo) ++first;
    size_t last = first;  // one past the last packed tensor overlapping [lo, hi)
    while (last < packed.size() && start[last] < hi) ++last;
    // Timeline rows: the response's tensors packed[first] .. packed[last - 1].
    const size_t row_lo = packed[first], row_hi = packed[last - 1] + 1;
    {
      auto scope = CopyIn(row_lo, row_hi);
      for (size_t k = first; k < last; ++k) {
        const int64_t a = std::max(lo, start[k]), b = std::min(hi, start[k + 1]);
        const TensorTableEntry& e = entries[packed[k]];
        uint8_t* dst = buf + (a - lo) * elem;
        const uint8_t* src = static_cast<const uint8_t*>(e.input.data) + (a - start[k]) * elem;
        if (e.input.data == nullptr) {
          std::memset(dst, 0, static_cast<size_t>((b - a) * elem));
        } else if (e.stats_group >= 0) {
          local_sq[k] += ops::CopySquaredNorm(dst, src, b - a, dtype);
        } else {
          Copy(dst, src, (b - a) * elem);
        }
      }
      ops::ScaleBuffer(buf, hi - lo, dtype, r.prescale_factor);
    }
    CountAllreduce(r.process_set_id);
    {
      auto scope = Collective(OpType::kAllreduce, row_lo, row_hi);
      HVD_RETURN_IF_ERROR(backend_->Allreduce(r.process_set_id, nullptr, buf, hi - lo, dtype, op));
    }
    auto scope = CopyOut(row_lo, row_hi);
    FinishReduction(r, set, buf, hi - lo);
    for (size_t k = first; k < last; ++k) {
      const int64_t a = std::max(lo, start[k]), b = std::min(hi, start[k + 1]);
      const TensorTableEntry& e = entries[packed[k]];
      if (e.output.data == nullptr) continue;
      uint8_t* dst = static_cast<uint8_t*>(e.output.data) + (a - start[k]) * elem;
      if (e.stats_group >= 0) {
        reduced_sq[k] += ops::CopySquaredNorm(dst, buf + (a - lo) * elem, b - a, dtype);
      } else {
        Copy(dst, buf + (a - lo) * elem, (b - a) * elem);
      }
    }
  }
  for (size_t k = 0; k < packed.size(); ++k) {
    AddStats(r, entries[packed[k]], local_sq[k], reduced_sq[k], r.tensor_sizes[packed[k]]);
  }
  return Status::OK();
}

Status OpExecutor::ExecuteBroadcast(const Response& r, const Set& set,
                                    std::vector<TensorTableEntry>& entries) {
  const int64_t elem = DataTypeSize(r.dtype);
  const int root = RootInSet(set.ranks, r.root_rank);
  const bool is_root = root == set.rank;
  // A broadcast does no arithmetic, so the fusion buffer only saves calls: a tensor worth a
  // call of its own (at least the chunk size, or alone) goes straight from the root's memory
  // into every rank's, with no copy in or out. Only the small ones share one call through
  // the buffer. Every rank decides alike: sizes, dtype and chunk size are agreed.
  std::vector<size_t> packed;
  for (size_t i = 0; i < entries.size(); ++i) {
    TensorTableEntry& e = entries[i];
    const int64_t bytes = r.tensor_sizes[i] * elem;
    if (!RunsAlone(r.tensor_sizes[i], entries.size(), r.dtype)) {
      packed.push_back(i);
      continue;
    }
    if (bytes == 0) continue;
    if (is_root && e.input.data != e.output.data) Copy(e.output.data, e.input.data, bytes);
    counters_->broadcast_calls.fetch_add(1, std::memory_order_relaxed);
    auto scope = Collective(OpType::kBroadcast, i, i + 1);
    HVD_RETURN_IF_ERROR(backend_->Broadcast(r.process_set_id, e.output.data, bytes, root));
  }
  int64_t total = 0;
  for (size_t i : packed) total += r.tensor_sizes[i] * elem;
  if (total == 0) return Status::OK();
  uint8_t* buf = Buffer(0, total);
  if (is_root) {
    auto scope = CopyIn(packed.front(), packed.back() + 1);
    int64_t offset = 0;
    for (size_t i : packed) {
      Copy(buf + offset, entries[i].input.data, r.tensor_sizes[i] * elem);
      offset += r.tensor_sizes[i] * elem;
    }
  }
  counters_->broadcast_calls.fetch_add(1, std::memory_order_relaxed);
  {
    auto scope = Collective(OpType::kBroadcast, packed.front(), packed.back() + 1);
    HVD_RETURN_IF_ERROR(backend_->Broadcast(r.process_set_id, buf, total, root));
  }
  auto scope = CopyOut(packed.front(), packed.back() + 1);
  int64_t offset = 0;
  for (size_t i : packed) {
    Copy(entries[i].output.data, buf + offset, r.tensor_sizes[i] * elem);
    offset += r.tensor_sizes[i] * elem;
  }
  return Status::OK();
}

Status OpExecutor::ExecuteAllgather(const Response& r, const Set& set,
                                    std::vector<TensorTableEntry>& entries) {
  const int64_t elem = DataTypeSize(r.dtype);
  const size_t n = static_cast<size_t>(set.size);
  const size_t count = entries.size();
  // rows(t, q): first dimension rank q of the set contributed to tensor t.
  auto rows = [&](size_t t, size_t q) { return r.rank_sizes[t * n + q]; };
  // Allocate every result: dim 0 is the sum over ranks; the other dims are this rank's.
  // (A caller-given output of the result's size, EnqueueAllgatherInto, is the result itself.)
  for (size_t t = 0; t < count; ++t) {
    TensorTableEntry& e = entries[t];
    const int64_t bytes = ShapeResult(e, r.dtype, AllgatherRows(r, t, set.size));
    if (e.output.data != nullptr && NumElements(e.output.shape) * elem == bytes) {
      e.result->data = std::shared_ptr<void>(e.output.data, [](void*) {});
    } else {
      e.result->data = results_.Allocate(bytes);
    }
  }
  // Like broadcast: a tensor worth a call of its own (its gathered size at least the chunk
  // size, or alone) is gathered straight from its input into its result, with no copies; the
  // small ones share one call through the buffers. The sizes are agreed, so every rank
  // decides alike.
  Response small;  // the fused part: its tensors' sizes, rank_sizes tensor-major as in r
  std::vector<size_t> packed;
  for (size_t t = 0; t < count; ++t) {
    const Layout l = AllgatherTensor(r, t, set.size);
    if (!RunsAlone(l.total, count, r.dtype)) {
      packed.push_back(t);
      small.tensor_sizes.push_back(r.tensor_sizes[t]);
      small.rank_sizes.insert(small.rank_sizes.end(), r.rank_sizes.begin() + t * n,
                              r.rank_sizes.begin() + (t + 1) * n);
      continue;
    }
    counters_->allgather_calls.fetch_add(1, std::memory_order_relaxed);
    auto scope = Collective(OpType::kAllgather, t, t + 1);
    HVD_RETURN_IF_ERROR(backend_->Allgatherv(r.process_set_id, entries[t].input.data,
                                             l.counts[set.rank], entries[t].result->data.get(),
                                             l.counts, l.displs, r.dtype));
  }
  if (packed.empty()) return Status::OK();
  counters_->allgather_calls.fetch_add(1, std::memory_order_relaxed);
  // Fused: pack this rank's tensors, gather one block per rank, unpack tensor by tensor.
  const Layout l = AllgatherFused(small, set.size);
  uint8_t* send = Buffer(0, l.counts[set.rank] * elem);
  uint8_t* recv = Buffer(1, l.total * elem);
  {
    auto scope = CopyIn(packed.front(), packed.back() + 1);
    int64_t offset = 0;
    for (size_t t : packed) {
      const int64_t bytes = rows(t, set.rank) * r.tensor_sizes[t] * elem;
      Copy(send + offset, entries[t].input.data, bytes);
      offset += bytes;
    }
  }
  {
    auto scope = Collective(OpType::kAllgather, packed.front(), packed.back() + 1);
    HVD_RETURN_IF_ERROR(backend_->Allgatherv(r.process_set_id, send, l.counts[set.rank], recv,
                                             l.counts, l.displs, r.dtype));
  }
  auto scope = CopyOut(packed.front(), packed.back() + 1);
  std::vector<int64_t> out_offset(count, 0);
  for (size_t q = 0; q < n; ++q) {
    int64_t in_block = l.displs[q] * elem;
    for (size_t t : packed) {
      const int64_t bytes = rows(t, q) * r.tensor_sizes[t] * elem;
      Copy(static_cast<uint8_t*>(entries[t].result->data.get()) + out_offset[t], recv + in_block,
           bytes);
      out_offset[t] += bytes;
      in_block += bytes;
    }
  }
  return Status::OK();
}

Status OpExecutor::ExecuteAlltoall(const Response& r, const Set& set,
                                   std::vector<TensorTableEntry>& entries) {
  const AlltoallLayout l = AlltoallOf(r, set.size, set.rank);
  TensorTableEntry& e = entries.front();
  e.result->data = results_.Allocate(ShapeResult(e, r.dtype, l.rows_in));
  e.result->received_splits = l.received_rows;
  counters_->alltoall_calls.fetch_add(1, std::memory_order_relaxed);
  auto scope = Collective(OpType::kAlltoall);
  return backend_->Alltoallv(r.process_set_id, e.input.data, l.send.counts, l.send.displs,
                             e.result->data.get(), l.recv.counts, l.recv.displs, r.dtype);
}

Status OpExecutor::ExecuteReducescatter(const Response& r, const Set& set,
                                        std::vector<TensorTableEntry>& entries) {
  const DataType dtype = r.dtype;
  const int64_t elem = DataTypeSize(dtype);
  const ReduceOp op = r.reduce_op == ReduceOp::kAverage ? ReduceOp::kSum : r.reduce_op;
  const size_t n = static_cast<size_t>(set.size);
  const size_t count = entries.size();
  // Rows of tensor t that rank q receives, and where they start in the tensor.
  auto rows = [&](size_t t, size_t q) {
    return ReducescatterRows(entries[t].input.shape[0], set.size, static_cast<int>(q));
  };
  std::vector<TensorShape> shapes;
  for (const TensorTableEntry& e : entries) shapes.push_back(e.input.shape);
  const Layout l = ReducescatterFused(shapes, set.size);
  const std::vector<int64_t>& recv_counts = l.counts;
  counters_->reducescatter_calls.fetch_add(1, std::memory_order_relaxed);

  if (count == 1 && r.prescale_factor == 1.0) {
    TensorTableEntry& e = entries.front();
    const int64_t n_in = NumElements(e.input.shape);
    const double local_sq = e.stats_group >= 0 ? ops::SquaredNorm(e.input.data, n_in, dtype) : 0;
    {
      auto scope = Collective(OpType::kReducescatter);
      HVD_RETURN_IF_ERROR(backend_->ReduceScatter(r.process_set_id, e.input.data, e.output.data,
                                                  recv_counts, dtype, op));
    }
    FinishReduction(r, set, e.output.data, recv_counts[set.rank]);
    const double reduced_sq =
        e.stats_group >= 0 ? ops::SquaredNorm(e.output.data, recv_counts[set.rank], dtype) : 0;
    AddStats(r, e, local_sq, reduced_sq, n_in);
    return Status::OK();
  }

  // Pack rank-major: for each destination rank, its rows of every tensor in turn.
  const int64_t total = l.total;
  uint8_t* send = Buffer(0, total * elem);
  uint8_t* recv = Buffer(1, recv_counts[set.rank] * elem);
  std::vector<double> local_sq(count, 0.0), reduced_sq(count, 0.0);  // statistics, per tensor
  {
    auto scope = CopyIn();
    std::vector<int64_t> taken(count, 0);  // bytes of tensor t already packed
    int64_t offset = 0;
    for (size_t q = 0; q < n; ++q) {
      for (size_t t = 0; t < count; ++t) {
        const int64_t bytes = rows(t, q) * RowElements(entries[t].input.shape) * elem;
        const uint8_t* src = static_cast<const uint8_t*>(entries[t].input.data) + taken[t];
        if (entries[t].stats_group >= 0) {
          local_sq[t] += ops::CopySquaredNorm(send + offset, src, bytes / elem, dtype);
        } else {
          Copy(send + offset, src, bytes);
        }
        taken[t] += bytes;
        offset += bytes;
      }
    }
    ops::ScaleBuffer(send, total, dtype, r.prescale_factor);
  }
  {
    auto scope = Collective(OpType::kReducescatter);
    HVD_RETURN_IF_ERROR(
        backend_->ReduceScatter(r.process_set_id, send, recv, recv_counts, dtype, op));
  }
  auto scope = CopyOut();
  FinishReduction(r, set, recv, recv_counts[set.rank]);
  int64_t offset = 0;
  for (size_t t = 0; t < count; ++t) {
    const int64_t bytes = rows(t, set.rank) * RowElements(entries[t].input.shape) * elem;
    if (entries[t].stats_group >= 0) {
      reduced_sq[t] =
          ops::CopySquaredNorm(entries[t].output.data, recv + offset, bytes / elem, dtype);
    } else {
      Copy(entries[t].output.data, recv + offset, bytes);
    }
    offset += bytes;
    AddStats(r, entries[t], local_sq[t], reduced_sq[t], NumElements(entries[t].input.shape));
  }
  return Status::OK();
}

}  // namespace hvd
