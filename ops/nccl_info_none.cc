// horovod_cpp — Apache-2.0
#include "ops/nccl_info.h"

namespace hvd {
namespace ops {

int NcclVersionCode() { return 0; }

}  // namespace ops
}  // namespace hvd
