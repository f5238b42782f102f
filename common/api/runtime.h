// horovod_cpp — Apache-2.0
#pragma once
// The process-wide runtime state behind the public API (internal to common/). Created on
// first use and never destroyed, so no static destructor can race the background thread at
// exit; an atexit handler registered by the first Init performs the negotiated Shutdown.

#include <atomic>
#include <string>

#include "base/mutex.h"
#include "common/loop/background_loop.h"
#include "common/config/config.h"
#include "common/state/counters.h"
#include "common/state/handle_table.h"
#include "common/horovod.h"
#include "common/state/process_set.h"
#include "common/state/tensor_queue.h"

namespace hvd {
namespace detail {

struct Runtime {
  Mutex lifecycle_mu;  // serialises Init and Shutdown
  TensorQueue queue;
  HandleTable handles;
  Counters counters;
  ProcessSetTable sets;
  BackgroundLoop loop{&queue, &sets, &counters};
  std::atomic<bool> started{false};
  std::atomic<bool> dynamic_process_sets{false};
  // The backends of the running Init include a device backend (CUDA tensors are accepted).
  std::atomic<bool> device_backend{false};
  // Per-process counters for default names ("allreduce.noname.<n>"), one per op type.
  std::atomic<int64_t> noname[kNumOpTypes] = {};
};

Runtime& R();

// FAILED_PRECONDITION before Init, ABORTED (with the reason) after a shutdown.
Status CheckRunning();

// `name`, or "<op>.noname.<n>" with n counted per process and op type.
std::string NameOrDefault(const std::string& name, OpType type);

// The calling thread's call site (CallSiteScope), "" when none.
const std::string& CurrentCallSite();

}  // namespace detail
}  // namespace hvd
