// horovod_cpp — Apache-2.0
#pragma once
// horovod_cpp public C++ API.
//
//   #include <horovod_cpp/common/horovod.h>
//   hvd::Status s = hvd::Init();                 // reads HOROVOD_* from the environment
//   std::vector<float> grad(1024, 1.0f);
//   s = hvd::Allreduce(hvd::View(grad.data(), {1024}), hvd::View(grad.data(), {1024}),
//                      "grad", {hvd::ReduceOp::kAverage});
//   hvd::Shutdown().IgnoreError();
//
// Every call returns a Status (or Result<T>); nothing throws. Calls made before Init return
// FAILED_PRECONDITION. Operations are asynchronous: Enqueue* validates what it can locally,
// hands the tensor to the background thread and returns a Handle at once; Poll/Wait observe
// completion. The background thread negotiates with the other ranks (every rank must enqueue
// a tensor of the same name), fuses small tensors, and runs the collective.
//
// Threads: any thread may call any function. Tensor memory must stay valid and untouched
// until the operation completes. Callbacks run on the background thread; they must be quick
// and must not Wait on handles.
//
// Process and MPI lifecycle: Init initialises MPI (MPI_Init_thread) unless the program already
// did; in that case the program must call hvd::Shutdown() before its own MPI_Finalize.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "base/status.h"
#include "base/types.h"

namespace hvd {

// A dense, row-major (contiguous) tensor in memory the caller owns.
struct TensorView {
  void* data = nullptr;
  DataType dtype = DataType::kFloat32;
  TensorShape shape;
  int32_t device = kCpuDevice;
  // CUDA tensors: the stream (a cudaStream_t) on which `data` is ready; nullptr is the legacy
  // default stream. Ignored for CPU tensors.
  void* stream = nullptr;
};

template <typename T>
constexpr DataType DataTypeOf() {
  if constexpr (std::is_same_v<T, bool>)
    return DataType::kBool;
  else if constexpr (std::is_same_v<T, uint8_t>)
    return DataType::kUInt8;
  else if constexpr (std::is_same_v<T, int8_t>)
    return DataType::kInt8;
  else if constexpr (std::is_same_v<T, uint16_t>)
    return DataType::kUInt16;
  else if constexpr (std::is_same_v<T, int16_t>)
    return DataType::kInt16;
  else if constexpr (std::is_same_v<T, int32_t>)
    return DataType::kInt32;
  else if constexpr (std::is_same_v<T, int64_t>)
    return DataType::kInt64;
  else if constexpr (std::is_same_v<T, float>)
    return DataType::kFloat32;
  else if constexpr (std::is_same_v<T, double>)
    return DataType::kFloat64;
  else
    static_assert(sizeof(T) == 0, "no horovod_cpp dtype for this C++ type; set dtype yourself");
}

// View of host memory holding C++ values of type T (float16/bfloat16 data: build a TensorView
// by hand with the dtype set).
template <typename T>
TensorView View(T* data, TensorShape shape) {
  return TensorView{static_cast<void*>(const_cast<std::remove_const_t<T>*>(data)),
                    DataTypeOf<std::remove_const_t<T>>(), std::move(shape), kCpuDevice};
}

using Handle = int64_t;
using StatusCallback = std::function<void(const Status&)>;

// Where the caller submits an operation from, named in error messages about it: mismatch
// errors, stall warnings, deadlock and collective-timeout reports ("train.cpp:42"). Every
// Enqueue* and blocking call made on this thread while a CallSiteScope lives carries it.
// CallSite::Here() as a default argument records the caller's line (as std::source_location
// does, with the compilers' __builtin_FILE/__builtin_LINE):
//   Status Step(hvd::CallSite where = hvd::CallSite::Here());
//   { hvd::CallSiteScope at(where); ... hvd::EnqueueAllreduce(...); }
// The Python binding sets it from the caller's Python frame.
struct CallSite {
  const char* file = nullptr;
  int line = 0;
  static constexpr CallSite Here(const char* file = __builtin_FILE(),
                                 int line = __builtin_LINE()) {
    return CallSite{file, line};
  }
  std::string ToString() const;  // "file:line", "" when unknown; the file without directories
};

class CallSiteScope {
 public:
  explicit CallSiteScope(const CallSite& where);
  explicit CallSiteScope(std::string where);  // already formatted, e.g. "train.py:42"
  ~CallSiteScope();
  CallSiteScope(const CallSiteScope&) = delete;
  CallSiteScope& operator=(const CallSiteScope&) = delete;

 private:
  std::string previous_;
};

struct AllreduceOptions {
  ReduceOp op = ReduceOp::kAverage;  // as in horovod.torch
  double prescale_factor = 1.0;      // applied to the input before the reduction
  double postscale_factor = 1.0;     // applied to the result (Average also divides by size)
  int32_t process_set_id = kGlobalProcessSetId;
  // Adaptive training: >= 0 makes the executor measure this tensor's squared norms, in
  // float64, into group `stats_group` of its process set, as it reduces it (TakeGradStats).
  // Allreduce and reducescatter; host tensors. -1: not measured.
  int32_t stats_group = -1;
  // Grouped calls: member i's stats group, overriding stats_group (empty, or one per member).
  std::vector<int32_t> stats_groups = {};
};

// The squared norms measured for one stats group (AllreduceOptions::stats_group), summed over
// the tensors reduced since the last TakeGradStats. Each is measured on data the executor
// touches anyway: the input as it is copied into the fusion buffer (or just before the
// collective, for a tensor reduced where it lives), the result as it is copied out.
struct GradStats {
  // |this rank's input|^2 before the reduction and before any prescale. For reducescatter,
  // of the whole input.
  double local_sq = 0;
  // |the result|^2: after the division of Average and the postscale. For reducescatter, of
  // this rank's share only: sum it over the set (one scalar allreduce) for the whole.
  double reduced_sq = 0;
  int64_t elements = 0;  // elements measured (input elements)
  int64_t tensors = 0;   // tensors completed
};

// A result whose size is only known once every rank has spoken (allgather, alltoall),
// allocated by the runtime and owned through `data`. Join reports through `value`.
struct Output {
  std::shared_ptr<void> data;
  DataType dtype = DataType::kFloat32;
  TensorShape shape;
  std::vector<int64_t> received_splits;  // alltoall: rows received from each rank of the set
  int64_t value = -1;                    // join: the last rank to join; add_process_set: its id
  // CUDA tensors: a cudaEvent_t recorded after the operation on horovod_cpp's stream. The
  // handle completes once the work is enqueued, not done: make the stream that uses the
  // output wait for this event first (StreamWaitEvent). Null for CPU tensors.
  std::shared_ptr<void> ready_event;
};

// A process set as seen by the calling rank.
struct ProcessSetInfo {
  int32_t id = kGlobalProcessSetId;
  std::vector<int> ranks;  // global ranks, sorted
  int size = 0;
  int rank = -1;  // this rank's index within the set, -1 if not included
  bool included = false;
};

struct InitOptions {
  // Process sets fixed at Init, as sorted lists of global ranks; they get ids 1, 2, ... in this
  // order. Every rank must pass the same list.
  std::vector<std::vector<int>> process_sets;
};

// Counters since Init, for tests and benchmarks.
struct Stats {
  uint64_t cycles = 0;              // negotiation cycles run
  uint64_t cache_hits = 0;          // tensors negotiated through the bit-vector fast path
  uint64_t coordinator_rounds = 0;  // cycles that gathered requests at rank 0
  uint64_t allreduce_calls = 0;     // data-plane collectives issued, by kind
  uint64_t hierarchical_allreduce_calls = 0;  // ... of which host allreduces went hierarchical
  uint64_t broadcast_calls = 0;
  uint64_t allgather_calls = 0;
  uint64_t alltoall_calls = 0;
  uint64_t reducescatter_calls = 0;
  uint64_t barrier_calls = 0;
  uint64_t tensors_completed = 0;    // entries completed (success or error)
  uint64_t fusion_buffer_bytes = 0;  // current size of the host fusion buffers
  // Sizes of the internal tables (for leak checks; steady in a steady job):
  uint64_t live_handles = 0;         // handles not yet released by Wait/WaitOutputs
  uint64_t queued_tensors = 0;       // entries submitted and not yet completed
  uint64_t reserved_names = 0;       // names submitted whose handle is not yet waited for
  uint64_t cache_entries = 0;        // response-cache entries
  uint64_t coordinator_pending = 0;  // tensors rank 0 is negotiating (0 on other ranks)
  // HOROVOD_AUTOTUNE: samples ended so far (warm-up included), and the values the loop runs
  // with now (the same on every rank after each sample); -1 without autotuning.
  uint64_t autotune_samples = 0;
  int64_t fusion_threshold_bytes = -1;
  int64_t collective_chunk_bytes = -1;
  int64_t cycle_time_us = -1;
  int64_t cache_on = -1;
  int64_t hierarchical_allreduce = -1;
};

// ---- lifecycle and topology ---------------------------------------------------------------

// Starts the runtime: parses HOROVOD_* (a malformed value fails here, naming the variable),
// initialises MPI if needed and starts the background thread. Idempotent.
Status Init();
Status Init(const InitOptions& options);
// Negotiated with the other ranks: every rank's background thread stops, and every pending
// operation completes with ABORTED. Idempotent; a no-op before Init.
Status Shutdown();
bool IsInitialized();

Result<int> Rank();
Result<int> Size();
Result<int> LocalRank();
Result<int> LocalSize();
Result<int> CrossRank();
Result<int> CrossSize();
// Whether MPI provides MPI_THREAD_MULTIPLE.
Result<bool> MpiThreadsSupported();

// ---- process sets -------------------------------------------------------------------------

Result<ProcessSetInfo> GetProcessSet(int32_t id);
Result<std::vector<int32_t>> ProcessSetIds();
// Collective: every rank calls it with the same sorted ranks (HOROVOD_DYNAMIC_PROCESS_SETS=1
// required). Returns the new set's id.
Result<int32_t> AddProcessSet(const std::vector<int>& ranks);
// Collective. Operations still pending in the set fail.
Status RemoveProcessSet(int32_t id);

// ---- gradient statistics (adaptive training) ----------------------------------------------

// The sums for (process_set_id, group) since the last call, which resets them. Call it once
// the handles of the step's reductions have completed; a group nothing was measured into
// gives zeros.
Result<GradStats> TakeGradStats(int32_t process_set_id, int32_t group);
// Every group of `process_set_id` measured since the last take, as (group, sums) in group
// order, and resets them: one call for a framework that measures each parameter on its own.
Result<std::vector<std::pair<int32_t, GradStats>>> TakeAllGradStats(int32_t process_set_id);

// ---- asynchronous operations --------------------------------------------------------------

// Reduces `input` across ranks into `output` (same dtype and shape; may alias `input`).
// `name` identifies the tensor across ranks; an empty name gets "allreduce.noname.<n>", with
// n counted per process (so ranks must issue unnamed ops in the same order).
Result<Handle> EnqueueAllreduce(const TensorView& input, const TensorView& output,
                                const std::string& name, const AllreduceOptions& options = {},
                                StatusCallback callback = nullptr);

// Copies `input` of `root_rank` into `output` on every rank (on the root, `output` receives a
// copy of `input`; they may alias).
Result<Handle> EnqueueBroadcast(const TensorView& input, const TensorView& output, int root_rank,
                                const std::string& name,
                                int32_t process_set_id = kGlobalProcessSetId,
                                StatusCallback callback = nullptr);

// Concatenates every rank's `input` along dim 0 (dim 0 may differ per rank, the other
// dimensions must agree). The result is allocated by the runtime: see WaitOutputs.
Result<Handle> EnqueueAllgather(const TensorView& input, const std::string& name,
                                int32_t process_set_id = kGlobalProcessSetId,
                                StatusCallback callback = nullptr);

// EnqueueAllgather writing the result straight into `output` (host memory, contiguous, the
// input's dtype), when its size is the gathered result's; a caller that knows every rank's
// rows saves the runtime's buffer and a copy. Of another size, the result goes to a buffer of
// the runtime's as EnqueueAllgather's (every rank still takes part: no rank waits), and
// WaitOutputs tells which by its data pointer.
Result<Handle> EnqueueAllgatherInto(const TensorView& input, const TensorView& output,
                                    const std::string& name,
                                    int32_t process_set_id = kGlobalProcessSetId,
                                    StatusCallback callback = nullptr);

// Sends splits[d] rows of dim 0 to rank d of the set (empty splits: dim 0 split evenly, which
// must divide). The result (rows received from every rank, in rank order) and the received
// splits come from WaitOutputs.
Result<Handle> EnqueueAlltoall(const TensorView& input, const std::vector<int64_t>& splits,
                               const std::string& name,
                               int32_t process_set_id = kGlobalProcessSetId,
                               StatusCallback callback = nullptr);

// Reduces `input` (same shape everywhere) and scatters dim 0: rank i of the set receives
// ReducescatterShape(...) rows, the first dim0 % size ranks one more. Sum or Average only.
Result<Handle> EnqueueReducescatter(const TensorView& input, const TensorView& output,
                                    const std::string& name, const AllreduceOptions& options = {},
                                    StatusCallback callback = nullptr);
// The output shape of a reducescatter of `input_shape` on this rank of `process_set_id`.
Result<TensorShape> ReducescatterShape(const TensorShape& input_shape,
                                       int32_t process_set_id = kGlobalProcessSetId);

// Grouped operations: one handle for a list of tensors, negotiated together and released in
// the same cycle (so they are fused together). Members are named "<name>_<i>of<n>".
Result<Handle> EnqueueGroupedAllreduce(const std::vector<TensorView>& inputs,
                                       const std::vector<TensorView>& outputs,
                                       const std::string& name,
                                       const AllreduceOptions& options = {},
                                       StatusCallback callback = nullptr);
Result<Handle> EnqueueGroupedAllgather(const std::vector<TensorView>& inputs,
                                       const std::string& name,
                                       int32_t process_set_id = kGlobalProcessSetId,
                                       StatusCallback callback = nullptr);
Result<Handle> EnqueueGroupedReducescatter(const std::vector<TensorView>& inputs,
                                           const std::vector<TensorView>& outputs,
                                           const std::string& name,
                                           const AllreduceOptions& options = {},
                                           StatusCallback callback = nullptr);

// This rank has no more data: until every rank has joined, it contributes zeros to the other
// ranks' allreduces (Average still divides by the full size). Completes, with Output::value
// set to the last rank to join, once every rank has joined.
Result<Handle> EnqueueJoin(StatusCallback callback = nullptr);

// True once the operation has completed. Does not release the handle.
Result<bool> Poll(Handle handle);
// Blocks until the operation completes and returns its status; releases the handle.
Status Wait(Handle handle);
// Like Wait, and also returns the runtime-allocated results: one Output per tensor (allgather,
// alltoall, grouped ops in member order), or one carrying `value` (join, add_process_set).
Result<std::vector<Output>> WaitOutputs(Handle handle);
// CUDA tensors: makes `stream` (a cudaStream_t; nullptr = legacy default stream) wait for the
// operation behind `output` (its ready_event), without blocking the calling thread. A no-op
// for CPU outputs. Use WaitOutputs on a CUDA operation's handle to get its Outputs.
Status StreamWaitEvent(const Output& output, void* stream);

// ---- blocking conveniences ----------------------------------------------------------------

Status Allreduce(const TensorView& input, const TensorView& output, const std::string& name = "",
                 const AllreduceOptions& options = {});
Status Broadcast(const TensorView& input, const TensorView& output, int root_rank,
                 const std::string& name = "", int32_t process_set_id = kGlobalProcessSetId);
Result<Output> Allgather(const TensorView& input, const std::string& name = "",
                         int32_t process_set_id = kGlobalProcessSetId);
Result<Output> Alltoall(const TensorView& input, const std::vector<int64_t>& splits = {},
                        const std::string& name = "", int32_t process_set_id = kGlobalProcessSetId);
Status Reducescatter(const TensorView& input, const TensorView& output,
                     const std::string& name = "", const AllreduceOptions& options = {});
// Returns the last rank to join (the same on every rank).
Result<int> Join();
// Returns once every rank of the process set has called Barrier.
Status Barrier(int32_t process_set_id = kGlobalProcessSetId);

Result<Stats> GetStats();

// ---- timeline -----------------------------------------------------------------------------

// Starts recording a Chrome-tracing timeline into `path` (global rank 0 writes it; other ranks
// return OK and record nothing). May be called any number of times; starting while recording
// finishes the current file first. A file that cannot be created is INVALID_ARGUMENT.
Status StartTimeline(const std::string& path, bool mark_cycles = false);
// Finishes the file (valid JSON). A no-op when not recording.
Status StopTimeline();
// A counter event in the timeline: `values` (name, number) now, as one "C" event named `name`
// on the process row (chrome://tracing draws each as a track). Rank 0 records it; a no-op on
// the other ranks and while no timeline records. For a few events per step (adaptive
// training's batch size, noise scale, learning-rate factor, ...), from any thread.
Status TimelineCounter(const std::string& name,
                       const std::vector<std::pair<std::string, double>>& values);

// ---- PowerSGD's fused passes (valid before Init) -------------------------------------------

// For the optimizers' PowerSGD (docs/compression.md), on a float32 n x m row-major matrix M with
// P and Q held transposed (pt: r x n, qt: r x m, contiguous); the same bits on every x86-64 CPU
// and for any `threads` (rows split among that many threads when the matrix is large):
// LowRankOrthogonalize: Gram-Schmidt on the r rows (n long) of `rows` (P^T or Q^T), in place;
// a zero row stays zero.
void LowRankOrthogonalize(float* rows, int64_t r, int64_t n, double epsilon = 0.0);
// LowRankStart: M += E (error may be null), then pt = Q^T M^T, in one pass over M.
void LowRankStart(float* matrix, const float* error, const float* qt, int64_t r, int64_t n,
                  int64_t m, float* pt, int threads = 1);
// LowRankFinish: out = P Q^T and M -= out (M keeps the error), in one pass; with out == matrix,
// M = P Q^T.
void LowRankFinish(float* matrix, const float* pt, const float* qt, int64_t r, int64_t n,
                   int64_t m, float* out, int threads = 1);

// ---- build information (valid before Init) -------------------------------------------------

// NCCL's version code (e.g. 22809) when this build has the NCCL backend, otherwise 0.
int NcclBuilt();
// Whether this build has the Gloo backend (HOROVOD_CONTROLLER=gloo; libgloo-dev at build time).
bool GlooBuilt();
// Whether this build has the oneCCL data plane (HOROVOD_CPU_OPERATIONS=ccl;
// scripts/install_ccl.sh before the build).
bool CclBuilt();
// The backend the running job reduces CPU tensors with: "MPI", "Gloo" or "oneCCL" (the last
// beside an MPI or Gloo controller, which HOROVOD_CONTROLLER names).
Result<std::string> HostBackendName();

}  // namespace hvd
