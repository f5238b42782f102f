// horovod_cpp — Apache-2.0
// CUDA tensors through horovod_cpp's NCCL path against raw NCCL calls on the same device
// buffers, measured in the same run (interleaved; rank 0's times; every repetition starts with
// an MPI_Barrier and ends when the caller's stream has the result). One GPU per rank.
//
//   D1  allreduce of one 4/16/64 MiB float32 tensor vs ncclAllReduce            >= 0.95
//   D2  allgather, 16 MiB per rank, vs ncclAllGather                           >= 0.95
//   D3  broadcast of 16 MiB vs ncclBroadcast                                   >= 0.95
//   D4  a lone 4-byte allreduce, enqueue to the result on the caller's stream  (reported)
//
// Every result is checked against the exact value; a wrong answer exits 1. Without a usable
// GPU it says so and exits 0.
//
//   mpirun -np <GPUs> build/examples/bench/nccl_bench [--reps 30] [--latency-reps 500]

#include <cuda_runtime_api.h>
#include <mpi.h>
#include <nccl.h>

#include <cstdio>
#include <functional>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "common/horovod.h"
#include "examples/bench/bench_util.h"

namespace {

int g_rank = 0, g_size = 1;

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "nccl_bench: rank %d: %s\n", g_rank, what.c_str());
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::exit(1);
}
void Cuda(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) Fail(std::string(what) + ": " + cudaGetErrorString(rc));
}
void Nccl(ncclResult_t rc, const char* what) {
  if (rc != ncclSuccess) Fail(std::string(what) + ": " + ncclGetErrorString(rc));
}
void Ok(const hvd::Status& s, const char* what) {
  if (!s.ok()) Fail(std::string(what) + ": " + s.ToString());
}

// Rank r contributes (r + 1) * (i % 13 + 1): sums are exact in float32.
float* UploadPattern(int64_t n) {
  std::vector<float> host(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) host[i] = static_cast<float>((g_rank + 1) * (i % 13 + 1));
  void* p = nullptr;
  Cuda(cudaMalloc(&p, static_cast<size_t>(n) * sizeof(float)), "cudaMalloc");
  Cuda(cudaMemcpy(p, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice), "upload");
  return static_cast<float*>(p);
}

// Checks every element of `device` (n floats) against want(i).
template <typename Want>
void Check(const void* device, int64_t n, const char* what, Want want) {
  std::vector<float> host(static_cast<size_t>(n));
  Cuda(cudaMemcpy(host.data(), device, host.size() * sizeof(float), cudaMemcpyDeviceToHost),
       "download");
  for (int64_t i = 0; i < n; ++i) {
    if (host[i] != want(i)) {
      Fail(std::string(what) + ": element " + std::to_string(i) + " is " +
           std::to_string(host[i]) + ", expected " + std::to_string(want(i)));
    }
  }
}

hvd::TensorView View(float* p, hvd::TensorShape shape, int dev, cudaStream_t stream) {
  hvd::TensorView v{p, hvd::DataType::kFloat32, std::move(shape), dev};
  v.stream = stream;
  return v;
}

// Waits for the handle and makes `stream` wait for the result; returns the outputs.
std::vector<hvd::Output> Finish(hvd::Handle h, cudaStream_t stream, const char* what) {
  hvd::Result<std::vector<hvd::Output>> outs = hvd::WaitOutputs(h);
  if (!outs.ok()) Fail(std::string(what) + ": " + outs.status().ToString());
  for (const hvd::Output& o : *outs) Ok(hvd::StreamWaitEvent(o, stream), "StreamWaitEvent");
  Cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  return std::move(*outs);
}

double Timed(const std::function<void()>& run) {
  MPI_Barrier(MPI_COMM_WORLD);
  const double start = bench::NowMs();
  run();
  return bench::NowMs() - start;
}

void Report(bench::Figure& f, double target) {
  f.ratio = bench::Percentile(f.base_ms, 0.5) / bench::Percentile(f.ours_ms, 0.5);
  char t[32];
  std::snprintf(t, sizeof t, ">=%.2f", target);
  f.target = t;
  f.met = bench::Met(true, f.ratio >= target);
  if (g_rank == 0) bench::Print(f);
}

}  // namespace

int main(int argc, char** argv) {
  // Two flags, parsed by hand: GPU machines often lack Boost's libraries.
  int reps = 30, latency_reps = 500;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    int* target = a == "--reps" ? &reps : a == "--latency-reps" ? &latency_reps : nullptr;
    if (a == "--help") {
      std::cout << "nccl_bench [--reps N (30)] [--latency-reps N (500)]\n";
      return 0;
    }
    if (target == nullptr || i + 1 >= argc || (*target = std::atoi(argv[++i])) <= 0) {
      std::cerr << "nccl_bench: bad argument '" << a << "' (try --help)\n";
      return 2;
    }
  }
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  int gpus = 0;
  const cudaError_t rc = cudaGetDeviceCount(&gpus);
  int usable = rc == cudaSuccess && gpus >= g_size ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &usable, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!usable) {
    if (g_rank == 0) {
      std::printf("nccl_bench: skipped: needs one GPU per rank (%s)\n",
                  rc != cudaSuccess ? cudaGetErrorString(rc)
                                    : (std::to_string(gpus) + " GPUs for " +
                                       std::to_string(g_size) + " ranks")
                                          .c_str());
    }
    MPI_Finalize();
    return 0;
  }
  const int dev = g_rank % gpus;  // one host: rank r on GPU r
  Cuda(cudaSetDevice(dev), "cudaSetDevice");
  Ok(hvd::Init(), "Init");
  cudaStream_t stream = nullptr;
  Cuda(cudaStreamCreate(&stream), "cudaStreamCreate");
  ncclUniqueId id;
  if (g_rank == 0) Nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
  MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclComm_t comm = nullptr;
  Nccl(ncclCommInitRank(&comm, g_size, id, g_rank), "ncclCommInitRank");
  if (g_rank == 0) {
    cudaDeviceProp prop{};
    cudaGetDeviceProperties(&prop, dev);
    int nccl_version = 0;
    ncclGetVersion(&nccl_version);
    std::printf("# %d rank(s), one %s each, NCCL %d\n", g_size, prop.name, nccl_version);
  }
  const float ranks_sum = static_cast<float>(g_size * (g_size + 1) / 2);

  // D1: allreduce, out of place for both (the input keeps the pattern).
  for (int mib : {4, 16, 64}) {
    const int64_t n = int64_t{mib} << 18;  // floats
    float* in = UploadPattern(n);
    float* out = nullptr;
    Cuda(cudaMalloc(reinterpret_cast<void**>(&out), n * sizeof(float)), "cudaMalloc");
    bench::Figure f("D1", "cuda_allreduce_" + std::to_string(mib) + "MiB");
    f.baseline = "ncclAllReduce";
    const std::string name = "bench.d1." + std::to_string(mib);
    auto want = [&](int64_t i) { return ranks_sum * static_cast<float>(i % 13 + 1); };
    for (int r = 0; r < reps + 2; ++r) {
      const double ours = Timed([&] {
        auto h = hvd::EnqueueAllreduce(View(in, {n}, dev, stream), View(out, {n}, dev, stream),
                                       name, {hvd::ReduceOp::kSum});
        Ok(h.status(), "EnqueueAllreduce");
        Finish(*h, stream, "allreduce");
      });
      if (r == 0) Check(out, n, "allreduce", want);
      Cuda(cudaMemset(out, 0, n * sizeof(float)), "cudaMemset");
      const double base = Timed([&] {
        Nccl(ncclAllReduce(in, out, n, ncclFloat, ncclSum, comm, stream), "ncclAllReduce");
        Cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
      });
      if (r == 0) Check(out, n, "ncclAllReduce", want);
      if (r >= 2) f.ours_ms.push_back(ours), f.base_ms.push_back(base);  // 2 warm-up rounds
    }
    Report(f, 0.95);
    cudaFree(in);
    cudaFree(out);
  }

  // D2: allgather of 16 MiB per rank (the runtime allocates our output).
  {
    const int64_t n = int64_t{16} << 18;
    float* in = UploadPattern(n);
    float* out = nullptr;
    Cuda(cudaMalloc(reinterpret_cast<void**>(&out), n * g_size * sizeof(float)), "cudaMalloc");
    bench::Figure f("D2", "cuda_allgather_16MiB");
    f.baseline = "ncclAllGather";
    auto want = [&](int64_t i) {
      return static_cast<float>((i / n + 1) * ((i % n) % 13 + 1));
    };
    for (int r = 0; r < reps + 2; ++r) {
      std::vector<hvd::Output> got;
      const double ours = Timed([&] {
        auto h = hvd::EnqueueAllgather(View(in, {n}, dev, stream), "bench.d2");
        Ok(h.status(), "EnqueueAllgather");
        got = Finish(*h, stream, "allgather");
      });
      if (r == 0) Check(got.at(0).data.get(), n * g_size, "allgather", want);
      got.clear();
      const double base = Timed([&] {
        Nccl(ncclAllGather(in, out, n, ncclFloat, comm, stream), "ncclAllGather");
        Cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
      });
      if (r == 0) Check(out, n * g_size, "ncclAllGather", want);
      if (r >= 2) f.ours_ms.push_back(ours), f.base_ms.push_back(base);
    }
    Report(f, 0.95);
    cudaFree(in);
    cudaFree(out);
  }

  // D3: broadcast of 16 MiB from rank 0, in place for both.
  {
    const int64_t n = int64_t{16} << 18;
    float* buf = UploadPattern(n);
    bench::Figure f("D3", "cuda_broadcast_16MiB");
    f.baseline = "ncclBroadcast";
    auto want = [&](int64_t i) { return static_cast<float>(i % 13 + 1); };  // rank 0's
    for (int r = 0; r < reps + 2; ++r) {
      const double ours = Timed([&] {
        auto h = hvd::EnqueueBroadcast(View(buf, {n}, dev, stream), View(buf, {n}, dev, stream),
                                       0, "bench.d3");
        Ok(h.status(), "EnqueueBroadcast");
        Finish(*h, stream, "broadcast");
      });
      if (r == 0) Check(buf, n, "broadcast", want);
      const double base = Timed([&] {
        Nccl(ncclBroadcast(buf, buf, n, ncclFloat, 0, comm, stream), "ncclBroadcast");
        Cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
      });
      if (r == 0) Check(buf, n, "ncclBroadcast", want);
      if (r >= 2) f.ours_ms.push_back(ours), f.base_ms.push_back(base);
    }
    Report(f, 0.95);
    cudaFree(buf);
  }

  // D4: a lone 4-byte allreduce, enqueue to the result on the caller's stream.
  {
    float* x = UploadPattern(1);
    bench::Figure f("D4", "cuda_lone_4B_allreduce");
    for (int r = 0; r < latency_reps + 10; ++r) {
      const double ours = Timed([&] {
        auto h = hvd::EnqueueAllreduce(View(x, {1}, dev, stream), View(x, {1}, dev, stream),
                                       "bench.d4", {hvd::ReduceOp::kMax});
        Ok(h.status(), "EnqueueAllreduce");
        Finish(*h, stream, "lone allreduce");
      });
      if (r >= 10) f.ours_ms.push_back(ours);
    }
    Check(x, 1, "lone allreduce", [&](int64_t) { return static_cast<float>(g_size); });
    f.target = "none";
    f.met = "n/a";
    if (g_rank == 0) bench::Print(f);
    cudaFree(x);
  }

  ncclCommDestroy(comm);
  cudaStreamDestroy(stream);
  Ok(hvd::Shutdown(), "Shutdown");
  MPI_Finalize();
  return 0;
}
