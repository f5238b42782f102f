// horovod_cpp — Apache-2.0
// The public C++ API (common/horovod.h), part 2: local validation and enqueueing of every
// operation. Everything that can be checked on this rank alone is checked here and returned
// at once as INVALID_ARGUMENT; what needs the other ranks is validated by the coordinator.

#include <cmath>
#include <cstring>
#include <memory>
#include "base/mutex.h"
#include <numeric>

#include "common/protocol/reserved_names.h"
#include "common/api/runtime.h"
#include "ops/device.h"

namespace hvd {

using detail::CheckRunning;
using detail::NameOrDefault;
using detail::R;

std::string CallSite::ToString() const {
  if (file == nullptr || *file == '\0') return "";
  const char* base = std::strrchr(file, '/');
  return std::string(base ? base + 1 : file) + ":" + std::to_string(line);
}

namespace {

// The calling thread's call site (CallSiteScope), copied into every request it submits.
thread_local std::string t_call_site;

std::string SupportedList(bool allow_bool) {
  std::string s;
  for (int i = 0; i < kNumDataTypes; ++i) {
    const DataType t = static_cast<DataType>(i);
    if (t == DataType::kBool && !allow_bool) continue;
    s += (s.empty() ? "" : ", ") + std::string(DataTypeName(t));
  }
  return s;
}

Status CheckName(const std::string& what, const std::string& name) {
  if (name.rfind(kReservedPrefix, 0) == 0) {
    return Status::InvalidArgument(what + ": names starting with '" + kReservedPrefix +
                                   "' are reserved for horovod_cpp's own operations");
  }
  return Status::OK();
}

// The process set must exist and contain this rank.
Result<ProcessSetInfo> MemberSet(const std::string& what, int32_t process_set_id) {
  Result<ProcessSetInfo> info = R().sets.Get(process_set_id);
  if (!info.ok()) return Status::InvalidArgument(what + ": " + info.status().message());
  if (!info->included) {
    return Status::InvalidArgument(what + ": rank " + std::to_string(R().loop.topology().rank) +
                                   " is not a member of process set " +
                                   std::to_string(process_set_id) + " (ranks " +
                                   RanksToString(info->ranks) + ")");
  }
  return info;
}

// Checks on one tensor; `output` may be null (the runtime allocates the result).
Status CheckTensor(const std::string& what, const TensorView& input, const TensorView* output,
                   bool allow_bool, bool needs_input_data) {
  if (!IsValid(input.dtype)) {
    return Status::InvalidArgument(what + ": invalid dtype code " +
                                   std::to_string(static_cast<int>(input.dtype)));
  }
  if (input.dtype == DataType::kBool && !allow_bool) {
    return Status::InvalidArgument(what +
                                   ": dtype bool is not supported for this operation "
                                   "(supported: " +
                                   SupportedList(false) + ")");
  }
  for (int64_t d : input.shape) {
    if (d < 0) {
      return Status::InvalidArgument(what + ": negative dimension in shape " +
                                     ShapeToString(input.shape));
    }
  }
  // The routing rule (ops/device.h): CPU tensors go to the host backend, CUDA tensors to the
  // device backend, when Init made one (ops::CreateBackends).
  const Result<ops::Route> route =
      ops::RouteFor(input.device, R().device_backend.load(std::memory_order_relaxed));
  if (!route.ok()) return Status::InvalidArgument(what + ": " + route.status().message());
  if (output && output->device != input.device) {
    return Status::InvalidArgument(what + ": output is on " + DeviceToString(output->device) +
                                   " but input is on " + DeviceToString(input.device));
  }
  if (output && output->dtype != input.dtype) {
    return Status::InvalidArgument(what + ": output dtype " + DataTypeName(output->dtype) +
                                   " differs from input dtype " + DataTypeName(input.dtype));
  }
  const bool empty = NumElements(input.shape) == 0;
  if (!empty && needs_input_data && input.data == nullptr) {
    return Status::InvalidArgument(what + ": tensor data pointer is null");
  }
  return Status::OK();
}

Status CheckSameShapeOutput(const std::string& what, const TensorView& input,
                            const TensorView& output) {
  if (output.shape != input.shape) {
    return Status::InvalidArgument(what + ": output shape " + ShapeToString(output.shape) +
                                   " differs from input shape " + ShapeToString(input.shape));
  }
  if (NumElements(output.shape) > 0 && output.data == nullptr) {
    return Status::InvalidArgument(what + ": output data pointer is null");
  }
  return Status::OK();
}

// Member i of a grouped reduction: its own stats group where the call gives one per member.
// (A stats_groups list of the wrong length fails in CheckReduction.)
AllreduceOptions MemberOptions(const AllreduceOptions& options, size_t i) {
  if (i >= options.stats_groups.size()) return options;
  AllreduceOptions member = options;
  member.stats_group = options.stats_groups[i];
  return member;
}

// stats_groups is one group per member of a grouped call (`members`), or empty; a single
// tensor's call (members == 0) takes stats_group alone.
Status CheckStatsGroups(const std::string& what, const AllreduceOptions& options,
                        size_t members) {
  const size_t n = options.stats_groups.size();
  if (n == 0 || (members > 0 && n == members)) return Status::OK();
  return Status::InvalidArgument(
      what + ": " + std::to_string(n) + " stats groups for " +
      (members == 0 ? std::string("a single tensor (use stats_group)")
                    : std::to_string(members) + " tensors; give one per tensor or none"));
}

// The executor measures gradient statistics on host memory only.
Status CheckStatsDevice(const std::string& what, const TensorView& input,
                        const AllreduceOptions& options) {
  if (options.stats_group < 0 || input.device == kCpuDevice) return Status::OK();
  return Status::InvalidArgument(what +
                                 ": gradient statistics (a stats group) are measured on host "
                                 "tensors only; measure a CUDA tensor's norms in the framework");
}

Status CheckReduction(const std::string& what, const AllreduceOptions& options) {
  if (!IsValid(options.op)) {
    return Status::InvalidArgument(what + ": invalid reduction op code " +
                                   std::to_string(static_cast<int>(options.op)));
  }
  if (options.op == ReduceOp::kAdasum) {
    return Status::InvalidArgument(what +
                                   ": Adasum is not supported by horovod_cpp; use "
                                   "Average, Sum, Min, Max or Product");
  }
  if (!std::isfinite(options.prescale_factor) || !std::isfinite(options.postscale_factor)) {
    return Status::InvalidArgument(what + ": prescale and postscale factors must be finite");
  }
  if (options.stats_group < -1) {
    return Status::InvalidArgument(what + ": stats group " + std::to_string(options.stats_group) +
                                   " is invalid; use -1 (none) or a group number >= 0");
  }
  return Status::OK();
}

bool ProducesOutput(OpType type) {
  return type == OpType::kAllgather || type == OpType::kAlltoall || type == OpType::kJoin ||
         type == OpType::kProcessSetAdd || type == OpType::kProcessSetRemove;
}

TensorTableEntry NewEntry(OpType type, const std::string& name, int32_t process_set_id,
                          const TensorView& input, const TensorView& output) {
  TensorTableEntry e;
  e.input = input;
  e.output = output;
  e.result = std::make_shared<Output>();
  Request& q = e.request;
  q.request_rank = R().loop.topology().rank;
  q.type = type;
  q.dtype = input.dtype;
  q.device = input.device;
  q.process_set_id = process_set_id;
  q.tensor_name = name;
  q.shape = input.shape;
  q.call_site = t_call_site;
  return e;
}

// Hands `entries` to the background thread under one handle that completes when all of them
// have: with the first error, or with every entry's output (in order) for ops that have one.
}  // namespace

CallSiteScope::CallSiteScope(const CallSite& where) : CallSiteScope(where.ToString()) {}
CallSiteScope::CallSiteScope(std::string where) : previous_(std::move(where)) {
  t_call_site.swap(previous_);
}
CallSiteScope::~CallSiteScope() { t_call_site.swap(previous_); }

const std::string& detail::CurrentCallSite() { return t_call_site; }

namespace {

Result<Handle> Submit(std::vector<TensorTableEntry> entries, StatusCallback callback) {
  detail::Runtime& rt = R();
  const Handle handle = rt.handles.Allocate();
  struct Group {
    Mutex mu;
    size_t remaining HVD_GUARDED_BY(mu);
    Status status HVD_GUARDED_BY(mu);
    std::vector<Output> outputs HVD_GUARDED_BY(mu);
    StatusCallback callback;
  };
  auto group = std::make_shared<Group>();
  group->callback = std::move(callback);
  // CUDA operations hand their completion event to the caller through Output::ready_event.
  const bool outputs =
      ProducesOutput(entries.front().request.type) || entries.front().input.device != kCpuDevice;
  {
    MutexLock lock(group->mu);
    group->remaining = entries.size();
    if (outputs) group->outputs.resize(entries.size());
  }
  for (size_t i = 0; i < entries.size(); ++i) {
    std::shared_ptr<Output> result = entries[i].result;
    entries[i].callback = [group, handle, i, result, outputs](const Status& s) {
      UniqueLock lock(group->mu);
      if (!s.ok() && group->status.ok()) group->status = s;
      if (outputs) group->outputs[i] = *result;
      if (--group->remaining > 0) return;
      const Status status = group->status;
      std::vector<Output> done;
      if (status.ok()) done = std::move(group->outputs);
      lock.Unlock();
      if (group->callback) group->callback(status);
      R().handles.Complete(handle, status, std::move(done));
    };
  }
  Status added = rt.queue.Add(std::move(entries), handle);
  if (!added.ok()) {
    rt.handles.Release(handle);
    return added;
  }
  return handle;
}

Result<Handle> SubmitOne(TensorTableEntry entry, StatusCallback callback) {
  std::vector<TensorTableEntry> entries;
  entries.push_back(std::move(entry));
  return Submit(std::move(entries), std::move(callback));
}

// Member names of a grouped op: "<name>_<i>of<n>".
std::string MemberName(const std::string& base, size_t i, size_t n) {
  return base + "_" + std::to_string(i) + "of" + std::to_string(n);
}

Result<TensorTableEntry> AllreduceEntry(const TensorView& input, const TensorView& output,
                                        const std::string& name, const AllreduceOptions& options) {
  const std::string what = "allreduce '" + name + "'";
  HVD_RETURN_IF_ERROR(CheckName(what, name));
  HVD_RETURN_IF_ERROR(CheckReduction(what, options));
  HVD_RETURN_IF_ERROR(CheckTensor(what, input, &output, /*allow_bool=*/false, true));
  HVD_RETURN_IF_ERROR(CheckSameShapeOutput(what, input, output));
  HVD_RETURN_IF_ERROR(CheckStatsDevice(what, input, options));
  HVD_RETURN_IF_ERROR(MemberSet(what, options.process_set_id).status());
  TensorTableEntry e = NewEntry(OpType::kAllreduce, name, options.process_set_id, input, output);
  e.request.reduce_op = options.op;
  e.request.prescale_factor = options.prescale_factor;
  e.request.postscale_factor = options.postscale_factor;
  e.stats_group = options.stats_group;
  return e;
}

Result<TensorTableEntry> AllgatherEntry(const TensorView& input, const std::string& name,
                                        int32_t process_set_id,
                                        const TensorView& output = TensorView{}) {
  const std::string what = "allgather '" + name + "'";
  const bool into = output.data != nullptr;
  HVD_RETURN_IF_ERROR(CheckName(what, name));
  HVD_RETURN_IF_ERROR(
      CheckTensor(what, input, into ? &output : nullptr, /*allow_bool=*/true, true));
  if (input.shape.empty()) {
    return Status::InvalidArgument(what +
                                   ": a scalar cannot be gathered; the tensor needs at "
                                   "least one dimension");
  }
  if (into && output.device != kCpuDevice) {
    return Status::InvalidArgument(what + ": a given output must be in host memory (it is on " +
                                   DeviceToString(output.device) + ")");
  }
  HVD_RETURN_IF_ERROR(MemberSet(what, process_set_id).status());
  return NewEntry(OpType::kAllgather, name, process_set_id, input, output);
}

Result<TensorTableEntry> ReducescatterEntry(const TensorView& input, const TensorView& output,
                                            const std::string& name,
                                            const AllreduceOptions& options) {
  const std::string what = "reducescatter '" + name + "'";
  HVD_RETURN_IF_ERROR(CheckName(what, name));
  HVD_RETURN_IF_ERROR(CheckReduction(what, options));
  if (options.op != ReduceOp::kSum && options.op != ReduceOp::kAverage) {
    return Status::InvalidArgument(what + ": op " + ReduceOpName(options.op) +
                                   " is not supported; reducescatter supports Sum and Average");
  }
  HVD_RETURN_IF_ERROR(CheckTensor(what, input, &output, /*allow_bool=*/false, true));
  if (input.shape.empty()) {
    return Status::InvalidArgument(what +
                                   ": a scalar cannot be scattered; the tensor needs at "
                                   "least one dimension");
  }
  HVD_RETURN_IF_ERROR(CheckStatsDevice(what, input, options));
  HVD_ASSIGN_OR_RETURN(ProcessSetInfo set, MemberSet(what, options.process_set_id));
  TensorShape expected = input.shape;
  expected[0] = ReducescatterRows(input.shape[0], set.size, set.rank);
  if (output.shape != expected) {
    return Status::InvalidArgument(what + ": output shape " + ShapeToString(output.shape) +
                                   " does not match this rank's share " + ShapeToString(expected) +
                                   " of input " + ShapeToString(input.shape));
  }
  if (NumElements(expected) > 0 && output.data == nullptr) {
    return Status::InvalidArgument(what + ": output data pointer is null");
  }
  if (output.data != nullptr && output.data == input.data) {
    return Status::InvalidArgument(what + ": output must not alias input");
  }
  TensorTableEntry e =
      NewEntry(OpType::kReducescatter, name, options.process_set_id, input, output);
  e.request.reduce_op = options.op;
  e.request.prescale_factor = options.prescale_factor;
  e.request.postscale_factor = options.postscale_factor;
  e.stats_group = options.stats_group;
  return e;
}

// Builds `count` members with make(i, member name) and submits them as one group named `base`
// under one handle. `what` names the op in errors.
template <typename MakeMember>
Result<Handle> SubmitGroup(const std::string& what, const std::string& base, size_t count,
                           bool outputs_match, MakeMember make, StatusCallback callback) {
  if (count == 0 || !outputs_match) {
    return Status::InvalidArgument("grouped " + what + " '" + base +
                                   "': needs one or more inputs (and as many outputs)");
  }
  std::vector<TensorTableEntry> entries;
  for (size_t i = 0; i < count; ++i) {
    HVD_ASSIGN_OR_RETURN(TensorTableEntry e, make(i, MemberName(base, i, count)));
    e.request.group_name = base;
    e.request.group_size = static_cast<int32_t>(count);
    entries.push_back(std::move(e));
  }
  return Submit(std::move(entries), std::move(callback));
}

// A collective of the runtime itself (barrier, join, process-set change), negotiated like a
// tensor under a reserved name.
Result<Handle> SubmitControl(OpType type, const std::string& name, int32_t process_set_id,
                             std::vector<int64_t> args, StatusCallback callback) {
  TensorTableEntry e = NewEntry(type, name, process_set_id, TensorView{}, TensorView{});
  e.request.shape.clear();
  e.request.splits = std::move(args);
  return SubmitOne(std::move(e), std::move(callback));
}

}  // namespace

Result<Handle> EnqueueAllreduce(const TensorView& input, const TensorView& output,
                                const std::string& name, const AllreduceOptions& options,
                                StatusCallback callback) {
  HVD_RETURN_IF_ERROR(CheckRunning());
  HVD_RETURN_IF_ERROR(CheckStatsGroups("allreduce", options, 0));
  HVD_ASSIGN_OR_RETURN(
      TensorTableEntry e,
      AllreduceEntry(input, output, NameOrDefault(name, OpType::kAllreduce), options));
  return SubmitOne(std::move(e), std::move(callback));
}

Result<Handle> EnqueueBroadcast(const TensorView& input, const TensorView& output, int root_rank,
                                const std::string& name, int32_t process_set_id,
                                StatusCallback callback) {
  HVD_RETURN_IF_ERROR(CheckRunning());
  const std::string tensor_name = NameOrDefault(name, OpType::kBroadcast);
  const std::string what = "broadcast '" + tensor_name + "'";
  HVD_RETURN_IF_ERROR(CheckName(what, tensor_name));
  HVD_ASSIGN_OR_RETURN(ProcessSetInfo set, MemberSet(what, process_set_id));
  const int world = R().loop.topology().size;
  if (root_rank < 0 || root_rank >= world) {
    return Status::InvalidArgument(what + ": root rank " + std::to_string(root_rank) +
                                   " is out of range; the job has " + std::to_string(world) +
                                   " ranks (0.." + std::to_string(world - 1) + ")");
  }
  if (!std::binary_search(set.ranks.begin(), set.ranks.end(), root_rank)) {
    return Status::InvalidArgument(
        what + ": root rank " + std::to_string(root_rank) + " is not a member of process set " +
        std::to_string(process_set_id) + " (ranks " + RanksToString(set.ranks) + ")");
  }
  const bool is_root = R().loop.topology().rank == root_rank;
  HVD_RETURN_IF_ERROR(CheckTensor(what, input, &output, /*allow_bool=*/true, is_root));
  HVD_RETURN_IF_ERROR(CheckSameShapeOutput(what, input, output));
  TensorTableEntry e = NewEntry(OpType::kBroadcast, tensor_name, process_set_id, input, output);
  e.request.root_rank = root_rank;
  return SubmitOne(std::move(e), std::move(callback));
}

Result<Handle> EnqueueAllgather(const TensorView& input, const std::string& name,
                                int32_t process_set_id, StatusCallback callback) {
  HVD_RETURN_IF_ERROR(CheckRunning());
  HVD_ASSIGN_OR_RETURN(
      TensorTableEntry e,
      AllgatherEntry(input, NameOrDefault(name, OpType::kAllgather), process_set_id));
  return SubmitOne(std::move(e), std::move(callback));
}

Result<Handle> EnqueueAllgatherInto(const TensorView& input, const TensorView& output,
                                    const std::string& name, int32_t process_set_id,
                                    StatusCallback callback) {
  HVD_RETURN_IF_ERROR(CheckRunning());
  if (output.data == nullptr && NumElements(output.shape) != 0) {
    return Status::InvalidArgument("allgather '" + name + "': the output's data pointer is null");
  }
  HVD_ASSIGN_OR_RETURN(
      TensorTableEntry e,
      AllgatherEntry(input, NameOrDefault(name, OpType::kAllgather), process_set_id, output));
  return SubmitOne(std::move(e), std::move(callback));
}

Result<Handle> EnqueueAlltoall(const TensorView& input, const std::vector<int64_t>& splits,
                               const std::string& name, int32_t process_set_id,
                               StatusCallback callback) {
  HVD_RETURN_IF_ERROR(CheckRunning());
  const std::string tensor_name = NameOrDefault(name, OpType::kAlltoall);
  const std::string what = "alltoall '" + tensor_name + "'";
  HVD_RETURN_IF_ERROR(CheckName(what, tensor_name));
  HVD_RETURN_IF_ERROR(CheckTensor(what, input, nullptr, /*allow_bool=*/true, true));
  if (input.shape.empty()) {
    return Status::InvalidArgument(what +
                                   ": a scalar cannot be split; the tensor needs at least "
                                   "one dimension");
  }
  HVD_ASSIGN_OR_RETURN(ProcessSetInfo set, MemberSet(what, process_set_id));
  const int64_t dim0 = input.shape[0];
  std::vector<int64_t> parts = splits;
  if (parts.empty()) {
    if (dim0 % set.size != 0) {
      return Status::InvalidArgument(what + ": splits not given, and the first dimension (" +
                                     std::to_string(dim0) + ") is not divisible by the " +
                                     std::to_string(set.size) +
                                     " ranks of the process set; pass splits explicitly");
    }
    parts.assign(set.size, dim0 / set.size);
  }
  if (static_cast<int>(parts.size()) != set.size) {
    return Status::InvalidArgument(what + ": " + std::to_string(parts.size()) +
                                   " splits given, but the process set has " +
                                   std::to_string(set.size) + " ranks");
  }
  for (int64_t p : parts) {
    if (p < 0) return Status::InvalidArgument(what + ": splits must not be negative");
  }
  const int64_t sum = std::accumulate(parts.begin(), parts.end(), int64_t{0});
  if (sum != dim0) {
    return Status::InvalidArgument(what + ": splits sum to " + std::to_string(sum) +
                                   ", but the first dimension is " + std::to_string(dim0));
  }
  TensorTableEntry e =
      NewEntry(OpType::kAlltoall, tensor_name, process_set_id, input, TensorView{});
  e.request.splits = std::move(parts);
  return SubmitOne(std::move(e), std::move(callback));
}

Result<Handle> EnqueueReducescatter(const TensorView& input, const TensorView& output,
                                    const std::string& name, const AllreduceOptions& options,
                                    StatusCallback callback) {
  HVD_RETURN_IF_ERROR(CheckRunning());
  HVD_RETURN_IF_ERROR(CheckStatsGroups("reducescatter", options, 0));
  HVD_ASSIGN_OR_RETURN(
      TensorTableEntry e,
      ReducescatterEntry(input, output, NameOrDefault(name, OpType::kReducescatter), options));
  return SubmitOne(std::move(e), std::move(callback));
}

Result<TensorShape> ReducescatterShape(const TensorShape& input_shape, int32_t process_set_id) {
  HVD_RETURN_IF_ERROR(CheckRunning());
  if (input_shape.empty()) {
    return Status::InvalidArgument("reducescatter: a scalar cannot be scattered");
  }
  HVD_ASSIGN_OR_RETURN(ProcessSetInfo set, MemberSet("reducescatter", process_set_id));
  TensorShape out = input_shape;
  out[0] = ReducescatterRows(input_shape[0], set.size, set.rank);
  return out;
}

Result<Handle> EnqueueGroupedAllreduce(const std::vector<TensorView>& inputs,
                                       const std::vector<TensorView>& outputs,
                                       const std::string& name, const AllreduceOptions& options,
                                       StatusCallback callback) {
  HVD_RETURN_IF_ERROR(CheckRunning());
  HVD_RETURN_IF_ERROR(CheckStatsGroups("grouped allreduce", options, inputs.size()));
  return SubmitGroup(
      "allreduce", NameOrDefault(name, OpType::kAllreduce), inputs.size(),
      inputs.size() == outputs.size(),
      [&](size_t i, const std::string& member) {
        return AllreduceEntry(inputs[i], outputs[i], member, MemberOptions(options, i));
      },
      std::move(callback));
}

Result<Handle> EnqueueGroupedAllgather(const std::vector<TensorView>& inputs,
                                       const std::string& name, int32_t process_set_id,
                                       StatusCallback callback) {
  HVD_RETURN_IF_ERROR(CheckRunning());
  return SubmitGroup(
      "allgather", NameOrDefault(name, OpType::kAllgather), inputs.size(), true,
      [&](size_t i, const std::string& member) {
        return AllgatherEntry(inputs[i], member, process_set_id);
      },
      std::move(callback));
}

Result<Handle> EnqueueGroupedReducescatter(const std::vector<TensorView>& inputs,
                                           const std::vector<TensorView>& outputs,
                                           const std::string& name, const AllreduceOptions& options,
                                           StatusCallback callback) {
  HVD_RETURN_IF_ERROR(CheckRunning());
  HVD_RETURN_IF_ERROR(CheckStatsGroups("grouped reducescatter", options, inputs.size()));
  return SubmitGroup(
      "reducescatter", NameOrDefault(name, OpType::kReducescatter), inputs.size(),
      inputs.size() == outputs.size(),
      [&](size_t i, const std::string& member) {
        return ReducescatterEntry(inputs[i], outputs[i], member, MemberOptions(options, i));
      },
      std::move(callback));
}

Result<Handle> EnqueueJoin(StatusCallback callback) {
  HVD_RETURN_IF_ERROR(CheckRunning());
  return SubmitControl(OpType::kJoin, kJoinName, kGlobalProcessSetId, {}, std::move(callback));
}

Status Barrier(int32_t process_set_id) {
  HVD_RETURN_IF_ERROR(CheckRunning());
  HVD_RETURN_IF_ERROR(MemberSet("barrier", process_set_id).status());
  // One name per process set, not a per-process count: a barrier that failed on some ranks
  // only (a deadlock, say) must not shift those ranks' later barriers against the others'.
  // A second barrier of the same set from another thread of this rank is rejected as in flight.
  HVD_ASSIGN_OR_RETURN(Handle h,
                       SubmitControl(OpType::kBarrier, kBarrierPrefix + std::to_string(process_set_id),
                                     process_set_id, {}, nullptr));
  return Wait(h);
}

Result<int32_t> AddProcessSet(const std::vector<int>& ranks) {
  HVD_RETURN_IF_ERROR(CheckRunning());
  if (!R().dynamic_process_sets.load()) {
    return Status::FailedPrecondition(
        "add_process_set: dynamic process sets are disabled; set HOROVOD_DYNAMIC_PROCESS_SETS=1 "
        "before Init (or pass the sets to Init)");
  }
  const std::string problem = ValidateRankList(ranks, R().loop.topology().size);
  if (!problem.empty()) return Status::InvalidArgument("add_process_set: " + problem);
  const int64_t n = R().noname[static_cast<int>(OpType::kProcessSetAdd)].fetch_add(1);
  HVD_ASSIGN_OR_RETURN(
      Handle h, SubmitControl(OpType::kProcessSetAdd, kProcessSetAddPrefix + std::to_string(n),
                              kGlobalProcessSetId, std::vector<int64_t>(ranks.begin(), ranks.end()),
                              nullptr));
  HVD_ASSIGN_OR_RETURN(std::vector<Output> out, WaitOutputs(h));
  return static_cast<int32_t>(out.front().value);
}

Status RemoveProcessSet(int32_t id) {
  HVD_RETURN_IF_ERROR(CheckRunning());
  if (!R().dynamic_process_sets.load()) {
    return Status::FailedPrecondition(
        "remove_process_set: dynamic process sets are disabled; set "
        "HOROVOD_DYNAMIC_PROCESS_SETS=1 before Init");
  }
  if (id == kGlobalProcessSetId) {
    return Status::InvalidArgument(
        "remove_process_set: the global process set (id 0) cannot be "
        "removed");
  }
  HVD_RETURN_IF_ERROR(R().sets.Get(id).status());
  const int64_t n = R().noname[static_cast<int>(OpType::kProcessSetRemove)].fetch_add(1);
  HVD_ASSIGN_OR_RETURN(Handle h, SubmitControl(OpType::kProcessSetRemove,
                                               kProcessSetRemovePrefix + std::to_string(n),
                                               kGlobalProcessSetId, {id}, nullptr));
  return Wait(h);
}

// ---- blocking conveniences ----------------------------------------------------------------

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

Result<Output> Allgather(const TensorView& input, const std::string& name, int32_t process_set_id) {
  HVD_ASSIGN_OR_RETURN(Handle h, EnqueueAllgather(input, name, process_set_id));
  HVD_ASSIGN_OR_RETURN(std::vector<Output> out, WaitOutputs(h));
  return std::move(out.front());
}

Result<Output> Alltoall(const TensorView& input, const std::vector<int64_t>& splits,
                        const std::string& name, int32_t process_set_id) {
  HVD_ASSIGN_OR_RETURN(Handle h, EnqueueAlltoall(input, splits, name, process_set_id));
  HVD_ASSIGN_OR_RETURN(std::vector<Output> out, WaitOutputs(h));
  return std::move(out.front());
}

Status Reducescatter(const TensorView& input, const TensorView& output, const std::string& name,
                     const AllreduceOptions& options) {
  HVD_ASSIGN_OR_RETURN(Handle h, EnqueueReducescatter(input, output, name, options));
  return Wait(h);
}

Result<int> Join() {
  HVD_ASSIGN_OR_RETURN(Handle h, EnqueueJoin());
  HVD_ASSIGN_OR_RETURN(std::vector<Output> out, WaitOutputs(h));
  return static_cast<int>(out.front().value);
}

}  // namespace hvd
