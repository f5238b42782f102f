// horovod_cpp — Apache-2.0
// The Gloo backend: every collective over Gloo's TCP transport, without MPI.
//
// Ranks are started by a launcher (hvdrun --gloo, or the elastic driver), not by mpirun, and
// learn who they are from the environment: HOROVOD_RANK and HOROVOD_SIZE, the rendezvous store
// (HOROVOD_GLOO_RENDEZVOUS_ADDR / _PORT, authenticated with HOROVOD_GLOO_SECRET), the
// address to listen on (HOROVOD_GLOO_IFACE, else HOROVOD_HOSTNAME, else the host name) and a
// scope (HOROVOD_GLOO_SCOPE, set by the elastic layer for each round and by Ray for each run,
// with the count of this process's Inits under it) that keeps one rendezvous's keys apart from
// the next one's. Local and cross ranks are worked out from every rank's HOROVOD_HOSTNAME
// after the ranks meet, so a launcher cannot get them wrong.
//
// The negotiation, the host names and the global set's small collectives go over a TCP mesh
// of our own (ops/tcp_mesh.h: one write and one read per message, where Gloo takes a
// rendezvous and a hop through its event-loop thread); a full-mesh Gloo context carries the
// global set's other data, and each process set gets a context of its own, built through the
// store by its members. Only the background thread calls a Backend, so the calls on a context
// are ordered alike on every rank and one tag suffices. Every operation waits up to
// HOROVOD_GLOO_TIMEOUT_SECONDS; a peer whose process ended closes its connections, which fails
// the operation at once. Every failure becomes kUnavailable, which ends the background loop
// with HorovodInternalError on every pending operation: what an elastic job catches to re-form
// without the lost ranks.

#include <unistd.h>

#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <string>

#include "base/logging.h"
#include "ops/backend.h"
#include "ops/block_layout.h"
#include "ops/reduce_kernels.h"
#include "ops/rendezvous_client.h"
#include "ops/tcp_mesh.h"

namespace hvd {
namespace ops {
namespace {

constexpr double kDefaultTimeoutSeconds = 30;

std::string Env(const char* name, const std::string& fallback = std::string()) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::string(v) : fallback;
}

Status EnvInt(const char* name, int* out) {
  const std::string v = Env(name);
  if (v.empty()) {
    return Status::FailedPrecondition(std::string("the Gloo backend needs ") + name +
                                      " (ranks of a Gloo job are started by `hvdrun --gloo`, "
                                      "which sets it)");
  }
  char* end = nullptr;
  const long n = std::strtol(v.c_str(), &end, 10);
  if (end == v.c_str() || *end != '\0' || n < 0 || n > (1 << 24)) {
    return Status::InvalidArgument(std::string(name) + "='" + v + "' is not a rank number");
  }
  *out = static_cast<int>(n);
  return Status::OK();
}

// Gloo's store interface over the launcher's rendezvous store. Gloo's calls throw on failure.
class Store final : public gloo::rendezvous::Store {
 public:
  Store(RendezvousClient* client, std::chrono::milliseconds timeout)
      : client_(client), timeout_(timeout) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    Status s = client_->Set(key, data);
    if (!s.ok()) throw std::runtime_error(s.message());
  }
  std::vector<char> get(const std::string& key) override {
    Result<std::vector<char>> v = client_->Get(key, timeout_);
    if (!v.ok()) throw std::runtime_error(v.status().message());
    return std::move(v).value();
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& t) override {
    for (const std::string& key : keys) {
      Result<std::vector<char>> v = client_->Get(key, t);
      if (!v.ok()) throw std::runtime_error(v.status().message());
    }
  }

 private:
  RendezvousClient* client_;
  std::chrono::milliseconds timeout_;
};

template <typename T>
void ReduceFn(void* c, const void* a, const void* b, size_t n, DataType dtype, ReduceOp op) {
  if (c != a) std::memcpy(c, a, n * sizeof(T));
  ReduceInto(c, b, static_cast<int64_t>(n), dtype, op);
}

// Small collectives go by direct exchange (ExchangeBlocks): every rank sends its block to every
// other rank at once, one message per pair, and reduces what it received locally, in rank
// order, so every rank computes the same result bit for bit. Gloo's ring allreduce splits even
// a few bytes into segments and passes each through its event-loop thread and back: measured
// on 2 cores, a 4 KB allreduce took 0.8 ms at np 2 and 6.3 ms at np 4 against 0.14 and 0.85 ms
// by direct exchange; at 1 MB received per rank the two are even (2 ms at np 2, 4.1-4.4 at
// np 3), and above that the ring's n-1 steps of 1/n each win on volume. So a collective takes
// the direct path while a rank receives at most this much.
constexpr size_t kDirectBytes = size_t{1} << 20;
// The slot of the direct exchange's messages: a prefix none of Gloo's collectives uses
// (gloo/types.h: 0x01-0x08), so they never match an algorithm's messages on the same context.
const uint64_t kExchangeSlot = gloo::Slot::build(0x7e, 0);

// Runs the statements after `label`; a Gloo exception becomes kUnavailable naming `label`.
#define HVD_GLOO_TRY(label, ...)                                                               \
  try {                                                                                        \
    __VA_ARGS__;                                                                               \
  } catch (const std::exception& hvd_gloo_error_) {                                            \
    return Status::Unavailable(std::string("Gloo ") + (label) + " failed: " +                  \
                               hvd_gloo_error_.what());                                        \
  }

class GlooBackend final : public Backend {
 public:
  const char* name() const override { return "Gloo"; }
  const char* ActivityName(OpType type) const override {
    switch (type) {
      case OpType::kAllreduce:
        return "GLOO_ALLREDUCE";
      case OpType::kBroadcast:
        return "GLOO_BCAST";
      case OpType::kAllgather:
        return "GLOO_ALLGATHER";
      case OpType::kAlltoall:
        return "GLOO_ALLTOALL";
      case OpType::kReducescatter:
        return "GLOO_REDUCESCATTER";
      case OpType::kBarrier:
        return "GLOO_BARRIER";
      default:
        return "GLOO";
    }
  }
  const Topology& topology() const override { return topo_; }

  Status Initialize() override {
    HVD_RETURN_IF_ERROR(EnvInt("HOROVOD_RANK", &topo_.rank));
    HVD_RETURN_IF_ERROR(EnvInt("HOROVOD_SIZE", &topo_.size));
    if (topo_.size < 1 || topo_.rank >= topo_.size) {
      return Status::InvalidArgument("HOROVOD_RANK=" + std::to_string(topo_.rank) +
                                     " is not below HOROVOD_SIZE=" + std::to_string(topo_.size));
    }
    const std::string addr = Env("HOROVOD_GLOO_RENDEZVOUS_ADDR");
    int port = 0;
    HVD_RETURN_IF_ERROR(EnvInt("HOROVOD_GLOO_RENDEZVOUS_PORT", &port));
    if (addr.empty()) {
      return Status::FailedPrecondition(
          "the Gloo backend needs HOROVOD_GLOO_RENDEZVOUS_ADDR (ranks of a Gloo job are "
          "started by `hvdrun --gloo`, which serves the rendezvous store)");
    }
    const std::string timeout_text = Env("HOROVOD_GLOO_TIMEOUT_SECONDS");
    double seconds = kDefaultTimeoutSeconds;
    if (!timeout_text.empty()) {
      char* end = nullptr;
      seconds = std::strtod(timeout_text.c_str(), &end);
      if (end == timeout_text.c_str() || *end != '\0' || !(seconds > 0)) {
        return Status::InvalidArgument("HOROVOD_GLOO_TIMEOUT_SECONDS='" + timeout_text +
                                       "' is not a positive number of seconds");
      }
    }
    timeout_ = std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
    client_ = std::make_unique<RendezvousClient>(addr, port, Env("HOROVOD_GLOO_SECRET"));
    store_ = std::make_unique<Store>(client_.get(), timeout_);
    // Every Init meets under a prefix of its own: a job that shuts down and initializes again
    // must not find the addresses of its previous rendezvous in the store. The launcher may
    // name a scope (the elastic layer: each round; Ray: each run); within it, this process's
    // count of Inits under that scope tells them apart (every rank of the scope initializes
    // the same number of times).
    static std::map<std::string, int> inits;
    const std::string scope = Env("HOROVOD_GLOO_SCOPE");
    scope_ = (scope.empty() ? std::string("job") : scope) + "/init" +
             std::to_string(inits[scope]++);

    char host[256] = {0};
    ::gethostname(host, sizeof(host) - 1);
    host_ = Env("HOROVOD_HOSTNAME", host);
    gloo::transport::tcp::attr attr;
    const std::string iface = Env("HOROVOD_GLOO_IFACE");
    if (!iface.empty()) {
      attr.iface = iface;
    } else {
      attr.hostname = host_;
    }
    gloo::transport::tcp::attr resolved;
    HVD_GLOO_TRY("device on " + (iface.empty() ? host_ : iface), {
      resolved = gloo::transport::tcp::CreateDeviceAttr(attr);
      device_ = gloo::transport::tcp::CreateDevice(attr);
    });
    HVD_ASSIGN_OR_RETURN(world_, Connect("global", topo_.rank, topo_.size));
    sets_[kGlobalProcessSetId] = world_;
    HVD_RETURN_IF_ERROR(ConnectMesh(resolved));
    return WorkOutHosts();
  }

  void Leaving(const Status& why) override {
    if (mesh_) mesh_->Leave(why.message());
  }

  Status Finalize() override {
    mesh_.reset();
    sets_.clear();
    world_.reset();
    device_.reset();
    store_.reset();
    client_.reset();
    return Status::OK();
  }

  // The negotiation's vote: a few words from every rank, exchanged directly (kDirectBytes).
  Status AllreduceBitsAnd(uint64_t* words, int count) override {
    if (topo_.size == 1 || count == 0) return Status::OK();
    const size_t n = static_cast<size_t>(count);
    std::vector<uint64_t> all(n * static_cast<size_t>(topo_.size));
    HVD_RETURN_IF_ERROR(mesh_->Allgather(words, n * sizeof(uint64_t),
                                         reinterpret_cast<char*>(all.data()),
                                         "bit-vector allreduce"));
    for (int r = 0; r < topo_.size; ++r) {
      const uint64_t* theirs = all.data() + static_cast<size_t>(r) * n;
      for (size_t i = 0; i < n; ++i) words[i] &= theirs[i];
    }
    return Status::OK();
  }

  Status GatherBytes(const std::vector<uint8_t>& mine,
                     std::vector<std::vector<uint8_t>>* at_root) override {
    return mesh_->Gather(mine, 0, at_root, "gather of bytes");
  }

  Status BroadcastBytes(std::vector<uint8_t>* bytes, int root) override {
    return mesh_->Broadcast(bytes, root, "broadcast of bytes");
  }

  Status AddProcessSet(int32_t id, const std::vector<int>& ranks) override {
    // Every rank counts every call, so a set id used again meets under a fresh prefix.
    const std::string prefix = "set" + std::to_string(id) + "." + std::to_string(++set_calls_);
    auto it = std::lower_bound(ranks.begin(), ranks.end(), topo_.rank);
    if (it == ranks.end() || *it != topo_.rank) {
      sets_[id] = nullptr;
      return Status::OK();
    }
    HVD_ASSIGN_OR_RETURN(sets_[id], Connect(prefix, static_cast<int>(it - ranks.begin()),
                                            static_cast<int>(ranks.size())));
    return Status::OK();
  }

  Status RemoveProcessSet(int32_t id) override {
    auto it = sets_.find(id);
    if (it == sets_.end() || id == kGlobalProcessSetId) {
      return Status::Internal("the Gloo backend has no process set " + std::to_string(id));
    }
    sets_.erase(it);
    return Status::OK();
  }

  Status Allreduce(int32_t ps, const void* send, void* recv, int64_t count, DataType dtype,
                   ReduceOp op) override {
    HVD_ASSIGN_OR_RETURN(std::shared_ptr<gloo::Context> ctx, Context(ps));
    const bool in_place = send == nullptr || send == recv;
    if (ctx->size == 1 || count == 0) {
      if (!in_place) std::memcpy(recv, send, static_cast<size_t>(count * DataTypeSize(dtype)));
      return Status::OK();
    }
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kMin:
      case ReduceOp::kMax:
      case ReduceOp::kProduct:
        break;
      default:
        return Status::Internal(std::string("the Gloo backend was asked for reduction ") +
                                ReduceOpName(op) + ", which the caller must lower first");
    }
    const size_t bytes = static_cast<size_t>(count * DataTypeSize(dtype));
    if (static_cast<size_t>(ctx->size - 1) * bytes <= kDirectBytes) {
      // Every rank's block, then block 0 reduced with 1, 2, ... in that order on every rank.
      exchange_.resize(bytes * static_cast<size_t>(ctx->size));
      HVD_RETURN_IF_ERROR(ExchangeBlocks(ctx, in_place ? recv : send, bytes, exchange_.data(),
                                         "allreduce"));
      std::memcpy(recv, exchange_.data(), bytes);
      for (int r = 1; r < ctx->size; ++r) {
        ReduceInto(recv, exchange_.data() + static_cast<size_t>(r) * bytes, count, dtype, op);
      }
      return Status::OK();
    }
    HVD_GLOO_TRY("allreduce", {
      switch (DataTypeSize(dtype)) {
        case 1:
          RunAllreduce<uint8_t>(ctx, send, recv, count, dtype, op, in_place);
          break;
        case 2:
          RunAllreduce<uint16_t>(ctx, send, recv, count, dtype, op, in_place);
          break;
        case 4:
          RunAllreduce<uint32_t>(ctx, send, recv, count, dtype, op, in_place);
          break;
        default:
          RunAllreduce<uint64_t>(ctx, send, recv, count, dtype, op, in_place);
          break;
      }
    });
    return Status::OK();
  }

  Status Broadcast(int32_t ps, void* buffer, int64_t bytes, int root) override {
    HVD_ASSIGN_OR_RETURN(std::shared_ptr<gloo::Context> ctx, Context(ps));
    return BroadcastOn(ctx, buffer, bytes, root, "broadcast");
  }

  Status Barrier(int32_t ps) override {
    HVD_ASSIGN_OR_RETURN(std::shared_ptr<gloo::Context> ctx, Context(ps));
    if (ctx->size == 1) return Status::OK();
    HVD_GLOO_TRY("barrier", {
      gloo::BarrierOptions opts(ctx);
      gloo::barrier(opts);
    });
    return Status::OK();
  }

  Status Allgatherv(int32_t ps, const void* send, int64_t send_count, void* recv,
                    const std::vector<int64_t>& counts, const std::vector<int64_t>& displs,
                    DataType dtype) override {
    HVD_ASSIGN_OR_RETURN(std::shared_ptr<gloo::Context> ctx, Context(ps));
    const size_t elem = static_cast<size_t>(DataTypeSize(dtype));
    const int64_t total = TotalCount(counts);
    if (total == 0) return Status::OK();
    if (static_cast<size_t>(total) * elem <= kDirectBytes) {  // the same choice on every rank
      std::vector<size_t> lens(counts.size()), at(counts.size());
      for (size_t r = 0; r < counts.size(); ++r) {
        lens[r] = static_cast<size_t>(counts[r]) * elem;
        at[r] = static_cast<size_t>(displs[r]) * elem;
      }
      return ExchangeBlocksV(ctx, send, static_cast<char*>(recv), lens, at, "allgather");
    }
    std::vector<char> staging;
    char* out = ReceiveBlocks(static_cast<char*>(recv), counts, displs,
                              static_cast<int64_t>(elem), &staging);
    HVD_GLOO_TRY("allgather", {
      gloo::AllgathervOptions opts(ctx);
      opts.setInput(const_cast<char*>(static_cast<const char*>(send)),
                    static_cast<size_t>(send_count) * elem);
      std::vector<size_t> bytes(counts.size());
      for (size_t r = 0; r < counts.size(); ++r) bytes[r] = static_cast<size_t>(counts[r]) * elem;
      opts.setOutput(out, std::move(bytes));
      gloo::allgatherv(opts);
    });
    if (out != recv) {
      UnpackBlocks(out, static_cast<char*>(recv), counts, displs, static_cast<int64_t>(elem));
    }
    return Status::OK();
  }

  Status Alltoallv(int32_t ps, const void* send, const std::vector<int64_t>& send_counts,
                   const std::vector<int64_t>& send_displs, void* recv,
                   const std::vector<int64_t>& recv_counts, const std::vector<int64_t>& recv_displs,
                   DataType dtype) override {
    HVD_ASSIGN_OR_RETURN(std::shared_ptr<gloo::Context> ctx, Context(ps));
    const int64_t elem = DataTypeSize(dtype);
    // Gloo takes blocks packed in rank order: pack and unpack around it where the layout differs.
    std::vector<char> in_staging, out_staging;
    const char* in = PackBlocks(static_cast<const char*>(send), send_counts, send_displs, elem,
                                &in_staging);
    char* out = ReceiveBlocks(static_cast<char*>(recv), recv_counts, recv_displs, elem,
                              &out_staging);
    std::vector<int64_t> in_bytes(send_counts.size()), out_bytes(recv_counts.size());
    for (size_t r = 0; r < send_counts.size(); ++r) in_bytes[r] = send_counts[r] * elem;
    for (size_t r = 0; r < recv_counts.size(); ++r) out_bytes[r] = recv_counts[r] * elem;
    std::vector<char> dummy(1);  // Gloo wants a buffer even where nothing moves
    HVD_GLOO_TRY("alltoall", {
      gloo::AlltoallvOptions opts(ctx);
      opts.setInput(const_cast<char*>(in != nullptr ? in : dummy.data()), in_bytes);
      opts.setOutput(out != nullptr ? out : dummy.data(), out_bytes);
      gloo::alltoallv(opts);
    });
    if (out != recv) {
      UnpackBlocks(out, static_cast<char*>(recv), recv_counts, recv_displs, elem);
    }
    return Status::OK();
  }

  // An allreduce of the whole buffer, keeping this rank's block: Gloo 0.5 has no
  // reduce-scatter on arbitrary blocks in its options API.
  Status ReduceScatter(int32_t ps, const void* send, void* recv,
                       const std::vector<int64_t>& recv_counts, DataType dtype,
                       ReduceOp op) override {
    HVD_ASSIGN_OR_RETURN(std::shared_ptr<gloo::Context> ctx, Context(ps));
    const int64_t elem = DataTypeSize(dtype);
    int64_t total = 0, offset = 0;
    for (size_t r = 0; r < recv_counts.size(); ++r) {
      if (static_cast<int>(r) == ctx->rank) offset = total;
      total += recv_counts[r];
    }
    reduced_.resize(static_cast<size_t>(std::max<int64_t>(total * elem, 1)));
    HVD_RETURN_IF_ERROR(Allreduce(ps, send, reduced_.data(), total, dtype, op));
    std::memcpy(recv, reduced_.data() + offset * elem,
                static_cast<size_t>(recv_counts[static_cast<size_t>(ctx->rank)] * elem));
    return Status::OK();
  }

 private:
  // Direct exchange (kDirectBytes): rank r's block of lens[r] bytes lands at out + at[r] on
  // every rank; this rank's comes from `mine` (copied, unless it is already in place). One
  // message per pair of ranks, all in flight at once; waits up to the context's timeout and
  // throws as Gloo's collectives do (a peer gone, a timeout). Every rank knows every lens[r].
  static void GlooExchangeBlocksV(const std::shared_ptr<gloo::Context>& ctx, const void* mine,
                              char* out, const std::vector<size_t>& lens,
                              const std::vector<size_t>& at) {
    const int me = ctx->rank;
    const size_t my_len = lens[static_cast<size_t>(me)];
    std::unique_ptr<gloo::transport::UnboundBuffer> in, outbuf;
    size_t extent = 0;
    for (size_t r = 0; r < lens.size(); ++r) extent = std::max(extent, at[r] + lens[r]);
    if (extent > 0) outbuf = ctx->createUnboundBuffer(out, extent);
    if (my_len > 0) in = ctx->createUnboundBuffer(const_cast<void*>(mine), my_len);
    int receiving = 0, sending = 0;
    for (int r = 0; r < ctx->size; ++r) {
      if (r == me || lens[static_cast<size_t>(r)] == 0) continue;
      outbuf->recv(r, kExchangeSlot, at[static_cast<size_t>(r)], lens[static_cast<size_t>(r)]);
      ++receiving;
    }
    if (my_len > 0) {
      for (int step = 1; step < ctx->size; ++step) {  // each rank starts with its right-hand peer
        in->send((me + step) % ctx->size, kExchangeSlot, 0, my_len);
        ++sending;
      }
      if (out + at[static_cast<size_t>(me)] != mine) {
        std::memcpy(out + at[static_cast<size_t>(me)], mine, my_len);
      }
    }
    for (int i = 0; i < receiving; ++i) outbuf->waitRecv();
    for (int i = 0; i < sending; ++i) in->waitSend();
  }

  // The direct exchange on `ctx`: over the control mesh for the global set, else over Gloo.
  Status ExchangeBlocksV(const std::shared_ptr<gloo::Context>& ctx, const void* mine, char* out,
                         const std::vector<size_t>& lens, const std::vector<size_t>& at,
                         const char* what) {
    if (ctx == world_) return mesh_->AllgatherInto(mine, lens, at, out, what);
    HVD_GLOO_TRY(what, GlooExchangeBlocksV(ctx, mine, out, lens, at));
    return Status::OK();
  }

  // Every rank's block of `bytes` in rank order at `out`.
  Status ExchangeBlocks(const std::shared_ptr<gloo::Context>& ctx, const void* mine,
                        size_t bytes, char* out, const char* what) {
    const size_t n = static_cast<size_t>(ctx->size);
    std::vector<size_t> lens(n, bytes), at(n);
    for (size_t r = 0; r < n; ++r) at[r] = r * bytes;
    return ExchangeBlocksV(ctx, mine, out, lens, at, what);
  }

  template <typename T>
  static void RunAllreduce(const std::shared_ptr<gloo::Context>& ctx, const void* send,
                           void* recv, int64_t count, DataType dtype, ReduceOp op, bool in_place) {
    gloo::AllreduceOptions opts(ctx);
    if (!in_place) opts.setInput(const_cast<T*>(static_cast<const T*>(send)), count);
    opts.setOutput(static_cast<T*>(recv), static_cast<size_t>(count));
    opts.setReduceFunction([dtype, op](void* c, const void* a, const void* b, size_t n) {
      ReduceFn<T>(c, a, b, n, dtype, op);
    });
    gloo::allreduce(opts);
  }

  Result<std::shared_ptr<gloo::Context>> Connect(const std::string& name, int rank, int size) {
    auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
    ctx->setTimeout(timeout_);
    HVD_GLOO_TRY("rendezvous of '" + name + "' (rank " + std::to_string(rank) + " of " +
                     std::to_string(size) + ", store " + client_->Where() + ")",
                 {
                   gloo::rendezvous::PrefixStore prefixed(scope_ + "/" + name, *store_);
                   ctx->connectFullMesh(prefixed, device_);
                 });
    return std::shared_ptr<gloo::Context>(std::move(ctx));
  }

  Result<std::shared_ptr<gloo::Context>> Context(int32_t ps) const {
    auto it = sets_.find(ps);
    if (it == sets_.end() || it->second == nullptr) {
      return Status::Internal("this rank has no Gloo context for process set " +
                              std::to_string(ps));
    }
    return it->second;
  }

  static Status BroadcastOn(const std::shared_ptr<gloo::Context>& ctx, void* buffer,
                            int64_t bytes, int root, const char* what) {
    if (ctx->size == 1 || bytes == 0) return Status::OK();
    HVD_GLOO_TRY(what, {
      gloo::BroadcastOptions opts(ctx);
      opts.setOutput(static_cast<char*>(buffer), static_cast<size_t>(bytes));
      opts.setRoot(root);
      gloo::broadcast(opts);
    });
    return Status::OK();
  }

  // Local rank: among the ranks of the same HOROVOD_HOSTNAME; cross rank: among the ranks of
  // the same local rank (as the MPI backend's communicators define them).
  Status WorkOutHosts() {
    std::vector<uint8_t> mine(host_.begin(), host_.end());
    std::vector<std::vector<uint8_t>> hosts;
    HVD_RETURN_IF_ERROR(mesh_->AllgatherV(mine, &hosts, "exchange of host names"));
    std::vector<int> local_rank(hosts.size());
    topo_.local_rank = topo_.local_size = 0;
    for (size_t r = 0; r < hosts.size(); ++r) {
      int before = 0;
      for (size_t q = 0; q < r; ++q) before += hosts[q] == hosts[r] ? 1 : 0;
      local_rank[r] = before;
      if (hosts[r] == mine) ++topo_.local_size;
    }
    topo_.local_rank = local_rank[static_cast<size_t>(topo_.rank)];
    topo_.cross_rank = topo_.cross_size = 0;
    for (size_t r = 0; r < hosts.size(); ++r) {
      if (local_rank[r] != topo_.local_rank) continue;
      if (static_cast<int>(r) < topo_.rank) ++topo_.cross_rank;
      ++topo_.cross_size;
    }
    return Status::OK();
  }

  // The control mesh over the global set's ranks (ops/tcp_mesh.h), at the address Gloo's
  // device listens on; the rendezvous under this Init's scope.
  Status ConnectMesh(const gloo::transport::tcp::attr& resolved) {
    const std::string prefix = scope_ + "/mesh/";
    auto set = [this, &prefix](const std::string& key, const std::vector<char>& value) {
      return client_->Set(prefix + key, value);
    };
    auto get = [this, &prefix](const std::string& key) {
      return client_->Get(prefix + key, timeout_);
    };
    HVD_ASSIGN_OR_RETURN(mesh_, TcpMesh::Connect(resolved.ai_addr,
                                                 static_cast<socklen_t>(resolved.ai_addrlen),
                                                 topo_.rank, topo_.size, timeout_, set, get));
    return Status::OK();
  }

  Topology topo_;
  std::chrono::milliseconds timeout_{30000};
  std::string scope_;
  std::string host_;
  std::unique_ptr<RendezvousClient> client_;
  std::unique_ptr<Store> store_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::Context> world_;
  std::unique_ptr<TcpMesh> mesh_;
  std::map<int32_t, std::shared_ptr<gloo::Context>> sets_;  // null: not a member
  int64_t set_calls_ = 0;
  std::vector<char> reduced_;   // ReduceScatter's whole reduced buffer
  std::vector<char> exchange_;  // a direct allreduce's blocks, every rank's
};

}  // namespace

std::unique_ptr<Backend> CreateGlooBackend() { return std::make_unique<GlooBackend>(); }

}  // namespace ops
}  // namespace hvd
