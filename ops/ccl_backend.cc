// horovod_cpp — Apache-2.0
// The oneCCL data plane (HOROVOD_CPU_OPERATIONS=ccl): the collectives on CPU tensors run on
// Intel's oneCCL, while the negotiation (control plane), process-set bookkeeping and the
// topology stay on the controller's backend (MPI or Gloo), which this one wraps.
//
// Bootstrap: oneCCL meets through its own key-value store. Each communicator (the global set,
// then each process set) gets a fresh one: the set's first rank creates the main store and its
// address travels to the members over the controller's BroadcastBytes, at the same point of the
// call sequence on every rank (AddProcessSet is called on every rank, members or not).
//
// Transport: oneCCL's ATL over libfabric (OFI), never its MPI transport: that would load Intel
// MPI's libmpi.so.12 into a process that may already run Open MPI as the controller. The
// project installs oneCCL 2021.16 from PyPI beside a link to the system's libfabric
// (scripts/install_ccl.sh, docs/ccl.md says why this version).
//
// oneCCL reads its settings (CCL_*) once, at its first initialisation in a process; the
// worker count and pinning come from HOROVOD_CCL_WORKER_COUNT / HOROVOD_CCL_WORKER_AFFINITY
// (knobs.def) and the local rank and size from the controller's topology. A oneCCL call
// cannot be interrupted: a peer that dies mid-collective is bounded by the collective
// watchdog (HOROVOD_COLLECTIVE_TIMEOUT_SECONDS), which ends the job through the controller.

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <oneapi/ccl.hpp>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "base/logging.h"
#include "ops/backend.h"
#include "ops/block_layout.h"
#include "ops/ccl.h"

namespace hvd {
namespace ops {
namespace {

#define HVD_CCL_TRY(label, ...)                                                     \
  try {                                                                             \
    __VA_ARGS__;                                                                    \
  } catch (const std::exception& e) {                                               \
    return Status::Unavailable(std::string("oneCCL ") + (label) + ": " + e.what()); \
  }

ccl::datatype CclType(DataType dtype) {
  switch (dtype) {
    case DataType::kUInt8:
    case DataType::kBool:
      return ccl::datatype::uint8;
    case DataType::kInt8:
      return ccl::datatype::int8;
    case DataType::kUInt16:
      return ccl::datatype::uint16;
    case DataType::kInt16:
      return ccl::datatype::int16;
    case DataType::kInt32:
      return ccl::datatype::int32;
    case DataType::kInt64:
      return ccl::datatype::int64;
    case DataType::kFloat16:
      return ccl::datatype::float16;
    case DataType::kFloat32:
      return ccl::datatype::float32;
    case DataType::kFloat64:
      return ccl::datatype::float64;
    case DataType::kBFloat16:
      return ccl::datatype::bfloat16;
  }
  return ccl::datatype::uint8;
}

// Booleans travel as bytes holding 0 or 1: sum and max are OR, product and min are AND (as
// the other backends reduce C++ bools).
Result<ccl::reduction> CclOp(DataType dtype, ReduceOp op) {
  const bool boolean = dtype == DataType::kBool;
  switch (op) {
    case ReduceOp::kSum:
      return boolean ? ccl::reduction::max : ccl::reduction::sum;
    case ReduceOp::kMax:
      return ccl::reduction::max;
    case ReduceOp::kMin:
      return ccl::reduction::min;
    case ReduceOp::kProduct:
      return boolean ? ccl::reduction::min : ccl::reduction::prod;
    default:
      return Status::Internal(std::string("the oneCCL backend was asked for reduction ") +
                              ReduceOpName(op) + ", which the caller must lower first");
  }
}

// Completes `e`, polling it (with no oneCCL workers, each test() also progresses it) and
// yielding the core between polls once a brief spin has not done: ranks that share cores
// (several per core, as the test suites run them) then let the others progress, as Open MPI's
// mpi_yield_when_idle does; oneCCL's own wait() spins without yielding (measured: 3 or 4 ranks
// on 2 cores took ~25 ms a call whatever its size).
void Complete(ccl::event e) {
  for (int polls = 0; !e.test(); ++polls) {
    if (polls >= 64) std::this_thread::yield();
  }
}

std::vector<size_t> Sizes(const std::vector<int64_t>& v) {
  return std::vector<size_t>(v.begin(), v.end());
}

// Sets `name` unless the user did: their CCL_* setting wins over ours, with a warning when
// horovod_cpp's knob asked for something else.
void DefaultEnv(const char* name, const std::string& value, const char* knob) {
  const char* had = std::getenv(name);
  if (had == nullptr) {
    ::setenv(name, value.c_str(), 1);
  } else if (knob != nullptr && value != had) {
    HVD_LOG(WARNING) << name << "=" << had << " is set: it wins over " << knob << " (" << value
                     << ")";
  }
}

class CclBackend final : public Backend {
 public:
  CclBackend(std::unique_ptr<Backend> controller, CclOptions options)
      : ctl_(std::move(controller)), options_(std::move(options)) {}

  const char* name() const override { return "oneCCL"; }
  const char* ActivityName(OpType type) const override {
    switch (type) {
      case OpType::kAllreduce:
        return "CCL_ALLREDUCE";
      case OpType::kBroadcast:
        return "CCL_BCAST";
      case OpType::kAllgather:
        return "CCL_ALLGATHER";
      case OpType::kAlltoall:
        return "CCL_ALLTOALL";
      case OpType::kReducescatter:
        return "CCL_REDUCESCATTER";
      case OpType::kBarrier:
        return "CCL_BARRIER";
      default:
        return "CCL";
    }
  }
  const Topology& topology() const override { return ctl_->topology(); }
  void Leaving(const Status& why) override { ctl_->Leaving(why); }
  void Abort(int code) override { ctl_->Abort(code); }

  Status Initialize() override {
    HVD_RETURN_IF_ERROR(ctl_->Initialize());
    Status s = StartCcl();
    if (!s.ok()) ctl_->Finalize().IgnoreError();
    return s;
  }

  Status Finalize() override {
    comms_.clear();
    return ctl_->Finalize();
  }

  Status AllreduceBitsAnd(uint64_t* words, int count) override {
    return ctl_->AllreduceBitsAnd(words, count);
  }
  Status GatherBytes(const std::vector<uint8_t>& mine,
                     std::vector<std::vector<uint8_t>>* at_root) override {
    return ctl_->GatherBytes(mine, at_root);
  }
  Status BroadcastBytes(std::vector<uint8_t>* bytes, int root) override {
    return ctl_->BroadcastBytes(bytes, root);
  }

  Status AddProcessSet(int32_t id, const std::vector<int>& ranks) override {
    HVD_RETURN_IF_ERROR(ctl_->AddProcessSet(id, ranks));
    return Connect(id, ranks);
  }

  Status RemoveProcessSet(int32_t id) override {
    comms_.erase(id);
    return ctl_->RemoveProcessSet(id);
  }

  Status Allreduce(int32_t ps, const void* send, void* recv, int64_t count, DataType dtype,
                   ReduceOp op) override {
    HVD_ASSIGN_OR_RETURN(Set * set, Find(ps));
    const size_t bytes = static_cast<size_t>(count) * DataTypeSize(dtype);
    const bool in_place = send == nullptr || send == recv;
    if (set->comm == nullptr || count == 0) {
      if (!in_place && bytes > 0) std::memcpy(recv, send, bytes);
      return Status::OK();
    }
    HVD_ASSIGN_OR_RETURN(ccl::reduction red, CclOp(dtype, op));
    HVD_CCL_TRY("allreduce",
                Complete(ccl::allreduce(in_place ? recv : send, recv, static_cast<size_t>(count),
                                        CclType(dtype), red, *set->comm)));
    return Status::OK();
  }

  Status Broadcast(int32_t ps, void* buffer, int64_t bytes, int root) override {
    HVD_ASSIGN_OR_RETURN(Set * set, Find(ps));
    if (set->comm == nullptr || bytes == 0) return Status::OK();
    HVD_CCL_TRY("broadcast", Complete(ccl::broadcast(buffer, static_cast<size_t>(bytes),
                                                     ccl::datatype::uint8, root, *set->comm)));
    return Status::OK();
  }

  Status Barrier(int32_t ps) override {
    HVD_ASSIGN_OR_RETURN(Set * set, Find(ps));
    if (set->comm == nullptr) return Status::OK();
    HVD_CCL_TRY("barrier", Complete(ccl::barrier(*set->comm)));
    return Status::OK();
  }

  Status Allgatherv(int32_t ps, const void* send, int64_t send_count, void* recv,
                    const std::vector<int64_t>& counts, const std::vector<int64_t>& displs,
                    DataType dtype) override {
    HVD_ASSIGN_OR_RETURN(Set * set, Find(ps));
    const size_t elem = static_cast<size_t>(DataTypeSize(dtype));
    char* out = static_cast<char*>(recv);
    if (set->comm == nullptr) {
      const size_t bytes = static_cast<size_t>(send_count) * elem;
      char* at = out + static_cast<size_t>(displs[0]) * elem;
      if (bytes > 0 && send != at) std::memmove(at, send, bytes);
      return Status::OK();
    }
    // oneCCL lays the blocks out back to back; other displacements go through a scratch buffer.
    const int64_t width = static_cast<int64_t>(elem);
    char* into = ReceiveBlocks(out, counts, displs, width, &scratch_);
    HVD_CCL_TRY("allgather", Complete(ccl::allgatherv(send, static_cast<size_t>(send_count), into,
                                                      Sizes(counts), CclType(dtype), *set->comm)));
    if (into != out) UnpackBlocks(into, out, counts, displs, width);
    return Status::OK();
  }

  Status Alltoallv(int32_t ps, const void* send, const std::vector<int64_t>& send_counts,
                   const std::vector<int64_t>& send_displs, void* recv,
                   const std::vector<int64_t>& recv_counts, const std::vector<int64_t>& recv_displs,
                   DataType dtype) override {
    HVD_ASSIGN_OR_RETURN(Set * set, Find(ps));
    const size_t elem = static_cast<size_t>(DataTypeSize(dtype));
    const char* in = static_cast<const char*>(send);
    char* out = static_cast<char*>(recv);
    if (set->comm == nullptr) {
      const size_t bytes = static_cast<size_t>(send_counts[0]) * elem;
      if (bytes > 0) {
        std::memmove(out + static_cast<size_t>(recv_displs[0]) * elem,
                     in + static_cast<size_t>(send_displs[0]) * elem, bytes);
      }
      return Status::OK();
    }
    // oneCCL takes blocks back to back (its per-rank buffer lists are for GPUs only).
    const int64_t width = static_cast<int64_t>(elem);
    std::vector<char> packed_send;
    const char* from = PackBlocks(in, send_counts, send_displs, width, &packed_send);
    char* into = ReceiveBlocks(out, recv_counts, recv_displs, width, &scratch_);
    HVD_CCL_TRY("alltoall",
                Complete(ccl::alltoallv(from, Sizes(send_counts), into, Sizes(recv_counts),
                                        CclType(dtype), *set->comm)));
    if (into != out) UnpackBlocks(into, out, recv_counts, recv_displs, width);
    return Status::OK();
  }

  Status ReduceScatter(int32_t ps, const void* send, void* recv,
                       const std::vector<int64_t>& recv_counts, DataType dtype,
                       ReduceOp op) override {
    HVD_ASSIGN_OR_RETURN(Set * set, Find(ps));
    const size_t elem = static_cast<size_t>(DataTypeSize(dtype));
    const int rank = set->rank;
    int64_t total = 0, offset = 0;
    for (size_t r = 0; r < recv_counts.size(); ++r) {
      if (static_cast<int>(r) == rank) offset = total;
      total += recv_counts[r];
    }
    const size_t mine = static_cast<size_t>(recv_counts[static_cast<size_t>(rank)]) * elem;
    if (set->comm == nullptr || total == 0) {
      if (mine > 0) std::memmove(recv, static_cast<const char*>(send) + offset * elem, mine);
      return Status::OK();
    }
    HVD_ASSIGN_OR_RETURN(ccl::reduction red, CclOp(dtype, op));
    const bool even = std::all_of(recv_counts.begin(), recv_counts.end(),
                                  [&](int64_t c) { return c == recv_counts[0]; });
    if (even) {
      HVD_CCL_TRY("reduce_scatter",
                  Complete(ccl::reduce_scatter(send, recv, static_cast<size_t>(recv_counts[0]),
                                               CclType(dtype), red, *set->comm)));
      return Status::OK();
    }
    // oneCCL's reduce_scatter takes one count for every rank: uneven blocks are reduced whole
    // and each rank keeps its own (twice the traffic of a reduce-scatter).
    scratch_.resize(static_cast<size_t>(total) * elem);
    HVD_CCL_TRY("reduce_scatter (uneven, as an allreduce)",
                Complete(ccl::allreduce(send, scratch_.data(), static_cast<size_t>(total),
                                        CclType(dtype), red, *set->comm)));
    if (mine > 0) std::memcpy(recv, scratch_.data() + offset * static_cast<int64_t>(elem), mine);
    return Status::OK();
  }

 private:
  struct Set {
    int rank = 0;
    // The store the communicator was made through stays with it (the first rank's serves the
    // others' lookups; it must not stop while a member may still be connecting).
    std::shared_ptr<ccl::kvs> kvs;
    std::unique_ptr<ccl::communicator> comm;  // null for a set of one rank
  };

  Status StartCcl() {
    const Topology& t = ctl_->topology();
    // Settings oneCCL reads at its first initialisation in this process.
    DefaultEnv("CCL_ATL_TRANSPORT", "ofi", nullptr);
    // oneCCL warns about every setting that differs from its default (ours above): errors only,
    // unless the user asks for more.
    DefaultEnv("CCL_LOG_LEVEL", "error", nullptr);
    DefaultEnv("CCL_PROCESS_LAUNCHER", "none", nullptr);
    DefaultEnv("CCL_LOCAL_RANK", std::to_string(t.local_rank), nullptr);
    DefaultEnv("CCL_LOCAL_SIZE", std::to_string(t.local_size), nullptr);
    // horovod_cpp's background thread is already a thread for communication: by default it
    // drives oneCCL's collectives itself (no offload). oneCCL's workers busy-poll; where ranks
    // share cores with them (measured at 2 ranks on 2 cores) a 64 MiB allreduce took 1.43 s
    // with one worker per rank against 66 ms without.
    if (options_.worker_count > 0) {
      DefaultEnv("CCL_WORKER_OFFLOAD", "1", "HOROVOD_CCL_WORKER_COUNT");
      DefaultEnv("CCL_WORKER_COUNT", std::to_string(options_.worker_count),
                 "HOROVOD_CCL_WORKER_COUNT");
    } else {
      DefaultEnv("CCL_WORKER_OFFLOAD", "0", nullptr);
    }
    if (!options_.worker_affinity.empty()) {
      DefaultEnv("CCL_WORKER_AFFINITY", options_.worker_affinity, "HOROVOD_CCL_WORKER_AFFINITY");
    }
    static bool initialized = false;
    if (!initialized) {
      HVD_CCL_TRY("initialisation (is libfabric installed? scripts/install_ccl.sh links it)",
                  ccl::init());
      initialized = true;
    }
    std::vector<int> all(static_cast<size_t>(t.size));
    for (int r = 0; r < t.size; ++r) all[static_cast<size_t>(r)] = r;
    return Connect(kGlobalProcessSetId, all);
  }

  // The communicator of set `id` (sorted global `ranks`): every rank takes part in the
  // broadcast of the store's address; members create the communicator.
  Status Connect(int32_t id, const std::vector<int>& ranks) {
    const int me = ctl_->topology().rank;
    auto it = std::lower_bound(ranks.begin(), ranks.end(), me);
    const bool member = it != ranks.end() && *it == me;
    if (ranks.size() <= 1) {
      if (member) comms_[id] = std::make_unique<Set>();
      return Status::OK();
    }
    const int root = ranks.front();
    std::shared_ptr<ccl::kvs> kvs;
    std::vector<uint8_t> address;
    if (me == root) {
      HVD_CCL_TRY("key-value store", kvs = ccl::create_main_kvs());
      ccl::kvs::address_type a = kvs->get_address();
      address.assign(a.begin(), a.end());
    }
    HVD_RETURN_IF_ERROR(ctl_->BroadcastBytes(&address, root));
    if (!member) return Status::OK();
    auto set = std::make_unique<Set>();
    set->rank = static_cast<int>(it - ranks.begin());
    if (me != root) {
      ccl::kvs::address_type a{};
      if (address.size() != a.size()) {
        return Status::Internal("oneCCL store address of " + std::to_string(address.size()) +
                                " bytes, expected " + std::to_string(a.size()));
      }
      std::copy(address.begin(), address.end(), a.begin());
      HVD_CCL_TRY("key-value store", kvs = ccl::create_kvs(a));
    }
    HVD_CCL_TRY("communicator of process set " + std::to_string(id),
                set->comm = std::make_unique<ccl::communicator>(
                    ccl::create_communicator(static_cast<int>(ranks.size()), set->rank, kvs)));
    set->kvs = std::move(kvs);
    comms_[id] = std::move(set);
    return Status::OK();
  }

  Result<Set*> Find(int32_t ps) {
    auto it = comms_.find(ps);
    if (it == comms_.end()) {
      return Status::Internal("this rank has no oneCCL communicator for process set " +
                              std::to_string(ps));
    }
    return it->second.get();
  }

  std::unique_ptr<Backend> ctl_;
  CclOptions options_;
  std::map<int32_t, std::unique_ptr<Set>> comms_;
  std::vector<char> scratch_;
};

}  // namespace

bool CclBuilt() { return true; }

std::unique_ptr<Backend> CreateCclBackend(std::unique_ptr<Backend> controller,
                                          const CclOptions& options) {
  return std::make_unique<CclBackend>(std::move(controller), options);
}

}  // namespace ops
}  // namespace hvd
