// horovod_cpp — Apache-2.0
#pragma once
// The collective backend interface: what the background loop needs from a transport.
//
// Two planes share one interface:
//   * control plane — small messages that carry the negotiation (a bit-vector AND-allreduce,
//     a gather of byte strings to rank 0, a broadcast of bytes); the backend knows nothing
//     about what the bytes mean;
//   * data plane — the collectives on tensor memory.
// All ranks call the same methods in the same order. Only the background thread calls a
// Backend (Initialize and Finalize included), so implementations need no locking.

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "base/types.h"

namespace hvd {
namespace ops {

struct Topology {
  int rank = 0;
  int size = 1;
  int local_rank = 0;  // rank among the processes on this host
  int local_size = 1;
  int cross_rank = 0;  // index of this host among hosts (ranks with the same local_rank)
  int cross_size = 1;
  bool threads_multiple = false;  // MPI_THREAD_MULTIPLE available
};

class Backend {
 public:
  virtual ~Backend() = default;

  // "MPI", ... (used in messages).
  virtual const char* name() const = 0;
  // The timeline activity of a collective of this backend, e.g. "MPI_ALLREDUCE" (a literal).
  virtual const char* ActivityName(OpType type) const = 0;

  // Brings the transport up (e.g. MPI_Init_thread unless already initialised) and fills the
  // topology. Called once, on the background thread.
  virtual Status Initialize() = 0;
  // Releases everything Initialize created (and finalises MPI if Initialize started it).
  virtual Status Finalize() = 0;
  // The loop ended with `why` (an error, not a shutdown); Finalize follows. A backend may tell
  // its peers why, who otherwise see only its connections close.
  virtual void Leaving(const Status& /*why*/) {}
  virtual const Topology& topology() const = 0;
  // Asks for the hierarchical algorithms (HOROVOD_HIERARCHICAL_ALLREDUCE / _ALLGATHER): the
  // allreduce on every process set whose hosts run the same number of its ranks, the allgather
  // on the global set. Every rank calls it at the same point (after Init, and when the
  // autotuner switches) with the same values. Returns a warning for the log when the global set
  // cannot use one (e.g. hosts with different numbers of ranks: the flat algorithm stays),
  // identical on every rank; empty when all is well.
  virtual std::string UseHierarchical(bool allreduce, bool allgather) {
    return allreduce || allgather ? std::string(name()) + " has no hierarchical collectives"
                                  : std::string();
  }
  // Whether Allreduce on process set `ps` takes the hierarchical algorithm (this rank a member).
  virtual bool HierarchicalAllreduce(int32_t /*ps*/) const { return false; }
  // Ends the whole job as fast as the transport can (MPI_Abort), from any thread; it may not
  // return. Used by the collective timeout. The default ends this process only.
  virtual void Abort(int code) { std::_Exit(code); }

  // ---- control plane ----
  // Bitwise AND of `words` across all ranks, in place.
  virtual Status AllreduceBitsAnd(uint64_t* words, int count) = 0;
  // Rank 0 receives every rank's bytes (`at_root` is resized to size); others get nothing.
  virtual Status GatherBytes(const std::vector<uint8_t>& mine,
                             std::vector<std::vector<uint8_t>>* at_root) = 0;
  // `bytes` of `root` are copied to every rank (resized on receivers).
  virtual Status BroadcastBytes(std::vector<uint8_t>* bytes, int root) = 0;

  // ---- process sets ----
  // Creates the communicator of process set `id` (sorted global `ranks`). Called on every
  // rank, members or not, at the same point of the call sequence.
  virtual Status AddProcessSet(int32_t id, const std::vector<int>& ranks) = 0;
  virtual Status RemoveProcessSet(int32_t id) = 0;

  // ---- data plane ----
  // Every call runs within process set `ps` (this rank must be a member); roots, counts and
  // displacements are indexed by rank *within the set*; counts are in elements of `dtype`.
  //
  // Element-wise reduction of `count` elements. `send` == nullptr or == `recv` means in place.
  // `op` is one of kSum, kMin, kMax, kProduct (Average is Sum plus scaling by the caller).
  virtual Status Allreduce(int32_t ps, const void* send, void* recv, int64_t count, DataType dtype,
                           ReduceOp op) = 0;
  virtual Status Broadcast(int32_t ps, void* buffer, int64_t bytes, int root) = 0;
  virtual Status Barrier(int32_t ps) = 0;
  // Each rank sends `send_count` elements; rank r's arrive at recv + displs[r].
  virtual Status Allgatherv(int32_t ps, const void* send, int64_t send_count, void* recv,
                            const std::vector<int64_t>& counts, const std::vector<int64_t>& displs,
                            DataType dtype) = 0;
  virtual Status Alltoallv(int32_t ps, const void* send, const std::vector<int64_t>& send_counts,
                           const std::vector<int64_t>& send_displs, void* recv,
                           const std::vector<int64_t>& recv_counts,
                           const std::vector<int64_t>& recv_displs, DataType dtype) = 0;
  // Reduces `send` (sum of recv_counts elements, laid out rank by rank) and leaves rank r's
  // recv_counts[r] elements in its `recv`.
  virtual Status ReduceScatter(int32_t ps, const void* send, void* recv,
                               const std::vector<int64_t>& recv_counts, DataType dtype,
                               ReduceOp op) = 0;
};

// The MPI backend (always built).
std::unique_ptr<Backend> CreateMpiBackend();
// The Gloo backend (ops/gloo_backend.cc; only in builds with Gloo, see GlooBuilt()).
std::unique_ptr<Backend> CreateGlooBackend();

}  // namespace ops
}  // namespace hvd
