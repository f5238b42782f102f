// horovod_cpp — Apache-2.0
// Builds without oneCCL: the factory refuses "ccl" before it would call this.
#include "ops/ccl.h"

namespace hvd {
namespace ops {

bool CclBuilt() { return false; }

std::unique_ptr<Backend> CreateCclBackend(std::unique_ptr<Backend>, const CclOptions&) {
  return nullptr;
}

}  // namespace ops
}  // namespace hvd
