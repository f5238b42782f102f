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
  const std::string controller = Lower(std::getenv("HOROVOD_CONTROLLER"));
  const std::string cpu = Lower(std::getenv("HOROVOD_CPU_OPERATIONS"));
  if (!controller.empty() && controller != "mpi" && controller != "gloo") {
    return Status::InvalidArgument("HOROVOD_CONTROLLER='" + controller +
                                   "': horovod_cpp has the controllers mpi and gloo");
  }
  if (!cpu.empty() && cpu != "mpi" && cpu != "gloo" && cpu != "ccl") {
    return Status::InvalidArgument("HOROVOD_CPU_OPERATIONS='" + cpu +
                                   "': horovod_cpp runs CPU collectives on mpi, gloo or ccl");
  }
  if (cpu == "ccl") {
    options.cpu_operations = cpu;
    if (!controller.empty()) options.host = controller;
    return options;
  }
  if (!controller.empty() && !cpu.empty() && controller != cpu) {
    return Status::InvalidArgument(
        "HOROVOD_CONTROLLER=" + controller + " but HOROVOD_CPU_OPERATIONS=" + cpu +
        ": horovod_cpp runs the negotiation and the CPU collectives on one backend; set both "
        "to the same value (or only one of them), or HOROVOD_CPU_OPERATIONS=ccl for oneCCL "
        "beside either controller");
  }
  if (!controller.empty()) options.host = controller;
  if (!cpu.empty()) options.host = cpu;
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
  if (options.cpu_operations == "ccl") {
    if (!CclBuilt()) {
      return Status::FailedPrecondition(
          "oneCCL was asked for (HOROVOD_CPU_OPERATIONS=ccl, hvdrun --cpu-operations ccl), but "
          "this build of horovod_cpp has no oneCCL: run scripts/install_ccl.sh (scripts/"
          "install_deps.sh does) and rebuild");
    }
    backends.host = CreateCclBackend(std::move(backends.host), options.ccl);
  } else if (!options.cpu_operations.empty()) {
    return Status::InvalidArgument("unknown CPU operations '" + options.cpu_operations +
                                   "' (known: ccl, or the controller's own)");
  }
  // The NCCL collectives when this build has them (null otherwise).
  backends.device = CreateNcclCollectives(backends.host.get());
  return backends;
}

}  // namespace ops
}  // namespace hvd
