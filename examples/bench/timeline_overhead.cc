// horovod_cpp — Apache-2.0
// Timeline overhead: the same training-like step (many gradient-sized tensors allreduced
// asynchronously, then waited on) with the timeline off and on, in short interleaved blocks of
// one run, so machine noise hits both alike. Prints p50/p90 step times per mode and the
// throughput ratio on/off (target >= 0.95): the median, over adjacent off/on block pairs, of
// p50(off) / p50(on), which cancels slow drift; the ratio of the overall p50s is printed too.
// Every step's results are checked against the reference sum.
//
//   mpirun -np 2 build/examples/bench/timeline_overhead [--blocks 10] [--steps 20] ...

#include <unistd.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "common/horovod.h"
#include "examples/bench/bench_util.h"

namespace po = boost::program_options;

using bench::Percentile;
using bench::ThreadCpuSeconds;

int main(int argc, char** argv) {
  int blocks = 40, steps = 5, tensors = 64, warmup = 20;
  int64_t min_elems = 256, max_elems = 262144;
  std::string file = "/tmp/hvd_timeline_overhead.json";
  po::options_description opts("timeline_overhead options");
  opts.add_options()("help", "show this help")("blocks", po::value(&blocks)->default_value(blocks),
                                               "blocks per mode (off/on alternate)")(
      "steps", po::value(&steps)->default_value(steps), "steps per block")(
      "tensors", po::value(&tensors)->default_value(tensors), "tensors allreduced per step")(
      "min-elems", po::value(&min_elems)->default_value(min_elems), "smallest tensor (floats)")(
      "max-elems", po::value(&max_elems)->default_value(max_elems), "largest tensor (floats)")(
      "warmup", po::value(&warmup)->default_value(warmup), "untimed steps first")(
      "timeline-file", po::value(&file)->default_value(file), "where rank 0 records");
  po::variables_map vm;
  try {
    po::store(po::parse_command_line(argc, argv, opts), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    std::cerr << "timeline_overhead: " << e.what() << "\n" << opts;
    return 2;
  }
  if (vm.count("help")) {
    std::cout << opts;
    return 0;
  }
  if (hvd::Status s = hvd::Init(); !s.ok()) {
    std::cerr << "timeline_overhead: " << s.ToString() << "\n";
    return 1;
  }
  const int rank = *hvd::Rank(), size = *hvd::Size();

  // Sizes spread geometrically between min and max, like a model's gradients.
  std::vector<std::vector<float>> grads(tensors);
  int64_t total = 0;
  for (int t = 0; t < tensors; ++t) {
    const double f = tensors > 1 ? static_cast<double>(t) / (tensors - 1) : 0.0;
    const int64_t n = static_cast<int64_t>(min_elems * std::pow(double(max_elems) / min_elems, f));
    grads[t].resize(n);
    total += n;
  }
  const float expected = size * (size + 1) / 2.0f;
  bool correct = true;
  auto step = [&] {
    std::vector<hvd::Handle> hs;
    for (int t = 0; t < tensors; ++t) {
      std::fill(grads[t].begin(), grads[t].end(), static_cast<float>(rank + 1));
      const int64_t n = static_cast<int64_t>(grads[t].size());
      hs.push_back(*hvd::EnqueueAllreduce(hvd::View(grads[t].data(), {n}),
                                          hvd::View(grads[t].data(), {n}),
                                          "grad." + std::to_string(t), {hvd::ReduceOp::kSum}));
    }
    for (hvd::Handle h : hs) correct &= hvd::Wait(h).ok();
    for (auto& g : grads) correct &= g.front() == expected && g.back() == expected;
  };

  for (int i = 0; i < warmup; ++i) step();
  std::vector<double> ms[2];       // every step's time: [0] off, [1] on
  std::vector<double> pair_ratio;  // per adjacent (off, on) block pair: p50 off / p50 on
  std::vector<double> block_ms;
  for (int b = 0; b < 2 * blocks; ++b) {
    const int on = b % 2;
    if (on && !hvd::StartTimeline(file).ok()) {
      std::cerr << "timeline_overhead: cannot record into " << file << "\n";
      return 1;
    }
    std::vector<double> this_block;
    for (int i = 0; i < steps; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      step();
      this_block.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    ms[on].insert(ms[on].end(), this_block.begin(), this_block.end());
    if (on) {
      (void)hvd::StopTimeline();
      pair_ratio.push_back(Percentile(block_ms, 0.5) / Percentile(this_block, 0.5));
    }
    block_ms = this_block;
  }
  const double bg_cpu = ThreadCpuSeconds("hvd-bg"), tl_cpu = ThreadCpuSeconds("hvd-timeline");
  hvd::Shutdown().IgnoreError();
  if (!correct) {
    std::cerr << "timeline_overhead: WRONG RESULTS\n";
    return 1;
  }
  if (rank == 0) {
    const double off50 = Percentile(ms[0], 0.5), on50 = Percentile(ms[1], 0.5);
    const double ratio = Percentile(pair_ratio, 0.5);
    std::ifstream out(file, std::ios::ate | std::ios::binary);
    bench::Figure f("T3", "timeline_overhead");
    f.ours_ms = ms[1];
    f.base_ms = ms[0];
    f.baseline = "timeline_off";
    f.ratio = ratio;  // throughput on/off: median over adjacent block pairs
    f.target = ">=0.95";
    f.met = bench::Met(true, ratio >= 0.95);
    char extra[256];
    std::snprintf(extra, sizeof(extra),
                  "np=%d tensors=%d floats_per_step=%lld steps_per_mode=%zu ratio_of_p50s=%.3f "
                  "last_file_bytes=%lld cpu_s_background=%.3f cpu_s_timeline_writer=%.3f",
                  size, tensors, static_cast<long long>(total), ms[0].size(), off50 / on50,
                  static_cast<long long>(out.tellg()), bg_cpu, tl_cpu);
    f.extra = extra;
    bench::Print(f);
  }
  return 0;
}
