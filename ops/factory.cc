// horovod_cpp — Apache-2.0
#include "ops/factory.h"

namespace hvd {
namespace ops {

Result<Backends> CreateBackends(const BackendOptions& options) {
  Backends backends;
  if (options.host == "mpi") {
    backends.host = CreateMpiBackend();
  } else {
    return Status::InvalidArgument("unknown host backend '" + options.host + "' (known: mpi)");
  }
  // The NCCL collectives when this build has them (null otherwise).
  backends.device = CreateNcclCollectives(backends.host.get());
  return backends;
}

}  // namespace ops
}  // namespace hvd
