// horovod_cpp — Apache-2.0
#pragma once
// The one place that chooses the backends: the host backend (control plane, and the data plane
// of CPU tensors) and the device collectives (CUDA tensors). Init asks CreateBackends and
// hands the result to the background loop; tests hand the loop their own (a LocalBackend, a
// fake device backend). Routing asks the result (Backends::device), never the build.
//
// Adding a backend: implement ops::Backend or ops::DeviceCollectives in ops/, and choose it
// here from BackendOptions.

#include <memory>
#include <string>

#include "base/status.h"
#include "ops/backend.h"
#include "ops/ccl.h"
#include "ops/device.h"

namespace hvd {
namespace ops {

struct Backends {
  std::unique_ptr<Backend> host;
  // Null when this build has no device backend: CUDA tensors are then refused at enqueue.
  // Holds a pointer to `host`, which it may use (on the background thread) once the host is
  // initialised; destroy it first.
  std::unique_ptr<DeviceCollectives> device;
};

struct BackendOptions {
  std::string host = "mpi";  // the controller: "mpi" or "gloo"
  // The CPU collectives: "" (the controller's own) or "ccl" (oneCCL, beside the controller).
  std::string cpu_operations;
  CclOptions ccl;  // HOROVOD_CCL_* knobs (Init fills them from the Config)

  // Horovod's settings: HOROVOD_CONTROLLER ("mpi" or "gloo") and HOROVOD_CPU_OPERATIONS ("mpi",
  // "gloo" or "ccl"), either case. MPI and Gloo each carry both planes here, so those two
  // must not name different ones (one of them set is enough); "ccl" runs the CPU collectives
  // on oneCCL under either controller. Unset: MPI.
  static Result<BackendOptions> FromEnv();
};

// Whether this build has the Gloo backend (libgloo was found).
bool GlooBuilt();
// (CclBuilt(), in ops/ccl.h: whether it has oneCCL.)

Result<Backends> CreateBackends(const BackendOptions& options = {});

}  // namespace ops
}  // namespace hvd
