// horovod_cpp — Apache-2.0
#include "common/config.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <sstream>

namespace hvd {
namespace {

std::string Trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

Status BadValue(const char* name, const std::string& value, const std::string& expected) {
  return Status::InvalidArgument(std::string(name) + "='" + value + "' is not valid: expected " +
                                 expected);
}

Result<int64_t> ParseInt(const char* name, const std::string& raw, int64_t lo, int64_t hi,
                         const char* unit) {
  std::string v = Trim(raw);
  std::string expected = std::string("an integer (") + unit + ") in [" + std::to_string(lo) + ", " +
                         std::to_string(hi) + "]";
  if (v.empty()) return BadValue(name, raw, expected);
  errno = 0;
  char* end = nullptr;
  long long parsed = std::strtoll(v.c_str(), &end, 10);
  if (errno != 0 || end != v.c_str() + v.size()) return BadValue(name, raw, expected);
  if (parsed < lo || parsed > hi) return BadValue(name, raw, expected);
  return static_cast<int64_t>(parsed);
}

Result<double> ParseDouble(const char* name, const std::string& raw, double lo, double hi,
                           const char* unit) {
  std::string v = Trim(raw);
  std::ostringstream expected;
  expected << "a number (" << unit << ") in [" << lo << ", " << hi << "]";
  if (v.empty()) return BadValue(name, raw, expected.str());
  errno = 0;
  char* end = nullptr;
  double parsed = std::strtod(v.c_str(), &end);
  if (errno != 0 || end != v.c_str() + v.size() || !std::isfinite(parsed) || parsed < lo ||
      parsed > hi) {
    return BadValue(name, raw, expected.str());
  }
  return parsed;
}

Result<bool> ParseBool(const char* name, const std::string& raw) {
  std::string v = Lower(Trim(raw));
  if (v == "1" || v == "true" || v == "yes" || v == "on") return true;
  if (v == "0" || v == "false" || v == "no" || v == "off") return false;
  return BadValue(name, raw, "one of 1, 0, true, false, yes, no, on, off");
}

Result<LogLevel> ParseLogLevel(const char* name, const std::string& raw) {
  std::string v = Lower(Trim(raw));
  if (v == "trace") return LogLevel::kTrace;
  if (v == "debug") return LogLevel::kDebug;
  if (v == "info") return LogLevel::kInfo;
  if (v == "warning" || v == "warn") return LogLevel::kWarning;
  if (v == "error") return LogLevel::kError;
  if (v == "fatal") return LogLevel::kFatal;
  return BadValue(name, raw, "one of trace, debug, info, warning, error, fatal");
}

constexpr int64_t kMaxFusionBytes = int64_t{1} << 40;    // 1 TiB: beyond any real buffer
constexpr int64_t kMaxCacheCapacity = int64_t{1} << 20;  // bit vector stays <= 128 KiB
constexpr double kMaxCycleTimeMs = 60'000.0;
constexpr double kMaxStallSeconds = 86'400.0;

// A knob: its documentation row plus how to apply a value to a Config.
struct Knob {
  KnobSpec spec;
  Status (*apply)(const char* name, const std::string& value, Config* config);
};

#define HVD_ASSIGN_FIELD(field, parse_expr)                             \
  [](const char* name, const std::string& value, Config* c) -> Status { \
    auto parsed = (parse_expr);                                         \
    if (!parsed.ok()) return parsed.status();                           \
    c->field = *parsed;                                                 \
    return Status::OK();                                                \
  }

const std::vector<Knob>& Knobs() {
  static const std::vector<Knob> knobs = {
      {{"HOROVOD_FUSION_THRESHOLD", "bytes", "134217728 (128 MiB)", "0 .. 2^40; 0 = no fusion",
        "Largest fused buffer. Tensors that agree on op, dtype, device and scaling are packed "
        "into one collective up to this size."},
       HVD_ASSIGN_FIELD(fusion_threshold_bytes,
                        ParseInt(name, value, 0, kMaxFusionBytes, "bytes"))},
      {{"HOROVOD_COLLECTIVE_CHUNK_BYTES", "bytes", "1048576 (1 MiB)", "0 .. 2^40; 0 = one call",
        "Largest single collective call on a host buffer. Bigger tensors and fused buffers are "
        "reduced chunk by chunk (copy in, reduce, copy out while in cache); tensors at least "
        "this big skip the fusion buffer."},
       HVD_ASSIGN_FIELD(collective_chunk_bytes,
                        ParseInt(name, value, 0, kMaxFusionBytes, "bytes"))},
      {{"HOROVOD_CYCLE_TIME", "milliseconds", "1", "0 .. 60000, fractional allowed",
        "Longest wait between negotiation cycles while work is outstanding. Enqueueing work "
        "wakes the background thread at once."},
       HVD_ASSIGN_FIELD(cycle_time_ms,
                        ParseDouble(name, value, 0.0, kMaxCycleTimeMs, "milliseconds"))},
      {{"HOROVOD_CACHE_CAPACITY", "integer", "1024", "0 .. 1048576; 0 = cache off",
        "Response-cache entries. Cached tensors are negotiated by one small bit-vector "
        "allreduce per cycle instead of a gather to rank 0."},
       HVD_ASSIGN_FIELD(cache_capacity, ParseInt(name, value, 0, kMaxCacheCapacity, "entries"))},
      {{"HOROVOD_LOG_LEVEL", "level", "warning", "trace, debug, info, warning, error, fatal",
        "Least severe message printed to stderr."},
       HVD_ASSIGN_FIELD(log_level, ParseLogLevel(name, value))},
      {{"HOROVOD_STALL_CHECK_TIME_SECONDS", "seconds", "60", "0 .. 86400; 0 = no check",
        "A tensor submitted by some ranks but not all for this long is reported with the "
        "missing ranks."},
       HVD_ASSIGN_FIELD(stall_check_time_seconds,
                        ParseDouble(name, value, 0.0, kMaxStallSeconds, "seconds"))},
      {{"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "seconds", "0", "0 .. 86400; 0 = never",
        "A stall this long shuts the job down; pending operations fail with the reason."},
       HVD_ASSIGN_FIELD(stall_shutdown_time_seconds,
                        ParseDouble(name, value, 0.0, kMaxStallSeconds, "seconds"))},
      {{"HOROVOD_DEADLOCK_GRACE_SECONDS", "seconds", "5", "0 .. 86400; 0 = no detection",
        "Every rank blocked waiting on operations, and nothing submitted or completed "
        "anywhere, for this long is a deadlock: the waits fail on every rank, naming what "
        "each rank waits for."},
       HVD_ASSIGN_FIELD(deadlock_grace_seconds,
                        ParseDouble(name, value, 0.0, kMaxStallSeconds, "seconds"))},
      {{"HOROVOD_TIMELINE", "path", "(unset)", "a file path, or DYNAMIC",
        "Chrome-tracing timeline written by rank 0; DYNAMIC starts it later through the API."},
       [](const char*, const std::string& value, Config* c) -> Status {
         c->timeline_path = value;
         return Status::OK();
       }},
      {{"HOROVOD_TIMELINE_MARK_CYCLES", "bool", "0", "0 or 1",
        "Add a CYCLE_START marker to the timeline for every negotiation cycle."},
       HVD_ASSIGN_FIELD(timeline_mark_cycles, ParseBool(name, value))},
      {{"HOROVOD_DYNAMIC_PROCESS_SETS", "bool", "0", "0 or 1",
        "Allow process sets to be added and removed after Init (by all ranks together)."},
       HVD_ASSIGN_FIELD(dynamic_process_sets, ParseBool(name, value))},
      {{"HOROVOD_STALL_CHECK_DISABLE", "bool", "0", "0 or 1",
        "Turn the stall inspector off: no stall warnings and no stall shutdown."},
       HVD_ASSIGN_FIELD(stall_check_disabled, ParseBool(name, value))},
  };
  return knobs;
}

#undef HVD_ASSIGN_FIELD

}  // namespace

Result<Config> Config::FromEnv(const EnvLookup& getenv) {
  EnvLookup lookup = getenv;
  if (!lookup) {
    lookup = [](const char* name) -> std::optional<std::string> {
      const char* v = std::getenv(name);
      if (v == nullptr) return std::nullopt;
      return std::string(v);
    };
  }
  Config config;
  for (const Knob& knob : Knobs()) {
    std::optional<std::string> value = lookup(knob.spec.name);
    if (!value || value->empty()) continue;
    HVD_RETURN_IF_ERROR(knob.apply(knob.spec.name, *value, &config));
  }
  if (config.stall_check_disabled) {
    config.stall_check_time_seconds = 0;
    config.stall_shutdown_time_seconds = 0;
  }
  if (config.stall_shutdown_time_seconds > 0 && config.stall_check_time_seconds > 0 &&
      config.stall_shutdown_time_seconds < config.stall_check_time_seconds) {
    // Horovod's behaviour: a shutdown time below the check time is ignored with a warning.
    std::ostringstream msg;
    msg << "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=" << config.stall_shutdown_time_seconds
        << " is less than HOROVOD_STALL_CHECK_TIME_SECONDS=" << config.stall_check_time_seconds
        << "; stalls will be reported but will not shut the job down";
    config.warnings.push_back(msg.str());
    config.stall_shutdown_time_seconds = 0;
  }
  return config;
}

namespace {

// Horovod's run-time settings that horovod_cpp does not implement, and what to do instead.
struct ForeignSetting {
  const char* name;
  const char* advice;
};
constexpr ForeignSetting kHorovodSettings[] = {
    {"HOROVOD_HIERARCHICAL_ALLREDUCE", "collectives are flat; the setting is ignored"},
    {"HOROVOD_HIERARCHICAL_ALLGATHER", "collectives are flat; the setting is ignored"},
    {"HOROVOD_AUTOTUNE",
     "there is no autotuner; set HOROVOD_FUSION_THRESHOLD and HOROVOD_CYCLE_TIME directly"},
    {"HOROVOD_AUTOTUNE_LOG", "there is no autotuner"},
    {"HOROVOD_AUTOTUNE_WARMUP_SAMPLES", "there is no autotuner"},
    {"HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE", "there is no autotuner"},
    {"HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", "there is no autotuner"},
    {"HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", "there is no autotuner"},
    {"HOROVOD_CONTROLLER", "negotiation always runs over MPI"},
    {"HOROVOD_CPU_OPERATIONS", "CPU tensors always go through MPI"},
    {"HOROVOD_GPU_OPERATIONS", "CUDA tensors always go through NCCL"},
    {"HOROVOD_GPU_ALLREDUCE", "CUDA tensors always go through NCCL"},
    {"HOROVOD_GPU_ALLGATHER", "CUDA tensors always go through NCCL"},
    {"HOROVOD_GPU_BROADCAST", "CUDA tensors always go through NCCL"},
    {"HOROVOD_GPU_ALLTOALL", "CUDA tensors always go through NCCL"},
    {"HOROVOD_GPU_REDUCESCATTER", "CUDA tensors always go through NCCL"},
    {"HOROVOD_NUM_NCCL_STREAMS", "each device has one NCCL stream"},
    {"HOROVOD_ENABLE_ASYNC_COMPLETION", "CUDA operations always complete asynchronously"},
    {"HOROVOD_BATCH_D2D_MEMCOPIES", "the setting is ignored"},
    {"HOROVOD_DISABLE_GROUP_FUSION", "grouped members are fused like other tensors"},
    {"HOROVOD_ADASUM_MPI_CHUNK_SIZE", "Adasum is not supported"},
    {"HOROVOD_MPI_THREADS_DISABLE", "MPI is initialised with MPI_THREAD_MULTIPLE when asked"},
    {"HOROVOD_THREAD_AFFINITY", "bind the ranks with mpirun --bind-to (or hvdrun)"},
    {"HOROVOD_LOG_HIDE_TIME", "log lines carry no time stamp"},
    {"HOROVOD_GLOO_RENDEZVOUS_ADDR", "there is no Gloo backend; launch with mpirun or hvdrun"},
    {"HOROVOD_GLOO_RENDEZVOUS_PORT", "there is no Gloo backend; launch with mpirun or hvdrun"},
    {"HOROVOD_GLOO_TIMEOUT_SECONDS", "there is no Gloo backend; launch with mpirun or hvdrun"},
    {"HOROVOD_GLOO_IFACE", "there is no Gloo backend; launch with mpirun or hvdrun"},
    {"HOROVOD_RANK", "ranks come from MPI (launch with mpirun or hvdrun)"},
    {"HOROVOD_SIZE", "ranks come from MPI (launch with mpirun or hvdrun)"},
    {"HOROVOD_LOCAL_RANK", "ranks come from MPI (launch with mpirun or hvdrun)"},
    {"HOROVOD_LOCAL_SIZE", "ranks come from MPI (launch with mpirun or hvdrun)"},
    {"HOROVOD_CROSS_RANK", "ranks come from MPI (launch with mpirun or hvdrun)"},
    {"HOROVOD_CROSS_SIZE", "ranks come from MPI (launch with mpirun or hvdrun)"},
    {"HOROVOD_HOSTNAME", "hosts come from MPI (launch with mpirun or hvdrun)"},
};
// Read by horovod_cpp's Python layer, not by the core.
constexpr const char* kReadByPython[] = {"HOROVOD_ELASTIC"};
// Prefixes of Horovod's build-time settings (pip install horovod).
constexpr const char* kBuildPrefixes[] = {"HOROVOD_WITH_",  "HOROVOD_WITHOUT_", "HOROVOD_BUILD_",
                                          "HOROVOD_CUDA_",  "HOROVOD_NCCL_",    "HOROVOD_CMAKE",
                                          "HOROVOD_MPICXX", "HOROVOD_ROCM_",    "HOROVOD_CCL_"};

size_t EditDistance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1])});
      diagonal = up;
    }
  }
  return row[b.size()];
}

}  // namespace

std::vector<std::string> UnknownSettingWarnings(const std::vector<std::string>& env_names) {
  const std::string prefix = "HOROVOD_";
  std::vector<std::string> known;  // the names horovod_cpp reads
  for (const Knob& knob : Knobs()) known.push_back(knob.spec.name);
  std::vector<std::string> proposals = known;  // what a "did you mean" may propose
  for (const ForeignSetting& f : kHorovodSettings) proposals.push_back(f.name);
  std::vector<std::string> out;
  std::vector<std::string> names = env_names;
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  for (const std::string& name : names) {
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    if (std::find(known.begin(), known.end(), name) != known.end()) continue;
    if (std::any_of(std::begin(kReadByPython), std::end(kReadByPython),
                    [&](const char* n) { return name == n; })) {
      continue;
    }
    const ForeignSetting* foreign =
        std::find_if(std::begin(kHorovodSettings), std::end(kHorovodSettings),
                     [&](const ForeignSetting& f) { return name == f.name; });
    if (foreign != std::end(kHorovodSettings)) {
      out.push_back(name + " is a Horovod setting that horovod_cpp does not implement: " +
                    foreign->advice);
      continue;
    }
    if (std::any_of(std::begin(kBuildPrefixes), std::end(kBuildPrefixes),
                    [&](const char* p) { return name.rfind(p, 0) == 0; })) {
      out.push_back(name +
                    " is a Horovod build setting; horovod_cpp does not read it (its build is "
                    "configured with CMake options, see the README)");
      continue;
    }
    // The nearest setting within a few edits (about one in six characters) is a likely typo.
    std::string best;
    size_t best_distance = std::max<size_t>(2, name.size() / 6) + 1;
    for (const std::string& candidate : proposals) {
      const size_t d = EditDistance(name, candidate);
      if (d < best_distance) best_distance = d, best = candidate;
    }
    out.push_back(name + " is not a horovod_cpp setting" +
                  (best.empty() ? std::string("; docs/config.md lists the settings")
                                : "; did you mean " + best + "?"));
  }
  return out;
}

std::vector<KnobSpec> KnobTable() {
  std::vector<KnobSpec> specs;
  for (const Knob& knob : Knobs()) specs.push_back(knob.spec);
  return specs;
}

std::string DescribeKnobs() {
  std::ostringstream out;
  for (const Knob& knob : Knobs()) {
    const KnobSpec& s = knob.spec;
    out << s.name << "  (" << s.type << ", default " << s.default_value << "; " << s.range
        << ")\n    " << s.help << "\n";
  }
  return out.str();
}

const char* LogLevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kTrace:
      return "TRACE";
    case LogLevel::kDebug:
      return "DEBUG";
    case LogLevel::kInfo:
      return "INFO";
    case LogLevel::kWarning:
      return "WARNING";
    case LogLevel::kError:
      return "ERROR";
    case LogLevel::kFatal:
      return "FATAL";
  }
  return "?";
}

}  // namespace hvd
