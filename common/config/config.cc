// horovod_cpp — Apache-2.0
#include "common/config/config.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "common/protocol/wire.h"

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

// "0,2,4": CPU numbers, kept as written (the runtime picks its local rank's entry).
Result<std::string> ParseCpuList(const char* name, const std::string& raw) {
  const std::string v = Trim(raw);
  bool digit = false;
  for (char c : v) {
    if (std::isdigit(static_cast<unsigned char>(c))) {
      digit = true;
    } else if (c == ',' && digit) {
      digit = false;
    } else if (!std::isspace(static_cast<unsigned char>(c))) {
      digit = false;
      break;
    }
  }
  if (!digit) return BadValue(name, raw, "CPU numbers separated by commas, e.g. 0,2");
  return v;
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

const char* KindName(KnobKind kind) {
  switch (kind) {
    case KnobKind::kBytes:
      return "bytes";
    case KnobKind::kInteger:
      return "integer";
    case KnobKind::kMilliseconds:
      return "milliseconds";
    case KnobKind::kSeconds:
      return "seconds";
    case KnobKind::kReal:
      return "number";
    case KnobKind::kBool:
      return "bool";
    case KnobKind::kLogLevel:
      return "level";
    case KnobKind::kPath:
      return "path";
    case KnobKind::kCpuList:
      return "cpu list";
  }
  return "?";
}

// ---- per kind: parse, encode for the agreement, and show ------------------------------------

template <KnobKind K>
Result<KnobValue<K>> Parse(const KnobSpec& s, const std::string& raw) {
  if constexpr (K == KnobKind::kBytes) {
    return ParseInt(s.name, raw, static_cast<int64_t>(s.min), static_cast<int64_t>(s.max),
                    "bytes");
  } else if constexpr (K == KnobKind::kInteger) {
    return ParseInt(s.name, raw, static_cast<int64_t>(s.min), static_cast<int64_t>(s.max),
                    "entries");
  } else if constexpr (K == KnobKind::kMilliseconds || K == KnobKind::kSeconds ||
                       K == KnobKind::kReal) {
    return ParseDouble(s.name, raw, s.min, s.max, KindName(K));
  } else if constexpr (K == KnobKind::kBool) {
    return ParseBool(s.name, raw);
  } else if constexpr (K == KnobKind::kLogLevel) {
    return ParseLogLevel(s.name, raw);
  } else if constexpr (K == KnobKind::kCpuList) {
    return ParseCpuList(s.name, raw);
  } else {
    return raw;
  }
}

template <KnobKind K>
void Put(wire::Writer* w, const KnobValue<K>& v) {
  if constexpr (std::is_same_v<KnobValue<K>, int64_t>) {
    w->I64(v);
  } else if constexpr (std::is_same_v<KnobValue<K>, double>) {
    w->F64(v);
  } else if constexpr (std::is_same_v<KnobValue<K>, bool>) {
    w->U8(v ? 1 : 0);
  } else if constexpr (std::is_same_v<KnobValue<K>, LogLevel>) {
    w->I32(static_cast<int32_t>(v));
  } else {
    w->Str(v);
  }
}

template <KnobKind K>
Status Get(wire::Reader* r, KnobValue<K>* v, const char* what) {
  if constexpr (std::is_same_v<KnobValue<K>, int64_t>) {
    return r->I64(v, what);
  } else if constexpr (std::is_same_v<KnobValue<K>, double>) {
    return r->F64(v, what);
  } else if constexpr (std::is_same_v<KnobValue<K>, bool>) {
    uint8_t b = 0;
    HVD_RETURN_IF_ERROR(r->U8(&b, what));
    *v = b != 0;
    return Status::OK();
  } else if constexpr (std::is_same_v<KnobValue<K>, LogLevel>) {
    int32_t level = 0;
    HVD_RETURN_IF_ERROR(r->I32(&level, what));
    *v = static_cast<LogLevel>(level);
    return Status::OK();
  } else {
    return r->Str(v, 4096, what);
  }
}

std::string ShowNumber(double v) {
  if (v == std::floor(v) && std::fabs(v) < 1e15) return std::to_string(static_cast<int64_t>(v));
  std::ostringstream out;
  out << v;
  return out.str();
}

template <KnobKind K>
std::string Show(const KnobValue<K>& v) {
  if constexpr (K == KnobKind::kBytes) {
    std::string text = std::to_string(v);
    if (v >= (int64_t{1} << 20) && v % (int64_t{1} << 20) == 0) {
      text += " (" + std::to_string(v >> 20) + " MiB)";
    }
    return text;
  } else if constexpr (K == KnobKind::kInteger) {
    return std::to_string(v);
  } else if constexpr (std::is_same_v<KnobValue<K>, double>) {
    return ShowNumber(v);
  } else if constexpr (K == KnobKind::kBool) {
    return v ? "1" : "0";
  } else if constexpr (K == KnobKind::kLogLevel) {
    return Lower(LogLevelName(v));
  } else {
    return v.empty() ? "unset" : v;
  }
}

// A bound as people read it: powers of two from 2^20 on as 2^N.
std::string ShowBound(KnobKind kind, double v) {
  if (kind == KnobKind::kBytes && v >= (1 << 20)) {
    const int exp = static_cast<int>(std::log2(v));
    if (std::ldexp(1.0, exp) == v) return "2^" + std::to_string(exp);
  }
  return ShowNumber(v);
}

std::string RangeText(KnobKind kind, double lo, double hi, const char* note) {
  switch (kind) {
    case KnobKind::kBool:
      return "1, 0, true, false, yes, no, on, off";
    case KnobKind::kLogLevel:
      return "trace, debug, info, warning (warn), error, fatal";
    case KnobKind::kPath:
      return *note ? std::string("a file path, or `") + note + "`" : "a file path";
    case KnobKind::kCpuList:
      return "CPU numbers separated by commas, one per local rank";
    default:
      break;
  }
  std::string text = ShowBound(kind, lo) + " .. " + ShowBound(kind, hi);
  if (kind == KnobKind::kMilliseconds || kind == KnobKind::kSeconds || kind == KnobKind::kReal) {
    text += ", fractional";
  }
  if (*note) text += std::string("; 0 = ") + note;
  return text;
}

// ---- the table, from common/config/knobs.def --------------------------------------------------------

// What the runtime does with one knob's field.
template <KnobKind K, KnobValue<K> Config::*Field>
struct FieldOps {
  static Status Apply(const KnobSpec& s, const std::string& raw, Config* c) {
    Result<KnobValue<K>> parsed = Parse<K>(s, raw);
    if (!parsed.ok()) return parsed.status();
    c->*Field = std::move(*parsed);
    return Status::OK();
  }
  static void Put(const Config& c, wire::Writer* w) { hvd::Put<K>(w, c.*Field); }
  static Status Get(wire::Reader* r, Config* c, const char* what) {
    return hvd::Get<K>(r, &(c->*Field), what);
  }
  static bool Same(const Config& a, const Config& b) { return a.*Field == b.*Field; }
  static std::string Show(const Config& c) { return hvd::Show<K>(c.*Field); }
};

struct Knob {
  KnobSpec spec;
  Status (*apply)(const KnobSpec&, const std::string&, Config*);
  void (*put)(const Config&, wire::Writer*);
  Status (*get)(wire::Reader*, Config*, const char*);
  bool (*same)(const Config&, const Config&);
  std::string (*show)(const Config&);
};

const std::vector<Knob>& Knobs() {
  static const std::vector<Knob> knobs = [] {
    const Config defaults;
    std::vector<Knob> table;
#define HVD_KNOB(field, kind, name, default_value, lo, hi, agree, flag, flag_alias, scale,     \
                 note, help)                                                                   \
  {                                                                                            \
    using Ops = FieldOps<KnobKind::k##kind, &Config::field>;                                   \
    table.push_back({KnobSpec{name, KnobKind::k##kind, KindName(KnobKind::k##kind),            \
                              Ops::Show(defaults),                                             \
                              RangeText(KnobKind::k##kind, static_cast<double>(lo),            \
                                        static_cast<double>(hi), note),                        \
                              static_cast<double>(lo), static_cast<double>(hi), agree, flag,   \
                              flag_alias, scale, note, help},                                  \
                     &Ops::Apply, &Ops::Put, &Ops::Get, &Ops::Same, &Ops::Show});              \
  }
#include "common/config/knobs.def"
#undef HVD_KNOB
    return table;
  }();
  return knobs;
}

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
    HVD_RETURN_IF_ERROR(knob.apply(knob.spec, *value, &config));
    config.set_in_env.push_back(knob.spec.name);
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

Status Config::AgreeWithRank0(const std::function<Status(std::vector<uint8_t>*)>& broadcast) {
  wire::Writer w;
  for (const Knob& knob : Knobs()) {
    if (knob.spec.agree) knob.put(*this, &w);
  }
  std::vector<uint8_t> bytes = w.bytes();
  HVD_RETURN_IF_ERROR(broadcast(&bytes));
  wire::Reader r(bytes.data(), bytes.size());
  Config agreed = *this;
  std::string differed;
  for (const Knob& knob : Knobs()) {
    if (!knob.spec.agree) continue;
    HVD_RETURN_IF_ERROR(knob.get(&r, &agreed, knob.spec.name));
    if (!knob.same(agreed, *this)) {
      differed += std::string(differed.empty() ? "" : ", ") + knob.spec.name + "=" +
                  knob.show(*this) + " (rank 0: " + knob.show(agreed) + ")";
    }
  }
  if (!differed.empty()) {
    HVD_LOG(WARNING) << "this rank's settings differ from rank 0's, which every rank uses: "
                     << differed;
  }
  agreed.warnings = warnings;
  agreed.set_in_env = set_in_env;
  *this = std::move(agreed);
  return Status::OK();
}

bool Config::SetInEnv(const char* name) const {
  return std::find(set_in_env.begin(), set_in_env.end(), name) != set_in_env.end();
}

const std::vector<KnobSpec>& KnobTable() {
  static const std::vector<KnobSpec> specs = [] {
    std::vector<KnobSpec> out;
    for (const Knob& knob : Knobs()) out.push_back(knob.spec);
    return out;
  }();
  return specs;
}

std::string KnobsMarkdown() {
  std::ostringstream out;
  out << "| variable | type | default | accepted | all ranks use rank 0's | hvdrun flag | meaning |\n"
      << "|---|---|---|---|---|---|---|\n";
  for (const KnobSpec& s : KnobTable()) {
    std::string flag = *s.flag ? std::string("`") + s.flag + "`" : "";
    if (*s.flag_alias) flag += std::string(" (`") + s.flag_alias + "`)";
    if (*s.flag && s.flag_scale == (int64_t{1} << 20)) flag += ", in MiB";
    out << "| `" << s.name << "` | " << s.type << " | " << s.default_value << " | " << s.range
        << " | " << (s.agree ? "yes" : "") << " | " << flag << " | " << s.help << " |\n";
  }
  return out.str();
}

namespace {

// Horovod's run-time settings that horovod_cpp does not implement, and what to do instead.
struct ForeignSetting {
  const char* name;
  const char* advice;
};
constexpr ForeignSetting kHorovodSettings[] = {
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
    {"HOROVOD_ADASUM_MPI_CHUNK_SIZE",
     "Adasum gathers every rank's tensor through the fused allgather (docs/adasum.md)"},
    {"HOROVOD_MPI_THREADS_DISABLE", "MPI is initialised with MPI_THREAD_MULTIPLE when asked"},
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
// Read outside the knob table: by the Python package, by the backend factory (ops/factory.cc)
// and by the Gloo backend (ops/gloo_backend.cc), which a launcher sets up.
constexpr const char* kReadByPython[] = {
    "HOROVOD_ELASTIC",       "HOROVOD_SPARK_START_TIMEOUT",  "HOROVOD_CONTROLLER",
    "HOROVOD_CPU_OPERATIONS", "HOROVOD_RANK",                "HOROVOD_SIZE",
    "HOROVOD_LOCAL_RANK",    "HOROVOD_LOCAL_SIZE",           "HOROVOD_CROSS_RANK",
    "HOROVOD_CROSS_SIZE",    "HOROVOD_HOSTNAME",             "HOROVOD_GLOO_RENDEZVOUS_ADDR",
    "HOROVOD_GLOO_RENDEZVOUS_PORT", "HOROVOD_GLOO_SECRET",   "HOROVOD_GLOO_SCOPE",
    "HOROVOD_GLOO_IFACE",    "HOROVOD_GLOO_TIMEOUT_SECONDS", "HOROVOD_ELASTIC_WORKER_ID",
    "HOROVOD_ELASTIC_TIMEOUT", "HOROVOD_ELASTIC_WORKER_START",
    "HOROVOD_ADAPTIVE_MEMORY_BUDGET", "HOROVOD_SCHEDULER_JOB"};
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

}  // namespace hvd
