// horovod_cpp — Apache-2.0
#pragma once
// The oneCCL data plane (ops/ccl_backend.cc; ops/ccl_none.cc in builds without oneCCL): a
// Backend that runs the CPU collectives on oneCCL and everything else on `controller`.

#include <memory>
#include <string>

#include "ops/backend.h"

namespace hvd {
namespace ops {

struct CclOptions {
  int worker_count = 0;         // HOROVOD_CCL_WORKER_COUNT; 0: none (the background thread)
  std::string worker_affinity;  // HOROVOD_CCL_WORKER_AFFINITY; empty: oneCCL's own default
};

// Whether this build has oneCCL (found at configure time, HVD_WITH_CCL).
bool CclBuilt();

std::unique_ptr<Backend> CreateCclBackend(std::unique_ptr<Backend> controller,
                                          const CclOptions& options);

}  // namespace ops
}  // namespace hvd
