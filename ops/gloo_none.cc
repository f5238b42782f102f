// horovod_cpp — Apache-2.0
// Builds without Gloo: the factory refuses "gloo" before it would call this.
#include "ops/backend.h"

namespace hvd {
namespace ops {

std::unique_ptr<Backend> CreateGlooBackend() { return nullptr; }

}  // namespace ops
}  // namespace hvd
