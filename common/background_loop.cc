// horovod_cpp — Apache-2.0
#include "common/background_loop.h"

#include <cstring>

#if defined(__linux__)
#include <pthread.h>
#include <sys/prctl.h>
#endif

#include "common/controller.h"
#include "common/fusion_planner.h"
#include "common/logging.h"
#include "common/op_executor.h"
#include "common/wire.h"

namespace hvd {

BackgroundLoop::BackgroundLoop(TensorQueue* queue, ProcessSetTable* sets, Counters* counters)
    : queue_(queue), sets_(sets), counters_(counters) {}

BackgroundLoop::~BackgroundLoop() { Stop(); }

Status BackgroundLoop::Start(const Config& config, const InitOptions& options,
                             std::unique_ptr<ops::Backend> backend) {
  config_ = config;
  options_ = options;
  backend_ = std::move(backend);
  {
    std::lock_guard<std::mutex> lock(mu_);
    init_done_ = false;
    init_status_ = Status::OK();
    end_reason_.clear();
  }
  thread_ = std::thread(&BackgroundLoop::ThreadMain, this);
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return init_done_; });
  Status status = init_status_;
  lock.unlock();
  if (!status.ok()) {
    thread_.join();
    backend_.reset();
  }
  return status;
}

void BackgroundLoop::Stop() {
  if (!thread_.joinable()) return;
  queue_->RequestShutdown();
  thread_.join();
  backend_.reset();
  timeline_.reset();
}

Status BackgroundLoop::StartTimeline(const std::string& path, bool mark_cycles) {
  if (!timeline_) return Status::OK();  // only global rank 0 records
  std::string error;
  if (!timeline_->Start(path, mark_cycles, &error)) return Status::InvalidArgument(error);
  return Status::OK();
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
  std::lock_guard<std::mutex> lock(mu_);
  return running_;
}

std::string BackgroundLoop::end_reason() const {
  std::lock_guard<std::mutex> lock(mu_);
  return end_reason_;
}

void BackgroundLoop::ThreadMain() {
#if defined(__linux__)
  pthread_setname_np(pthread_self(), "hvd-bg");
  // Sleep precisely: the default 50 us timer slack would add that much to every backoff.
  prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
#endif
  Status status = backend_->Initialize();
  if (status.ok()) {
    topology_ = backend_->topology();
    SetLogRank(topology_.rank);
    sets_->Reset(topology_.size, topology_.rank);
    status = SyncConfig();
  }
  if (status.ok()) status = CreateStaticProcessSets();
  if (status.ok() && topology_.rank == 0) {
    timeline_ = std::make_unique<timeline::Timeline>();
    if (!config_.timeline_path.empty() && config_.timeline_path != "DYNAMIC") {
      Status started = StartTimeline(config_.timeline_path, config_.timeline_mark_cycles);
      if (!started.ok()) {
        HVD_LOG(WARNING) << "HOROVOD_TIMELINE: " << started.message()
                         << "; continuing without a timeline";
      }
    }
  }
  if (!status.ok()) backend_->Finalize().IgnoreError();
  {
    std::lock_guard<std::mutex> lock(mu_);
    init_done_ = true;
    init_status_ = status;
    running_ = status.ok();
  }
  cv_.notify_all();
  if (!status.ok()) return;

  // CUDA tensors' backend (null without NCCL); its communicators are made on first use and
  // destroyed before the host backend (which bootstrapped them) is finalised.
  device_ = ops::CreateNcclCollectives(backend_.get());
  Status end = Loop();
  Finish(end);
  device_.reset();
  Status fin = backend_->Finalize();
  if (!fin.ok())
    HVD_LOG(WARNING) << "finalizing the " << backend_->name() << " backend: " << fin.message();
}

// Rank 0's values of the knobs that must agree across ranks (they decide the size of the
// negotiation bit vector and how tensors are grouped) are adopted everywhere.
Status BackgroundLoop::SyncConfig() {
  wire::Writer w;
  w.I64(config_.fusion_threshold_bytes);
  w.I64(config_.collective_chunk_bytes);
  w.I64(config_.cache_capacity);
  w.F64(config_.cycle_time_ms);
  w.F64(config_.stall_check_time_seconds);
  w.F64(config_.stall_shutdown_time_seconds);
  w.F64(config_.deadlock_grace_seconds);
  std::vector<uint8_t> bytes = w.bytes();
  HVD_RETURN_IF_ERROR(backend_->BroadcastBytes(&bytes, 0));
  wire::Reader rd(bytes.data(), bytes.size());
  Config agreed = config_;
  HVD_RETURN_IF_ERROR(rd.I64(&agreed.fusion_threshold_bytes, "fusion threshold"));
  HVD_RETURN_IF_ERROR(rd.I64(&agreed.collective_chunk_bytes, "collective chunk size"));
  HVD_RETURN_IF_ERROR(rd.I64(&agreed.cache_capacity, "cache capacity"));
  HVD_RETURN_IF_ERROR(rd.F64(&agreed.cycle_time_ms, "cycle time"));
  HVD_RETURN_IF_ERROR(rd.F64(&agreed.stall_check_time_seconds, "stall check time"));
  HVD_RETURN_IF_ERROR(rd.F64(&agreed.stall_shutdown_time_seconds, "stall shutdown time"));
  HVD_RETURN_IF_ERROR(rd.F64(&agreed.deadlock_grace_seconds, "deadlock grace"));
  if (agreed.fusion_threshold_bytes != config_.fusion_threshold_bytes ||
      agreed.collective_chunk_bytes != config_.collective_chunk_bytes ||
      agreed.cache_capacity != config_.cache_capacity ||
      agreed.cycle_time_ms != config_.cycle_time_ms) {
    HVD_LOG(WARNING) << "this rank's HOROVOD_FUSION_THRESHOLD/HOROVOD_COLLECTIVE_CHUNK_BYTES/"
                        "HOROVOD_CACHE_CAPACITY/HOROVOD_CYCLE_TIME differ from rank 0's; using "
                        "rank 0's values ("
                     << agreed.fusion_threshold_bytes << " bytes, " << agreed.collective_chunk_bytes
                     << " bytes, " << agreed.cache_capacity << " entries, " << agreed.cycle_time_ms
                     << " ms)";
  }
  config_ = agreed;
  return Status::OK();
}

// Every rank must pass the same InitOptions::process_sets: rank 0's list is broadcast, each
// rank compares, and one AND vote makes every rank fail together with the same message.
Status BackgroundLoop::CreateStaticProcessSets() {
  auto encode = [](const std::vector<std::vector<int>>& sets) {
    wire::Writer w;
    w.U32(static_cast<uint32_t>(sets.size()));
    for (const auto& ranks : sets) w.I64Vec(std::vector<int64_t>(ranks.begin(), ranks.end()));
    return w.bytes();
  };
  auto describe = [](const std::vector<std::vector<int>>& sets) {
    std::string s = "[";
    for (size_t i = 0; i < sets.size(); ++i) s += (i ? ", " : "") + RanksToString(sets[i]);
    return s + "]";
  };
  const std::vector<uint8_t> mine = encode(options_.process_sets);
  std::vector<uint8_t> root = mine;
  HVD_RETURN_IF_ERROR(backend_->BroadcastBytes(&root, 0));
  uint64_t same = root == mine ? 1 : 0;
  HVD_RETURN_IF_ERROR(backend_->AllreduceBitsAnd(&same, 1));
  if (!same) {
    return Status::InvalidArgument(
        "every rank must pass the same process sets to Init; this rank passed " +
        describe(options_.process_sets) +
        (root == mine ? " like rank 0, but another rank did not"
                      : ", which differs from rank 0's"));
  }
  for (const std::vector<int>& ranks : options_.process_sets) {
    HVD_ASSIGN_OR_RETURN(int32_t id, sets_->Add(ranks));
    HVD_RETURN_IF_ERROR(backend_->AddProcessSet(id, ranks));
  }
  return Status::OK();
}

Status BackgroundLoop::Loop() {
  Controller controller(backend_.get(), config_, sets_, counters_, timeline_.get());
  OpExecutor executor(backend_.get(), sets_, counters_, timeline_.get(),
                      config_.collective_chunk_bytes, device_.get());
  const auto cycle_time = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double, std::milli>(config_.cycle_time_ms));
  size_t outstanding = 0;
  bool idle = true, follow_up = false;
  auto last_cycle = std::chrono::steady_clock::now();

  while (true) {
    if (!follow_up) {
      queue_->WaitForWork(last_cycle +
                          (idle ? std::chrono::steady_clock::duration(kIdleWait) : cycle_time));
    }
    last_cycle = std::chrono::steady_clock::now();
    std::vector<Request> fresh = queue_->PopNewRequests();
    outstanding += fresh.size();
    Result<CycleOutcome> outcome =
        controller.RunCycle(std::move(fresh), queue_->shutdown_requested(), outstanding,
                            queue_->Blocked(), [this] { return queue_->BlockedOn(); });
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
      if (!Runs(groups[i])) continue;
      for (const std::string& name : groups[i].tensor_names) {
        rows[i].push_back(timeline_->Row(TimelineRow(TensorKey{groups[i].process_set_id, name})));
      }
      timeline_->Begin(rows[i], OpTypeName(groups[i].type));
      timeline_->Begin(rows[i], "QUEUE");
    }
    for (size_t i = 0; i < groups.size(); ++i) {
      const std::vector<int32_t>* group_rows = recording && !rows[i].empty() ? &rows[i] : nullptr;
      if (group_rows) timeline_->End(*group_rows);                     // QUEUE
      Result<size_t> done = Execute(groups[i], executor, group_rows);  // closes <OP>
      if (!done.ok()) return done.status();
      outstanding -= *done;
    }
    if (outcome->shutdown) {
      const std::string& reason = outcome->shutdown_reason;
      return outcome->shutdown_after_stall ? Status::DeadlineExceeded(reason)
                                           : Status::Aborted(reason);
    }
  }
}

bool BackgroundLoop::Runs(const Response& group) const {
  if (group.type == OpType::kProcessSetAdd || group.type == OpType::kProcessSetRemove) return true;
  Result<ProcessSetInfo> set = sets_->Get(group.process_set_id);
  // A removed set's entries were failed at removal; another set's operation is run by its
  // members (error responses are delivered to whoever has the tensor).
  return set.ok() && (set->included || group.type == OpType::kError);
}

Result<size_t> BackgroundLoop::Execute(const Response& group, OpExecutor& executor,
                                       const std::vector<int32_t>* rows) {
  const bool changes_sets =
      group.type == OpType::kProcessSetAdd || group.type == OpType::kProcessSetRemove;
  if (!Runs(group)) return size_t{0};
  std::vector<std::optional<TensorTableEntry>> taken =
      queue_->Take(group.process_set_id, group.tensor_names);
  std::vector<TensorTableEntry> entries;
  size_t mine = 0;
  for (size_t i = 0; i < taken.size(); ++i) {
    if (taken[i]) {
      entries.push_back(std::move(*taken[i]));
      ++mine;
    } else if (group.type == OpType::kAllreduce) {
      // This rank has joined: it contributes zeros of the agreed size.
      TensorTableEntry zeros;
      zeros.input = zeros.output = TensorView{nullptr, group.dtype, {group.tensor_sizes[i]}};
      entries.push_back(std::move(zeros));
    } else if (group.type != OpType::kError) {
      return Status::Internal(std::string("rank has no entry for ") + OpTypeLowerName(group.type) +
                              " '" + group.tensor_names[i] + "'");
    }
  }
  Status status;
  size_t failed_elsewhere = 0;
  if (changes_sets) {
    status =
        ChangeProcessSets(group, entries.empty() ? nullptr : &entries.front(), &failed_elsewhere);
  } else if (!entries.empty()) {
    status = executor.Execute(group, entries, rows);
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
  for (TensorTableEntry& e : entries) {
    if (e.callback) e.callback(status);
  }
  if (status.code() == StatusCode::kUnavailable) return status;  // the transport is gone
  return mine + failed_elsewhere;
}

// Agreed on every rank, in the same position of the same response list, so every rank's
// table, communicators and ids stay identical.
Status BackgroundLoop::ChangeProcessSets(const Response& group, TensorTableEntry* entry,
                                         size_t* failed) {
  if (group.type == OpType::kProcessSetAdd) {
    const std::vector<int> ranks(group.rank_sizes.begin(), group.rank_sizes.end());
    HVD_ASSIGN_OR_RETURN(int32_t id, sets_->Add(ranks));
    HVD_RETURN_IF_ERROR(backend_->AddProcessSet(id, ranks));
    if (entry) entry->result->value = id;
    return Status::OK();
  }
  const int32_t id = static_cast<int32_t>(group.rank_sizes.front());
  HVD_RETURN_IF_ERROR(sets_->Remove(id));
  HVD_RETURN_IF_ERROR(backend_->RemoveProcessSet(id));
  if (device_) device_->RemoveProcessSet(id);
  *failed =
      queue_->FailProcessSet(id, Status::Aborted("process set " + std::to_string(id) +
                                                 " was removed while this operation was pending"));
  return Status::OK();
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
    std::lock_guard<std::mutex> lock(mu_);
    running_ = false;
    end_reason_ = reason;
  }
  queue_->Close(pending);
  StopTimeline();
}

}  // namespace hvd
