// horovod_cpp — Apache-2.0
#pragma once
// Runtime configuration: every HOROVOD_* knob the core reads, declared once in a table
// (config.cc) with its type, default, range and help text. Config::FromEnv() parses the
// environment once at Init and fails with a message naming the variable and the value; a
// malformed value is never silently replaced by 0 or the default.
//
// Thread: parsed on the caller of Init; afterwards the Config is owned (read-only) by the
// runtime.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace hvd {

enum class LogLevel : int { kTrace = 0, kDebug, kInfo, kWarning, kError, kFatal };

struct Config {
  // Largest fused buffer, in bytes. 0 disables fusion (every tensor is reduced on its own).
  int64_t fusion_threshold_bytes = int64_t{128} << 20;
  // Largest single collective call on a host buffer, in bytes: a bigger tensor or fused buffer
  // is reduced in chunks of this size, each copied in, reduced and copied out while it is
  // still in cache (one huge MPI call is much slower here, see docs/design.md). Tensors at
  // least this big are reduced in place instead of through the fusion buffer. 0: one call.
  int64_t collective_chunk_bytes = int64_t{1} << 20;
  // Longest the background thread waits between negotiation cycles while work is outstanding,
  // in milliseconds. It wakes at once when work is enqueued, so this bounds latency only for
  // ranks that have nothing new to say.
  double cycle_time_ms = 1.0;
  // Entries in the response cache; 0 disables the bit-vector fast path.
  int64_t cache_capacity = 1024;
  LogLevel log_level = LogLevel::kWarning;
  // Seconds a tensor may wait for the remaining ranks before a stall warning; 0 disables.
  double stall_check_time_seconds = 60.0;
  // Seconds after which a stall shuts the job down; 0 never shuts down.
  double stall_shutdown_time_seconds = 0.0;
  // Seconds every rank may stay blocked in a wait with nothing able to complete before the
  // waits fail as a deadlock; 0 disables the detection.
  double deadlock_grace_seconds = 5.0;
  // Timeline output path ("" = off, "DYNAMIC" = started later through the API).
  std::string timeline_path;
  bool timeline_mark_cycles = false;
  // Allow AddProcessSet/RemoveProcessSet after Init.
  bool dynamic_process_sets = false;
  // HOROVOD_STALL_CHECK_DISABLE: no stall warnings and no stall shutdown (FromEnv then sets
  // both stall times to 0).
  bool stall_check_disabled = false;

  // Non-fatal remarks found while parsing (logged by Init).
  std::vector<std::string> warnings;

  // Reads the knobs through `getenv` (defaults to std::getenv). Unset or empty variables keep
  // their defaults.
  using EnvLookup = std::function<std::optional<std::string>(const char* name)>;
  static Result<Config> FromEnv(const EnvLookup& getenv = nullptr);
};

// One row of the knob table.
struct KnobSpec {
  const char* name;           // "HOROVOD_FUSION_THRESHOLD"
  const char* type;           // "bytes", "milliseconds", "integer", "seconds", "bool", ...
  const char* default_value;  // as a user would write it
  const char* range;          // human-readable accepted values
  const char* help;
};

// Every knob Config::FromEnv reads, in table order.
std::vector<KnobSpec> KnobTable();

// One warning for each HOROVOD_* name in `env_names` that horovod_cpp does not read: a likely
// typo of a setting ("did you mean ...?"), a Horovod setting horovod_cpp does not implement
// (with what to use instead, where there is something), a Horovod build setting, or an
// unknown name. Names of other prefixes are ignored. Logged by Init on rank 0.
std::vector<std::string> UnknownSettingWarnings(const std::vector<std::string>& env_names);

// The knob table as aligned text (used by --help texts and docs/config.md).
std::string DescribeKnobs();

const char* LogLevelName(LogLevel level);

}  // namespace hvd
