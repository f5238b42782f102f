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

namespace po = boost::program_options;

namespace {

// CPU seconds used so far by this process's threads named `comm` (from /proc/self/task).
double ThreadCpuSeconds(const std::string& comm) {
  double total = 0;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream stat(task.path() / "stat");
    std::string line;
    std::getline(stat, line);
    const size_t open = line.find('('), close = line.rfind(')');
    if (open == std::string::npos || line.substr(open + 1, close - open - 1) != comm) continue;
    std::istringstream rest(line.substr(close + 2));
    std::string field;
    long long utime = 0, stime = 0;
    for (int i = 3; i <= 15 && rest >> field; ++i) {
      if (i == 14) utime = std::stoll(field);
      if (i == 15) stime = std::stoll(field);
    }
    total += static_cast<double>(utime + stime) / sysconf(_SC_CLK_TCK);
  }
  return total;
}

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(p * (v.size() - 1))];
}

}  // namespace

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
    std::ifstream f(file, std::ios::ate | std::ios::binary);
    std::printf(
        "name=timeline_overhead np=%d tensors=%d floats_per_step=%lld steps_per_mode=%zu "
        "p50_ms_off=%.3f p90_ms_off=%.3f p50_ms_on=%.3f p90_ms_on=%.3f ratio=%.3f "
        "ratio_of_p50s=%.3f "
        "last_file_bytes=%lld cpu_s_background=%.3f cpu_s_timeline_writer=%.3f\n",
        size, tensors, static_cast<long long>(total), ms[0].size(), off50, Percentile(ms[0], 0.9),
        on50, Percentile(ms[1], 0.9), ratio, off50 / on50, static_cast<long long>(f.tellg()),
        bg_cpu, tl_cpu);
  }
  return 0;
}
