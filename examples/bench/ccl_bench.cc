// horovod_cpp — Apache-2.0
// oneCCL's own allreduce, the ceiling of horovod_cpp's oneCCL data plane: for each size, the
// p50 of horovod_cpp's allreduce (HOROVOD_CPU_OPERATIONS=ccl, set here) against one
// ccl::allreduce of the whole buffer on a communicator of our own, in interleaved repetitions,
// and MPI_Allreduce for reference. Run under mpirun (MPI carries the bootstrap):
//
//   mpirun -np 2 build/examples/bench/ccl_bench --sizes-mib 1,16,64,256 --reps 10
//
// Prints FIGURE CCL2 lines: ratio = oneCCL's p50 / ours (>= 1: as fast as oneCCL alone).
// Every result is checked against the sum it must be.
#include <mpi.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <oneapi/ccl.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "common/horovod.h"
#include "examples/bench/bench_util.h"

namespace {

int g_rank = 0, g_size = 1;

void Fail(const std::string& what) {
  std::fprintf(stderr, "ccl_bench: rank %d: %s\n", g_rank, what.c_str());
  MPI_Abort(MPI_COMM_WORLD, 1);
}

void Check(const std::vector<float>& out, const char* what) {
  const float want = static_cast<float>(g_size) * static_cast<float>(g_size + 1) / 2.0f;
  for (size_t i = 0; i < out.size(); i += 4099) {
    if (out[i] != want) Fail(std::string(what) + ": wrong sum");
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string sizes = "1,16,64,256", label;
  int reps = 10;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--sizes-mib")
      sizes = argv[i + 1];
    else if (a == "--reps")
      reps = std::atoi(argv[i + 1]);
    else if (a == "--label")
      label = argv[i + 1];
  }
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  ::setenv("HOROVOD_CPU_OPERATIONS", "ccl", 1);
  if (!hvd::Init().ok()) Fail("hvd::Init on oneCCL failed");  // sets oneCCL's settings too

  // A communicator of our own, bootstrapped over MPI.
  ccl::kvs::address_type address{};
  std::shared_ptr<ccl::kvs> kvs;
  if (g_rank == 0) {
    kvs = ccl::create_main_kvs();
    address = kvs->get_address();
  }
  MPI_Bcast(address.data(), static_cast<int>(address.size()), MPI_BYTE, 0, MPI_COMM_WORLD);
  if (g_rank != 0) kvs = ccl::create_kvs(address);
  ccl::communicator comm = ccl::create_communicator(g_size, g_rank, kvs);

  std::stringstream ss(sizes);
  for (std::string item; std::getline(ss, item, ',');) {
    const int64_t mib = std::stoll(item), n = mib << 18;
    std::vector<float> in(static_cast<size_t>(n), static_cast<float>(g_rank + 1)),
        out(static_cast<size_t>(n));
    std::vector<double> ours, raw, mpi;
    for (int r = -1; r < reps; ++r) {  // one warm-up round
      MPI_Barrier(MPI_COMM_WORLD);
      double t = bench::NowMs();
      hvd::AllreduceOptions sum;
      sum.op = hvd::ReduceOp::kSum;
      auto h = hvd::EnqueueAllreduce(hvd::View(in.data(), {n}), hvd::View(out.data(), {n}),
                                     "ccl_bench." + item, sum);
      if (!h.ok() || !hvd::Wait(*h).ok()) Fail("hvd allreduce");
      if (r >= 0) ours.push_back(bench::NowMs() - t);
      Check(out, "horovod_cpp");
      MPI_Barrier(MPI_COMM_WORLD);
      t = bench::NowMs();
      ccl::allreduce(in.data(), out.data(), static_cast<size_t>(n), ccl::reduction::sum, comm)
          .wait();
      if (r >= 0) raw.push_back(bench::NowMs() - t);
      Check(out, "oneCCL");
      MPI_Barrier(MPI_COMM_WORLD);
      t = bench::NowMs();
      MPI_Allreduce(in.data(), out.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      if (r >= 0) mpi.push_back(bench::NowMs() - t);
      Check(out, "MPI");
    }
    if (g_rank == 0) {
      bench::Figure f("CCL2", "ccl_data_plane_allreduce_" + item + "MiB" + label);
      f.ours_ms = ours;
      f.base_ms = raw;
      f.baseline = "ccl::allreduce";
      f.ratio = bench::Percentile(raw, 0.5) / bench::Percentile(ours, 0.5);
      f.target = "none";
      f.met = "n/a";
      char extra[128];
      std::snprintf(extra, sizeof(extra), "mpi_allreduce_p50_ms=%.3f np=%d",
                    bench::Percentile(mpi, 0.5), g_size);
      f.extra = extra;
      bench::Print(f);
    }
  }
  hvd::Shutdown().IgnoreError();
  MPI_Finalize();
  return 0;
}
