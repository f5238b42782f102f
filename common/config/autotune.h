// horovod_cpp — Apache-2.0
#pragma once
// The autotuner (HOROVOD_AUTOTUNE=1): tunes the runtime's own knobs while the job trains.
//
// What it tunes: the fusion threshold, the size of each collective call (chunk), the cycle
// time, the response cache (on or off) and, where every host runs as many ranks, hierarchical
// allreduce. A knob set in the environment (HOROVOD_FUSION_THRESHOLD=...) stays as set, as in
// Horovod.
//
// How: a step is one round of the job's tensors: a step begins with the cycle in which a
// tensor comes back that the current step has already reduced, and a sample is
// --steps-per-sample steps. Steps are counted from the agreed responses, which are the same
// on every rank, so every rank knows when a sample ends without asking. The score of a sample
// is rank 0's bytes reduced per second of wall time over it, which for a training loop is
// proportional to its steps per second. After the warm-up samples, rank 0 searches one knob at
// a time (the most consequential first): every value of the knob is sampled with the others at
// their best so far, and a value other than the incumbent must win a re-check by more than
// kMargin to be adopted: the two sampled again in ABBA order (challenger, incumbent,
// incumbent, challenger), deciding on those four samples alone, so that neither noise nor a
// job that speeds up or slows down over time (which favours whatever is sampled later) fools
// it into a change. After at most --bayes-opt-max-samples samples it settles on the best
// values. It then keeps scoring: when the score at those values moves by more than
// kRetuneChange for kRetuneSamples samples in a row (a link got slower or faster, the job
// changed), it searches again.
//
// Agreement: at the end of every sample each rank calls Exchange(), a broadcast from rank 0 of
// the knobs to use from the next cycle on (the values it decided, its phase). The background
// loop applies them between cycles: every collective of the cycle has completed by then, and a
// buffer is only ever grown by the background thread before the collective that uses it, so no
// buffer changes under a running collective (Horovod's issue #1282).
//
// Log: with a log path, rank 0 writes one CSV line per sample (the knobs it ran with and the
// score), plus a line for each decision.
//
// Owned by the background thread; not thread-safe.

#include <chrono>
#include <cstdint>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

#include "base/status.h"
#include "common/protocol/message.h"

namespace hvd {

// The values the autotuner sets. Every rank runs with the same.
struct TunedKnobs {
  int64_t fusion_threshold_bytes = 0;
  int64_t chunk_bytes = 0;
  double cycle_time_ms = 0;
  bool cache = true;
  bool hierarchical_allreduce = false;
  bool operator==(const TunedKnobs& o) const;
  bool operator!=(const TunedKnobs& o) const { return !(*this == o); }
};

class Autotuner {
 public:
  using Clock = std::chrono::steady_clock;
  // A value must beat the incumbent by this much (relative score) to replace it.
  static constexpr double kMargin = 0.03;
  // Tuned: the score moving by more than this for kRetuneSamples samples in a row starts a new
  // search. A link 10x slower moves it by far more; this machine's own drift moved it by 35 %
  // for minutes (measured: 25 % here started needless searches, whose bad candidates cost).
  static constexpr double kRetuneChange = 0.5;
  static constexpr int kRetuneSamples = 3;

  struct Options {
    int rank = 0;
    int warmup_samples = 3;     // HOROVOD_AUTOTUNE_WARMUP_SAMPLES: samples not scored
    int steps_per_sample = 10;  // HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE
    int max_samples = 20;       // HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES: search length
    bool tune_hierarchical = false;  // every host the same number of ranks, several hosts
    // Knobs not to tune (set in the environment): "fusion", "chunk", "cycle", "cache",
    // "hierarchical".
    std::vector<std::string> fixed;
    std::string log_path;  // rank 0 only; empty: no log
    // HOROVOD_AUTOTUNE_COMPARE (rank 0; benchmarks): once settled, every other sample runs
    // the next of these static settings, round robin, and the log marks it "compare". Those
    // samples do not count towards the re-tune check.
    std::vector<TunedKnobs> compare;
  };

  // The settings of a HOROVOD_AUTOTUNE_COMPARE file's `text`: one per line, `defaults` or
  // `fusion=BYTES chunk=BYTES cycle=MS cache=0|1` (any of them; the others as in `base`);
  // blank lines and `#` comments skipped.
  static Status ParseCompare(const std::string& text, const TunedKnobs& base,
                             std::vector<TunedKnobs>* out);

  // `initial`: the values the job started with (the configuration's).
  Autotuner(Options options, TunedKnobs initial);
  ~Autotuner();
  Autotuner(const Autotuner&) = delete;
  Autotuner& operator=(const Autotuner&) = delete;

  // After a cycle's responses have run, on every rank: counts steps. True when a sample ends
  // with this cycle; every rank then calls Exchange().
  bool Observe(const std::vector<Response>& responses, Clock::time_point now);

  // Collective. Rank 0 scores the sample that just ended, decides the next knobs and sends
  // them; every rank returns them. `broadcast` replaces its argument with rank 0's bytes.
  Result<TunedKnobs> Exchange(const std::function<Status(std::vector<uint8_t>*)>& broadcast);

  const TunedKnobs& knobs() const { return current_; }
  // Searching (true) or settled on its best values (false).
  bool searching() const { return phase_ != Phase::kTuned; }
  // Samples ended so far (warm-up included): the same on every rank after each Exchange.
  int samples_ended() const { return samples_ended_; }

  // The candidate values of each tunable knob, in the order searched.
  struct Dimension {
    std::string name;
    std::vector<TunedKnobs> (*values)(const TunedKnobs& at);
  };

  // Wire form of an Exchange (for tests): knobs, phase.
  static std::vector<uint8_t> Encode(const TunedKnobs& knobs, bool searching);
  static Status Decode(const std::vector<uint8_t>& bytes, TunedKnobs* knobs, bool* searching);

 private:
  enum class Phase { kWarmup, kSearch, kTuned };
  void Decide(double score);   // rank 0
  void StartSearch();          // rank 0
  void NextDimension();        // rank 0
  void Log(double score);      // rank 0
  void LogLine(const std::string& line);

  Options options_;
  TunedKnobs current_;
  Phase phase_ = Phase::kWarmup;
  int warmup_left_;
  int samples_ = 0;  // scored samples (search and tuned; rank 0)
  int samples_ended_ = 0;

  // Step counting (every rank).
  std::unordered_set<std::string> in_step_;  // the tensors reduced in the current step
  int steps_ = 0;                             // steps begun since the sample began
  double bytes_ = 0;
  Clock::time_point sample_start_;
  bool started_ = false;
  double last_score_ = 0;

  // The search (rank 0).
  TunedKnobs best_;
  std::vector<Dimension> dimensions_;
  size_t dimension_ = 0;
  std::vector<TunedKnobs> candidates_;
  std::vector<double> scores_;     // per candidate
  size_t next_ = 0;                // next candidate to sample
  // Re-check: the challenger and the incumbent, sampled in ABBA order.
  bool rechecking_ = false;
  TunedKnobs challenger_, incumbent_;
  std::vector<double> challenger_scores_, incumbent_scores_;
  int search_samples_ = 0;
  // Comparison (Options::compare): the sample that is running is one, and the next to run.
  bool comparing_ = false;
  size_t compare_next_ = 0;
  // Tuned: the reference score and how many samples in a row have moved away from it.
  std::vector<double> reference_scores_;
  double reference_ = 0;
  int moved_ = 0;

  std::unique_ptr<std::ofstream> log_;
};

// A line of the knobs, for logs and errors: "fusion=64MiB chunk=1MiB cycle=1ms cache=on
// hierarchical=off".
std::string DescribeKnobs(const TunedKnobs& knobs);

}  // namespace hvd
