// horovod_cpp — Apache-2.0
// libFuzzer target for the configuration parser (Config::FromEnv): HOROVOD_* values come from
// users' environments. Any values must give a Config or an error naming the variable, never a
// crash or undefined behaviour, and an accepted Config must be inside the documented ranges.
//
// Input: lines. "NAME=VALUE" sets NAME; a line without '=' is the value of the next knob in
// table order (so short inputs reach every knob).

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>

#include "common/config/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const std::vector<hvd::KnobSpec> knobs = hvd::KnobTable();
  std::map<std::string, std::string> env;
  size_t next_knob = 0;
  for (size_t start = 0; start <= text.size();) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(start, end - start);
    const size_t eq = line.find('=');
    if (eq != std::string::npos) {
      env[line.substr(0, eq)] = line.substr(eq + 1);
    } else if (next_knob < knobs.size()) {
      env[knobs[next_knob++].name] = line;
    }
    start = end + 1;
  }
  hvd::Result<hvd::Config> config =
      hvd::Config::FromEnv([&](const char* name) -> std::optional<std::string> {
        auto it = env.find(name);
        if (it == env.end()) return std::nullopt;
        return it->second;
      });
  if (!config.ok()) {
    // The error names the variable it is about.
    if (config.status().message().find("HOROVOD_") == std::string::npos) std::abort();
    return 0;
  }
  const hvd::Config& c = *config;
  const bool in_range =
      c.fusion_threshold_bytes >= 0 && c.fusion_threshold_bytes <= (int64_t{1} << 40) &&
      c.collective_chunk_bytes >= 0 && c.collective_chunk_bytes <= (int64_t{1} << 40) &&
      std::isfinite(c.cycle_time_ms) && c.cycle_time_ms >= 0 && c.cycle_time_ms <= 60000 &&
      c.cache_capacity >= 0 && c.cache_capacity <= (1 << 20) &&
      std::isfinite(c.stall_check_time_seconds) && c.stall_check_time_seconds >= 0 &&
      c.stall_check_time_seconds <= 86400 && std::isfinite(c.stall_shutdown_time_seconds) &&
      c.stall_shutdown_time_seconds >= 0 && c.stall_shutdown_time_seconds <= 86400;
  if (!in_range) std::abort();
  return 0;
}
