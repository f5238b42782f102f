// horovod_cpp — Apache-2.0
// The public C++ API (common/horovod.h), part 1: lifecycle, topology, process sets, waiting
// and statistics. Enqueueing of operations is in enqueue.cc.

#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "base/logging.h"
#include "common/protocol/reserved_names.h"
#include "common/api/runtime.h"
#include "ops/device.h"
#include "ops/factory.h"
#include "ops/low_rank.h"
#include "ops/nccl_info.h"

namespace hvd {
namespace detail {

Runtime& R() {
  static Runtime* runtime = new Runtime();  // intentionally never destroyed
  return *runtime;
}

Status CheckRunning() {
  Runtime& rt = R();
  if (!rt.started.load()) {
    return Status::FailedPrecondition(
        "horovod_cpp has not been initialized; call hvd::Init() first");
  }
  if (!rt.loop.running()) {
    return Status::Aborted("horovod_cpp has been shut down (" + rt.loop.end_reason() + ")");
  }
  return Status::OK();
}

std::string NameOrDefault(const std::string& name, OpType type) {
  if (!name.empty()) return name;
  const int64_t n = R().noname[static_cast<int>(type)].fetch_add(1);
  return std::string(OpTypeLowerName(type)) + ".noname." + std::to_string(n);
}

}  // namespace detail

using detail::CheckRunning;
using detail::R;

namespace {

// Topology and process-set membership are facts fixed at Init: they stay answerable after a
// peer's shutdown ended the loop, until this rank calls Shutdown itself. A script that prints
// hvd.rank() after its last collective must not fail because another rank finished first.
Status CheckStarted() {
  if (!R().started.load()) return CheckRunning();
  return Status::OK();
}

Result<int> TopologyField(int ops::Topology::*field) {
  HVD_RETURN_IF_ERROR(CheckStarted());
  return R().loop.topology().*field;
}

}  // namespace

Status Init() { return Init(InitOptions{}); }

Status Init(const InitOptions& options) {
  detail::Runtime& rt = R();
  MutexLock lock(rt.lifecycle_mu);
  if (rt.started.load()) {
    if (rt.loop.running()) return Status::OK();
    rt.loop.Stop();  // ended by a peer's shutdown; clean up before starting again
    rt.started = false;
  }
  HVD_ASSIGN_OR_RETURN(Config config, Config::FromEnv());
  SetLogLevel(config.log_level);
  for (const std::string& w : config.warnings) HVD_LOG(WARNING) << w;
  rt.dynamic_process_sets = config.dynamic_process_sets;
  rt.queue.Reset();
  rt.counters.Reset();
  rt.counters.grad_stats.Clear();
  // Every rank starts again together, so default names ("allreduce.noname.<n>") restart too:
  // an op that failed on one rank while the runtime was down must not shift its sequence.
  for (auto& n : rt.noname) n = 0;
  HVD_ASSIGN_OR_RETURN(ops::BackendOptions backend_options, ops::BackendOptions::FromEnv());
  backend_options.ccl.worker_count = static_cast<int>(config.ccl_worker_count);
  backend_options.ccl.worker_affinity = config.ccl_worker_affinity;
  HVD_ASSIGN_OR_RETURN(ops::Backends backends, ops::CreateBackends(backend_options));
  // Routing (enqueue.cc) asks what was built here, not the build: a test or a future option
  // may run without a device backend where NCCL exists.
  rt.device_backend = backends.device != nullptr;
  HVD_RETURN_IF_ERROR(rt.loop.Start(config, options, std::move(backends)));
  rt.started = true;
  if (rt.loop.topology().rank == 0) {
    std::vector<std::string> names;
    for (char** e = environ; *e != nullptr; ++e) {
      const char* eq = std::strchr(*e, '=');
      names.emplace_back(*e, eq ? static_cast<size_t>(eq - *e) : std::strlen(*e));
    }
    for (const std::string& w : UnknownSettingWarnings(names)) HVD_LOG(WARNING) << w;
  }
  static std::once_flag atexit_once;
  std::call_once(atexit_once, [] { std::atexit([] { Shutdown().IgnoreError(); }); });
  return Status::OK();
}

Status Shutdown() {
  detail::Runtime& rt = R();
  MutexLock lock(rt.lifecycle_mu);
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
  HVD_RETURN_IF_ERROR(CheckStarted());
  return R().loop.topology().threads_multiple;
}

Result<ProcessSetInfo> GetProcessSet(int32_t id) {
  HVD_RETURN_IF_ERROR(CheckStarted());
  return R().sets.Get(id);
}

Result<std::vector<int32_t>> ProcessSetIds() {
  HVD_RETURN_IF_ERROR(CheckStarted());
  return R().sets.Ids();
}

Status StartTimeline(const std::string& path, bool mark_cycles) {
  detail::Runtime& rt = R();
  MutexLock lock(rt.lifecycle_mu);  // the loop's timeline lives until Stop
  HVD_RETURN_IF_ERROR(CheckRunning());
  return rt.loop.StartTimeline(path, mark_cycles);
}

Status StopTimeline() {
  detail::Runtime& rt = R();
  MutexLock lock(rt.lifecycle_mu);
  HVD_RETURN_IF_ERROR(CheckRunning());
  rt.loop.StopTimeline();
  return Status::OK();
}

Status TimelineCounter(const std::string& name,
                       const std::vector<std::pair<std::string, double>>& values) {
  detail::Runtime& rt = R();
  MutexLock lock(rt.lifecycle_mu);  // the loop's timeline lives until Stop
  HVD_RETURN_IF_ERROR(CheckRunning());
  rt.loop.TimelineCounter(name, values);
  return Status::OK();
}

Result<bool> Poll(Handle handle) { return R().handles.Poll(handle); }

Status Wait(Handle handle) {
  Result<std::vector<Output>> r = WaitOutputs(handle);
  return r.ok() ? Status::OK() : r.status();
}

// A waited handle's names may be submitted again (TensorQueue reserves them until then).
// While it waits, the thread counts as blocked for deadlock detection (TensorQueue::Blocked).
Result<std::vector<Output>> WaitOutputs(Handle handle) {
  R().queue.BeginWait(handle, detail::CurrentCallSite());
  Result<std::vector<Output>> r = R().handles.WaitOutputs(handle);
  R().queue.EndWait(handle);
  R().queue.ReleaseNames(handle);
  return r;
}

Result<Stats> GetStats() {
  HVD_RETURN_IF_ERROR(CheckStarted());
  Stats s = R().counters.Snapshot();
  s.live_handles = R().handles.size();
  s.queued_tensors = R().queue.size();
  s.reserved_names = R().queue.reserved();
  return s;
}

Result<GradStats> TakeGradStats(int32_t process_set_id, int32_t group) {
  HVD_RETURN_IF_ERROR(CheckStarted());
  return R().counters.grad_stats.Take(process_set_id, group);
}

Result<std::vector<std::pair<int32_t, GradStats>>> TakeAllGradStats(int32_t process_set_id) {
  HVD_RETURN_IF_ERROR(CheckStarted());
  return R().counters.grad_stats.TakeAll(process_set_id);
}

int NcclBuilt() { return ops::NcclVersionCode(); }

bool GlooBuilt() { return ops::GlooBuilt(); }
bool CclBuilt() { return ops::CclBuilt(); }

Result<std::string> HostBackendName() {
  HVD_RETURN_IF_ERROR(CheckStarted());
  return std::string(R().loop.backend_name());
}

void LowRankOrthogonalize(float* rows, int64_t r, int64_t n, double epsilon) {
  ops::LowRankOrthogonalize(rows, r, n, epsilon);
}

void LowRankStart(float* matrix, const float* error, const float* qt, int64_t r, int64_t n,
                  int64_t m, float* pt, int threads) {
  ops::LowRankStart(matrix, error, qt, r, n, m, pt, threads);
}

void LowRankFinish(float* matrix, const float* pt, const float* qt, int64_t r, int64_t n,
                   int64_t m, float* out, int threads) {
  ops::LowRankFinish(matrix, pt, qt, r, n, m, out, threads);
}

Status StreamWaitEvent(const Output& output, void* stream) {
  return ops::StreamWaitEvent(output.ready_event, stream);
}

}  // namespace hvd
