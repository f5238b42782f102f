// horovod_cpp — Apache-2.0
#pragma once
// Timeline: a Chrome-tracing record of every tensor's negotiation and collective
// (HOROVOD_TIMELINE, StartTimeline/StopTimeline), cheap enough to leave on.
//
// Threads:
//  * One producer — the background thread — records events. Recording an event stamps the
//    steady clock and pushes a small fixed-size record into a bounded single-producer ring;
//    it never formats, allocates (except the first time a tensor name is seen) or blocks. When
//    the ring is full the event is dropped and counted.
//  * The writer thread ("hvd-timeline") owns the file: it drains the ring every 20 ms, formats
//    the Chrome Trace Event JSON and writes each batch with one write(2), so the file always
//    ends on a whole event.
//  * Start/Stop may be called from any thread; Stop returns once the file is closed.
//
// File layout: "[" then events separated by ",\n", then "\n]" on Stop. A process that dies
// while recording leaves a JSON array missing only its closing bracket, which chrome://tracing
// and Perfetto accept. One row (pid) per tensor, named in metadata; pid 0 carries the start
// metadata (start_time_since_epoch_in_micros) and global instants such as CYCLE_START.
//
// Depends on nothing else in horovod_cpp.

#include <atomic>
#include <cstdint>
#include <deque>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "base/mutex.h"

namespace hvd {
namespace timeline {

class Timeline {
 public:
  static constexpr size_t kDefaultCapacity = size_t{1} << 17;  // records (32 bytes each)

  explicit Timeline(size_t capacity = kDefaultCapacity);
  ~Timeline();
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  // Any thread. Starts recording into `path` (created or truncated); if already recording,
  // the current file is finished first. Returns false with `error` set if the file cannot be
  // opened (missing directory, no permission, ...).
  bool Start(const std::string& path, bool mark_cycles, std::string* error);
  // Any thread. Finishes the file (valid JSON) and returns how many events were dropped
  // because the ring was full. No-op (returns 0) when not recording.
  uint64_t Stop();
  bool enabled() const { return active_.load(std::memory_order_relaxed); }
  bool mark_cycles() const { return mark_cycles_.load(std::memory_order_relaxed); }
  // Changes with every Start: lets a producer forget spans it opened in an earlier file.
  uint32_t session() const { return gen_.load(std::memory_order_relaxed); }

  // ---- producer: the background thread only ----
  // The row of a tensor (look it up once, then record events by row).
  int32_t Row(const std::string& tensor);
  // Opens span `name` (a string literal, e.g. "NEGOTIATE_ALLREDUCE") on each row, with one
  // timestamp for all of them: tensors fused together share their spans.
  void Begin(const std::vector<int32_t>& rows, const char* name);
  void Begin(int32_t row, const char* name);
  // Closes the innermost open span on each row.
  void End(const std::vector<int32_t>& rows);
  void End(int32_t row);
  // An instant on the row named after `rank` (that rank reported the tensor ready).
  void RankReady(int32_t row, int rank);
  // A global CYCLE_START instant (only when started with mark_cycles).
  void MarkCycleStart();

  // ---- any thread ----
  // Counter `name` with these values now (a "C" event on the process row), for numbers the
  // framework tracks (adaptive training's batch size, noise scale, ...). Takes the writer's
  // lock: meant for a few events per step, not per tensor. No-op while not recording.
  void Counter(const std::string& name, std::vector<std::pair<std::string, double>> values);

  // Events dropped since construction (ring full).
  uint64_t dropped_total() const { return dropped_.load(std::memory_order_relaxed); }
  // Tests: while paused the writer drains nothing, so the ring fills up.
  void PauseWriterForTest(bool paused);

 private:
  enum Kind : uint8_t { kBegin, kEnd, kRankReady, kCycle };
  struct Record {
    int64_t ts_ns;     // steady clock
    const char* name;  // kBegin: span name
    int32_t pid;
    int32_t arg;   // kRankReady: the rank
    uint32_t gen;  // which Start() the event belongs to
    uint8_t kind;
  };
  struct Command {
    enum Type { kStart, kStop, kExit } type;
    explicit Command(Type t) : type(t) {}
    int fd = -1;
    std::string path;
    uint32_t gen = 0;
    int64_t start_ns = 0;
    int64_t epoch_micros = 0;
  };

  void Push(Kind kind, int32_t pid, const char* name, int32_t arg, int64_t ts_ns);
  void WriterMain();
  void Drain();
  void FinishFile();
  void WriteOut();

  // Ring (single producer, single consumer).
  std::vector<Record> ring_;
  const uint64_t mask_;
  std::atomic<uint64_t> head_{0};
  std::atomic<uint64_t> tail_{0};
  std::atomic<uint64_t> dropped_{0};

  std::atomic<bool> active_{false};
  std::atomic<bool> mark_cycles_{false};
  std::atomic<uint32_t> gen_{0};

  // Producer-owned: tensor name -> row.
  std::unordered_map<std::string, int32_t> pids_;

  Mutex mu_;
  CondVar cv_;
  CondVar done_cv_;
  std::deque<Command> commands_ HVD_GUARDED_BY(mu_);
  uint64_t commands_done_ HVD_GUARDED_BY(mu_) = 0;
  uint64_t commands_sent_ HVD_GUARDED_BY(mu_) = 0;
  std::vector<std::pair<int32_t, std::string>> new_names_ HVD_GUARDED_BY(mu_);
  struct CounterEvent {
    int64_t ts_ns;
    uint32_t gen;
    std::string name;
    std::vector<std::pair<std::string, double>> values;
  };
  std::vector<CounterEvent> counters_ HVD_GUARDED_BY(mu_);
  bool paused_ HVD_GUARDED_BY(mu_) = false;

  // Writer-owned.
  std::vector<std::string> names_;  // by pid
  std::vector<bool> written_;       // by pid: metadata already in the current file
  // By pid: spans begun in the current file and not yet ended. A span still open when the
  // file is finished (a negotiation under way at Stop) is closed then; an end whose begin
  // went into an earlier file is left out, so every file's spans nest.
  std::vector<uint32_t> open_;
  int fd_ = -1;
  std::string path_;
  bool write_failed_ = false;  // this file's writes failed once (warned; not again)
  uint32_t file_gen_ = 0;
  int64_t file_start_ns_ = 0;
  uint64_t dropped_at_start_ = 0;
  uint64_t last_dropped_ = 0;  // of the last finished file; read by Stop after the ack
  std::string out_;
  std::thread writer_;
};

}  // namespace timeline
}  // namespace hvd
