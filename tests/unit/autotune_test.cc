// horovod_cpp — Apache-2.0
// The autotuner's logic on a simulated job: steps counted from responses, a score that is a
// known function of the knobs (the clock advances by a step's time under them), the search,
// its re-checks against noise, fixed knobs, re-tuning when the score moves, agreement through
// Exchange, and the log.

#include "common/config/autotune.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <random>
#include <string>

namespace hvd {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

TunedKnobs Defaults() {
  TunedKnobs k;
  k.fusion_threshold_bytes = 128 * kMiB;
  k.chunk_bytes = kMiB;
  k.cycle_time_ms = 1.0;
  k.cache = true;
  k.hierarchical_allreduce = false;
  return k;
}

// One training step's responses: two tensors of 1 MiB of float32 each.
std::vector<Response> Step() {
  Response r;
  r.type = OpType::kAllreduce;
  r.dtype = DataType::kFloat32;
  r.tensor_names = {"grad.a", "grad.b"};
  r.tensor_sizes = {kMiB / 4, kMiB / 4};
  return {r};
}
constexpr double kStepBytes = 2.0 * kMiB;

// A job: every step takes kStepBytes / speed(knobs) seconds; speed in bytes per second.
struct Job {
  using Speed = std::function<double(const TunedKnobs&)>;
  Autotuner tuner;
  Speed speed;
  Autotuner::Clock::time_point now{};
  std::mt19937 rng{7};
  double noise = 0.0;  // relative, uniform in [-noise, +noise] per step
  double drift = 0.0;  // the job's speed grows by this fraction of speed() per sample ended
  int samples_ended = 0;

  Job(Autotuner::Options o, Speed s) : tuner(std::move(o), Defaults()), speed(std::move(s)) {}

  // Runs steps until a sample ends, then the exchange (rank 0 alone: broadcast is a no-op).
  void RunSample() {
    while (true) {
      std::uniform_real_distribution<double> u(-noise, noise);
      const double seconds =
          kStepBytes / (speed(tuner.knobs()) * (1 + drift * samples_ended)) * (1 + u(rng));
      now += std::chrono::duration_cast<Autotuner::Clock::duration>(
          std::chrono::duration<double>(seconds));
      if (tuner.Observe(Step(), now)) break;
    }
    ++samples_ended;
    Result<TunedKnobs> k = tuner.Exchange([](std::vector<uint8_t>*) { return Status::OK(); });
    ASSERT_TRUE(k.ok()) << k.status().ToString();
  }
  void RunUntilSettled(int limit) {
    for (int i = 0; i < limit && (i < 1 || tuner.searching()); ++i) RunSample();
  }
};

Autotuner::Options Options(int steps = 4, int warmup = 2, int max_samples = 40) {
  Autotuner::Options o;
  o.rank = 0;
  o.steps_per_sample = steps;
  o.warmup_samples = warmup;
  o.max_samples = max_samples;
  return o;
}

// A landscape with one best point: chunk 4 MiB, fusion 32 MiB, cache on; cycle time and
// hierarchical do not matter. Off by one notch costs 10-30 %.
double Landscape(const TunedKnobs& k) {
  double s = 100e6;
  s *= k.chunk_bytes == 4 * kMiB ? 1.0 : k.chunk_bytes == 16 * kMiB ? 0.85 : 0.7;
  s *= k.fusion_threshold_bytes == 32 * kMiB ? 1.0 : 0.8;
  s *= k.cache ? 1.0 : 0.9;
  return s;
}

// A step of a loop whose gradients fall into two cycles: the last layer's first, then the
// rest (as backward produces them).
std::vector<Response> FirstCycle() {
  std::vector<Response> r = Step();
  r[0].tensor_names.resize(1);
  r[0].tensor_sizes.resize(1);
  return r;
}
std::vector<Response> SecondCycle() {
  std::vector<Response> r = Step();
  r[0].tensor_names.erase(r[0].tensor_names.begin());
  r[0].tensor_sizes.erase(r[0].tensor_sizes.begin());
  return r;
}

TEST(Autotune, ASampleIsStepsPerSampleWholeSteps) {
  // A step begins with the cycle in which a tensor of the step before comes back, so the
  // sample ends there, after exactly that many steps, however the steps fall into cycles.
  Autotuner tuner(Options(3), Defaults());
  Autotuner::Clock::time_point t{};
  EXPECT_FALSE(tuner.Observe({}, t));  // no responses: nothing counted, no clock started
  EXPECT_FALSE(tuner.Observe(Step(), t += std::chrono::milliseconds(10)));  // step 1 begins
  EXPECT_FALSE(tuner.Observe(Step(), t += std::chrono::milliseconds(10)));  // 2
  EXPECT_FALSE(tuner.Observe(Step(), t += std::chrono::milliseconds(10)));  // 3
  EXPECT_TRUE(tuner.Observe(Step(), t += std::chrono::milliseconds(10)));   // 4: 3 steps done
  // Two cycles a step: the sample still ends when its third step is over, at the cycle that
  // begins the fourth, and scores three steps' bytes over three steps' time.
  Autotuner::Options o = Options(3);
  const std::string path = ::testing::TempDir() + "/autotune_steps.csv";
  o.log_path = path;
  Autotuner two(o, Defaults());
  t = {};
  int cycles = 0;
  bool ended = false;
  for (int step = 0; step < 4 && !ended; ++step) {
    ++cycles;
    ended = two.Observe(FirstCycle(), t += std::chrono::milliseconds(2));
    if (ended) break;
    ++cycles;
    ended = two.Observe(SecondCycle(), t += std::chrono::milliseconds(8));
  }
  ASSERT_TRUE(ended);
  EXPECT_EQ(cycles, 7);  // steps 1-3 (two cycles each), then the first cycle of step 4
  ASSERT_TRUE(two.Exchange([](std::vector<uint8_t>*) { return Status::OK(); }).ok());
  std::ifstream in(path);
  std::string header, line;
  ASSERT_TRUE(std::getline(in, header) && std::getline(in, line));
  // From the end of cycle 1 to the end of cycle 7: three steps of 10 ms, 3 x 2 MiB.
  EXPECT_NEAR(std::stod(line.substr(line.rfind(',') + 1)), 3 * kStepBytes / 0.030, 1.0) << line;
  std::remove(path.c_str());
  // A cycle that holds the rest of one step and the start of the next (b, then a again)
  // begins a step too: once a step, as the cycles do not change.
  Autotuner shifted(Options(2), Defaults());
  std::vector<Response> rest_and_next = Step();
  std::swap(rest_and_next[0].tensor_names[0], rest_and_next[0].tensor_names[1]);
  t = {};
  EXPECT_FALSE(shifted.Observe(FirstCycle(), t += std::chrono::milliseconds(5)));     // 1
  EXPECT_FALSE(shifted.Observe(rest_and_next, t += std::chrono::milliseconds(10)));  // 2
  EXPECT_TRUE(shifted.Observe(rest_and_next, t += std::chrono::milliseconds(10)));   // 3
}

TEST(Autotune, FindsTheBestPointOfAKnownLandscapeWithinTheBudget) {
  Job job(Options(), Landscape);
  job.RunUntilSettled(100);
  EXPECT_FALSE(job.tuner.searching());
  EXPECT_EQ(job.tuner.knobs().chunk_bytes, 4 * kMiB);
  EXPECT_EQ(job.tuner.knobs().fusion_threshold_bytes, 32 * kMiB);
  EXPECT_TRUE(job.tuner.knobs().cache);
  // 2 warm-up samples, then chunk (4 values + a re-check of 4), fusion (5 + 4), cycle (3),
  // cache (2).
  EXPECT_EQ(job.samples_ended, 2 + 8 + 9 + 3 + 2);
  // Settled: it stays there.
  for (int i = 0; i < 10; ++i) job.RunSample();
  EXPECT_FALSE(job.tuner.searching());
  EXPECT_EQ(job.tuner.knobs().chunk_bytes, 4 * kMiB);
}

TEST(Autotune, NoiseWithoutARealDifferenceChangesNothing) {
  // Every setting is as fast; each step is +-2 % noisy. The re-check (and its 3 % margin)
  // keeps the defaults.
  for (unsigned seed = 1; seed <= 20; ++seed) {
    Job job(Options(), [](const TunedKnobs&) { return 100e6; });
    job.rng.seed(seed);
    job.noise = 0.02;
    job.RunUntilSettled(100);
    EXPECT_FALSE(job.tuner.searching());
    EXPECT_EQ(job.tuner.knobs(), Defaults()) << "seed " << seed << ": "
                                             << DescribeKnobs(job.tuner.knobs());
  }
}

TEST(Autotune, AJobThatSpeedsUpOrSlowsDownDoesNotMoveTheKnobs) {
  // Every setting is as fast, but the job gets 5 % faster (or slower) each sample, as a job
  // warming up does (measured: the MLP bench's first hundred steps). Sampled one after another,
  // later candidates score higher; the ABBA re-check gives both the same mean time.
  for (double drift : {0.05, -0.02}) {
    for (unsigned seed = 1; seed <= 10; ++seed) {
      Job job(Options(), [](const TunedKnobs&) { return 100e6; });
      job.rng.seed(seed);
      job.noise = 0.01;
      job.drift = drift;
      job.RunUntilSettled(100);
      EXPECT_FALSE(job.tuner.searching());
      EXPECT_EQ(job.tuner.knobs(), Defaults())
          << "drift " << drift << " seed " << seed << ": " << DescribeKnobs(job.tuner.knobs());
    }
  }
  // A real difference is still found while the job speeds up.
  Job job(Options(), Landscape);
  job.drift = 0.03;
  job.RunUntilSettled(100);
  EXPECT_EQ(job.tuner.knobs().chunk_bytes, 4 * kMiB);
  EXPECT_EQ(job.tuner.knobs().fusion_threshold_bytes, 32 * kMiB);
}

TEST(Autotune, KnobsSetInTheEnvironmentAreNotTuned) {
  Autotuner::Options o = Options();
  o.fixed = {"chunk", "cache"};
  Job job(o, Landscape);
  job.RunUntilSettled(100);
  EXPECT_FALSE(job.tuner.searching());
  EXPECT_EQ(job.tuner.knobs().chunk_bytes, kMiB);  // the configured value, though 4 MiB is best
  EXPECT_TRUE(job.tuner.knobs().cache);
  EXPECT_EQ(job.tuner.knobs().fusion_threshold_bytes, 32 * kMiB);
}

TEST(Autotune, HierarchicalIsACandidateOnlyWhereTheLayoutAllowsIt) {
  auto faster_hierarchical = [](const TunedKnobs& k) {
    return k.hierarchical_allreduce ? 200e6 : 100e6;
  };
  Job flat(Options(), faster_hierarchical);
  flat.RunUntilSettled(100);
  EXPECT_FALSE(flat.tuner.knobs().hierarchical_allreduce);
  Autotuner::Options o = Options();
  o.tune_hierarchical = true;
  Job hosts(o, faster_hierarchical);
  hosts.RunUntilSettled(100);
  EXPECT_FALSE(hosts.tuner.searching());
  EXPECT_TRUE(hosts.tuner.knobs().hierarchical_allreduce);
}

TEST(Autotune, TheSampleBudgetEndsTheSearchWithTheBestSoFar) {
  // No warm-up asked: the first sample still runs with the starting values, unscored. Then 5
  // samples: chunk's 4 values and the first of its re-check.
  Job job(Options(4, 0, 5), Landscape);
  for (int i = 0; i < 6; ++i) job.RunSample();
  EXPECT_FALSE(job.tuner.searching());
  // The chunk search was cut in its re-check: the incumbent (the configured 1 MiB) stays.
  EXPECT_EQ(job.tuner.knobs(), Defaults());
}

TEST(Autotune, SearchesAgainWhenTheScoreMoves) {
  bool slow_link = false;
  // On the slow link small chunks win (say); the job is also 5x slower overall.
  Job job(Options(), [&](const TunedKnobs& k) {
    if (!slow_link) return Landscape(k);
    return (k.chunk_bytes == kMiB / 4 ? 1.0 : 0.6) * 20e6;
  });
  job.RunUntilSettled(100);
  ASSERT_FALSE(job.tuner.searching());
  ASSERT_EQ(job.tuner.knobs().chunk_bytes, 4 * kMiB);
  for (int i = 0; i < 5; ++i) job.RunSample();  // the reference score
  slow_link = true;
  int waited = 0;
  while (!job.tuner.searching() && waited < 10) {
    job.RunSample();
    ++waited;
  }
  EXPECT_EQ(waited, Autotuner::kRetuneSamples);  // three samples in a row far from it
  job.RunUntilSettled(100);
  EXPECT_FALSE(job.tuner.searching());
  EXPECT_EQ(job.tuner.knobs().chunk_bytes, kMiB / 4);
}

TEST(Autotune, EveryRankTakesRankZerosKnobs) {
  // Two tuners, rank 0 and rank 1, over a broadcast that copies rank 0's bytes.
  Autotuner::Options o0 = Options(), o1 = Options();
  o1.rank = 1;
  Autotuner r0(o0, Defaults()), r1(o1, Defaults());
  std::vector<uint8_t> sent;
  Autotuner::Clock::time_point t{};
  for (int sample = 0; sample < 12; ++sample) {
    bool end0 = false, end1 = false;
    while (!end0) {
      // Rank 1's clock differs (its timing is not what decides); the steps are the same.
      t += std::chrono::milliseconds(10 + sample);
      end0 = r0.Observe(Step(), t);
      end1 = r1.Observe(Step(), t + std::chrono::milliseconds(3 * sample));
      ASSERT_EQ(end0, end1);
    }
    Result<TunedKnobs> k0 = r0.Exchange([&](std::vector<uint8_t>* b) {
      sent = *b;
      return Status::OK();
    });
    Result<TunedKnobs> k1 = r1.Exchange([&](std::vector<uint8_t>* b) {
      *b = sent;
      return Status::OK();
    });
    ASSERT_TRUE(k0.ok() && k1.ok());
    EXPECT_EQ(*k0, *k1) << "sample " << sample;
    EXPECT_EQ(r0.searching(), r1.searching());
  }
}

TEST(Autotune, WireFormatRoundTripsAndRejectsAnotherVersion) {
  TunedKnobs k = Defaults();
  k.chunk_bytes = 3 * kMiB;
  k.cycle_time_ms = 2.5;
  k.cache = false;
  k.hierarchical_allreduce = true;
  TunedKnobs back;
  bool searching = false;
  ASSERT_TRUE(Autotuner::Decode(Autotuner::Encode(k, true), &back, &searching).ok());
  EXPECT_EQ(back, k);
  EXPECT_TRUE(searching);
  std::vector<uint8_t> bytes = Autotuner::Encode(k, false);
  bytes[0] = 99;
  Status bad = Autotuner::Decode(bytes, &back, &searching);
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("version 99"), std::string::npos) << bad.message();
  bytes = Autotuner::Encode(k, false);
  bytes.resize(bytes.size() - 2);  // truncated
  EXPECT_FALSE(Autotuner::Decode(bytes, &back, &searching).ok());
}

TEST(Autotune, TheLogHasALinePerSampleAndEachDecision) {
  const std::string path = ::testing::TempDir() + "/autotune_test.csv";
  Autotuner::Options o = Options();
  o.log_path = path;
  {
    Job job(o, Landscape);
    job.RunUntilSettled(100);
    ASSERT_EQ(job.samples_ended, 24);
  }
  std::ifstream in(path);
  std::string line;
  int header = 0, samples = 0, comments = 0, warmup = 0;
  while (std::getline(in, line)) {
    if (line.rfind("sample,phase,", 0) == 0) {
      ++header;
    } else if (line.rfind("#", 0) == 0) {
      ++comments;
    } else {
      ++samples;
      if (line.find(",warmup,") != std::string::npos) ++warmup;
      // sample,phase,fusion,chunk,cycle,cache,hierarchical,score: 8 fields, a positive score.
      EXPECT_EQ(std::count(line.begin(), line.end(), ','), 7) << line;
      EXPECT_GT(std::stod(line.substr(line.rfind(',') + 1)), 0) << line;
    }
  }
  EXPECT_EQ(header, 1);
  EXPECT_EQ(samples, 24);
  EXPECT_EQ(warmup, 2);
  // Two re-checks (chunk and fusion) and the final "best" line.
  EXPECT_EQ(comments, 3);
  std::remove(path.c_str());
}

TEST(Autotune, ComparisonSettingsAlternateWithTheTunedValuesOnceSettled) {
  Autotuner::Options o = Options();
  TunedKnobs small = Defaults(), big = Defaults();
  small.chunk_bytes = kMiB / 4;
  big.fusion_threshold_bytes = 4 * kMiB;
  o.compare = {Defaults(), small, big};
  const std::string path = ::testing::TempDir() + "/autotune_compare.csv";
  o.log_path = path;
  {
    Job job(o, Landscape);
    job.RunUntilSettled(100);
    ASSERT_FALSE(job.tuner.searching());
    TunedKnobs tuned = job.tuner.knobs();
    ASSERT_EQ(tuned.chunk_bytes, 4 * kMiB);  // the search as without comparisons
    // Tuned, then each comparison in turn, with the tuned values in between.
    std::vector<TunedKnobs> ran;
    for (int i = 0; i < 8; ++i) {
      job.RunSample();
      ran.push_back(job.tuner.knobs());  // what the next sample runs with
      EXPECT_FALSE(job.tuner.searching());
    }
    const std::vector<TunedKnobs> want = {Defaults(), tuned, small, tuned,
                                          big,        tuned, Defaults(), tuned};
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(ran[i], want[i]) << i << ": " << DescribeKnobs(ran[i]);
    }
    // The comparisons score 0.56-0.7 of the tuned values: far more than kRetuneChange would
    // start a search if they counted; they do not.
    for (int i = 0; i < 20; ++i) job.RunSample();
    EXPECT_FALSE(job.tuner.searching());
  }
  std::ifstream in(path);
  std::string line;
  int compare = 0, tuned = 0;
  while (std::getline(in, line)) {
    compare += line.find(",compare,") != std::string::npos;
    tuned += line.find(",tuned,") != std::string::npos;
  }
  EXPECT_EQ(compare, 14);  // every other one of the 28 samples after settling
  EXPECT_EQ(tuned, 14);
  std::remove(path.c_str());
}

TEST(Autotune, ComparisonFileParsing) {
  std::vector<TunedKnobs> got;
  ASSERT_TRUE(Autotuner::ParseCompare("# a grid\ndefaults\n\nchunk=262144 fusion=4194304\n"
                                      "cycle=5 cache=0  # slow\n",
                                      Defaults(), &got)
                  .ok());
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0], Defaults());
  TunedKnobs want = Defaults();
  want.chunk_bytes = 262144;
  want.fusion_threshold_bytes = 4194304;
  EXPECT_EQ(got[1], want);
  want = Defaults();
  want.cycle_time_ms = 5;
  want.cache = false;
  EXPECT_EQ(got[2], want);
  for (const char* bad : {"chunk=lots", "speed=3", "cache=2", "fusion=-1", "chunk", "# none"}) {
    std::vector<TunedKnobs> out;
    Status s = Autotuner::ParseCompare(bad, Defaults(), &out);
    EXPECT_FALSE(s.ok()) << bad;
    EXPECT_NE(s.message().find("HOROVOD_AUTOTUNE_COMPARE"), std::string::npos) << s.message();
  }
}

}  // namespace
}  // namespace hvd
