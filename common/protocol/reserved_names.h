// horovod_cpp — Apache-2.0
#pragma once
// Names of the runtime's own negotiated operations. They live under a reserved prefix that
// user tensor names may not use, so they can never collide with a tensor.

namespace hvd {

constexpr const char* kReservedPrefix = "__hvd.";
constexpr const char* kJoinName = "__hvd.join";
constexpr const char* kBarrierPrefix = "__hvd.barrier.";  // + the process set id
constexpr const char* kProcessSetAddPrefix = "__hvd.process_set.add.";
constexpr const char* kProcessSetRemovePrefix = "__hvd.process_set.remove.";

}  // namespace hvd
