// horovod_cpp — Apache-2.0
// The routing rule (ops/device.h): always built.
#include <string>

#include "ops/device.h"

namespace hvd {
namespace ops {

Result<Route> RouteFor(int32_t device, bool device_backend) {
  if (device == kCpuDevice) return Route::kHost;
  if (device < 0) {
    return Status::InvalidArgument("invalid device " + std::to_string(device) +
                                   " (use -1 for the CPU or a CUDA ordinal >= 0)");
  }
  if (!device_backend) {
    return Status::InvalidArgument(
        "tensor is on " + DeviceToString(device) +
        ", but this horovod_cpp was built without NCCL (CUDA tensors need -DHVD_WITH_NCCL=ON "
        "with CUDA and NCCL found); move the tensor to the CPU or rebuild");
  }
  return Route::kDevice;
}

}  // namespace ops
}  // namespace hvd
