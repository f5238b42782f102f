// horovod_cpp — Apache-2.0
// The MPI backend.
//
// Communicators: private duplicates of MPI_COMM_WORLD (so user MPI traffic never matches
// ours) — one for negotiation, one for the global set's data — a communicator per process
// set, a per-host communicator (MPI_Comm_split_type SHARED) for local rank/size, and a
// cross-host communicator (ranks with the same local rank) for cross rank/size. Errors return
// (MPI_ERRORS_RETURN) and become Status values naming the call.
//
// Waiting: control-plane collectives are non-blocking and completed by WaitPolitely(): it
// spins on MPI_Test briefly (peers usually arrive within microseconds when they have work),
// then sleeps with exponential backoff. A rank that reaches a negotiation round early (its
// peers are still computing) therefore does not burn the core its own training thread needs.
// Data-plane collectives are blocking calls, so their speed is exactly MPI's.
//
// float16 and bfloat16 travel as 2-byte contiguous types with user-defined commutative
// MPI_Ops that compute in float32 (ops/reduce_kernels).

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <utility>

#include "base/logging.h"
#include "ops/backend.h"
#include "ops/reduce_kernels.h"

namespace hvd {
namespace ops {
namespace {

// Largest element count per MPI call: MPI counts are 32-bit ints.
constexpr int64_t kMaxCountPerCall = int64_t{1} << 30;
// Reduce-scatters of at least this many bytes take RingReduceScatter (below: MPI's).
constexpr int64_t kRingReduceScatterBytes = int64_t{1} << 20;
constexpr int kRingTag = 7301;
// RingReduceScatter's piece: its two buffers hold this many bytes each.
constexpr int64_t kRingPieceBytes = int64_t{4} << 20;

// Polite waiting: spin for kSpinTime, then sleep kMinSleep at a time until kShortSleepTime has
// passed (a peer that is a little behind, e.g. a rank whose cycle started just before the
// other's submission, is met within ~20 us instead of a long backoff period), then sleep
// doubling up to kMaxSleep (a peer still computing costs a few wake-ups per millisecond).
constexpr auto kSpinTime = std::chrono::microseconds(100);
constexpr auto kMinSleep = std::chrono::microseconds(20);
constexpr auto kShortSleepTime = std::chrono::milliseconds(2);
constexpr auto kMaxSleep = std::chrono::microseconds(500);

// The custom 2-byte types, read by the MPI_Op callbacks (which receive no user data).
MPI_Datatype g_float16 = MPI_DATATYPE_NULL;
MPI_Datatype g_bfloat16 = MPI_DATATYPE_NULL;

template <ReduceOp kOp>
void Reduce16Bit(void* in, void* inout, int* len, MPI_Datatype* dtype) {
  const DataType t = (*dtype == g_bfloat16) ? DataType::kBFloat16 : DataType::kFloat16;
  ReduceInto(inout, in, *len, t, kOp);
}

std::string MpiErrorText(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, len);
}

#define HVD_MPI_CHECK(call)                                                                     \
  do {                                                                                          \
    int hvd_mpi_rc_ = (call);                                                                   \
    if (hvd_mpi_rc_ != MPI_SUCCESS) {                                                           \
      return Status::Unavailable(std::string(#call) + " failed: " + MpiErrorText(hvd_mpi_rc_) + \
                                 HVD_WHERE());                                                  \
    }                                                                                           \
  } while (0)

class MpiBackend final : public Backend {
 public:
  MpiBackend() = default;
  MpiBackend(const MpiBackend&) = delete;
  MpiBackend& operator=(const MpiBackend&) = delete;

  const char* name() const override { return "MPI"; }
  const char* ActivityName(OpType type) const override {
    switch (type) {
      case OpType::kAllreduce:
        return "MPI_ALLREDUCE";
      case OpType::kBroadcast:
        return "MPI_BCAST";
      case OpType::kAllgather:
        return "MPI_ALLGATHER";
      case OpType::kAlltoall:
        return "MPI_ALLTOALL";
      case OpType::kReducescatter:
        return "MPI_REDUCESCATTER";
      case OpType::kBarrier:
        return "MPI_BARRIER";
      default:
        return "MPI";
    }
  }
  const Topology& topology() const override { return topo_; }
  // mpirun stops every rank. Called from the watchdog's thread while the background thread
  // may be blocked in a collective (Open MPI gives MPI_THREAD_MULTIPLE; docs/design.md).
  void Abort(int code) override { MPI_Abort(MPI_COMM_WORLD, code); }

  Status Initialize() override {
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (finalized) {
      return Status::FailedPrecondition(
          "MPI has already been finalized in this process (by an earlier hvd::Shutdown() or by "
          "the application), and MPI cannot be initialized twice");
    }
    int provided = 0;
    if (!initialized) {
      HVD_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided));
      owns_mpi_ = true;
    } else {
      MPI_Query_thread(&provided);
      if (provided < MPI_THREAD_SERIALIZED) {
        HVD_LOG(WARNING) << "MPI was initialized by the application with thread level " << provided
                         << "; horovod_cpp calls MPI from its background thread and "
                         << "needs at least MPI_THREAD_SERIALIZED (initialize with "
                         << "MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...))";
      }
    }
    topo_.threads_multiple = provided >= MPI_THREAD_MULTIPLE;

    HVD_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &world_));
    HVD_MPI_CHECK(MPI_Comm_set_errhandler(world_, MPI_ERRORS_RETURN));
    HVD_MPI_CHECK(MPI_Comm_rank(world_, &topo_.rank));
    HVD_MPI_CHECK(MPI_Comm_size(world_, &topo_.size));
    sets_[kGlobalProcessSetId] = world_;
    HVD_MPI_CHECK(MPI_Comm_dup(world_, &control_));
    HVD_MPI_CHECK(MPI_Comm_set_errhandler(control_, MPI_ERRORS_RETURN));
    HVD_MPI_CHECK(
        MPI_Comm_split_type(world_, MPI_COMM_TYPE_SHARED, topo_.rank, MPI_INFO_NULL, &local_));
    HVD_MPI_CHECK(MPI_Comm_rank(local_, &topo_.local_rank));
    HVD_MPI_CHECK(MPI_Comm_size(local_, &topo_.local_size));
    HVD_MPI_CHECK(MPI_Comm_split(world_, topo_.local_rank, topo_.rank, &cross_));
    HVD_MPI_CHECK(MPI_Comm_rank(cross_, &topo_.cross_rank));
    HVD_MPI_CHECK(MPI_Comm_size(cross_, &topo_.cross_size));

    HVD_MPI_CHECK(MPI_Type_contiguous(2, MPI_BYTE, &g_float16));
    HVD_MPI_CHECK(MPI_Type_commit(&g_float16));
    HVD_MPI_CHECK(MPI_Type_contiguous(2, MPI_BYTE, &g_bfloat16));
    HVD_MPI_CHECK(MPI_Type_commit(&g_bfloat16));
    // Commutative (1): otherwise Open MPI falls back to slow non-commutative algorithms.
    HVD_MPI_CHECK(MPI_Op_create(&Reduce16Bit<ReduceOp::kSum>, 1, &op16_sum_));
    HVD_MPI_CHECK(MPI_Op_create(&Reduce16Bit<ReduceOp::kMin>, 1, &op16_min_));
    HVD_MPI_CHECK(MPI_Op_create(&Reduce16Bit<ReduceOp::kMax>, 1, &op16_max_));
    HVD_MPI_CHECK(MPI_Op_create(&Reduce16Bit<ReduceOp::kProduct>, 1, &op16_prod_));
    return Status::OK();
  }

  Status Finalize() override {
    for (MPI_Op* op : {&op16_sum_, &op16_min_, &op16_max_, &op16_prod_}) {
      if (*op != MPI_OP_NULL) MPI_Op_free(op);
    }
    for (MPI_Datatype* t : {&g_float16, &g_bfloat16}) {
      if (*t != MPI_DATATYPE_NULL) MPI_Type_free(t);
    }
    for (auto& [id, comm] : sets_) {
      if (id != kGlobalProcessSetId && comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
    }
    sets_.clear();
    for (auto& [id, layout] : set_hosts_) layout.Free();
    set_hosts_.clear();
    for (MPI_Comm* c : {&control_, &cross_, &local_, &world_}) {
      if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
    }
    if (owns_mpi_) {
      int finalized = 0;
      MPI_Finalized(&finalized);
      owns_mpi_ = false;
      if (!finalized) HVD_MPI_CHECK(MPI_Finalize());
    }
    return Status::OK();
  }

  Status AllreduceBitsAnd(uint64_t* words, int count) override {
    MPI_Request req;
    HVD_MPI_CHECK(
        MPI_Iallreduce(MPI_IN_PLACE, words, count, MPI_UINT64_T, MPI_BAND, control_, &req));
    return WaitPolitely(&req, "bit-vector allreduce");
  }

  Status GatherBytes(const std::vector<uint8_t>& mine,
                     std::vector<std::vector<uint8_t>>* at_root) override {
    const bool root = topo_.rank == 0;
    int my_len = static_cast<int>(mine.size());
    std::vector<int> lens(root ? topo_.size : 0);
    MPI_Request req;
    HVD_MPI_CHECK(MPI_Igather(&my_len, 1, MPI_INT, lens.data(), 1, MPI_INT, 0, control_, &req));
    HVD_RETURN_IF_ERROR(WaitPolitely(&req, "gather of request sizes"));
    std::vector<int> displs(lens.size());
    std::vector<uint8_t> all;
    if (root) {
      int64_t total = 0;
      for (size_t r = 0; r < lens.size(); ++r) {
        displs[r] = static_cast<int>(total);
        total += lens[r];
      }
      if (total > INT_MAX) return Status::Internal("negotiation messages exceed 2 GiB");
      all.resize(static_cast<size_t>(total));
    }
    HVD_MPI_CHECK(MPI_Igatherv(mine.data(), my_len, MPI_BYTE, all.data(), lens.data(),
                               displs.data(), MPI_BYTE, 0, control_, &req));
    HVD_RETURN_IF_ERROR(WaitPolitely(&req, "gather of requests"));
    if (root) {
      at_root->assign(lens.size(), {});
      for (size_t r = 0; r < lens.size(); ++r) {
        (*at_root)[r].assign(all.begin() + displs[r], all.begin() + displs[r] + lens[r]);
      }
    }
    return Status::OK();
  }

  Status BroadcastBytes(std::vector<uint8_t>* bytes, int root) override {
    int64_t len = static_cast<int64_t>(bytes->size());
    MPI_Request req;
    HVD_MPI_CHECK(MPI_Ibcast(&len, 1, MPI_INT64_T, root, control_, &req));
    HVD_RETURN_IF_ERROR(WaitPolitely(&req, "broadcast of response size"));
    if (len > INT_MAX) return Status::Internal("negotiation message exceeds 2 GiB");
    bytes->resize(static_cast<size_t>(len));
    HVD_MPI_CHECK(MPI_Ibcast(bytes->data(), static_cast<int>(len), MPI_BYTE, root, control_, &req));
    return WaitPolitely(&req, "broadcast of responses");
  }

  Status AddProcessSet(int32_t id, const std::vector<int>& ranks) override {
    const bool member = std::binary_search(ranks.begin(), ranks.end(), topo_.rank);
    MPI_Comm comm = MPI_COMM_NULL;
    // Collective over every rank; non-members get MPI_COMM_NULL.
    HVD_MPI_CHECK(MPI_Comm_split(world_, member ? 0 : MPI_UNDEFINED, topo_.rank, &comm));
    if (comm != MPI_COMM_NULL) HVD_MPI_CHECK(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
    sets_[id] = comm;
    if (hier_requested_ && comm != MPI_COMM_NULL) HVD_RETURN_IF_ERROR(SplitByHost(id, comm));
    return Status::OK();
  }

  Status RemoveProcessSet(int32_t id) override {
    auto it = sets_.find(id);
    if (it == sets_.end() || id == kGlobalProcessSetId) {
      return Status::Internal("the MPI backend has no process set " + std::to_string(id));
    }
    if (it->second != MPI_COMM_NULL) MPI_Comm_free(&it->second);
    sets_.erase(it);
    auto hosts = set_hosts_.find(id);
    if (hosts != set_hosts_.end()) {
      hosts->second.Free();
      set_hosts_.erase(hosts);
    }
    return Status::OK();
  }

  Status Allreduce(int32_t ps, const void* send, void* recv, int64_t count, DataType dtype,
                   ReduceOp op) override {
    MPI_Comm comm;
    MPI_Op mpi_op;
    HVD_RETURN_IF_ERROR(Comm(ps, &comm));
    HVD_RETURN_IF_ERROR(MpiOp(dtype, op, &mpi_op));
    const MPI_Datatype mpi_type = MpiType(dtype);
    const int64_t elem = DataTypeSize(dtype);
    if (ps == kGlobalProcessSetId && hier_allreduce_) {
      return RunHierarchicalAllreduce(local_, cross_, topo_.local_rank, topo_.local_size, send, recv,
                                   count, elem, mpi_type, mpi_op);
    }
    if (ps != kGlobalProcessSetId && HierarchicalAllreduce(ps)) {
      const SetHosts& h = set_hosts_.at(ps);
      return RunHierarchicalAllreduce(h.local, h.cross, h.local_rank, h.local_size, send, recv, count,
                                   elem, mpi_type, mpi_op);
    }
    const bool in_place = send == nullptr || send == recv;
    for (int64_t done = 0; done < count; done += kMaxCountPerCall) {
      const int n = static_cast<int>(std::min(kMaxCountPerCall, count - done));
      char* r = static_cast<char*>(recv) + done * elem;
      const void* s = in_place ? MPI_IN_PLACE : static_cast<const char*>(send) + done * elem;
      HVD_MPI_CHECK(MPI_Allreduce(s, r, n, mpi_type, mpi_op, comm));
    }
    return Status::OK();
  }

  Status Broadcast(int32_t ps, void* buffer, int64_t bytes, int root) override {
    MPI_Comm comm;
    HVD_RETURN_IF_ERROR(Comm(ps, &comm));
    return BroadcastOn(comm, buffer, bytes, root);
  }

  // MPI_Bcast of `bytes` on `comm`, in calls of at most kMaxCountPerCall.
  static Status BroadcastOn(MPI_Comm comm, void* buffer, int64_t bytes, int root) {
    for (int64_t done = 0; done < bytes; done += kMaxCountPerCall) {
      const int n = static_cast<int>(std::min(kMaxCountPerCall, bytes - done));
      HVD_MPI_CHECK(MPI_Bcast(static_cast<char*>(buffer) + done, n, MPI_BYTE, root, comm));
    }
    return Status::OK();
  }

  Status Barrier(int32_t ps) override {
    MPI_Comm comm;
    HVD_RETURN_IF_ERROR(Comm(ps, &comm));
    MPI_Request req;
    HVD_MPI_CHECK(MPI_Ibarrier(comm, &req));
    return WaitPolitely(&req, "barrier");
  }

  Status Allgatherv(int32_t ps, const void* send, int64_t send_count, void* recv,
                    const std::vector<int64_t>& counts, const std::vector<int64_t>& displs,
                    DataType dtype) override {
    MPI_Comm comm;
    HVD_RETURN_IF_ERROR(Comm(ps, &comm));
    std::vector<int> c, d;
    HVD_RETURN_IF_ERROR(ToInts(counts, &c, "allgather"));
    HVD_RETURN_IF_ERROR(ToInts(displs, &d, "allgather"));
    int sc = 0;
    HVD_RETURN_IF_ERROR(ToInt(send_count, &sc, "allgather"));
    const MPI_Datatype t = MpiType(dtype);
    if (ps == kGlobalProcessSetId && hier_allgather_) {
      HVD_ASSIGN_OR_RETURN(bool done,
                           HierarchicalAllgatherv(send, sc, recv, c, d, t, DataTypeSize(dtype)));
      if (done) return Status::OK();
    }
    HVD_MPI_CHECK(MPI_Allgatherv(send, sc, t, recv, c.data(), d.data(), t, comm));
    return Status::OK();
  }

  Status Alltoallv(int32_t ps, const void* send, const std::vector<int64_t>& send_counts,
                   const std::vector<int64_t>& send_displs, void* recv,
                   const std::vector<int64_t>& recv_counts, const std::vector<int64_t>& recv_displs,
                   DataType dtype) override {
    MPI_Comm comm;
    HVD_RETURN_IF_ERROR(Comm(ps, &comm));
    std::vector<int> sc, sd, rc, rd;
    HVD_RETURN_IF_ERROR(ToInts(send_counts, &sc, "alltoall"));
    HVD_RETURN_IF_ERROR(ToInts(send_displs, &sd, "alltoall"));
    HVD_RETURN_IF_ERROR(ToInts(recv_counts, &rc, "alltoall"));
    HVD_RETURN_IF_ERROR(ToInts(recv_displs, &rd, "alltoall"));
    const MPI_Datatype t = MpiType(dtype);
    HVD_MPI_CHECK(
        MPI_Alltoallv(send, sc.data(), sd.data(), t, recv, rc.data(), rd.data(), t, comm));
    return Status::OK();
  }

  Status ReduceScatter(int32_t ps, const void* send, void* recv,
                       const std::vector<int64_t>& recv_counts, DataType dtype,
                       ReduceOp op) override {
    MPI_Comm comm;
    MPI_Op mpi_op;
    HVD_RETURN_IF_ERROR(Comm(ps, &comm));
    HVD_RETURN_IF_ERROR(MpiOp(dtype, op, &mpi_op));
    std::vector<int> rc;
    HVD_RETURN_IF_ERROR(ToInts(recv_counts, &rc, "reducescatter"));
    int64_t total = 0;
    for (int64_t c : recv_counts) total += c;
    if (total * DataTypeSize(dtype) >= kRingReduceScatterBytes) {
      return RingReduceScatter(comm, send, recv, recv_counts, dtype, op);
    }
    HVD_MPI_CHECK(MPI_Reduce_scatter(send, recv, rc.data(), MpiType(dtype), mpi_op, comm));
    return Status::OK();
  }

 private:
  // Reduce-scatter by a ring: in step s of N-1, rank r passes its partial sum of block
  // r-s-1 to rank r+1 and adds the partial sum of block r-s-2 from rank r-1 to its own
  // contribution, with our reduction kernels; after the last step block r is complete. Every
  // rank sends and receives (N-1)/N of the buffer once. Open MPI 4.1's MPI_Reduce_scatter
  // took twice as long as MPI_Allreduce of the same buffer on this machine (every algorithm
  // of coll/tuned, over shared memory); this ring takes about half as long as the allreduce.
  Status RingReduceScatter(MPI_Comm comm, const void* send, void* recv,
                           const std::vector<int64_t>& counts, DataType dtype, ReduceOp op) {
    int n = 0, r = 0;
    HVD_MPI_CHECK(MPI_Comm_size(comm, &n));
    HVD_MPI_CHECK(MPI_Comm_rank(comm, &r));
    const int64_t elem = DataTypeSize(dtype);
    std::vector<int64_t> displs(counts.size(), 0);
    int64_t largest = 0;
    for (size_t q = 0; q < counts.size(); ++q) {
      if (q > 0) displs[q] = displs[q - 1] + counts[q - 1];
      largest = std::max(largest, counts[q]);
    }
    const auto* in = static_cast<const uint8_t*>(send);
    if (n == 1) {
      std::memcpy(recv, in, static_cast<size_t>(counts[0] * elem));
      return Status::OK();
    }
    if (static_cast<int>(counts.size()) != n) {
      return Status::Internal("reducescatter: " + std::to_string(counts.size()) +
                              " counts for " + std::to_string(n) + " ranks");
    }
    // The ring runs piece by piece (kRingPieceBytes of each block at a time), so that its
    // two buffers stay small whatever the tensor: a stage-3 unit of 200 MiB kept 2 x 50 MiB
    // here for the rest of the job when they held whole blocks.
    const int64_t piece = std::min(std::max<int64_t>(largest, 1), kRingPieceBytes / elem);
    ring_in_.resize(static_cast<size_t>(piece * elem));
    ring_out_.resize(ring_in_.size());
    const int next = (r + 1) % n, prev = (r - 1 + n) % n;
    auto part = [&](int block, int64_t lo) {  // elements of `block` in the piece from lo
      return std::clamp<int64_t>(counts[block] - lo, 0, piece);
    };
    for (int64_t lo = 0; lo < largest; lo += piece) {
      for (int step = 0; step < n - 1; ++step) {
        const int out_block = (r - step - 1 + 2 * n) % n, in_block = (r - step - 2 + 2 * n) % n;
        // Step 0 passes this rank's own contribution; later steps the partial sum just made.
        // The last step receives straight into the output; every step then adds this rank's
        // contribution to what came in (the ops are commutative), and that is what goes out
        // next.
        const uint8_t* out =
            step == 0 ? in + (displs[out_block] + lo) * elem : ring_out_.data();
        uint8_t* sum = in_block == r ? static_cast<uint8_t*>(recv) + lo * elem : ring_in_.data();
        const int64_t got = part(in_block, lo);
        HVD_RETURN_IF_ERROR(SendRecvBytes(out, part(out_block, lo) * elem, next, sum,
                                          got * elem, prev, comm));
        ops::ReduceInto(sum, in + (displs[in_block] + lo) * elem, got, dtype, op);
        if (sum == ring_in_.data()) std::swap(ring_in_, ring_out_);
      }
    }
    return Status::OK();
  }

  // MPI_Sendrecv of byte buffers, in calls of at most kMaxCountPerCall bytes.
  Status SendRecvBytes(const uint8_t* out, int64_t out_bytes, int to, uint8_t* in,
                       int64_t in_bytes, int from, MPI_Comm comm) {
    // (One call at least: a rank sends and receives a message every ring step, also an empty
    // one, so that no empty message waits to be taken for the next step's.)
    for (int64_t done = 0; done == 0 || done < std::max(out_bytes, in_bytes);
         done += kMaxCountPerCall) {
      const int o = static_cast<int>(std::clamp<int64_t>(out_bytes - done, 0, kMaxCountPerCall));
      const int i = static_cast<int>(std::clamp<int64_t>(in_bytes - done, 0, kMaxCountPerCall));
      HVD_MPI_CHECK(MPI_Sendrecv(out + std::min(done, out_bytes), o, MPI_BYTE, to, kRingTag,
                                 in + std::min(done, in_bytes), i, MPI_BYTE, from, kRingTag, comm,
                                 MPI_STATUS_IGNORE));
    }
    return Status::OK();
  }

  std::vector<uint8_t> ring_in_, ring_out_;  // RingReduceScatter's block buffers

  Status WaitPolitely(MPI_Request* req, const char* what) {
    int done = 0;
    const auto start = std::chrono::steady_clock::now();
    const auto spin_until = start + kSpinTime, short_sleeps_until = start + kShortSleepTime;
    while (true) {
      int rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS) {
        return Status::Unavailable(std::string("MPI_Test on the ") + what +
                                   " failed: " + MpiErrorText(rc));
      }
      if (done) return Status::OK();
      if (std::chrono::steady_clock::now() >= spin_until) break;
    }
    auto sleep = kMinSleep;
    while (true) {
      std::this_thread::sleep_for(sleep);
      int rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS) {
        return Status::Unavailable(std::string("MPI_Test on the ") + what +
                                   " failed: " + MpiErrorText(rc));
      }
      if (done) return Status::OK();
      if (std::chrono::steady_clock::now() >= short_sleeps_until) {
        sleep = std::min(sleep * 2, kMaxSleep);
      }
    }
  }

  static MPI_Datatype MpiType(DataType dtype) {
    switch (dtype) {
      case DataType::kUInt8:
        return MPI_UINT8_T;
      case DataType::kInt8:
        return MPI_INT8_T;
      case DataType::kUInt16:
        return MPI_UINT16_T;
      case DataType::kInt16:
        return MPI_INT16_T;
      case DataType::kInt32:
        return MPI_INT32_T;
      case DataType::kInt64:
        return MPI_INT64_T;
      case DataType::kFloat32:
        return MPI_FLOAT;
      case DataType::kFloat64:
        return MPI_DOUBLE;
      case DataType::kBool:
        return MPI_C_BOOL;
      case DataType::kFloat16:
        return g_float16;
      case DataType::kBFloat16:
        return g_bfloat16;
    }
    return MPI_DATATYPE_NULL;
  }

  Status Comm(int32_t ps, MPI_Comm* out) const {
    auto it = sets_.find(ps);
    if (it == sets_.end() || it->second == MPI_COMM_NULL) {
      return Status::Internal("this rank has no communicator for process set " +
                              std::to_string(ps));
    }
    *out = it->second;
    return Status::OK();
  }

  bool HierarchicalAllreduce(int32_t ps) const override {
    if (ps == kGlobalProcessSetId) return hier_allreduce_;
    if (!hier_requested_) return false;
    auto it = set_hosts_.find(ps);
    return it != set_hosts_.end() && it->second.use;
  }

  std::string UseHierarchical(bool allreduce, bool allgather) override {
    hier_allreduce_ = hier_allgather_ = false;
    hier_requested_ = allreduce;
    if (allreduce) {
      // The process sets' host communicators, made once (collective over each set's members;
      // every rank walks the sets in the same id order).
      for (auto& [id, comm] : sets_) {
        if (id == kGlobalProcessSetId || comm == MPI_COMM_NULL || set_hosts_.count(id)) continue;
        Status made = SplitByHost(id, comm);
        if (!made.ok()) {
          HVD_LOG(WARNING) << "process set " << id << ": " << made.message()
                           << "; its allreduce stays flat";
        }
      }
    }
    if (!allreduce && !allgather) return std::string();
    // Every host the same number of ranks (min == max); each host's ranks consecutive.
    const int L = topo_.local_size;
    int v[3] = {L, -L, topo_.rank == topo_.cross_rank * L + topo_.local_rank ? 1 : 0};
    if (MPI_Allreduce(MPI_IN_PLACE, v, 3, MPI_INT, MPI_MIN, world_) != MPI_SUCCESS) {
      return "hierarchical collectives: the hosts could not be compared; using the flat ones";
    }
    const bool alike = v[0] == -v[1];
    const std::string hosts = "the hosts run different numbers of ranks (" +
                              std::to_string(v[0]) + " to " + std::to_string(-v[1]) + ")";
    std::string warning;
    if (allreduce) {
      hier_allreduce_ = alike;
      if (!alike) warning = "HOROVOD_HIERARCHICAL_ALLREDUCE: " + hosts + "; using the flat allreduce";
    }
    if (allgather) {
      hier_allgather_ = alike && v[2] == 1;
      if (!hier_allgather_) {
        warning += std::string(warning.empty() ? "" : "; ") + "HOROVOD_HIERARCHICAL_ALLGATHER: " +
                   (alike ? std::string("each host's ranks are not consecutive (use --map-by slot)")
                          : hosts) +
                   "; using the flat allgather";
      }
    }
    return warning;
  }

  // A process set's ranks by host: `local` (its ranks on this host) and `cross` (its ranks of
  // this local rank, one per host). `use`: every host runs the same number of the set's ranks,
  // more than one, on more than one host.
  struct SetHosts {
    MPI_Comm local = MPI_COMM_NULL, cross = MPI_COMM_NULL;
    int local_rank = 0, local_size = 1, cross_size = 1;
    bool use = false;
    void Free() {
      for (MPI_Comm* c : {&local, &cross}) {
        if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
      }
    }
  };

  // Collective over the members of set `id` (`comm`).
  Status SplitByHost(int32_t id, MPI_Comm comm) {
    SetHosts h;
    int rank = 0;
    HVD_MPI_CHECK(MPI_Comm_rank(comm, &rank));
    HVD_MPI_CHECK(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &h.local));
    HVD_MPI_CHECK(MPI_Comm_rank(h.local, &h.local_rank));
    HVD_MPI_CHECK(MPI_Comm_size(h.local, &h.local_size));
    HVD_MPI_CHECK(MPI_Comm_split(comm, h.local_rank, rank, &h.cross));
    HVD_MPI_CHECK(MPI_Comm_size(h.cross, &h.cross_size));
    for (MPI_Comm c : {h.local, h.cross}) HVD_MPI_CHECK(MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN));
    int v[3] = {h.local_size, -h.local_size, -h.cross_size};  // min, max local size; hosts
    HVD_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, v, 3, MPI_INT, MPI_MIN, comm));
    h.use = v[0] == -v[1] && v[0] > 1 && -v[2] > 1;
    if (rank == 0) {
      if (h.use) {
        HVD_LOG(INFO) << "process set " << id << ": hierarchical allreduce on " << -v[2]
                      << " hosts x " << v[0] << " ranks";
      } else {
        HVD_LOG(INFO) << "process set " << id << ": flat allreduce (" << -v[2]
                      << (-v[2] == 1 ? " host" : " hosts") << " with " << v[0]
                      << (v[0] == -v[1] ? "" : " to " + std::to_string(-v[1]))
                      << " of its ranks each)";
      }
    }
    set_hosts_[id] = h;
    return Status::OK();
  }

  // Reduce-scatter within the host, allreduce of each slice across hosts (among the ranks of
  // one local rank), allgather within the host. Each host sends its buffer across once.
  Status RunHierarchicalAllreduce(MPI_Comm local, MPI_Comm cross, int local_rank, int local_size,
                               const void* send, void* recv, int64_t count, int64_t elem,
                               MPI_Datatype t, MPI_Op op) {
    const int L = local_size;
    std::vector<int> counts(static_cast<size_t>(L)), displs(static_cast<size_t>(L));
    const bool in_place = send == nullptr || send == recv;
    for (int64_t done = 0; done < count; done += kMaxCountPerCall) {
      const int64_t n = std::min(kMaxCountPerCall, count - done);
      for (int i = 0; i < L; ++i) {
        counts[static_cast<size_t>(i)] = static_cast<int>(n / L + (i < n % L ? 1 : 0));
        displs[static_cast<size_t>(i)] =
            i == 0 ? 0 : displs[static_cast<size_t>(i - 1)] + counts[static_cast<size_t>(i - 1)];
      }
      const int mine = counts[static_cast<size_t>(local_rank)];
      slice_.resize(static_cast<size_t>(std::max(mine, 1) * elem));
      char* r = static_cast<char*>(recv) + done * elem;
      const char* s = in_place ? r : static_cast<const char*>(send) + done * elem;
      HVD_MPI_CHECK(MPI_Reduce_scatter(s, slice_.data(), counts.data(), t, op, local));
      HVD_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, slice_.data(), mine, t, op, cross));
      HVD_MPI_CHECK(
          MPI_Allgatherv(slice_.data(), mine, t, r, counts.data(), displs.data(), t, local));
    }
    return Status::OK();
  }

  // Gather to each host's first rank, allgather among those, broadcast within the host.
  // Ranks are consecutive per host (UseHierarchical checked), so a host's rows are one block.
  // Returns false (nothing done) when the layout is not the plain concatenation in rank order.
  Result<bool> HierarchicalAllgatherv(const void* send, int sc, void* recv,
                                      const std::vector<int>& c, const std::vector<int>& d,
                                      MPI_Datatype t, int64_t elem) {
    const int L = topo_.local_size, H = topo_.cross_size;
    int64_t at = 0;
    for (size_t i = 0; i < c.size(); ++i) {
      if (d[i] != at) return false;
      at += c[i];
    }
    const int first = topo_.cross_rank * L;  // this host's first rank
    char* block = static_cast<char*>(recv) + static_cast<int64_t>(d[static_cast<size_t>(first)]) * elem;
    std::vector<int> local_counts(static_cast<size_t>(L)), local_displs(static_cast<size_t>(L));
    for (int i = 0; i < L; ++i) {
      local_counts[static_cast<size_t>(i)] = c[static_cast<size_t>(first + i)];
      local_displs[static_cast<size_t>(i)] =
          d[static_cast<size_t>(first + i)] - d[static_cast<size_t>(first)];
    }
    HVD_MPI_CHECK(MPI_Gatherv(send, sc, t, block, local_counts.data(), local_displs.data(), t, 0,
                              local_));
    if (topo_.local_rank == 0) {  // cross_ of local rank 0: the hosts' first ranks
      std::vector<int> host_counts(static_cast<size_t>(H)), host_displs(static_cast<size_t>(H));
      for (int h = 0; h < H; ++h) {
        int64_t sum = 0;
        for (int i = 0; i < L; ++i) sum += c[static_cast<size_t>(h * L + i)];
        HVD_RETURN_IF_ERROR(ToInt(sum, &host_counts[static_cast<size_t>(h)], "allgather"));
        host_displs[static_cast<size_t>(h)] = d[static_cast<size_t>(h * L)];
      }
      HVD_MPI_CHECK(MPI_Allgatherv(MPI_IN_PLACE, 0, t, recv, host_counts.data(),
                                   host_displs.data(), t, cross_));
    }
    HVD_RETURN_IF_ERROR(BroadcastOn(local_, recv, at * elem, 0));
    return true;
  }

  // MPI counts are 32-bit.
  static Status ToInt(int64_t v, int* out, const char* op) {
    if (v < 0 || v > INT_MAX) {
      return Status::InvalidArgument(std::string(op) + ": " + std::to_string(v) +
                                     " elements exceed MPI's 32-bit count limit (2^31-1) for one "
                                     "call; split the tensor");
    }
    *out = static_cast<int>(v);
    return Status::OK();
  }
  static Status ToInts(const std::vector<int64_t>& v, std::vector<int>* out, const char* op) {
    out->resize(v.size());
    for (size_t i = 0; i < v.size(); ++i) HVD_RETURN_IF_ERROR(ToInt(v[i], &(*out)[i], op));
    return Status::OK();
  }

  Status MpiOp(DataType dtype, ReduceOp op, MPI_Op* out) const {
    const bool custom = dtype == DataType::kFloat16 || dtype == DataType::kBFloat16;
    switch (op) {
      case ReduceOp::kSum:
        *out = custom ? op16_sum_ : MPI_SUM;
        return Status::OK();
      case ReduceOp::kMin:
        *out = custom ? op16_min_ : MPI_MIN;
        return Status::OK();
      case ReduceOp::kMax:
        *out = custom ? op16_max_ : MPI_MAX;
        return Status::OK();
      case ReduceOp::kProduct:
        *out = custom ? op16_prod_ : MPI_PROD;
        return Status::OK();
      default:
        return Status::Internal(std::string("the MPI backend was asked for reduction ") +
                                ReduceOpName(op) + ", which the caller must lower first");
    }
  }

  Topology topo_;
  bool owns_mpi_ = false;
  MPI_Comm world_ = MPI_COMM_NULL;    // data plane of the global set
  MPI_Comm control_ = MPI_COMM_NULL;  // negotiation only
  MPI_Comm local_ = MPI_COMM_NULL;
  MPI_Comm cross_ = MPI_COMM_NULL;
  std::map<int32_t, MPI_Comm>
      sets_;  // process set id -> communicator (MPI_COMM_NULL: not a member)
  MPI_Op op16_sum_ = MPI_OP_NULL;
  MPI_Op op16_min_ = MPI_OP_NULL;
  MPI_Op op16_max_ = MPI_OP_NULL;
  MPI_Op op16_prod_ = MPI_OP_NULL;
  bool hier_allreduce_ = false;  // UseHierarchical: hosts alike
  bool hier_requested_ = false;  // hierarchical allreduce asked for (process sets: set_hosts_)
  std::map<int32_t, SetHosts> set_hosts_;  // process sets (not the global one)
  bool hier_allgather_ = false;  // ... and each host's ranks consecutive
  std::vector<char> slice_;      // this rank's slice in a hierarchical allreduce
};

}  // namespace

std::unique_ptr<Backend> CreateMpiBackend() { return std::make_unique<MpiBackend>(); }

}  // namespace ops
}  // namespace hvd
