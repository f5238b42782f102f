// horovod_cpp — Apache-2.0
#include "common/config/autotune.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <iomanip>
#include <numeric>
#include <sstream>

#include "base/logging.h"
#include "common/protocol/wire.h"

namespace hvd {
namespace {

constexpr uint8_t kAutotuneWireVersion = 1;
constexpr int64_t kMiB = int64_t{1} << 20;

// Each dimension's candidates: `at` with one field set to each value (the incumbent's value
// first when it is not among them, so that it is measured in the same pass as the others).
template <typename T, typename Set>
std::vector<TunedKnobs> Vary(const TunedKnobs& at, T current, std::vector<T> values, Set set) {
  if (std::find(values.begin(), values.end(), current) == values.end()) {
    values.insert(values.begin(), current);
  }
  std::vector<TunedKnobs> out;
  for (const T& v : values) {
    TunedKnobs k = at;
    set(&k, v);
    out.push_back(k);
  }
  return out;
}

// The size of each collective call: the biggest lever on this kind of machine (one 64 MiB
// call ran 2.3-2.8x slower than 16 calls of 4 MiB; docs/performance.md).
std::vector<TunedKnobs> ChunkValues(const TunedKnobs& at) {
  return Vary<int64_t>(at, at.chunk_bytes, {kMiB / 4, kMiB, 4 * kMiB, 16 * kMiB},
                       [](TunedKnobs* k, int64_t v) { k->chunk_bytes = v; });
}
// Fusion: many small tensors in few collectives, against waiting for a big buffer to fill.
std::vector<TunedKnobs> FusionValues(const TunedKnobs& at) {
  return Vary<int64_t>(at, at.fusion_threshold_bytes,
                       {4 * kMiB, 16 * kMiB, 32 * kMiB, 64 * kMiB, 128 * kMiB},
                       [](TunedKnobs* k, int64_t v) { k->fusion_threshold_bytes = v; });
}
std::vector<TunedKnobs> HierarchicalValues(const TunedKnobs& at) {
  return Vary<bool>(at, at.hierarchical_allreduce, {false, true},
                    [](TunedKnobs* k, bool v) { k->hierarchical_allreduce = v; });
}
// The loop wakes at once when work arrives; the cycle time only bounds how long it gathers a
// burst, and how often it polls while work is outstanding.
std::vector<TunedKnobs> CycleValues(const TunedKnobs& at) {
  return Vary<double>(at, at.cycle_time_ms, {0.5, 1.0, 5.0},
                      [](TunedKnobs* k, double v) { k->cycle_time_ms = v; });
}
std::vector<TunedKnobs> CacheValues(const TunedKnobs& at) {
  return Vary<bool>(at, at.cache, {true, false}, [](TunedKnobs* k, bool v) { k->cache = v; });
}

// The re-check's order: true for the challenger's samples.
constexpr std::array<bool, 4> kRecheckOrder = {true, false, false, true};

double Mean(const std::vector<double>& v) {
  return v.empty() ? 0.0 : std::accumulate(v.begin(), v.end(), 0.0) / v.size();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

std::string Size(int64_t bytes) {
  if (bytes > 0 && bytes % kMiB == 0) return std::to_string(bytes / kMiB) + "MiB";
  if (bytes > 0 && bytes % 1024 == 0) return std::to_string(bytes / 1024) + "KiB";
  return std::to_string(bytes) + "B";
}

}  // namespace

bool TunedKnobs::operator==(const TunedKnobs& o) const {
  return fusion_threshold_bytes == o.fusion_threshold_bytes && chunk_bytes == o.chunk_bytes &&
         cycle_time_ms == o.cycle_time_ms && cache == o.cache &&
         hierarchical_allreduce == o.hierarchical_allreduce;
}

std::string DescribeKnobs(const TunedKnobs& k) {
  std::ostringstream out;
  out << "fusion=" << Size(k.fusion_threshold_bytes) << " chunk=" << Size(k.chunk_bytes)
      << " cycle=" << k.cycle_time_ms << "ms cache=" << (k.cache ? "on" : "off")
      << " hierarchical=" << (k.hierarchical_allreduce ? "on" : "off");
  return out.str();
}

Autotuner::Autotuner(Options options, TunedKnobs initial)
    : options_(std::move(options)),
      current_(initial),
      warmup_left_(std::max(0, options_.warmup_samples)),
      best_(initial) {
  auto fixed = [this](const char* name) {
    return std::find(options_.fixed.begin(), options_.fixed.end(), name) !=
           options_.fixed.end();
  };
  // Most consequential first: a search cut short by the sample budget loses the least.
  if (!fixed("chunk")) dimensions_.push_back({"chunk", &ChunkValues});
  if (!fixed("fusion")) dimensions_.push_back({"fusion", &FusionValues});
  if (options_.tune_hierarchical && !fixed("hierarchical")) {
    dimensions_.push_back({"hierarchical", &HierarchicalValues});
  }
  if (!fixed("cycle")) dimensions_.push_back({"cycle", &CycleValues});
  if (!fixed("cache")) dimensions_.push_back({"cache", &CacheValues});
  if (options_.rank == 0 && !options_.log_path.empty()) {
    log_ = std::make_unique<std::ofstream>(options_.log_path, std::ios::out | std::ios::trunc);
    if (!log_->good()) {
      HVD_LOG(WARNING) << "HOROVOD_AUTOTUNE_LOG: cannot write " << options_.log_path
                       << "; tuning without a log";
      log_.reset();
    } else {
      *log_ << "sample,phase,fusion_threshold_bytes,chunk_bytes,cycle_time_ms,cache,"
               "hierarchical_allreduce,score_bytes_per_second\n";
      log_->flush();
    }
  }
  if (options_.rank == 0) {
    std::string tuned;
    for (const Dimension& d : dimensions_) tuned += (tuned.empty() ? "" : ", ") + d.name;
    HVD_LOG(INFO) << "autotune: tuning " << (tuned.empty() ? "nothing" : tuned) << " from "
                  << DescribeKnobs(initial) << "; " << options_.warmup_samples
                  << " warm-up samples of " << options_.steps_per_sample << " steps";
  }
}

Autotuner::~Autotuner() = default;

bool Autotuner::Observe(const std::vector<Response>& responses, Clock::time_point now) {
  if (responses.empty()) return false;
  // The first sample starts when the job's first collectives have run (`now`): their bytes
  // are not the sample's.
  const bool first = !started_;
  if (first) {
    started_ = true;
    sample_start_ = now;
  }
  // A step begins with the cycle in which a tensor comes back that the current step has
  // already reduced: in a training loop, the cycle holding the step's first gradients, the
  // same point of every step, so a sample is a whole number of steps however the steps fall
  // into cycles.
  std::vector<std::string> keys;
  bool repeat = false;
  for (const Response& r : responses) {
    for (size_t i = 0; i < r.tensor_names.size(); ++i) {
      keys.push_back(std::to_string(r.process_set_id) + "/" + r.tensor_names[i]);
      repeat = repeat || in_step_.count(keys.back()) > 0;
      if (!first && i < r.tensor_sizes.size() && r.type != OpType::kError) {
        bytes_ += static_cast<double>(r.tensor_sizes[i]) * DataTypeSize(r.dtype);
      }
    }
  }
  if (repeat) {
    in_step_.clear();
    ++steps_;
  }
  in_step_.insert(std::make_move_iterator(keys.begin()), std::make_move_iterator(keys.end()));
  if (!repeat || steps_ < options_.steps_per_sample) return false;
  // The cycle that began a step ends the sample; its bytes were reduced within the sample's
  // time and the step it begins belongs to the next sample (in_step_ keeps its tensors).
  const double seconds = std::chrono::duration<double>(now - sample_start_).count();
  last_score_ = seconds > 0 ? bytes_ / seconds : 0.0;
  steps_ = 0;
  bytes_ = 0;
  sample_start_ = now;
  return true;
}

Result<TunedKnobs> Autotuner::Exchange(
    const std::function<Status(std::vector<uint8_t>*)>& broadcast) {
  ++samples_ended_;
  std::vector<uint8_t> bytes;
  if (options_.rank == 0) {
    Decide(last_score_);
    bytes = Encode(current_, searching());
  }
  HVD_RETURN_IF_ERROR(broadcast(&bytes));
  if (options_.rank != 0) {
    bool searching = true;
    HVD_RETURN_IF_ERROR(Decode(bytes, &current_, &searching));
    phase_ = searching ? Phase::kSearch : Phase::kTuned;
  }
  return current_;
}

std::vector<uint8_t> Autotuner::Encode(const TunedKnobs& k, bool searching) {
  wire::Writer w;
  w.U8(kAutotuneWireVersion);
  w.I64(k.fusion_threshold_bytes);
  w.I64(k.chunk_bytes);
  w.F64(k.cycle_time_ms);
  w.U8(k.cache ? 1 : 0);
  w.U8(k.hierarchical_allreduce ? 1 : 0);
  w.U8(searching ? 1 : 0);
  return w.bytes();
}

Status Autotuner::Decode(const std::vector<uint8_t>& bytes, TunedKnobs* k, bool* searching) {
  wire::Reader r(bytes.data(), bytes.size());
  uint8_t version = 0, cache = 0, hierarchical = 0, search = 0;
  HVD_RETURN_IF_ERROR(r.U8(&version, "autotune version"));
  if (version != kAutotuneWireVersion) {
    return Status::Internal("autotune: rank 0 sent version " + std::to_string(version) +
                            ", this rank reads " + std::to_string(kAutotuneWireVersion));
  }
  TunedKnobs out;
  HVD_RETURN_IF_ERROR(r.I64(&out.fusion_threshold_bytes, "autotune fusion threshold"));
  HVD_RETURN_IF_ERROR(r.I64(&out.chunk_bytes, "autotune chunk"));
  HVD_RETURN_IF_ERROR(r.F64(&out.cycle_time_ms, "autotune cycle time"));
  HVD_RETURN_IF_ERROR(r.U8(&cache, "autotune cache"));
  HVD_RETURN_IF_ERROR(r.U8(&hierarchical, "autotune hierarchical"));
  HVD_RETURN_IF_ERROR(r.U8(&search, "autotune phase"));
  out.cache = cache != 0;
  out.hierarchical_allreduce = hierarchical != 0;
  *k = out;
  *searching = search != 0;
  return Status::OK();
}

void Autotuner::Decide(double score) {
  if (phase_ == Phase::kWarmup) {
    Log(score);
    if (--warmup_left_ <= 0) StartSearch();
    return;
  }
  ++samples_;
  Log(score);
  if (phase_ == Phase::kTuned) {
    if (comparing_) {  // a static setting's sample (logged above); back to the tuned values
      comparing_ = false;
      current_ = best_;
      return;
    }
    if (reference_scores_.size() < static_cast<size_t>(kRetuneSamples)) {
      reference_scores_.push_back(score);
      reference_ = Median(reference_scores_);
    } else {
      moved_ = std::fabs(score - reference_) > kRetuneChange * reference_ ? moved_ + 1 : 0;
      if (moved_ >= kRetuneSamples) {
        std::ostringstream why;
        why << "score " << std::setprecision(3) << score / 1e6 << " MB/s, "
            << kRetuneSamples << " samples in a row more than " << 100 * kRetuneChange
            << "% from " << reference_ / 1e6 << " MB/s: searching again";
        LogLine("# " + why.str());
        HVD_LOG(INFO) << "autotune: " << why.str();
        StartSearch();
        return;
      }
    }
    if (!options_.compare.empty()) {
      current_ = options_.compare[compare_next_++ % options_.compare.size()];
      comparing_ = true;
    }
    return;
  }
  ++search_samples_;
  if (rechecking_) {
    // ABBA: challenger, incumbent, incumbent, challenger. Each has the same mean position in
    // time, so a job that speeds up or slows down steadily favours neither.
    const size_t done = challenger_scores_.size() + incumbent_scores_.size();
    (kRecheckOrder[done] ? challenger_scores_ : incumbent_scores_).push_back(score);
    if (done + 1 < kRecheckOrder.size()) {
      current_ = kRecheckOrder[done + 1] ? challenger_ : incumbent_;
    } else {
      const double c = Mean(challenger_scores_), i = Mean(incumbent_scores_);
      const bool adopt = c > i * (1 + kMargin);
      std::ostringstream line;
      line << "# " << dimensions_[dimension_].name << ": " << DescribeKnobs(challenger_)
           << " scored " << std::setprecision(4) << c / 1e6 << " MB/s against "
           << i / 1e6 << " MB/s of " << DescribeKnobs(incumbent_)
           << " (re-checked in ABBA order, 2 samples each): "
           << (adopt ? "adopted" : "kept the incumbent");
      LogLine(line.str());
      if (adopt) best_ = challenger_;
      rechecking_ = false;
      NextDimension();
    }
  } else {
    scores_[next_ - 1] = score;
    if (next_ < candidates_.size()) {
      current_ = candidates_[next_++];
    } else {
      const size_t winner = static_cast<size_t>(
          std::max_element(scores_.begin(), scores_.end()) - scores_.begin());
      double incumbent_score = 0;
      for (size_t j = 0; j < candidates_.size(); ++j) {
        if (candidates_[j] == best_) incumbent_score = scores_[j];
      }
      // Only a value that beat the incumbent by the margin gets a re-check.
      if (candidates_[winner] == best_ || scores_[winner] <= incumbent_score * (1 + kMargin)) {
        NextDimension();
      } else {  // a challenger: the pass only nominated it; the re-check decides alone
        rechecking_ = true;
        challenger_ = candidates_[winner];
        incumbent_ = best_;
        challenger_scores_.clear();
        incumbent_scores_.clear();
        current_ = challenger_;
      }
    }
  }
  if (phase_ == Phase::kSearch && search_samples_ >= options_.max_samples) {
    LogLine("# sample budget (" + std::to_string(options_.max_samples) + ") spent");
    dimension_ = dimensions_.size();
    rechecking_ = false;
    NextDimension();
  }
}

Status Autotuner::ParseCompare(const std::string& text, const TunedKnobs& base,
                               std::vector<TunedKnobs>* out) {
  std::istringstream lines(text);
  std::string line;
  int number = 0;
  while (std::getline(lines, line)) {
    ++number;
    const size_t hash = line.find('#');
    if (hash != std::string::npos) line.resize(hash);
    std::istringstream words(line);
    std::string word;
    TunedKnobs k = base;
    bool any = false;
    while (words >> word) {
      auto bad = [&](const std::string& why) {
        return Status::InvalidArgument("HOROVOD_AUTOTUNE_COMPARE line " + std::to_string(number) +
                                       ": '" + word + "': " + why);
      };
      any = true;
      if (word == "defaults") continue;
      const size_t eq = word.find('=');
      if (eq == std::string::npos) return bad("expected defaults or KNOB=VALUE");
      const std::string key = word.substr(0, eq), value = word.substr(eq + 1);
      char* end = nullptr;
      const double v = std::strtod(value.c_str(), &end);
      if (value.empty() || *end != '\0' || !(v >= 0)) return bad("not a number >= 0");
      if (key == "fusion") {
        k.fusion_threshold_bytes = static_cast<int64_t>(v);
      } else if (key == "chunk") {
        k.chunk_bytes = static_cast<int64_t>(v);
      } else if (key == "cycle") {
        k.cycle_time_ms = v;
      } else if (key == "cache") {
        if (v != 0 && v != 1) return bad("cache is 0 or 1");
        k.cache = v == 1;
      } else {
        return bad("the knobs are fusion, chunk, cycle and cache");
      }
    }
    if (any) out->push_back(k);
  }
  if (out->empty()) return Status::InvalidArgument("HOROVOD_AUTOTUNE_COMPARE: no settings");
  return Status::OK();
}

void Autotuner::StartSearch() {
  phase_ = Phase::kSearch;
  comparing_ = false;
  best_ = current_;
  search_samples_ = 0;
  rechecking_ = false;
  dimension_ = 0;
  if (dimensions_.empty()) {
    dimension_ = 0;
    phase_ = Phase::kTuned;
    reference_scores_.clear();
    moved_ = 0;
    return;
  }
  candidates_ = dimensions_[0].values(best_);
  scores_.assign(candidates_.size(), 0.0);
  next_ = 0;
  current_ = candidates_[next_++];
}

void Autotuner::NextDimension() {
  ++dimension_;
  if (dimension_ < dimensions_.size()) {
    candidates_ = dimensions_[dimension_].values(best_);
    scores_.assign(candidates_.size(), 0.0);
    next_ = 0;
    current_ = candidates_[next_++];
    return;
  }
  phase_ = Phase::kTuned;
  current_ = best_;
  reference_scores_.clear();
  moved_ = 0;
  LogLine("# best: " + DescribeKnobs(best_));
  HVD_LOG(INFO) << "autotune: settled on " << DescribeKnobs(best_) << " after " << samples_
                << " samples";
}

void Autotuner::Log(double score) {
  if (options_.rank != 0) return;
  const char* phase = phase_ == Phase::kWarmup ? "warmup"
                      : phase_ == Phase::kSearch ? "search"
                      : comparing_               ? "compare"
                                                 : "tuned";
  HVD_LOG(DEBUG) << "autotune sample " << samples_ << " (" << phase << "): "
                 << DescribeKnobs(current_) << " score " << score / 1e6 << " MB/s";
  if (!log_) return;
  *log_ << samples_ << "," << phase << "," << current_.fusion_threshold_bytes << ","
        << current_.chunk_bytes << "," << current_.cycle_time_ms << "," << (current_.cache ? 1 : 0)
        << "," << (current_.hierarchical_allreduce ? 1 : 0) << "," << std::fixed
        << std::setprecision(0) << score << std::defaultfloat << "\n";
  log_->flush();
}

void Autotuner::LogLine(const std::string& line) {
  if (options_.rank != 0 || !log_) return;
  *log_ << line << "\n";
  log_->flush();
}

}  // namespace hvd
