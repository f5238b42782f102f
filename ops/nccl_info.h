// horovod_cpp — Apache-2.0
#pragma once
// Whether this build has the NCCL backend. CMake compiles exactly one of nccl_info_nccl.cc
// (HVD_WITH_NCCL=ON) and nccl_info_none.cc, so no source needs an #ifdef.

namespace hvd {
namespace ops {

// NCCL's version code (e.g. 22809 for 2.28.9) when built with NCCL, otherwise 0.
int NcclVersionCode();

}  // namespace ops
}  // namespace hvd
