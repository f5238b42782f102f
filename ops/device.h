// horovod_cpp — Apache-2.0
#pragma once
// Collectives on device (CUDA) memory, and the one routing rule.
//
// Routing: CPU tensors go to the host backend (MPI), CUDA tensors to the device backend
// (NCCL); RouteFor() is the only place that decides. A tensor that is on the CPU on one rank
// and on a GPU on another is caught by negotiation ("mismatched devices", on every rank).
//
// Streams: every call gets the caller's stream (nullptr: the legacy default stream), on which
// the inputs are ready. The backend makes its own per-device stream wait for that point,
// enqueues the copies, the collective and any scaling there, and returns an event recorded
// after them. It never waits for the GPU: the background thread moves on at once, and the
// framework makes its own stream wait on the event (StreamWaitEvent) before using outputs.
//
// All calls come from the background thread, in the same order on every member of the set.

#include <cstdint>
#include <memory>
#include <vector>

#include "base/status.h"
#include "base/types.h"

namespace hvd {
namespace ops {

class Backend;

enum class Route { kHost, kDevice };

// Where a tensor on `device` (kCpuDevice or a CUDA ordinal) runs; an error for a tensor on a
// GPU when there is no device backend (`device_backend`: ops::CreateBackends made one).
Result<Route> RouteFor(int32_t device, bool device_backend);

// A completion event (a cudaEvent_t, destroyed with the last reference).
using Event = std::shared_ptr<void>;

// One tensor of a fused device allreduce.
struct DeviceTensor {
  const void* input = nullptr;
  void* output = nullptr;  // may equal input
  int64_t count = 0;       // elements
};

class DeviceCollectives {
 public:
  virtual ~DeviceCollectives() = default;
  virtual const char* name() const = 0;
  // The timeline activity of a collective, e.g. "NCCL_ALLREDUCE" (a literal).
  virtual const char* ActivityName(OpType type) const = 0;

  // Device memory for a runtime-allocated result (allgather, alltoall), freed with the last
  // reference.
  virtual Result<std::shared_ptr<void>> Allocate(int device, int64_t bytes) = 0;

  // Reduces every tensor across the set (fused through a device buffer when there are
  // several). `scale` multiplies the result (prescale x postscale, and 1/size for Average);
  // implementations may apply it before the reduction (it is linear for Sum).
  virtual Result<Event> Allreduce(int32_t ps, int set_size, int set_rank, int device, void* stream,
                                  const std::vector<DeviceTensor>& tensors, DataType dtype,
                                  ReduceOp op, double scale) = 0;
  virtual Result<Event> Broadcast(int32_t ps, int set_size, int set_rank, int device, void* stream,
                                  const void* input, void* output, int64_t bytes, int root) = 0;
  // counts/displs in elements, per rank of the set.
  virtual Result<Event> Allgatherv(int32_t ps, int set_size, int set_rank, int device, void* stream,
                                   const void* send, void* recv, const std::vector<int64_t>& counts,
                                   const std::vector<int64_t>& displs, DataType dtype) = 0;
  virtual Result<Event> Alltoallv(int32_t ps, int set_size, int set_rank, int device, void* stream,
                                  const void* send, const std::vector<int64_t>& send_counts,
                                  const std::vector<int64_t>& send_displs, void* recv,
                                  const std::vector<int64_t>& recv_counts,
                                  const std::vector<int64_t>& recv_displs, DataType dtype) = 0;
  // `send` holds sum(recv_counts) elements laid out rank by rank; this rank keeps its part.
  virtual Result<Event> ReduceScatter(int32_t ps, int set_size, int set_rank, int device,
                                      void* stream, const void* send, void* recv,
                                      const std::vector<int64_t>& recv_counts, DataType dtype,
                                      ReduceOp op, double scale) = 0;

  // The set is gone: drop its communicators.
  virtual void RemoveProcessSet(int32_t ps) = 0;
};

// The NCCL implementation; communicators are created on first use per (set, device), with
// the unique id broadcast over `host`. Returns null when this build has no NCCL.
std::unique_ptr<DeviceCollectives> CreateNcclCollectives(Backend* host);

// Makes `stream` wait for `event` (no-op for a null event). Fails without CUDA.
Status StreamWaitEvent(const Event& event, void* stream);

}  // namespace ops
}  // namespace hvd
