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

BackgroundLoop::BackgroundLoop(TensorQueue* queue, Counters* counters)
    : queue_(queue), counters_(counters) {}

BackgroundLoop::~BackgroundLoop() { Stop(); }

Status BackgroundLoop::Start(const Config& config, std::unique_ptr<ops::Backend> backend) {
  config_ = config;
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
    status = SyncConfig();
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

  Status end = Loop();
  Finish(end);
  Status fin = backend_->Finalize();
  if (!fin.ok()) HVD_LOG(WARNING) << "finalizing the " << backend_->name() << " backend: " << fin.message();
}

// Rank 0's values of the knobs that must agree across ranks (they decide the size of the
// negotiation bit vector and how tensors are grouped) are adopted everywhere.
Status BackgroundLoop::SyncConfig() {
  wire::Writer w;
  w.I64(config_.fusion_threshold_bytes);
  w.I64(config_.cache_capacity);
  w.F64(config_.cycle_time_ms);
  w.F64(config_.stall_check_time_seconds);
  w.F64(config_.stall_shutdown_time_seconds);
  std::vector<uint8_t> bytes = w.bytes();
  HVD_RETURN_IF_ERROR(backend_->BroadcastBytes(&bytes, 0));
  wire::Reader rd(bytes.data(), bytes.size());
  Config agreed = config_;
  HVD_RETURN_IF_ERROR(rd.I64(&agreed.fusion_threshold_bytes, "fusion threshold"));
  HVD_RETURN_IF_ERROR(rd.I64(&agreed.cache_capacity, "cache capacity"));
  HVD_RETURN_IF_ERROR(rd.F64(&agreed.cycle_time_ms, "cycle time"));
  HVD_RETURN_IF_ERROR(rd.F64(&agreed.stall_check_time_seconds, "stall check time"));
  HVD_RETURN_IF_ERROR(rd.F64(&agreed.stall_shutdown_time_seconds, "stall shutdown time"));
  if (agreed.fusion_threshold_bytes != config_.fusion_threshold_bytes ||
      agreed.cache_capacity != config_.cache_capacity ||
      agreed.cycle_time_ms != config_.cycle_time_ms) {
    HVD_LOG(WARNING) << "this rank's HOROVOD_FUSION_THRESHOLD/HOROVOD_CACHE_CAPACITY/"
                        "HOROVOD_CYCLE_TIME differ from rank 0's; using rank 0's values ("
                     << agreed.fusion_threshold_bytes << " bytes, " << agreed.cache_capacity
                     << " entries, " << agreed.cycle_time_ms << " ms)";
  }
  config_ = agreed;
  return Status::OK();
}

Status BackgroundLoop::Loop() {
  Controller controller(backend_.get(), config_, counters_);
  OpExecutor executor(backend_.get(), counters_);
  const auto cycle_time = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double, std::milli>(config_.cycle_time_ms));
  size_t outstanding = 0;
  bool idle = true;
  auto last_cycle = std::chrono::steady_clock::now();

  while (true) {
    queue_->WaitForWork(last_cycle + (idle ? std::chrono::steady_clock::duration(kIdleWait)
                                           : cycle_time));
    last_cycle = std::chrono::steady_clock::now();
    std::vector<Request> fresh = queue_->PopNewRequests();
    outstanding += fresh.size();
    Result<CycleOutcome> outcome =
        controller.RunCycle(std::move(fresh), queue_->shutdown_requested(), outstanding);
    if (!outcome.ok()) return outcome.status();
    idle = outcome->idle;

    for (const Response& group : FuseResponses(outcome->responses, config_.fusion_threshold_bytes)) {
      std::vector<TensorTableEntry> entries = queue_->Take(group.process_set_id, group.tensor_names);
      Status status = executor.Execute(group, entries);
      // Count before completing, so a caller returning from Wait sees its tensor counted.
      counters_->tensors_completed.fetch_add(entries.size(), std::memory_order_relaxed);
      outstanding -= entries.size();
      for (TensorTableEntry& e : entries) {
        if (e.callback) e.callback(status);
      }
      if (!status.ok() && status.code() == StatusCode::kUnavailable) return status;
    }
    if (outcome->shutdown) return Status::Aborted(outcome->shutdown_reason);
  }
}

void BackgroundLoop::Finish(const Status& why) {
  std::string reason = why.message();
  Status pending;
  if (why.code() == StatusCode::kAborted) {
    pending = Status::Aborted("horovod_cpp has been shut down (" + reason +
                              "); operations still pending or submitted later do not run. If "
                              "this is unexpected, look for the cause in the log of the rank "
                              "that shut down.");
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
}

}  // namespace hvd
