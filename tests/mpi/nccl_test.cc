// horovod_cpp — Apache-2.0
// CUDA tensors through the NCCL backend, under mpirun, one GPU per rank (device = local rank
// modulo the GPUs present). Built only with HVD_WITH_NCCL. On a machine without a usable GPU
// the GPU tests skip, naming the reason (cudaGetDeviceCount's error), and two tests that need
// no GPU run instead: a CPU/GPU mix across ranks, and CUDA operations failing cleanly.

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/horovod.h"
#include "tests/mpi/test_util.h"

namespace hvd {
namespace {

using namespace test;  // NOLINT

// GPUs this process can use, and why none when there are none.
int Gpus(std::string* why) {
  int n = 0;
  const cudaError_t rc = cudaGetDeviceCount(&n);
  if (rc != cudaSuccess) {
    *why = std::string("cudaGetDeviceCount failed: ") + cudaGetErrorString(rc) + " (error " +
           std::to_string(static_cast<int>(rc)) + ")";
    return 0;
  }
  if (n == 0) *why = "cudaGetDeviceCount found no GPU";
  return n;
}

// NCCL needs a GPU of its own for every rank of a host.
#define REQUIRE_GPU()                                                                  \
  std::string no_gpu;                                                                  \
  const int gpus = Gpus(&no_gpu);                                                      \
  if (gpus == 0) GTEST_SKIP() << "no GPU: " << no_gpu;                                 \
  if (gpus < *LocalSize()) {                                                           \
    GTEST_SKIP() << "needs one GPU per rank: " << gpus << " GPUs for " << *LocalSize() \
                 << " ranks on this host";                                             \
  }                                                                                    \
  const int dev = *LocalRank();                                                        \
  ASSERT_EQ(cudaSetDevice(dev), cudaSuccess)

// A device copy of `host` (freed with the pointer).
template <typename T>
std::shared_ptr<T> Upload(const std::vector<T>& host) {
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(1, host.size() * sizeof(T))), cudaSuccess);
  if (!host.empty()) {
    EXPECT_EQ(cudaMemcpy(p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  return std::shared_ptr<T>(static_cast<T*>(p), [](T* q) { cudaFree(q); });
}

template <typename T>
std::vector<T> Download(const void* device, size_t n) {
  std::vector<T> host(n);
  if (n > 0) {
    EXPECT_EQ(cudaMemcpy(host.data(), device, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  }
  return host;
}

template <typename T>
TensorView DeviceView(T* p, TensorShape shape, int dev, cudaStream_t stream = nullptr) {
  TensorView v{p, DataTypeOf<T>(), std::move(shape), dev};
  v.stream = stream;
  return v;
}

// Waits for `handle`, makes `stream` wait for every output's event, then synchronizes it.
std::vector<Output> Finish(Handle handle, cudaStream_t stream) {
  Result<std::vector<Output>> outs = WaitOutputs(handle);
  EXPECT_TRUE(outs.ok()) << outs.status().ToString();
  if (!outs.ok()) return {};
  for (const Output& o : *outs) {
    EXPECT_NE(o.ready_event, nullptr);
    EXPECT_TRUE(StreamWaitEvent(o, stream).ok());
  }
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  return std::move(*outs);
}

// ---- no GPU needed -----------------------------------------------------------------------

TEST(Nccl, CpuOnOneRankGpuOnAnotherFailsOnEveryRankAndTheJobGoesOn) {
  if (N() < 2) GTEST_SKIP() << "needs 2 ranks";
  std::vector<float> x(4, 1.0f);
  TensorView v = View(x.data(), {4});
  if (R() == 0) v.device = 0;  // never touched: negotiation fails first
  const Status s = Allreduce(v, v, "nccl.mixed", {ReduceOp::kSum});
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("allreduce 'nccl.mixed': mismatched devices (CPU vs GPU): rank 0 "
                             "sent GPU;"),
            std::string::npos)
      << s.message();
  std::vector<float> y(3, 1.0f);
  ASSERT_TRUE(
      Allreduce(View(y.data(), {3}), View(y.data(), {3}), "nccl.after.mixed", {ReduceOp::kSum})
          .ok());
  EXPECT_EQ(y[0], static_cast<float>(N()));
}

TEST(Nccl, WithoutAGpuCudaOperationsFailCleanlyOnEveryRank) {
  std::string why;
  if (Gpus(&why) > 0) GTEST_SKIP() << "a GPU is present: the GPU tests below cover it";
  std::vector<float> x(4, 1.0f);
  TensorView v = View(x.data(), {4});
  v.device = 0;
  const Status s = Allreduce(v, v, "nccl.nogpu", {ReduceOp::kSum});
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("cannot use GPU:0"), std::string::npos) << s.message();
  EXPECT_EQ(x[0], 1.0f);
  std::vector<double> y(2, R() + 1.0);
  ASSERT_TRUE(
      Allreduce(View(y.data(), {2}), View(y.data(), {2}), "nccl.after.nogpu", {ReduceOp::kSum})
          .ok());
  EXPECT_EQ(y[1], N() * (N() + 1) / 2.0);
}

// ---- GPU tests (suite NcclGpu: skip without a GPU; ctest reports them as skipped) --------

template <typename T>
void AllreduceOne(int dev, ReduceOp op, const std::string& name) {
  const int n = 1000;
  std::vector<T> host(n);
  for (int i = 0; i < n; ++i) host[i] = static_cast<T>((R() + 1) * (i % 5 + 1));
  auto buf = Upload(host);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  auto h = EnqueueAllreduce(DeviceView(buf.get(), {n}, dev, stream),
                            DeviceView(buf.get(), {n}, dev, stream), name, {op});
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  Finish(*h, stream);
  const std::vector<T> got = Download<T>(buf.get(), n);
  for (int i = 0; i < n; ++i) {
    double want = 0;
    for (int r = 0; r < N(); ++r) {
      const double v = (r + 1) * (i % 5 + 1);
      want = op == ReduceOp::kMin   ? (r == 0 ? v : std::min(want, v))
             : op == ReduceOp::kMax ? std::max(want, v)
                                    : want + v;
    }
    if (op == ReduceOp::kAverage) want /= N();
    ASSERT_NEAR(static_cast<double>(got[i]), want, 1e-6 * std::abs(want)) << name << " at " << i;
  }
  cudaStreamDestroy(stream);
}

TEST(NcclGpu, AllreduceEveryOpAndDtype) {
  REQUIRE_GPU();
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax}) {
    const std::string o = std::to_string(static_cast<int>(op));
    AllreduceOne<float>(dev, op, "nccl.f32." + o);
    AllreduceOne<double>(dev, op, "nccl.f64." + o);
    AllreduceOne<int32_t>(dev, op, "nccl.i32." + o);
    AllreduceOne<int64_t>(dev, op, "nccl.i64." + o);
    AllreduceOne<uint8_t>(dev, op, "nccl.u8." + o);
  }
  AllreduceOne<float>(dev, ReduceOp::kAverage, "nccl.f32.avg");
  AllreduceOne<double>(dev, ReduceOp::kAverage, "nccl.f64.avg");
}

TEST(NcclGpu, FusedAllreduceWithScalingCompletesThroughEvents) {
  REQUIRE_GPU();
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  std::vector<std::shared_ptr<float>> bufs;
  std::vector<Handle> handles;
  for (int t = 0; t < 12; ++t) {
    bufs.push_back(Upload(std::vector<float>(100 + t, static_cast<float>(R() + t))));
    auto h = EnqueueAllreduce(DeviceView(bufs.back().get(), {100 + t}, dev, stream),
                              DeviceView(bufs.back().get(), {100 + t}, dev, stream),
                              "nccl.fused." + std::to_string(t), {ReduceOp::kAverage, 0.5, 3.0});
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    handles.push_back(*h);
  }
  for (Handle h : handles) Finish(h, stream);
  for (int t = 0; t < 12; ++t) {
    double sum = 0;
    for (int r = 0; r < N(); ++r) sum += r + t;
    const float want = static_cast<float>(sum / N() * 0.5 * 3.0);
    for (float v : Download<float>(bufs[t].get(), 100 + t)) ASSERT_NEAR(v, want, 1e-4);
  }
  cudaStreamDestroy(stream);
}

TEST(NcclGpu, BroadcastAllgatherAlltoallReducescatter) {
  REQUIRE_GPU();
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  const int n = N(), me = R();
  // Broadcast from every root.
  for (int root = 0; root < n; ++root) {
    auto b = Upload(std::vector<int64_t>(7, me * 10 + 1));
    auto h = EnqueueBroadcast(DeviceView(b.get(), {7}, dev, stream),
                              DeviceView(b.get(), {7}, dev, stream), root,
                              "nccl.bcast." + std::to_string(root));
    ASSERT_TRUE(h.ok());
    Finish(*h, stream);
    for (int64_t v : Download<int64_t>(b.get(), 7)) EXPECT_EQ(v, root * 10 + 1);
  }
  // Allgather: rank r contributes r + 1 rows of 3.
  {
    std::vector<float> mine(static_cast<size_t>((me + 1) * 3), static_cast<float>(me));
    auto in = Upload(mine);
    auto h = EnqueueAllgather(DeviceView(in.get(), {me + 1, 3}, dev, stream), "nccl.gather");
    ASSERT_TRUE(h.ok());
    std::vector<Output> out = Finish(*h, stream);
    ASSERT_EQ(out.size(), 1u);
    EXPECT_EQ(out[0].shape, (TensorShape{n * (n + 1) / 2, 3}));
    const std::vector<float> got = Download<float>(out[0].data.get(), NumElements(out[0].shape));
    size_t at = 0;
    for (int r = 0; r < n; ++r) {
      for (int k = 0; k < (r + 1) * 3; ++k) EXPECT_EQ(got[at++], static_cast<float>(r));
    }
  }
  // Alltoall: rank r sends d + 1 rows (value 100 r + d) to rank d.
  {
    std::vector<int32_t> send;
    std::vector<int64_t> splits;
    for (int d = 0; d < n; ++d) {
      splits.push_back(d + 1);
      for (int k = 0; k < d + 1; ++k) send.push_back(100 * me + d);
    }
    auto in = Upload(send);
    auto h = EnqueueAlltoall(DeviceView(in.get(), {static_cast<int64_t>(send.size())}, dev, stream),
                             splits, "nccl.alltoall");
    ASSERT_TRUE(h.ok());
    std::vector<Output> out = Finish(*h, stream);
    ASSERT_EQ(out.size(), 1u);
    EXPECT_EQ(out[0].shape, (TensorShape{n * (me + 1)}));
    const std::vector<int32_t> got = Download<int32_t>(out[0].data.get(), n * (me + 1));
    for (int r = 0; r < n; ++r) {
      for (int k = 0; k < me + 1; ++k) EXPECT_EQ(got[r * (me + 1) + k], 100 * r + me);
    }
  }
  // Reducescatter of 2n + 1 rows: the first rank gets one more.
  {
    const int64_t rows = 2 * n + 1;
    auto in = Upload(std::vector<double>(static_cast<size_t>(rows * 2), me + 1.0));
    const TensorShape out_shape = *ReducescatterShape({rows, 2});
    auto out = Upload(std::vector<double>(static_cast<size_t>(NumElements(out_shape)), -1.0));
    auto h = EnqueueReducescatter(DeviceView(in.get(), {rows, 2}, dev, stream),
                                  DeviceView(out.get(), out_shape, dev, stream), "nccl.rs",
                                  {ReduceOp::kSum});
    ASSERT_TRUE(h.ok());
    Finish(*h, stream);
    EXPECT_EQ(out_shape[0], me == 0 ? 3 : 2);
    for (double v : Download<double>(out.get(), NumElements(out_shape))) {
      EXPECT_EQ(v, n * (n + 1) / 2.0);
    }
  }
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace hvd
