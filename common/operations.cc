// horovod_cpp — Apache-2.0
// The public C++ API (common/horovod.h): lifecycle, local validation and enqueueing.
//
// The process-wide runtime state lives in one Runtime object that is created on first use and
// never destroyed (so no static destructor can race the background thread at exit). An
// atexit handler, registered by the first Init, performs the negotiated Shutdown if the
// program did not.

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <mutex>

#include "common/background_loop.h"
#include "common/config.h"
#include "common/counters.h"
#include "common/handle_table.h"
#include "common/horovod.h"
#include "common/logging.h"
#include "common/tensor_queue.h"
#include "ops/backend.h"
#include "ops/nccl_info.h"
#include "timeline/timeline.h"

namespace hvd {
namespace {

struct Runtime {
  std::mutex lifecycle_mu;  // serialises Init and Shutdown
  TensorQueue queue;
  HandleTable handles;
  Counters counters;
  BackgroundLoop loop{&queue, &counters};
  std::atomic<bool> started{false};
  // Per-process counters for default names ("allreduce.noname.<n>"), one per op type.
  std::atomic<int64_t> noname[kNumOpTypes] = {};
};

Runtime& R() {
  static Runtime* runtime = new Runtime();  // intentionally never destroyed
  return *runtime;
}

Status NotInitialized() {
  return Status::FailedPrecondition("horovod_cpp has not been initialized; call hvd::Init() first");
}

Status CheckRunning() {
  Runtime& rt = R();
  if (!rt.started.load()) return NotInitialized();
  if (!rt.loop.running()) {
    return Status::Aborted("horovod_cpp has been shut down (" + rt.loop.end_reason() + ")");
  }
  return Status::OK();
}

std::string SupportedList(bool allow_bool) {
  std::string s;
  for (int i = 0; i < kNumDataTypes; ++i) {
    DataType t = static_cast<DataType>(i);
    if (t == DataType::kBool && !allow_bool) continue;
    if (!s.empty()) s += ", ";
    s += DataTypeName(t);
  }
  return s;
}

// Checks that hold for every tensor operation; `what` is "allreduce 'name'".
Status ValidateViews(const std::string& what, const TensorView& input, const TensorView& output,
                     bool allow_bool, bool needs_input) {
  if (!IsValid(input.dtype)) {
    return Status::InvalidArgument(what + ": invalid dtype code " +
                                   std::to_string(static_cast<int>(input.dtype)));
  }
  if (input.dtype == DataType::kBool && !allow_bool) {
    return Status::InvalidArgument(what + ": dtype bool is not supported for this operation "
                                   "(supported: " + SupportedList(false) + ")");
  }
  if (output.dtype != input.dtype) {
    return Status::InvalidArgument(what + ": output dtype " + DataTypeName(output.dtype) +
                                   " differs from input dtype " + DataTypeName(input.dtype));
  }
  for (int64_t d : input.shape) {
    if (d < 0) {
      return Status::InvalidArgument(what + ": negative dimension in shape " +
                                     ShapeToString(input.shape));
    }
  }
  if (output.shape != input.shape) {
    return Status::InvalidArgument(what + ": output shape " + ShapeToString(output.shape) +
                                   " differs from input shape " + ShapeToString(input.shape));
  }
  if (input.device != kCpuDevice || output.device != kCpuDevice) {
    return Status::InvalidArgument(what + ": tensor is on " + DeviceToString(input.device) +
                                   ", but this build of horovod_cpp supports CPU tensors only");
  }
  if (NumElements(input.shape) > 0 && (output.data == nullptr || (needs_input && input.data == nullptr))) {
    return Status::InvalidArgument(what + ": tensor data pointer is null");
  }
  return Status::OK();
}

Status ValidateProcessSet(const std::string& what, int32_t process_set_id) {
  if (process_set_id != kGlobalProcessSetId) {
    return Status::InvalidArgument(what + ": unknown process set " +
                                   std::to_string(process_set_id));
  }
  return Status::OK();
}

std::string NameOrDefault(const std::string& name, OpType type) {
  if (!name.empty()) return name;
  int64_t n = R().noname[static_cast<int>(type)].fetch_add(1);
  return std::string(OpTypeLowerName(type)) + ".noname." + std::to_string(n);
}

Result<Handle> Submit(TensorTableEntry entry, StatusCallback callback) {
  Runtime& rt = R();
  const Handle handle = rt.handles.Allocate();
  entry.callback = [handle, cb = std::move(callback)](const Status& status) {
    if (cb) cb(status);
    R().handles.Complete(handle, status);
  };
  std::vector<TensorTableEntry> entries;
  entries.push_back(std::move(entry));
  Status added = rt.queue.Add(std::move(entries));
  if (!added.ok()) {
    rt.handles.Release(handle);
    return added;
  }
  return handle;
}

Result<int> TopologyField(int ops::Topology::*field) {
  HVD_RETURN_IF_ERROR(CheckRunning());
  return R().loop.topology().*field;
}

}  // namespace

Status Init() {
  Runtime& rt = R();
  std::lock_guard<std::mutex> lock(rt.lifecycle_mu);
  if (rt.started.load()) {
    if (rt.loop.running()) return Status::OK();
    rt.loop.Stop();  // ended by a peer's shutdown; clean up before starting again
    rt.started = false;
  }
  HVD_ASSIGN_OR_RETURN(Config config, Config::FromEnv());
  SetLogLevel(config.log_level);
  for (const std::string& w : config.warnings) HVD_LOG(WARNING) << w;
  if (!config.timeline_path.empty() && config.timeline_path != "DYNAMIC") {
    std::string error;
    timeline::Timeline probe;
    if (!probe.Start(config.timeline_path, config.timeline_mark_cycles, &error)) {
      HVD_LOG(WARNING) << "HOROVOD_TIMELINE: " << error;
    }
  }
  rt.queue.Reset();
  rt.counters.Reset();
  HVD_RETURN_IF_ERROR(rt.loop.Start(config, ops::CreateMpiBackend()));
  rt.started = true;
  static std::once_flag atexit_once;
  std::call_once(atexit_once, [] { std::atexit([] { Shutdown().IgnoreError(); }); });
  return Status::OK();
}

Status Shutdown() {
  Runtime& rt = R();
  std::lock_guard<std::mutex> lock(rt.lifecycle_mu);
  if (!rt.started.load()) return Status::OK();
  rt.loop.Stop();
  rt.started = false;
  return Status::OK();
}

bool IsInitialized() { return CheckRunning().ok(); }

Result<int> Rank() { return TopologyField(&ops::Topology::rank); }
Result<int> Size() { return TopologyField(&ops::Topology::size); }
Result<int> LocalRank() { return TopologyField(&ops::Topology::local_rank); }
Result<int> LocalSize() { return TopologyField(&ops::Topology::local_size); }
Result<int> CrossRank() { return TopologyField(&ops::Topology::cross_rank); }
Result<int> CrossSize() { return TopologyField(&ops::Topology::cross_size); }

Result<bool> MpiThreadsSupported() {
  HVD_RETURN_IF_ERROR(CheckRunning());
  return R().loop.topology().threads_multiple;
}

Result<Handle> EnqueueAllreduce(const TensorView& input, const TensorView& output,
                                const std::string& name, const AllreduceOptions& options,
                                StatusCallback callback) {
  HVD_RETURN_IF_ERROR(CheckRunning());
  const std::string tensor_name = NameOrDefault(name, OpType::kAllreduce);
  const std::string what = "allreduce '" + tensor_name + "'";
  if (!IsValid(options.op)) {
    return Status::InvalidArgument(what + ": invalid reduction op code " +
                                   std::to_string(static_cast<int>(options.op)));
  }
  if (options.op == ReduceOp::kAdasum) {
    return Status::InvalidArgument(what + ": Adasum is not supported by horovod_cpp; use "
                                   "Average, Sum, Min, Max or Product");
  }
  if (!std::isfinite(options.prescale_factor) || !std::isfinite(options.postscale_factor)) {
    return Status::InvalidArgument(what + ": prescale and postscale factors must be finite");
  }
  HVD_RETURN_IF_ERROR(ValidateViews(what, input, output, /*allow_bool=*/false, true));
  HVD_RETURN_IF_ERROR(ValidateProcessSet(what, options.process_set_id));

  TensorTableEntry entry;
  entry.input = input;
  entry.output = output;
  Request& req = entry.request;
  req.request_rank = R().loop.topology().rank;
  req.type = OpType::kAllreduce;
  req.dtype = input.dtype;
  req.reduce_op = options.op;
  req.device = input.device;
  req.process_set_id = options.process_set_id;
  req.prescale_factor = options.prescale_factor;
  req.postscale_factor = options.postscale_factor;
  req.tensor_name = tensor_name;
  req.shape = input.shape;
  return Submit(std::move(entry), std::move(callback));
}

Result<Handle> EnqueueBroadcast(const TensorView& input, const TensorView& output, int root_rank,
                                const std::string& name, int32_t process_set_id,
                                StatusCallback callback) {
  HVD_RETURN_IF_ERROR(CheckRunning());
  const std::string tensor_name = NameOrDefault(name, OpType::kBroadcast);
  const std::string what = "broadcast '" + tensor_name + "'";
  const ops::Topology& topo = R().loop.topology();
  HVD_RETURN_IF_ERROR(ValidateProcessSet(what, process_set_id));
  if (root_rank < 0 || root_rank >= topo.size) {
    return Status::InvalidArgument(what + ": root rank " + std::to_string(root_rank) +
                                   " is out of range; the process set has " +
                                   std::to_string(topo.size) + " ranks (0.." +
                                   std::to_string(topo.size - 1) + ")");
  }
  HVD_RETURN_IF_ERROR(
      ValidateViews(what, input, output, /*allow_bool=*/true, topo.rank == root_rank));

  TensorTableEntry entry;
  entry.input = input;
  entry.output = output;
  Request& req = entry.request;
  req.request_rank = topo.rank;
  req.type = OpType::kBroadcast;
  req.dtype = input.dtype;
  req.root_rank = root_rank;
  req.device = input.device;
  req.process_set_id = process_set_id;
  req.tensor_name = tensor_name;
  req.shape = input.shape;
  return Submit(std::move(entry), std::move(callback));
}

Result<bool> Poll(Handle handle) { return R().handles.Poll(handle); }

Status Wait(Handle handle) { return R().handles.Wait(handle); }

Status Allreduce(const TensorView& input, const TensorView& output, const std::string& name,
                 const AllreduceOptions& options) {
  HVD_ASSIGN_OR_RETURN(Handle h, EnqueueAllreduce(input, output, name, options));
  return Wait(h);
}

Status Broadcast(const TensorView& input, const TensorView& output, int root_rank,
                 const std::string& name, int32_t process_set_id) {
  HVD_ASSIGN_OR_RETURN(Handle h, EnqueueBroadcast(input, output, root_rank, name, process_set_id));
  return Wait(h);
}

Status Barrier(int32_t process_set_id) {
  HVD_RETURN_IF_ERROR(CheckRunning());
  TensorTableEntry entry;
  Request& req = entry.request;
  req.tensor_name = NameOrDefault("", OpType::kBarrier);
  HVD_RETURN_IF_ERROR(ValidateProcessSet("barrier", process_set_id));
  req.request_rank = R().loop.topology().rank;
  req.type = OpType::kBarrier;
  req.process_set_id = process_set_id;
  HVD_ASSIGN_OR_RETURN(Handle h, Submit(std::move(entry), nullptr));
  return Wait(h);
}

Result<Stats> GetStats() {
  if (!R().started.load()) return NotInitialized();
  return R().counters.Snapshot();
}

int NcclBuilt() { return ops::NcclVersionCode(); }

}  // namespace hvd
