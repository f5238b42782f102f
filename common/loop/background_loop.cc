// horovod_cpp — Apache-2.0
#include "common/loop/background_loop.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#if defined(__linux__)
#include <pthread.h>
#include <sys/prctl.h>
#endif

#include "base/affinity.h"
#include "base/logging.h"
#include "common/negotiation/controller.h"
#include "common/execution/fusion_planner.h"
#include "common/state/handle_table.h"
#include "common/execution/op_executor.h"

namespace hvd {
namespace {

// CPUs as a bit mask (the first kCpuMaskWords * 64), for the agreement below.
constexpr int kCpuMaskWords = 16;

// Where the background thread runs (HOROVOD_THREAD_AFFINITY; docs/config.md). Plain mpirun
// binds each rank to one core, which the thread would then share with the training thread it
// exists to overlap with. It is let out onto the CPUs no rank is bound to (`free_cpus`, agreed
// by all ranks), and keeps its rank's binding when there are none: on a machine with a core
// per rank and nothing spare, a background thread on another rank's core slowed that rank's
// compute (docs/performance.md).
void PlaceBackgroundThread(const std::string& affinity, const ops::Topology& topology,
                           const std::vector<int>& free_cpus) {
  const int local_rank = topology.local_rank;
  if (!affinity.empty()) {
    std::vector<int> cpus;
    for (size_t at = 0; at <= affinity.size();) {
      const size_t comma = std::min(affinity.find(',', at), affinity.size());
      cpus.push_back(std::atoi(affinity.substr(at, comma - at).c_str()));
      at = comma + 1;
    }
    if (local_rank >= static_cast<int>(cpus.size())) {
      HVD_LOG(WARNING) << "HOROVOD_THREAD_AFFINITY=" << affinity << " has no entry for local rank "
                       << local_rank << "; the background thread keeps the rank's binding";
      return;
    }
    const Status pinned = SetThreadCpus({cpus[static_cast<size_t>(local_rank)]});
    if (!pinned.ok()) HVD_LOG(WARNING) << "HOROVOD_THREAD_AFFINITY: " << pinned.message();
    return;
  }
  const std::vector<int> bound = ThreadCpus();
  if (bound.size() != 1) return;
  if (free_cpus.empty()) {
    if (topology.rank == 0) {
      // Not a warning: which is faster depends on the model (docs/performance.md).
      HVD_LOG(INFO) << "each rank is bound to one CPU and none is spare, so horovod_cpp's "
                       "background thread shares its rank's CPU with the training thread; "
                       "hvdrun (mpirun --bind-to none) leaves ranks unbound instead";
    }
    return;
  }
  std::vector<int> cpus = free_cpus;
  cpus.push_back(bound.front());
  std::sort(cpus.begin(), cpus.end());
  const Status widened = SetThreadCpus(cpus);
  if (widened.ok()) {
    HVD_LOG(INFO) << "this rank is bound to CPU " << bound.front()
                  << "; its background thread runs on CPUs " << CpusToString(cpus)
                  << " (HOROVOD_THREAD_AFFINITY pins it)";
  } else {
    HVD_LOG(INFO) << "the background thread shares the rank's single CPU: "
                  << widened.message();
  }
}

// The CPUs of this machine that no rank's thread is bound to: each rank offers the CPUs it is
// not bound to, and one AND across ranks keeps those offered by all. Conservative across hosts
// (a CPU number busy on one host counts as busy everywhere). Every rank calls it at Init.
Result<std::vector<int>> CpusNoRankIsBoundTo(ops::Backend* backend) {
  std::vector<uint64_t> offered(kCpuMaskWords, 0);
  const std::vector<int> mine = ThreadCpus();
  for (int c = 0; c < std::min(OnlineCpus(), kCpuMaskWords * 64); ++c) {
    if (!std::binary_search(mine.begin(), mine.end(), c)) {
      offered[static_cast<size_t>(c / 64)] |= uint64_t{1} << (c % 64);
    }
  }
  HVD_RETURN_IF_ERROR(backend->AllreduceBitsAnd(offered.data(), kCpuMaskWords));
  std::vector<int> free_cpus;
  for (int c = 0; c < kCpuMaskWords * 64; ++c) {
    if (offered[static_cast<size_t>(c / 64)] >> (c % 64) & 1) free_cpus.push_back(c);
  }
  return free_cpus;
}

}  // namespace

BackgroundLoop::BackgroundLoop(TensorQueue* queue, ProcessSetTable* sets, Counters* counters)
    : queue_(queue), sets_(sets), counters_(counters) {}

BackgroundLoop::~BackgroundLoop() { Stop(); }

Status BackgroundLoop::Start(const Config& config, const InitOptions& options,
                             ops::Backends backends) {
  config_ = config;
  options_ = options;
  backend_ = std::move(backends.host);
  device_ = std::move(backends.device);
  backend_name_ = backend_->name();
  {
    MutexLock lock(mu_);
    init_done_ = false;
    init_status_ = Status::OK();
    end_reason_.clear();
  }
  thread_ = std::thread(&BackgroundLoop::ThreadMain, this);
  UniqueLock lock(mu_);
  while (!init_done_) cv_.Wait(lock);
  Status status = init_status_;
  lock.Unlock();
  if (!status.ok()) {
    thread_.join();
    device_.reset();
    backend_.reset();
  }
  return status;
}

void BackgroundLoop::Stop() {
  if (!thread_.joinable()) return;
  queue_->RequestShutdown();
  thread_.join();
  device_.reset();
  backend_.reset();
  timeline_.reset();
}

Status BackgroundLoop::StartTimeline(const std::string& path, bool mark_cycles) {
  if (!timeline_) return Status::OK();  // only global rank 0 records
  std::string error;
  if (!timeline_->Start(path, mark_cycles, &error)) return Status::InvalidArgument(error);
  return Status::OK();
}

void BackgroundLoop::TimelineCounter(const std::string& name,
                                     std::vector<std::pair<std::string, double>> values) {
  if (timeline_ != nullptr) timeline_->Counter(name, std::move(values));
}

void BackgroundLoop::StopTimeline() {
  if (!timeline_) return;
  const uint64_t dropped = timeline_->Stop();
  if (dropped > 0) {
    HVD_LOG(WARNING) << "timeline: " << dropped
                     << " events were dropped because the writer could not keep up";
  }
}

bool BackgroundLoop::running() const {
  MutexLock lock(mu_);
  return running_;
}

std::string BackgroundLoop::end_reason() const {
  MutexLock lock(mu_);
  return end_reason_;
}

void BackgroundLoop::ThreadMain() {
#if defined(__linux__)
  pthread_setname_np(pthread_self(), "hvd-bg");
  // Sleep precisely: the default 50 us timer slack would add that much to every backoff.
  prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
#endif
  Status status = Initialize();
  if (!status.ok()) {
    watchdog_.reset();
    executor_.reset();
    controller_.reset();
    backend_->Finalize().IgnoreError();
  }
  {
    MutexLock lock(mu_);
    init_done_ = true;
    init_status_ = status;
    running_ = status.ok();
  }
  cv_.NotifyAll();
  if (!status.ok()) return;

  Status end = Loop();
  watchdog_.reset();  // before the backend it may abort through goes
  if (!end.ok() && end.code() != StatusCode::kAborted) backend_->Leaving(end);
  Finish(end);
  executor_.reset();
  controller_.reset();
  // The device backend's communicators were bootstrapped over the host backend: they go first.
  device_.reset();
  Status fin = backend_->Finalize();
  if (!fin.ok())
    HVD_LOG(WARNING) << "finalizing the " << backend_->name() << " backend: " << fin.message();
}

Status BackgroundLoop::Initialize() {
  HVD_RETURN_IF_ERROR(backend_->Initialize());
  topology_ = backend_->topology();
  SetLogRank(topology_.rank);
  sets_->Reset(topology_.size, topology_.rank);
  HVD_RETURN_IF_ERROR(config_.AgreeWithRank0(
      [this](std::vector<uint8_t>* bytes) { return backend_->BroadcastBytes(bytes, 0); }));
  if (config_.collective_timeout_seconds > 0 && topology_.size > 1) {
    HVD_RETURN_IF_ERROR(StartWatchdog());
  }
  const std::string hierarchical = backend_->UseHierarchical(config_.hierarchical_allreduce,
                                                             config_.hierarchical_allgather);
  if (topology_.rank == 0 && !hierarchical.empty()) {
    HVD_LOG(WARNING) << hierarchical;
  } else if (topology_.rank == 0 &&
             (config_.hierarchical_allreduce || config_.hierarchical_allgather)) {
    HVD_LOG(INFO) << "hierarchical"
                  << (config_.hierarchical_allreduce ? " allreduce" : "")
                  << (config_.hierarchical_allreduce && config_.hierarchical_allgather ? " and" : "")
                  << (config_.hierarchical_allgather ? " allgather" : "") << " on "
                  << topology_.cross_size << " hosts x " << topology_.local_size << " ranks";
  }
  HVD_ASSIGN_OR_RETURN(std::vector<int> free_cpus, CpusNoRankIsBoundTo(backend_.get()));
  PlaceBackgroundThread(config_.thread_affinity, topology_, free_cpus);
  if (topology_.rank == 0) timeline_ = std::make_unique<timeline::Timeline>();
  controller_ = std::make_unique<Controller>(backend_.get(), config_, sets_, counters_,
                                             timeline_.get());
  executor_ = std::make_unique<OpExecutor>(backend_.get(), sets_, counters_, timeline_.get(),
                                           config_.collective_chunk_bytes, device_.get());
  HVD_RETURN_IF_ERROR(controller_->CreateStaticProcessSets(options_.process_sets));
  if (config_.autotune) HVD_RETURN_IF_ERROR(StartAutotune());
  if (timeline_ && !config_.timeline_path.empty() && config_.timeline_path != "DYNAMIC") {
    Status started = StartTimeline(config_.timeline_path, config_.timeline_mark_cycles);
    if (!started.ok()) {
      HVD_LOG(WARNING) << "HOROVOD_TIMELINE: " << started.message()
                       << "; continuing without a timeline";
    }
  }
  return Status::OK();
}

Status BackgroundLoop::StartWatchdog() {
  CollectiveWatchdog::Options options;
  options.timeout_seconds = config_.collective_timeout_seconds;
  options.rank = topology_.rank;
  options.pending = [this] { return queue_->BlockedOn(); };
  ops::Backend* backend = backend_.get();
  options.on_timeout = [backend](const std::string& report) {
    HVD_LOG(ERROR) << report << "\n  ending the job (" << backend->name() << " abort)";
    // If the abort cannot end this process (it waits for a launcher it cannot reach), this does.
    std::thread([] {
      std::this_thread::sleep_for(kAbortGrace);
      std::_Exit(kCollectiveTimeoutExitCode);
    }).detach();
    backend->Abort(kCollectiveTimeoutExitCode);
  };
  Result<std::unique_ptr<CollectiveWatchdog>> dog = CollectiveWatchdog::Create(std::move(options));
  std::vector<uint8_t> mine;
  if (dog.ok()) {
    watchdog_ = std::move(*dog);
    mine = watchdog_->Endpoint();
    HVD_LOG(INFO) << "collective timeout: this rank answers the others' probes on TCP port "
                  << watchdog_->port();
  } else {  // every rank still takes part in the exchange below
    HVD_LOG(WARNING) << dog.status().message() << "; this rank will not answer the others'";
  }
  std::vector<std::vector<uint8_t>> all;
  HVD_RETURN_IF_ERROR(backend_->GatherBytes(mine, &all));
  std::vector<uint8_t> table;
  if (topology_.rank == 0) table = CollectiveWatchdog::MakeTable(all);
  HVD_RETURN_IF_ERROR(backend_->BroadcastBytes(&table, 0));
  return watchdog_ ? watchdog_->SetTable(table) : Status::OK();
}

Status BackgroundLoop::StartAutotune() {
  // Hierarchical allreduce is a candidate where the backend has it and every host runs the
  // same number of ranks (>1) on several hosts. UseHierarchical is collective and its answer
  // the same everywhere; then the configured state is restored.
  const bool alike = backend_->UseHierarchical(true, false).empty();
  backend_->UseHierarchical(config_.hierarchical_allreduce, config_.hierarchical_allgather);
  Autotuner::Options o;
  o.rank = topology_.rank;
  o.warmup_samples = static_cast<int>(config_.autotune_warmup_samples);
  o.steps_per_sample = static_cast<int>(config_.autotune_steps_per_sample);
  o.max_samples = static_cast<int>(config_.autotune_bayes_opt_max_samples);
  o.tune_hierarchical = alike && topology_.cross_size > 1 && topology_.local_size > 1;
  const std::pair<const char*, const char*> fixed[] = {
      {"HOROVOD_FUSION_THRESHOLD", "fusion"}, {"HOROVOD_COLLECTIVE_CHUNK_BYTES", "chunk"},
      {"HOROVOD_CYCLE_TIME", "cycle"},        {"HOROVOD_CACHE_CAPACITY", "cache"},
      {"HOROVOD_HIERARCHICAL_ALLREDUCE", "hierarchical"}};
  for (const auto& [variable, knob] : fixed) {
    if (config_.SetInEnv(variable)) o.fixed.push_back(knob);
  }
  if (topology_.rank == 0) o.log_path = config_.autotune_log;
  running_knobs_.fusion_threshold_bytes = config_.fusion_threshold_bytes;
  running_knobs_.chunk_bytes = config_.collective_chunk_bytes;
  running_knobs_.cycle_time_ms = config_.cycle_time_ms;
  running_knobs_.cache = config_.cache_capacity > 0;
  running_knobs_.hierarchical_allreduce = config_.hierarchical_allreduce && alike;
  // Rank 0 alone decides the knobs, so only it reads the comparison file; what it found
  // wrong there (empty: nothing) is broadcast, so that every rank's Init fails with it.
  std::vector<uint8_t> problem;
  if (topology_.rank == 0 && !config_.autotune_compare.empty()) {
    std::ifstream in(config_.autotune_compare);
    std::stringstream text;
    text << in.rdbuf();
    const Status parsed =
        in.is_open()
            ? Autotuner::ParseCompare(text.str(), running_knobs_, &o.compare)
            : Status::InvalidArgument("HOROVOD_AUTOTUNE_COMPARE: cannot read " +
                                      config_.autotune_compare);
    if (!parsed.ok()) problem.assign(parsed.message().begin(), parsed.message().end());
  }
  HVD_RETURN_IF_ERROR(backend_->BroadcastBytes(&problem, 0));
  if (!problem.empty()) {
    return Status::InvalidArgument(std::string(problem.begin(), problem.end()) +
                                   " (rank 0's file)");
  }
  autotuner_ = std::make_unique<Autotuner>(std::move(o), running_knobs_);
  counters_->PublishKnobs(running_knobs_, 0);
  return Status::OK();
}

Status BackgroundLoop::ApplyTunedKnobs() {
  std::optional<CollectiveWatchdog::Scope> watch = Watch(nullptr);
  HVD_ASSIGN_OR_RETURN(
      TunedKnobs k, autotuner_->Exchange([this](std::vector<uint8_t>* bytes) {
        return backend_->BroadcastBytes(bytes, 0);
      }));
  // Every collective of the cycle has completed: nothing uses a buffer or the cache now.
  config_.fusion_threshold_bytes = k.fusion_threshold_bytes;
  config_.collective_chunk_bytes = k.chunk_bytes;
  executor_->set_chunk_bytes(k.chunk_bytes);
  config_.cycle_time_ms = k.cycle_time_ms;
  if (k.cache != running_knobs_.cache) {
    controller_->ResetCache(k.cache ? static_cast<uint32_t>(config_.cache_capacity) : 0);
  }
  if (k.hierarchical_allreduce != running_knobs_.hierarchical_allreduce) {
    backend_->UseHierarchical(k.hierarchical_allreduce, config_.hierarchical_allgather);
  }
  running_knobs_ = k;
  counters_->PublishKnobs(k, static_cast<uint64_t>(autotuner_->samples_ended()));
  return Status::OK();
}

Status BackgroundLoop::Loop() {
  size_t outstanding = 0;
  bool idle = true, follow_up = false;
  auto last_cycle = std::chrono::steady_clock::now();

  while (true) {
    // (read each cycle: the autotuner may change it)
    const auto cycle_time = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::duration<double, std::milli>(config_.cycle_time_ms));
    if (!follow_up) {
      queue_->WaitForWork(
          last_cycle + (idle ? std::chrono::steady_clock::duration(kIdleWait) : cycle_time),
          kBurstGap, cycle_time);
    }
    last_cycle = std::chrono::steady_clock::now();
    std::vector<Request> fresh = queue_->PopNewRequests();
    outstanding += fresh.size();
    std::optional<CollectiveWatchdog::Scope> watch = Watch(nullptr);
    Result<CycleOutcome> outcome =
        controller_->RunCycle(std::move(fresh), queue_->shutdown_requested(), outstanding,
                            queue_->Blocked(), [this] { return queue_->BlockedOn(); });
    watch.reset();
    if (!outcome.ok()) return outcome.status();
    if (!outcome->deadlocked.empty()) {  // identical on every rank: fail what can never run
      outstanding -= queue_->FailKeys(outcome->deadlocked, Status::Aborted(outcome->deadlock));
    }
    idle = outcome->idle;
    follow_up = outcome->follow_up;

    const std::vector<Response> groups =
        FuseResponses(outcome->responses, config_.fusion_threshold_bytes);
    // Timeline: each group's <OP> span opens now, with a QUEUE span until its turn comes.
    const bool recording = timeline_ && timeline_->enabled();
    std::vector<std::vector<int32_t>> rows(recording ? groups.size() : 0);
    for (size_t i = 0; i < rows.size(); ++i) {
      if (!controller_->RunsHere(groups[i])) continue;
      for (const std::string& name : groups[i].tensor_names) {
        rows[i].push_back(timeline_->Row(TimelineRow(TensorKey{groups[i].process_set_id, name})));
      }
      timeline_->Begin(rows[i], OpTypeName(groups[i].type));
      timeline_->Begin(rows[i], "QUEUE");
    }
    for (size_t i = 0; i < groups.size(); ++i) {
      const std::vector<int32_t>* group_rows = recording && !rows[i].empty() ? &rows[i] : nullptr;
      if (group_rows) timeline_->End(*group_rows);                     // QUEUE
      Result<size_t> done = [&] {
        std::optional<CollectiveWatchdog::Scope> watching = Watch(&groups[i]);
        return Execute(groups[i], group_rows);  // closes <OP>
      }();
      if (!done.ok()) return done.status();
      outstanding -= *done;
    }
    // The responses are the same on every rank, so every rank ends a sample at this cycle.
    if (autotuner_ && autotuner_->Observe(outcome->responses, std::chrono::steady_clock::now())) {
      HVD_RETURN_IF_ERROR(ApplyTunedKnobs());
    }
    if (outcome->shutdown) {
      const std::string& reason = outcome->shutdown_reason;
      return outcome->shutdown_after_stall ? Status::DeadlineExceeded(reason)
                                           : Status::Aborted(reason);
    }
  }
}

Result<size_t> BackgroundLoop::Execute(const Response& group, const std::vector<int32_t>* rows) {
  if (!controller_->RunsHere(group)) return size_t{0};
  std::vector<std::optional<TensorTableEntry>> taken =
      queue_->Take(group.process_set_id, group.tensor_names);
  const size_t mine = static_cast<size_t>(
      std::count_if(taken.begin(), taken.end(), [](const auto& e) { return e.has_value(); }));
  HVD_ASSIGN_OR_RETURN(std::vector<TensorTableEntry> entries,
                       controller_->EntriesToRun(group, std::move(taken)));
  Status status;
  size_t failed_elsewhere = 0;
  if (group.type == OpType::kProcessSetAdd || group.type == OpType::kProcessSetRemove) {
    Result<int32_t> id = controller_->ChangeProcessSets(group);
    status = id.status();
    if (id.ok() && group.type == OpType::kProcessSetAdd) {
      for (TensorTableEntry& e : entries) e.result->value = *id;
    } else if (id.ok()) {  // removed: its device communicators and pending operations go too
      if (device_) device_->RemoveProcessSet(*id);
      failed_elsewhere = queue_->FailProcessSet(
          *id, Status::Aborted("process set " + std::to_string(*id) +
                               " was removed while this operation was pending"));
    }
  } else if (!entries.empty()) {
    status = executor_->Execute(group, entries, rows);
  } else {
    status = Status::FailedPrecondition(group.error_message);  // an error for other ranks only
  }
  if (group.type == OpType::kJoin) {
    for (TensorTableEntry& e : entries) e.result->value = group.last_joined_rank;
  }
  // Close the timeline span and count before completing: a caller returning from Wait must
  // find its operation recorded and counted.
  if (rows) timeline_->End(*rows);  // <OP>
  counters_->tensors_completed.fetch_add(mine, std::memory_order_relaxed);
  {
    HandleTable::DeferWakeups wake_once;  // the group's waiters wake when all of it is done
    for (TensorTableEntry& e : entries) {
      if (e.callback) e.callback(status);
    }
  }
  if (status.code() == StatusCode::kUnavailable) return status;  // the transport is gone
  return mine + failed_elsewhere;
}

void BackgroundLoop::Finish(const Status& why) {
  std::string reason = why.message();
  Status pending;
  if (why.code() == StatusCode::kAborted) {
    pending = Status::Aborted("horovod_cpp has been shut down (" + reason +
                              "); operations still pending or submitted later do not run. If "
                              "this is unexpected, look for the cause in the log of the rank "
                              "that shut down.");
  } else if (why.code() == StatusCode::kDeadlineExceeded) {
    HVD_LOG(ERROR) << "shutting down: " << reason;
    pending = Status::DeadlineExceeded("horovod_cpp shut down after a stall (" + reason +
                                       "); operations still pending or submitted later do not "
                                       "run. Rank 0's log lists the tensors each rank missed.");
  } else {
    HVD_LOG(ERROR) << "the background loop stopped: " << why.ToString();
    pending = Status(why.code(), "horovod_cpp stopped after an error: " + reason);
  }
  {
    MutexLock lock(mu_);
    running_ = false;
    end_reason_ = reason;
  }
  queue_->Close(pending);
  StopTimeline();
}

}  // namespace hvd
