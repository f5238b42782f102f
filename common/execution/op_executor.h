// horovod_cpp — Apache-2.0
#pragma once
// OpExecutor: runs one agreed (possibly fused) Response on this rank's tensors.
//
// Fused responses are packed into host buffers (two regions, allocated once and grown only
// when a larger group arrives), reduced or gathered with one backend call, and unpacked. A
// response holding a single tensor runs directly on the tensor's memory: in place when input
// and output alias, otherwise MPI reads the input and writes the output, with no extra copy.
// Average is lowered to Sum followed by an exact division by the number of ranks
// (integers truncate toward zero) and then the postscale.
//
// Layouts of fused groups:
//   allreduce: tensors back to back (tensors of at least the chunk size are reduced in place).
//   broadcast: the tensors under the chunk size back to back; bigger ones in place, a call
//     each (a broadcast has no arithmetic for the buffer to batch).
//   allgather: each rank sends its tensors back to back; the gathered buffer holds one block
//     per rank, which is unpacked tensor by tensor.
//   reducescatter: rank-major, so that rank r's rows of every tensor are contiguous and one
//     MPI_Reduce_scatter leaves them in r's receive buffer.
// Tensors enqueued with a stats group (AllreduceOptions::stats_group) have their squared norms
// measured by the copies into and out of the fusion buffer (ops::CopySquaredNorm), or chunk by
// chunk around the collective when reduced where they live, and added to Counters::grad_stats.
// Allgather and alltoall results are allocated here (their size is known only now) and left
// in the entry's `result`.
//
// CUDA tensors (response.device != CPU, the same class on every rank) go to the device
// backend (ops/device.h) instead, in op_executor_device.cc: fused allreduces through a device
// buffer, other fused groups tensor by tensor, everything enqueued on the device backend's
// stream; each entry's result carries the completion event.
//
// Owned and called by the background thread only.

#include <cstdint>
#include <memory>
#include <vector>

#include "common/state/counters.h"
#include "common/protocol/message.h"
#include "common/state/process_set.h"
#include "common/state/result_pool.h"
#include "common/state/tensor_queue.h"
#include "ops/backend.h"
#include "ops/device.h"
#include "timeline/timeline.h"

namespace hvd {

class OpExecutor {
 public:
  // Result memory kept for reuse after the framework releases it (result_pool.h).
  static constexpr int64_t kMaxCachedResultBytes = int64_t{256} << 20;

  // `timeline` is null except on the rank that records one. `chunk_bytes` bounds each
  // collective call on a host buffer (Config::collective_chunk_bytes; 0 = no bound).
  // `device` runs CUDA tensors (null in builds without NCCL).
  OpExecutor(ops::Backend* backend, const ProcessSetTable* sets, Counters* counters,
             timeline::Timeline* timeline, int64_t chunk_bytes = 0,
             ops::DeviceCollectives* device = nullptr);
  OpExecutor(const OpExecutor&) = delete;
  OpExecutor& operator=(const OpExecutor&) = delete;

  // The bound on each collective call from the next response on (the autotuner). Between
  // responses only: the buffers grow, never shrink, and only before the call that uses them.
  void set_chunk_bytes(int64_t chunk_bytes) { chunk_bytes_ = chunk_bytes; }

  // `entries` are this rank's tensors, in response.tensor_names order. For allreduce an entry
  // with null data stands for a rank that has joined: it contributes zeros and receives
  // nothing. The returned status is what every entry completes with. `rows`, when recording,
  // are the tensors' timeline rows: the fusion copies and the collective are recorded on them.
  Status Execute(const Response& response, std::vector<TensorTableEntry>& entries,
                 const std::vector<int32_t>* rows = nullptr);

 private:
  struct Set {
    int size = 1;
    int rank = 0;
    std::vector<int> ranks;
  };
  Result<Set> SetOf(int32_t process_set_id) const;

  Status ExecuteAllreduce(const Response& r, const Set& set,
                          std::vector<TensorTableEntry>& entries);
  Status ExecuteBroadcast(const Response& r, const Set& set,
                          std::vector<TensorTableEntry>& entries);
  Status ExecuteAllgather(const Response& r, const Set& set,
                          std::vector<TensorTableEntry>& entries);
  Status ExecuteAlltoall(const Response& r, const Set& set, std::vector<TensorTableEntry>& entries);
  Status ExecuteReducescatter(const Response& r, const Set& set,
                              std::vector<TensorTableEntry>& entries);
  // CUDA tensors, through `device_` (op_executor_device.cc): the same methods as the host's.
  // CheckDeviceEntries first: a device backend exists, no joined stand-ins, one GPU, and at
  // least one entry.
  Status CheckDeviceEntries(const Response& r, const std::vector<TensorTableEntry>& entries) const;
  Status DeviceAllreduce(const Response& r, const Set& set, std::vector<TensorTableEntry>& entries);
  Status DeviceBroadcast(const Response& r, const Set& set, std::vector<TensorTableEntry>& entries);
  Status DeviceAllgather(const Response& r, const Set& set, std::vector<TensorTableEntry>& entries);
  Status DeviceAlltoall(const Response& r, const Set& set, std::vector<TensorTableEntry>& entries);
  Status DeviceReducescatter(const Response& r, const Set& set,
                             std::vector<TensorTableEntry>& entries);
  // Stores the event of a device call in the results of entries [first, last).
  static Status Completed(const Result<ops::Event>& event, std::vector<TensorTableEntry>& entries,
                          size_t first, size_t last);
  // Records `activity` for the lifetime of the returned scope on the rows of the response's
  // tensors [first, last) (default: all of them).
  class Activity {
   public:
    Activity(const OpExecutor* ex, const char* activity, size_t first = 0, size_t last = SIZE_MAX);
    ~Activity();
    Activity(const Activity&) = delete;
    Activity& operator=(const Activity&) = delete;

   private:
    const OpExecutor* ex_;
    std::vector<int32_t> rows_;
  };
  Activity CopyIn(size_t first = 0, size_t last = SIZE_MAX) const {
    return Activity(this, "MEMCPY_IN_FUSION_BUFFER", first, last);
  }
  Activity CopyOut(size_t first = 0, size_t last = SIZE_MAX) const {
    return Activity(this, "MEMCPY_OUT_FUSION_BUFFER", first, last);
  }
  Activity Collective(OpType type, size_t first = 0, size_t last = SIZE_MAX) const {
    return Activity(this, backend_->ActivityName(type), first, last);
  }

  // Allreduce of entry `index` where it lives (no fusion buffer), chunk by chunk.
  Status ReduceDirect(const Response& r, const Set& set, size_t index, TensorTableEntry& e,
                      int64_t n, ReduceOp op);
  // Allreduce of the entries `packed` through the fusion buffer, chunk by chunk.
  Status ReducePacked(const Response& r, const Set& set, const std::vector<size_t>& packed,
                      std::vector<TensorTableEntry>& entries, ReduceOp op);
  // Elements per collective call for `dtype`.
  int64_t ChunkElements(DataType dtype) const;
  // Whether a tensor of `elements` (gathered, for allgather) in a response of `tensors` gets
  // a collective call of its own on its own memory, skipping the fusion buffer: alone, or at
  // least a chunk. The one rule of allreduce, broadcast and allgather.
  bool RunsAlone(int64_t elements, size_t tensors, DataType dtype) const;

  // Sets the runtime-allocated result of `e` (allgather, alltoall) to `dtype` with `e`'s shape
  // but `dim0` rows; returns its size in bytes (the caller allocates where the data lives).
  static int64_t ShapeResult(TensorTableEntry& e, DataType dtype, int64_t dim0);

  // Average's division by the set size, then the postscale.
  static void FinishReduction(const Response& r, const Set& set, void* buf, int64_t n);
  // The same, returning the result's squared norm (measured in the same pass where it can).
  static double FinishReductionSquaredNorm(const Response& r, const Set& set, void* buf,
                                           int64_t n);

  // Host scratch region `which` (0 or 1) of at least `bytes`, 64-byte aligned, kept across
  // calls.
  uint8_t* Buffer(int which, int64_t bytes);
  // Adds entry `e`'s measured squared norms to its stats group (a no-op without one, or for a
  // joined rank's stand-in).
  void AddStats(const Response& r, const TensorTableEntry& e, double local_sq, double reduced_sq,
                int64_t elements);
  // Counts one host allreduce call on set `ps` (and whether it is hierarchical).
  void CountAllreduce(int32_t ps);

  ops::Backend* backend_;
  ops::DeviceCollectives* device_;
  const ProcessSetTable* sets_;
  Counters* counters_;
  timeline::Timeline* timeline_;
  int64_t chunk_bytes_;
  const std::vector<int32_t>* rows_ = nullptr;  // timeline rows of the response being run
  struct FreeDeleter {
    void operator()(uint8_t* p) const;
  };
  std::unique_ptr<uint8_t, FreeDeleter> buffers_[2];
  // Allgather and alltoall results (host memory), reused across calls of the same size.
  ResultPool results_{kMaxCachedResultBytes};
  int64_t buffer_bytes_[2] = {0, 0};
};

}  // namespace hvd
