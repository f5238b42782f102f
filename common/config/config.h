// horovod_cpp — Apache-2.0
#pragma once
// Runtime configuration: every HOROVOD_* knob the core reads, declared once in
// common/config/knobs.def with its type, default, range, agreement, hvdrun flag and help text.
// Config::FromEnv() parses the environment once at Init and fails with a message naming the
// variable and the value; a malformed value is never silently replaced by 0 or the default.
//
// Thread: parsed on the caller of Init; afterwards the Config is owned (read-only) by the
// runtime.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "base/logging.h"
#include "base/status.h"

namespace hvd {

enum class KnobKind {
  kBytes, kInteger, kMilliseconds, kSeconds, kReal, kBool, kLogLevel, kPath, kCpuList
};
enum KnobAgreement : bool { kLocal = false, kAgree = true };

// The C++ type of a knob of kind K.
template <KnobKind K>
struct KnobTraits {
  using type = std::conditional_t<
      K == KnobKind::kBytes || K == KnobKind::kInteger, int64_t,
      std::conditional_t<
          K == KnobKind::kMilliseconds || K == KnobKind::kSeconds || K == KnobKind::kReal,
          double,
          std::conditional_t<K == KnobKind::kBool, bool,
                             std::conditional_t<K == KnobKind::kLogLevel, LogLevel,
                                                std::string>>>>;
};
template <KnobKind K>
using KnobValue = typename KnobTraits<K>::type;

struct Config {
  // One field per knob of common/config/knobs.def, with its declared default.
#define HVD_KNOB(field, kind, name, default_value, ...) \
  KnobValue<KnobKind::k##kind> field = default_value;
#include "common/config/knobs.def"
#undef HVD_KNOB

  // Non-fatal remarks found while parsing (logged by Init).
  std::vector<std::string> warnings;
  // The variables FromEnv found set (this rank's; the autotuner leaves those knobs alone).
  std::vector<std::string> set_in_env;
  bool SetInEnv(const char* name) const;

  // Reads the knobs through `getenv` (defaults to std::getenv). Unset or empty variables keep
  // their defaults. HOROVOD_STALL_CHECK_DISABLE sets both stall times to 0.
  using EnvLookup = std::function<std::optional<std::string>(const char* name)>;
  static Result<Config> FromEnv(const EnvLookup& getenv = nullptr);

  // Every rank adopts rank 0's values of the knobs declared kAgree (the negotiation protocol
  // needs them equal: they decide the size of the vote's bit vector, how tensors are grouped
  // and when every rank gives up). `broadcast` replaces its argument, on every rank, with rank
  // 0's bytes. A rank whose values differed logs a warning naming each knob.
  Status AgreeWithRank0(const std::function<Status(std::vector<uint8_t>*)>& broadcast);
};

// One knob of common/config/knobs.def, described for people (docs, --help) and for hvdrun.
struct KnobSpec {
  const char* name;  // "HOROVOD_FUSION_THRESHOLD"
  KnobKind kind;
  const char* type;           // "bytes", "milliseconds", "integer", "seconds", "bool", ...
  std::string default_value;  // as a user would write it
  std::string range;          // the accepted values, in words
  double min, max;            // numeric kinds
  bool agree;                 // every rank uses rank 0's value
  const char* flag;           // hvdrun's flag, "" for none
  const char* flag_alias;     // another name for it, "" for none
  int64_t flag_scale;         // flag value x flag_scale = variable value
  const char* note;           // what 0 means; for Path, the keyword accepted instead
  const char* help;
};

// Every knob, in declaration order.
const std::vector<KnobSpec>& KnobTable();

// docs/config.md's table of knobs (markdown), generated from KnobTable().
std::string KnobsMarkdown();

// One warning for each HOROVOD_* name in `env_names` that horovod_cpp does not read: a likely
// typo of a setting ("did you mean ...?"), a Horovod setting horovod_cpp does not implement
// (with what to use instead, where there is something), a Horovod build setting, or an
// unknown name. Names of other prefixes are ignored. Logged by Init on rank 0.
std::vector<std::string> UnknownSettingWarnings(const std::vector<std::string>& env_names);



}  // namespace hvd
