// horovod_cpp — Apache-2.0
// Helpers shared by the benchmarks: percentiles, per-thread CPU time, page faults, and the one
// machine-readable line every figure is printed as:
//
//   FIGURE G1 name=allreduce_4MiB p50_ms=1.234 p90_ms=1.456 baseline=MPI_Allreduce
//          base_p50_ms=1.300 base_p90_ms=1.500 ratio=1.054 target=>=0.95 met=yes
//
// `ratio` is always "how many times better than the baseline" (baseline time / our time for
// durations), so a target reads the same way for every figure.
#pragma once

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace bench {

inline double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(p * static_cast<double>(v.size() - 1))];
}

inline double NowMs() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// CPU seconds used so far by this process's threads named `comm` (from /proc/self/task).
inline double ThreadCpuSeconds(const std::string& comm) {
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
    total += static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
  }
  return total;
}

inline long MinorFaults() {
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

struct Figure {
  Figure(std::string figure_id, std::string figure_name)
      : id(std::move(figure_id)), name(std::move(figure_name)) {}
  std::string id, name;
  std::vector<double> ours_ms, base_ms;  // samples; base empty for absolute figures
  std::string baseline;
  double ratio = 0;    // baseline p50 / our p50 unless set otherwise
  std::string target;  // e.g. ">=0.95" or "p50<=0.050ms"; "none" when no target applies
  std::string met;     // "yes", "no", or "n/a" (no target here)
  std::string extra;   // more key=value pairs
};

inline std::string Met(bool applies, bool met) { return applies ? (met ? "yes" : "no") : "n/a"; }

inline void Print(const Figure& f) {
  std::printf("FIGURE %s name=%s p50_ms=%.4f p90_ms=%.4f", f.id.c_str(), f.name.c_str(),
              Percentile(f.ours_ms, 0.5), Percentile(f.ours_ms, 0.9));
  if (!f.baseline.empty()) {
    std::printf(" baseline=%s base_p50_ms=%.4f base_p90_ms=%.4f ratio=%.3f", f.baseline.c_str(),
                Percentile(f.base_ms, 0.5), Percentile(f.base_ms, 0.9), f.ratio);
  }
  if (!f.extra.empty()) std::printf(" %s", f.extra.c_str());
  std::printf(" target=%s met=%s\n", f.target.c_str(), f.met.c_str());
  std::fflush(stdout);
}

}  // namespace bench
