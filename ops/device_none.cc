// horovod_cpp — Apache-2.0
// Builds without NCCL (CMake compiles exactly one of device_nccl.cc and this file).
#include "ops/device.h"

namespace hvd {
namespace ops {

std::unique_ptr<DeviceCollectives> CreateNcclCollectives(Backend*) { return nullptr; }

Status StreamWaitEvent(const Event& event, void*) {
  if (!event) return Status::OK();
  return Status::FailedPrecondition("this horovod_cpp was built without CUDA");
}

}  // namespace ops
}  // namespace hvd
