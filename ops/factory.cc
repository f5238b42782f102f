// horovod_cpp — Apache-2.0
#include "ops/factory.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>

namespace hvd {
namespace ops {

namespace {

std::string Lower(const char* v) {
  std::string s = v != nullptr ? v : "";
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

}  // namespace

bool GlooBuilt() {
#if HVD_WITH_GLOO
  return true;
#else
  return false;
#endif
}

Result<BackendOptions> BackendOptions::FromEnv() {
  BackendOptions options;
  std::string chosen, by;
  for (const char* name : {"HOROVOD_CONTROLLER", "HOROVOD_CPU_OPERATIONS"}) {
    const std::string v = Lower(std::getenv(name));
    if (v.empty()) continue;
    if (v != "mpi" && v != "gloo") {
      return Status::InvalidArgument(std::string(name) + "='" + v +
                                     "': horovod_cpp has the host backends mpi and gloo");
    }
    if (!chosen.empty() && v != chosen) {
      return Status::InvalidArgument(
          by + "=" + chosen + " but " + name + "=" + v +
          ": horovod_cpp runs the negotiation and the CPU collectives on one backend; set both "
          "to the same value (or only one of them)");
    }
    chosen = v;
    by = name;
  }
  if (!chosen.empty()) options.host = chosen;
  return options;
}

Result<Backends> CreateBackends(const BackendOptions& options) {
  Backends backends;
  if (options.host == "mpi") {
    backends.host = CreateMpiBackend();
  } else if (options.host == "gloo") {
    if (!GlooBuilt()) {
      return Status::FailedPrecondition(
          "the Gloo backend was asked for (HOROVOD_CONTROLLER / HOROVOD_CPU_OPERATIONS = gloo), "
          "but this build of horovod_cpp has no Gloo: install libgloo-dev (scripts/"
          "install_deps.sh does) and rebuild");
    }
    backends.host = CreateGlooBackend();
  } else {
    return Status::InvalidArgument("unknown host backend '" + options.host +
                                   "' (known: mpi, gloo)");
  }
  // The NCCL collectives when this build has them (null otherwise).
  backends.device = CreateNcclCollectives(backends.host.get());
  return backends;
}

}  // namespace ops
}  // namespace hvd
