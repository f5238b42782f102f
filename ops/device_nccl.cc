// horovod_cpp — Apache-2.0
// The NCCL device backend (ops/device.h). Compiled only with HVD_WITH_NCCL; it is compiled and
// linked on every such build, and exercised by the GPU tests wherever a GPU exists.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstring>
#include <map>
#include <string>
#include <utility>

#include "ops/backend.h"
#include "ops/device.h"
#include "ops/half.h"

namespace hvd {
namespace ops {
namespace {

#define HVD_CUDA_CHECK(expr)                                                            \
  do {                                                                                  \
    const cudaError_t hvd_cuda_err = (expr);                                            \
    if (hvd_cuda_err != cudaSuccess) {                                                  \
      return Status::Unavailable(std::string("CUDA error in " #expr ": ") +             \
                                 cudaGetErrorString(hvd_cuda_err) + " (error " +        \
                                 std::to_string(static_cast<int>(hvd_cuda_err)) + ")" + \
                                 HVD_WHERE());                                          \
    }                                                                                   \
  } while (0)

#define HVD_NCCL_CHECK(expr)                                                \
  do {                                                                      \
    const ncclResult_t hvd_nccl_err = (expr);                               \
    if (hvd_nccl_err != ncclSuccess) {                                      \
      return Status::Unavailable(std::string("NCCL error in " #expr ": ") + \
                                 ncclGetErrorString(hvd_nccl_err) + HVD_WHERE()); \
    }                                                                       \
  } while (0)

Result<ncclDataType_t> NcclType(DataType dtype) {
  switch (dtype) {
    case DataType::kUInt8:
      return ncclUint8;
    case DataType::kInt8:
      return ncclInt8;
    case DataType::kInt32:
      return ncclInt32;
    case DataType::kInt64:
      return ncclInt64;
    case DataType::kFloat16:
      return ncclFloat16;
    case DataType::kBFloat16:
      return ncclBfloat16;
    case DataType::kFloat32:
      return ncclFloat32;
    case DataType::kFloat64:
      return ncclFloat64;
    default:
      return Status::InvalidArgument(std::string("dtype ") + DataTypeName(dtype) +
                                     " is not supported on CUDA tensors (NCCL supports uint8, "
                                     "int8, int32, int64, float16, bfloat16, float32, float64)");
  }
}

bool IsFloat(DataType t) {
  return t == DataType::kFloat16 || t == DataType::kBFloat16 || t == DataType::kFloat32 ||
         t == DataType::kFloat64;
}

// A scalar of `dtype` holding `v`, as NCCL's PreMulSum wants it.
void ScalarOf(DataType dtype, double v, uint8_t out[8]) {
  std::memset(out, 0, 8);
  if (dtype == DataType::kFloat64) {
    std::memcpy(out, &v, sizeof v);
  } else if (dtype == DataType::kFloat32) {
    const float f = static_cast<float>(v);
    std::memcpy(out, &f, sizeof f);
  } else {
    const uint16_t h = dtype == DataType::kFloat16 ? FloatToHalf(static_cast<float>(v))
                                                   : FloatToBFloat16(static_cast<float>(v));
    std::memcpy(out, &h, sizeof h);
  }
}

void DestroyEvent(void* e) {
  if (e) cudaEventDestroy(static_cast<cudaEvent_t>(e));
}

class NcclCollectives : public DeviceCollectives {
 public:
  explicit NcclCollectives(Backend* host) : host_(host) {}

  ~NcclCollectives() override {
    for (auto& [key, comm] : comms_) ncclCommDestroy(comm);
    for (auto& [device, d] : devices_) {
      cudaSetDevice(device);
      if (d.fusion) cudaFree(d.fusion);
      if (d.ready) cudaEventDestroy(d.ready);
      if (d.stream) cudaStreamDestroy(d.stream);
    }
  }

  const char* name() const override { return "NCCL"; }

  const char* ActivityName(OpType type) const override {
    switch (type) {
      case OpType::kAllreduce:
        return "NCCL_ALLREDUCE";
      case OpType::kBroadcast:
        return "NCCL_BCAST";
      case OpType::kAllgather:
        return "NCCL_ALLGATHER";
      case OpType::kAlltoall:
        return "NCCL_ALLTOALL";
      case OpType::kReducescatter:
        return "NCCL_REDUCESCATTER";
      default:
        return "NCCL_COLLECTIVE";
    }
  }

  Result<std::shared_ptr<void>> Allocate(int device, int64_t bytes) override {
    HVD_CUDA_CHECK(cudaSetDevice(device));
    void* p = nullptr;
    HVD_CUDA_CHECK(cudaMalloc(&p, static_cast<size_t>(std::max<int64_t>(bytes, 1))));
    return std::shared_ptr<void>(p, [device](void* q) {
      cudaSetDevice(device);
      cudaFree(q);
    });
  }

  Result<Event> Allreduce(int32_t ps, int set_size, int set_rank, int device, void* stream,
                          const std::vector<DeviceTensor>& tensors, DataType dtype, ReduceOp op,
                          double scale) override {
    HVD_ASSIGN_OR_RETURN(Prepared p, Prepare(ps, set_size, set_rank, device, stream));
    HVD_ASSIGN_OR_RETURN(ncclDataType_t type, NcclType(dtype));
    HVD_ASSIGN_OR_RETURN(OwnedOp red, RedOp(op, scale, dtype, p.comm));
    const int64_t elem = DataTypeSize(dtype);
    if (tensors.size() == 1) {
      const DeviceTensor& t = tensors[0];
      HVD_RETURN_IF_ERROR(NcclStatus(ncclAllReduce(t.input, t.output, static_cast<size_t>(t.count),
                                                   type, red.get(), p.comm, p.stream),
                                     "ncclAllReduce"));
      return Done(p.stream);
    }
    int64_t total = 0;
    for (const DeviceTensor& t : tensors) total += t.count;
    HVD_ASSIGN_OR_RETURN(uint8_t * buf, Fusion(device, total * elem));
    int64_t at = 0;
    for (const DeviceTensor& t : tensors) {
      HVD_RETURN_IF_ERROR(CopyAsync(buf + at, t.input, t.count * elem, p.stream));
      at += t.count * elem;
    }
    HVD_RETURN_IF_ERROR(NcclStatus(
        ncclAllReduce(buf, buf, static_cast<size_t>(total), type, red.get(), p.comm, p.stream),
        "ncclAllReduce"));
    at = 0;
    for (const DeviceTensor& t : tensors) {
      HVD_RETURN_IF_ERROR(CopyAsync(t.output, buf + at, t.count * elem, p.stream));
      at += t.count * elem;
    }
    return Done(p.stream);
  }

  Result<Event> Broadcast(int32_t ps, int set_size, int set_rank, int device, void* stream,
                          const void* input, void* output, int64_t bytes, int root) override {
    HVD_ASSIGN_OR_RETURN(Prepared p, Prepare(ps, set_size, set_rank, device, stream));
    HVD_NCCL_CHECK(ncclBroadcast(input, output, static_cast<size_t>(bytes), ncclUint8, root, p.comm,
                                 p.stream));
    return Done(p.stream);
  }

  // Ranks contribute different counts, which ncclAllGather cannot: one broadcast per rank,
  // grouped so that NCCL runs them together.
  Result<Event> Allgatherv(int32_t ps, int set_size, int set_rank, int device, void* stream,
                           const void* send, void* recv, const std::vector<int64_t>& counts,
                           const std::vector<int64_t>& displs, DataType dtype) override {
    HVD_ASSIGN_OR_RETURN(Prepared p, Prepare(ps, set_size, set_rank, device, stream));
    HVD_ASSIGN_OR_RETURN(ncclDataType_t type, NcclType(dtype));
    const int64_t elem = DataTypeSize(dtype);
    auto* out = static_cast<uint8_t*>(recv);
    HVD_RETURN_IF_ERROR(Grouped([&]() -> Status {
      for (int r = 0; r < set_size; ++r) {
        const size_t n = static_cast<size_t>(counts[static_cast<size_t>(r)]);
        if (n == 0) continue;
        HVD_RETURN_IF_ERROR(NcclStatus(ncclBroadcast(r == set_rank ? send : nullptr,
                                                     out + displs[static_cast<size_t>(r)] * elem, n,
                                                     type, r, p.comm, p.stream),
                                       "ncclBroadcast"));
      }
      return Status::OK();
    }));
    return Done(p.stream);
  }

  Result<Event> Alltoallv(int32_t ps, int set_size, int set_rank, int device, void* stream,
                          const void* send, const std::vector<int64_t>& send_counts,
                          const std::vector<int64_t>& send_displs, void* recv,
                          const std::vector<int64_t>& recv_counts,
                          const std::vector<int64_t>& recv_displs, DataType dtype) override {
    HVD_ASSIGN_OR_RETURN(Prepared p, Prepare(ps, set_size, set_rank, device, stream));
    HVD_ASSIGN_OR_RETURN(ncclDataType_t type, NcclType(dtype));
    const int64_t elem = DataTypeSize(dtype);
    const auto* in = static_cast<const uint8_t*>(send);
    auto* out = static_cast<uint8_t*>(recv);
    HVD_RETURN_IF_ERROR(Grouped([&]() -> Status {
      for (int r = 0; r < set_size; ++r) {
        const size_t i = static_cast<size_t>(r);
        if (send_counts[i] > 0) {
          HVD_RETURN_IF_ERROR(
              NcclStatus(ncclSend(in + send_displs[i] * elem, static_cast<size_t>(send_counts[i]),
                                  type, r, p.comm, p.stream),
                         "ncclSend"));
        }
        if (recv_counts[i] > 0) {
          HVD_RETURN_IF_ERROR(
              NcclStatus(ncclRecv(out + recv_displs[i] * elem, static_cast<size_t>(recv_counts[i]),
                                  type, r, p.comm, p.stream),
                         "ncclRecv"));
        }
      }
      return Status::OK();
    }));
    return Done(p.stream);
  }

  // Uneven parts (the first dim0 % size ranks get a row more), which ncclReduceScatter cannot:
  // one reduce per rank to that rank, grouped.
  Result<Event> ReduceScatter(int32_t ps, int set_size, int set_rank, int device, void* stream,
                              const void* send, void* recv, const std::vector<int64_t>& recv_counts,
                              DataType dtype, ReduceOp op, double scale) override {
    HVD_ASSIGN_OR_RETURN(Prepared p, Prepare(ps, set_size, set_rank, device, stream));
    HVD_ASSIGN_OR_RETURN(ncclDataType_t type, NcclType(dtype));
    HVD_ASSIGN_OR_RETURN(OwnedOp red, RedOp(op, scale, dtype, p.comm));
    const int64_t elem = DataTypeSize(dtype);
    const auto* in = static_cast<const uint8_t*>(send);
    HVD_RETURN_IF_ERROR(Grouped([&]() -> Status {
      int64_t offset = 0;
      for (int r = 0; r < set_size; ++r) {
        const int64_t n = recv_counts[static_cast<size_t>(r)];
        if (n > 0) {
          HVD_RETURN_IF_ERROR(
              NcclStatus(ncclReduce(in + offset * elem, r == set_rank ? recv : nullptr,
                                    static_cast<size_t>(n), type, red.get(), r, p.comm, p.stream),
                         "ncclReduce"));
        }
        offset += n;
      }
      return Status::OK();
    }));
    return Done(p.stream);
  }

  void RemoveProcessSet(int32_t ps) override {
    for (auto it = comms_.begin(); it != comms_.end();) {
      if (it->first.first == ps) {
        ncclCommDestroy(it->second);
        it = comms_.erase(it);
      } else {
        ++it;
      }
    }
  }

 private:
  struct PerDevice {
    cudaStream_t stream = nullptr;
    cudaEvent_t ready = nullptr;  // recorded on the caller's stream
    uint8_t* fusion = nullptr;
    int64_t fusion_bytes = 0;
  };
  struct Prepared {
    ncclComm_t comm;
    cudaStream_t stream;
  };
  // A reduction op; a custom one (PreMulSum) is destroyed with this object, on every path.
  class OwnedOp {
   public:
    explicit OwnedOp(ncclRedOp_t op, ncclComm_t custom_comm = nullptr)
        : op_(op), comm_(custom_comm) {}
    OwnedOp(OwnedOp&& o) noexcept : op_(o.op_), comm_(std::exchange(o.comm_, nullptr)) {}
    OwnedOp(const OwnedOp&) = delete;
    OwnedOp& operator=(const OwnedOp&) = delete;
    OwnedOp& operator=(OwnedOp&&) = delete;
    ~OwnedOp() {
      if (comm_ != nullptr) ncclRedOpDestroy(op_, comm_);
    }
    ncclRedOp_t get() const { return op_; }

   private:
    ncclRedOp_t op_;
    ncclComm_t comm_;  // set only for a custom op
  };

  static Status NcclStatus(ncclResult_t rc, const char* call) {
    if (rc == ncclSuccess) return Status::OK();
    return Status::Unavailable(std::string("NCCL error in ") + call + ": " +
                               ncclGetErrorString(rc));
  }

  // Runs `calls` between ncclGroupStart and ncclGroupEnd; the group is ended even when one of
  // the calls fails, and the first error wins.
  template <typename Calls>
  static Status Grouped(Calls calls) {
    HVD_NCCL_CHECK(ncclGroupStart());
    const Status status = calls();
    const Status ended = NcclStatus(ncclGroupEnd(), "ncclGroupEnd");
    HVD_RETURN_IF_ERROR(status);
    return ended;
  }

  static Status CopyAsync(void* dst, const void* src, int64_t bytes, cudaStream_t stream) {
    HVD_CUDA_CHECK(
        cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice, stream));
    return Status::OK();
  }

  // The device's stream (created once), made to wait for the caller's stream, and the set's
  // communicator on that device (created on first use).
  Result<Prepared> Prepare(int32_t ps, int set_size, int set_rank, int device, void* stream) {
    // Every rank fails here alike when there is no usable GPU, before any communication, so
    // this error leaves the job running (CPU operations go on); later CUDA and NCCL errors
    // are Unavailable, which ends the background loop.
    const cudaError_t usable = cudaSetDevice(device);
    if (usable != cudaSuccess) {
      return Status::FailedPrecondition("cannot use " + DeviceToString(device) + ": " +
                                        cudaGetErrorString(usable) + " (CUDA error " +
                                        std::to_string(static_cast<int>(usable)) + ")");
    }
    PerDevice& d = devices_[device];
    if (d.stream == nullptr) {
      HVD_CUDA_CHECK(cudaStreamCreateWithFlags(&d.stream, cudaStreamNonBlocking));
      HVD_CUDA_CHECK(cudaEventCreateWithFlags(&d.ready, cudaEventDisableTiming));
    }
    HVD_CUDA_CHECK(cudaEventRecord(d.ready, static_cast<cudaStream_t>(stream)));
    HVD_CUDA_CHECK(cudaStreamWaitEvent(d.stream, d.ready, 0));
    auto key = std::make_pair(ps, device);
    auto it = comms_.find(key);
    if (it == comms_.end()) {
      // Set rank 0 makes the id; every member receives it over the host backend (MPI).
      ncclUniqueId id;
      std::memset(&id, 0, sizeof id);
      if (set_rank == 0) HVD_NCCL_CHECK(ncclGetUniqueId(&id));
      HVD_RETURN_IF_ERROR(host_->Broadcast(ps, &id, sizeof id, 0));
      ncclComm_t comm;
      HVD_NCCL_CHECK(ncclCommInitRank(&comm, set_size, id, set_rank));
      it = comms_.emplace(key, comm).first;
    }
    return Prepared{it->second, d.stream};
  }

  Result<uint8_t*> Fusion(int device, int64_t bytes) {
    PerDevice& d = devices_[device];
    if (bytes > d.fusion_bytes) {  // grows to the largest fused size, then stays
      if (d.fusion) HVD_CUDA_CHECK(cudaFree(d.fusion));
      d.fusion = nullptr;
      d.fusion_bytes = 0;
      void* p = nullptr;
      HVD_CUDA_CHECK(cudaMalloc(&p, static_cast<size_t>(bytes)));
      d.fusion = static_cast<uint8_t*>(p);
      d.fusion_bytes = bytes;
    }
    return d.fusion;
  }

  // Sum/Average with a scale: NCCL's pre-multiplied sum (linear, so scaling before the sum is
  // scaling after it). Average without a scale: ncclAvg.
  static Result<OwnedOp> RedOp(ReduceOp op, double scale, DataType dtype, ncclComm_t comm) {
    const bool linear = op == ReduceOp::kSum || op == ReduceOp::kAverage;
    if (scale != 1.0 && (!linear || !IsFloat(dtype))) {
      return Status::InvalidArgument(
          "on CUDA tensors, prescale/postscale factors need Sum or Average of a floating-point "
          "dtype");
    }
    if (scale != 1.0) {
      uint8_t scalar[8];
      ScalarOf(dtype, scale, scalar);
      HVD_ASSIGN_OR_RETURN(ncclDataType_t type, NcclType(dtype));
      ncclRedOp_t custom;
      HVD_NCCL_CHECK(
          ncclRedOpCreatePreMulSum(&custom, scalar, type, ncclScalarHostImmediate, comm));
      return OwnedOp(custom, comm);
    }
    switch (op) {
      case ReduceOp::kSum:
        return OwnedOp(ncclSum);
      case ReduceOp::kAverage:
        return OwnedOp(ncclAvg);
      case ReduceOp::kMin:
        return OwnedOp(ncclMin);
      case ReduceOp::kMax:
        return OwnedOp(ncclMax);
      case ReduceOp::kProduct:
        return OwnedOp(ncclProd);
      default:
        return Status::InvalidArgument("reduction not supported on CUDA tensors");
    }
  }

  // An event after everything enqueued so far on `stream`.
  static Result<Event> Done(cudaStream_t stream) {
    cudaEvent_t e = nullptr;
    HVD_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    Event owned(e, DestroyEvent);
    HVD_CUDA_CHECK(cudaEventRecord(e, stream));
    return owned;
  }

  Backend* host_;
  std::map<int, PerDevice> devices_;
  std::map<std::pair<int32_t, int>, ncclComm_t> comms_;
};

}  // namespace

std::unique_ptr<DeviceCollectives> CreateNcclCollectives(Backend* host) {
  return std::make_unique<NcclCollectives>(host);
}

Status StreamWaitEvent(const Event& event, void* stream) {
  if (!event) return Status::OK();
  HVD_CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream),
                                     static_cast<cudaEvent_t>(event.get()), 0));
  return Status::OK();
}

}  // namespace ops
}  // namespace hvd
