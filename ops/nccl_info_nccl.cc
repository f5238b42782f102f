// horovod_cpp — Apache-2.0
#include <nccl.h>

#include "ops/nccl_info.h"

namespace hvd {
namespace ops {

int NcclVersionCode() {
  int version = 0;
  if (ncclGetVersion(&version) != ncclSuccess) return NCCL_VERSION_CODE;
  return version;
}

}  // namespace ops
}  // namespace hvd
