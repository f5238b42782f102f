// horovod_cpp — Apache-2.0
#pragma once
// OpExecutor: runs one agreed (possibly fused) Response on this rank's tensors.
//
// Fused responses are packed into a host fusion buffer (allocated once, grown only when a
// larger group arrives, never above the fusion threshold), reduced with one backend call, and
// unpacked. A response holding a single tensor runs directly on the tensor's memory: in place
// when input and output alias, otherwise MPI reads the input and writes the output, with no
// extra copy. Average is lowered to Sum followed by an exact division by the number of ranks
// (integers truncate toward zero) and then the postscale.
//
// Owned and called by the background thread only.

#include <cstdint>
#include <memory>
#include <vector>

#include "common/counters.h"
#include "common/message.h"
#include "common/tensor_queue.h"
#include "ops/backend.h"

namespace hvd {

class OpExecutor {
 public:
  OpExecutor(ops::Backend* backend, Counters* counters);
  OpExecutor(const OpExecutor&) = delete;
  OpExecutor& operator=(const OpExecutor&) = delete;

  // `entries` are this rank's tensors, in response.tensor_names order. The returned status is
  // what every entry completes with.
  Status Execute(const Response& response, std::vector<TensorTableEntry>& entries);

 private:
  Status ExecuteAllreduce(const Response& r, std::vector<TensorTableEntry>& entries);
  Status ExecuteBroadcast(const Response& r, std::vector<TensorTableEntry>& entries);
  // A buffer of at least `bytes`, 64-byte aligned, kept across calls.
  uint8_t* FusionBuffer(int64_t bytes);

  ops::Backend* backend_;
  Counters* counters_;
  struct FreeDeleter {
    void operator()(uint8_t* p) const;
  };
  std::unique_ptr<uint8_t, FreeDeleter> buffer_;
  int64_t buffer_bytes_ = 0;
};

}  // namespace hvd
