// horovod_cpp — Apache-2.0
#include "timeline/timeline.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#if defined(__linux__)
#include <pthread.h>
#endif

#include "base/logging.h"
#include "timeline/trace_json.h"

namespace hvd {
namespace timeline {
namespace {

// How often the writer drains the ring while recording. Bounds what a crash can lose.
constexpr auto kDrainPeriod = std::chrono::milliseconds(20);
// Rows beyond this many distinct tensor names go to row 0 (keeps memory bounded when a
// program uses ever-new names, e.g. unnamed ops).
constexpr size_t kMaxRows = 100000;

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

size_t RoundUpPow2(size_t n) {
  size_t p = 1;
  while (p < n) p <<= 1;
  return p;
}

}  // namespace

Timeline::Timeline(size_t capacity)
    : ring_(RoundUpPow2(capacity < 2 ? 2 : capacity)), mask_(ring_.size() - 1) {
  writer_ = std::thread(&Timeline::WriterMain, this);
}

Timeline::~Timeline() {
  Stop();
  {
    MutexLock lock(mu_);
    commands_.push_back(Command(Command::kExit));
    ++commands_sent_;
  }
  cv_.NotifyOne();
  writer_.join();
}

bool Timeline::Start(const std::string& path, bool mark_cycles, std::string* error) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    *error = "cannot open timeline file '" + path + "': " + std::strerror(errno);
    return false;
  }
  UniqueLock lock(mu_);
  Command c(Command::kStart);
  c.fd = fd;
  c.path = path;
  c.gen = gen_.load() + 1;
  c.start_ns = NowNs();
  c.epoch_micros = std::chrono::duration_cast<std::chrono::microseconds>(
                       std::chrono::system_clock::now().time_since_epoch())
                       .count();
  commands_.push_back(c);
  const uint64_t ticket = ++commands_sent_;
  mark_cycles_.store(mark_cycles);
  gen_.store(c.gen);
  active_.store(true);
  cv_.NotifyOne();
  while (commands_done_ < ticket) done_cv_.Wait(lock);
  return true;
}

uint64_t Timeline::Stop() {
  UniqueLock lock(mu_);
  if (!active_.load()) return 0;
  active_.store(false);
  commands_.push_back(Command(Command::kStop));
  const uint64_t ticket = ++commands_sent_;
  cv_.NotifyOne();
  while (commands_done_ < ticket) done_cv_.Wait(lock);
  return last_dropped_;  // written by the writer before it acknowledged the command
}

void Timeline::PauseWriterForTest(bool paused) {
  MutexLock lock(mu_);
  paused_ = paused;
  cv_.NotifyOne();
}

int32_t Timeline::Row(const std::string& tensor) {
  auto it = pids_.find(tensor);
  if (it != pids_.end()) return it->second;
  if (pids_.size() >= kMaxRows) return 0;
  const int32_t pid = static_cast<int32_t>(pids_.size()) + 1;
  pids_.emplace(tensor, pid);
  MutexLock lock(mu_);
  new_names_.emplace_back(pid, tensor);  // published before any record that uses the pid
  return pid;
}

void Timeline::Push(Kind kind, int32_t pid, const char* name, int32_t arg, int64_t ts_ns) {
  const uint64_t h = head_.load(std::memory_order_relaxed);
  const uint64_t t = tail_.load(std::memory_order_acquire);
  if (h - t > mask_) {
    dropped_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  ring_[h & mask_] = Record{
      ts_ns, name, pid, arg, gen_.load(std::memory_order_relaxed), static_cast<uint8_t>(kind)};
  head_.store(h + 1, std::memory_order_release);
}

void Timeline::Begin(const std::vector<int32_t>& rows, const char* name) {
  if (!enabled()) return;
  const int64_t ts = NowNs();
  for (int32_t row : rows) Push(kBegin, row, name, 0, ts);
}

void Timeline::Begin(int32_t row, const char* name) {
  if (!enabled()) return;
  Push(kBegin, row, name, 0, NowNs());
}

void Timeline::End(const std::vector<int32_t>& rows) {
  if (!enabled()) return;
  const int64_t ts = NowNs();
  for (int32_t row : rows) Push(kEnd, row, nullptr, 0, ts);
}

void Timeline::End(int32_t row) {
  if (!enabled()) return;
  Push(kEnd, row, nullptr, 0, NowNs());
}

void Timeline::RankReady(int32_t row, int rank) {
  if (!enabled()) return;
  Push(kRankReady, row, nullptr, rank, NowNs());
}

void Timeline::MarkCycleStart() {
  if (!enabled() || !mark_cycles()) return;
  Push(kCycle, 0, "CYCLE_START", 0, NowNs());
}

void Timeline::Counter(const std::string& name,
                       std::vector<std::pair<std::string, double>> values) {
  if (!enabled()) return;
  const int64_t now = NowNs();
  MutexLock lock(mu_);
  counters_.push_back(CounterEvent{now, gen_.load(std::memory_order_relaxed), name,
                                   std::move(values)});
}

// ---- writer thread ---------------------------------------------------------------------------

void Timeline::WriterMain() {
#if defined(__linux__)
  pthread_setname_np(pthread_self(), "hvd-timeline");
#endif
  UniqueLock lock(mu_);
  while (true) {
    if (fd_ >= 0 && !paused_) {
      const auto deadline = std::chrono::steady_clock::now() + kDrainPeriod;
      while (commands_.empty() && cv_.WaitUntil(lock, deadline)) {
      }
    } else {
      while (commands_.empty() && !(fd_ >= 0 && !paused_)) cv_.Wait(lock);
    }
    while (!commands_.empty()) {
      const Command c = commands_.front();
      commands_.pop_front();
      lock.Unlock();
      if (fd_ >= 0) {  // every command first finishes the current file
        Drain();
        FinishFile();
      }
      if (c.type == Command::kStart) {
        fd_ = c.fd;
        path_ = c.path;
        write_failed_ = false;
        file_gen_ = c.gen;
        file_start_ns_ = c.start_ns;
        written_.assign(written_.size(), false);
        open_.assign(open_.size(), 0);
        dropped_at_start_ = dropped_.load();
        out_ = "[\n";
        AppendStartMetadata(&out_, c.epoch_micros);
        WriteOut();
      }
      lock.Lock();
      ++commands_done_;
      done_cv_.NotifyAll();
      if (c.type == Command::kExit) return;
    }
    if (fd_ >= 0 && !paused_) {
      lock.Unlock();
      Drain();
      lock.Lock();
    }
  }
}

void Timeline::Drain() {
  // Read the head first: every record before it had its tensor name published beforehand.
  const uint64_t h = head_.load(std::memory_order_acquire);
  {
    MutexLock lock(mu_);
    for (auto& [pid, name] : new_names_) {
      if (names_.size() <= static_cast<size_t>(pid)) {
        names_.resize(pid + 1);
        written_.resize(pid + 1, false);
        open_.resize(pid + 1, 0);
      }
      names_[pid] = std::move(name);
    }
    new_names_.clear();
    for (const CounterEvent& e : counters_) {
      if (e.gen != file_gen_) continue;  // from a previous Start
      out_ += ",\n";
      AppendCounter(&out_, (e.ts_ns - file_start_ns_) / 1000, e.name, e.values);
    }
    counters_.clear();
  }
  uint64_t t = tail_.load(std::memory_order_relaxed);
  for (; t < h; ++t) {
    const Record r = ring_[t & mask_];
    if (r.gen != file_gen_) continue;  // from a previous Start
    const int64_t ts = (r.ts_ns - file_start_ns_) / 1000;
    if (static_cast<size_t>(r.pid) >= open_.size()) open_.resize(r.pid + 1, 0);  // row 0
    if (r.kind == kEnd && open_[r.pid] == 0) continue;  // its begin is in an earlier file
    if (r.pid > 0 && !written_[r.pid]) {
      out_ += ",\n";
      AppendTensorMetadata(&out_, r.pid, names_[r.pid]);
      written_[r.pid] = true;
    }
    out_ += ",\n";
    switch (r.kind) {
      case kBegin:
        AppendBegin(&out_, r.pid, r.name, ts);
        ++open_[r.pid];
        break;
      case kEnd:
        AppendEnd(&out_, r.pid, ts);
        --open_[r.pid];
        break;
      case kRankReady:
        AppendInstant(&out_, r.pid, std::to_string(r.arg), ts, /*global=*/false);
        break;
      case kCycle:
        AppendInstant(&out_, 0, r.name, ts, /*global=*/true);
        break;
    }
  }
  tail_.store(t, std::memory_order_release);
  WriteOut();
}

void Timeline::FinishFile() {
  const int64_t now = (NowNs() - file_start_ns_) / 1000;
  for (size_t pid = 0; pid < open_.size(); ++pid) {
    for (; open_[pid] > 0; --open_[pid]) {
      out_ += ",\n";
      AppendEnd(&out_, static_cast<int>(pid), now);
    }
  }
  const uint64_t dropped = dropped_.load() - dropped_at_start_;
  last_dropped_ = dropped;
  if (dropped > 0) {
    out_ += ",\n";
    AppendDroppedCounter(&out_, now, dropped);
  }
  out_ += "\n]\n";
  WriteOut();
  ::close(fd_);
  fd_ = -1;
}

// One write(2) per batch, so the file always ends on a whole event.
void Timeline::WriteOut() {
  size_t done = 0;
  while (fd_ >= 0 && done < out_.size()) {
    const ssize_t n = ::write(fd_, out_.data() + done, out_.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      // Disk full or similar: this batch is lost, later ones are tried again. Training goes
      // on; one warning per file says so.
      if (!write_failed_) {
        write_failed_ = true;
        HVD_LOG(WARNING) << "timeline: cannot write to '" << path_ << "': " << std::strerror(errno)
                         << "; training goes on, and timeline events that cannot be written "
                            "are lost (no further warning for this file)";
      }
      break;
    }
    done += static_cast<size_t>(n);
  }
  out_.clear();
}

}  // namespace timeline
}  // namespace hvd
