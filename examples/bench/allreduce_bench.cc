// horovod_cpp — Apache-2.0
// Allreduce figures against raw MPI, measured in the same run (interleaved, rank 0's times,
// every repetition started by an MPI_Barrier). Each figure is one FIGURE line (bench_util.h).
//
//   G1  one tensor of 4/16/64 MiB vs MPI_Allreduce on the same buffer            >= 0.95
//   G3  ResNet-50's 161 gradients, enqueued as backward() would, vs the best of one raw
//       MPI_Allreduce on a pre-fused buffer and chunked raw calls       TCP >= 0.85
//   G4  the same vs 161 sequential per-tensor MPI_Allreduce calls   TCP >= 3, shm >= 1.1
//   G5  a lone 4-byte allreduce, enqueue to completion                  p50 <= 0.050 ms
//   G7  CPU time of the background thread over an idle period               <= 1% of a core
//   G9  16 x 4 MiB tensors (one 64 MiB fused buffer) vs one raw 64 MiB call       >= 1.5
//   G10 minor page faults per ResNet-50 step after warm-up                          < 10
//
// Every result (ours and the baselines') is checked against the exact sum; a wrong answer
// exits 1. The transport is mpirun's choice (e.g. --mca btl tcp,self); --transport only picks
// the targets (auto: tcp when OMPI_MCA_btl names tcp without vader/sm).
//
//   mpirun -np 2 build/examples/bench/allreduce_bench [--figures G1,G5] [--reps 20] ...

#include <mpi.h>

#include <boost/program_options.hpp>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <numeric>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/horovod.h"
#include "examples/bench/bench_util.h"

namespace po = boost::program_options;

namespace {

int g_rank = 0, g_size = 1;

void Fail(const std::string& what) {
  std::fprintf(stderr, "allreduce_bench: rank %d: %s\n", g_rank, what.c_str());
  MPI_Abort(MPI_COMM_WORLD, 1);
}

void Ok(const hvd::Status& s, const char* what) {
  if (!s.ok()) Fail(std::string(what) + ": " + s.ToString());
}

// Rank r contributes (r + 1) * (i % 13 + 1): the sum is exact in float32.
void Fill(std::vector<float>& v, int64_t offset = 0) {
  for (size_t i = 0; i < v.size(); ++i) {
    v[i] = static_cast<float>((g_rank + 1) * ((static_cast<int64_t>(i) + offset) % 13 + 1));
  }
}

void Check(const float* out, int64_t n, const char* what, int64_t offset = 0) {
  const int64_t ranks_sum = int64_t{g_size} * (g_size + 1) / 2;
  for (int64_t i = 0; i < n; ++i) {
    const float want = static_cast<float>(ranks_sum * ((i + offset) % 13 + 1));
    if (out[i] != want) {
      Fail(std::string("wrong result in ") + what + " at element " + std::to_string(i) + ": " +
           std::to_string(out[i]) + " != " + std::to_string(want));
    }
  }
}

void Sync() { MPI_Barrier(MPI_COMM_WORLD); }

// Times `fn` on rank 0 (all ranks run it), after a barrier.
template <typename Fn>
double Timed(Fn&& fn) {
  Sync();
  const double t0 = bench::NowMs();
  fn();
  return bench::NowMs() - t0;
}

void RawAllreduce(const float* in, float* out, int64_t n, int64_t chunk) {
  if (chunk <= 0) chunk = n;
  for (int64_t off = 0; off < n; off += chunk) {
    const int count = static_cast<int>(std::min(chunk, n - off));
    if (MPI_Allreduce(in + off, out + off, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD) !=
        MPI_SUCCESS) {
      Fail("MPI_Allreduce failed");
    }
  }
}

hvd::AllreduceOptions SumOptions() {
  hvd::AllreduceOptions o;
  o.op = hvd::ReduceOp::kSum;
  return o;
}

// Element counts of ResNet-50's 161 trainable parameters, in forward (registration) order.
std::vector<int64_t> Resnet50Sizes() {
  std::vector<int64_t> sizes;
  auto conv = [&](int64_t out, int64_t in, int64_t k) { sizes.push_back(out * in * k * k); };
  auto bn = [&](int64_t c) { sizes.insert(sizes.end(), {c, c}); };
  conv(64, 3, 7);
  bn(64);
  int64_t in = 64;
  const int64_t widths[] = {64, 128, 256, 512}, blocks[] = {3, 4, 6, 3};
  for (int layer = 0; layer < 4; ++layer) {
    const int64_t w = widths[layer];
    for (int64_t b = 0; b < blocks[layer]; ++b) {
      conv(w, in, 1), bn(w), conv(w, w, 3), bn(w), conv(4 * w, w, 1), bn(4 * w);
      if (b == 0) conv(4 * w, in, 1), bn(4 * w);
      in = 4 * w;
    }
  }
  sizes.push_back(1000 * 2048);
  sizes.push_back(1000);
  return sizes;
}

// A training step's gradients: separate buffers, enqueued last layer first.
struct GradientSet {
  std::vector<std::vector<float>> in, out;
  std::string prefix;
  int64_t total = 0;

  GradientSet(const std::vector<int64_t>& sizes, std::string name) : prefix(std::move(name)) {
    for (int64_t n : sizes) {
      in.emplace_back(static_cast<size_t>(n));
      out.emplace_back(static_cast<size_t>(n), 0.0f);
      Fill(in.back(), total);
      total += n;
    }
  }

  void Step() {
    std::vector<hvd::Handle> handles;
    handles.reserve(in.size());
    for (size_t k = in.size(); k-- > 0;) {
      const int64_t n = static_cast<int64_t>(in[k].size());
      auto h = hvd::EnqueueAllreduce(hvd::View(in[k].data(), {n}), hvd::View(out[k].data(), {n}),
                                     prefix + std::to_string(k), SumOptions());
      if (!h.ok()) Fail(h.status().ToString());
      handles.push_back(*h);
    }
    for (hvd::Handle h : handles) Ok(hvd::Wait(h), "Wait");
  }

  void CheckAll() {
    int64_t offset = 0;
    for (size_t k = 0; k < out.size(); ++k) {
      Check(out[k].data(), static_cast<int64_t>(out[k].size()), prefix.c_str(), offset);
      offset += static_cast<int64_t>(out[k].size());
    }
  }
};

// Rank 0 prints; a figure without a target on this transport says target=none met=n/a.
std::string g_label;  // --label: appended to every figure's name

void Print(bench::Figure f, bool applies, bool met) {
  if (g_rank != 0) return;
  f.name += g_label;
  f.met = bench::Met(applies, met);
  if (!applies) f.target = "none";
  bench::Print(f);
}

double RatioOfP50(const std::vector<double>& base, const std::vector<double>& ours) {
  return bench::Percentile(base, 0.5) / bench::Percentile(ours, 0.5);
}

}  // namespace

int main(int argc, char** argv) {
  std::string figures = "G1,G3,G4,G5,G7,G9,G10", sizes_mib = "4,16,64", transport = "auto";
  int reps = 15, resnet_reps = 8, latency_reps = 1000;
  double idle_seconds = 10, chunk_mib = 4, g1_target = 0.95;
  po::options_description opts(
      "allreduce_bench: horovod_cpp allreduce vs raw MPI (np-independent)");
  opts.add_options()("help", "show this help")(
      "figures", po::value(&figures)->default_value(figures), "comma-separated figures to run")(
      "sizes-mib", po::value(&sizes_mib)->default_value(sizes_mib), "G1 tensor sizes in MiB")(
      "reps", po::value(&reps)->default_value(reps), "repetitions per G1/G9 measurement")(
      "resnet-reps", po::value(&resnet_reps)->default_value(resnet_reps),
      "repetitions of the ResNet-50 step (G3/G4)")(
      "latency-reps", po::value(&latency_reps)->default_value(latency_reps),
      "repetitions of the 4-byte allreduce (G5)")(
      "idle-seconds", po::value(&idle_seconds)->default_value(idle_seconds), "idle period for G7")(
      "raw-chunk-mib", po::value(&chunk_mib)->default_value(chunk_mib, "4"),
      "chunk size of the chunked raw MPI baseline (G3)")(
      "transport", po::value(&transport)->default_value(transport),
      "targets to apply: shm, tcp or auto (from OMPI_MCA_btl)")(
      "label", po::value(&g_label), "appended to every figure's name (e.g. _2x2_1gbit)")(
      "g1-target", po::value(&g1_target)->default_value(g1_target, "0.95"),
      "G1's target ratio (e.g. 1.3 for hierarchical vs flat MPI_Allreduce across hosts)");
  po::variables_map vm;
  try {
    po::store(po::parse_command_line(argc, argv, opts), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    std::cerr << "allreduce_bench: " << e.what() << "\n\n" << opts;
    return 2;
  }
  if (vm.count("help")) {
    std::cout << opts;
    return 0;
  }
  if (transport == "auto") {
    const char* btl = std::getenv("OMPI_MCA_btl");
    const std::string b = btl ? btl : "";
    transport = b.find("tcp") != std::string::npos && b.find("vader") == std::string::npos &&
                        b.find("sm") == std::string::npos
                    ? "tcp"
                    : "shm";
  }
  const bool tcp = transport == "tcp";
  std::set<std::string> want;
  for (std::stringstream ss(figures); ss.good();) {
    std::string f;
    std::getline(ss, f, ',');
    want.insert(f);
  }

  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  Ok(hvd::Init(), "Init");
  if (g_rank == 0) {
    std::printf(
        "# allreduce_bench np=%d transport=%s HOROVOD_FUSION_THRESHOLD=%s "
        "HOROVOD_CYCLE_TIME=%s\n",
        g_size, transport.c_str(),
        std::getenv("HOROVOD_FUSION_THRESHOLD") ? std::getenv("HOROVOD_FUSION_THRESHOLD")
                                                : "default",
        std::getenv("HOROVOD_CYCLE_TIME") ? std::getenv("HOROVOD_CYCLE_TIME") : "default");
    std::fflush(stdout);
  }

  if (want.count("G1")) {
    for (std::stringstream ss(sizes_mib); ss.good();) {
      std::string item;
      std::getline(ss, item, ',');
      const int64_t mib = std::stoll(item), n = mib * (1 << 20) / 4;
      std::vector<float> in(static_cast<size_t>(n)), out(static_cast<size_t>(n));
      Fill(in);
      bench::Figure f{"G1", "allreduce_" + item + "MiB"};
      f.baseline = "MPI_Allreduce";
      const std::string name = "g1." + item;
      for (int r = -2; r < reps; ++r) {  // two warm-up rounds
        auto raw = [&] { RawAllreduce(in.data(), out.data(), n, 0); };
        auto ours = [&] {
          Ok(hvd::Allreduce(hvd::View(in.data(), {n}), hvd::View(out.data(), {n}), name,
                            SumOptions()),
             "Allreduce");
        };
        double t_raw, t_ours;
        if (r % 2) {
          t_raw = Timed(raw), Check(out.data(), n, "raw G1");
          t_ours = Timed(ours), Check(out.data(), n, "G1");
        } else {
          t_ours = Timed(ours), Check(out.data(), n, "G1");
          t_raw = Timed(raw), Check(out.data(), n, "raw G1");
        }
        if (r >= 0) f.ours_ms.push_back(t_ours), f.base_ms.push_back(t_raw);
      }
      f.ratio = RatioOfP50(f.base_ms, f.ours_ms);
      std::ostringstream target;
      target << ">=" << g1_target;
      f.target = target.str();
      Print(f, true, f.ratio >= g1_target);
    }
  }

  if (want.count("G3") || want.count("G4") || want.count("G10")) {
    const std::vector<int64_t> sizes = Resnet50Sizes();
    GradientSet grads(sizes, "resnet50.");
    const int64_t total = grads.total;
    std::vector<float> fused_in(static_cast<size_t>(total)), fused_out(static_cast<size_t>(total));
    Fill(fused_in);
    const int64_t chunk = static_cast<int64_t>(chunk_mib * (1 << 20) / 4);
    std::vector<double> ours, fused, chunked, sequential;
    for (int r = -2; r < resnet_reps; ++r) {
      const double t_ours = Timed([&] { grads.Step(); });
      grads.CheckAll();
      const double t_fused =
          Timed([&] { RawAllreduce(fused_in.data(), fused_out.data(), total, 0); });
      Check(fused_out.data(), total, "raw fused");
      const double t_chunked =
          Timed([&] { RawAllreduce(fused_in.data(), fused_out.data(), total, chunk); });
      Check(fused_out.data(), total, "raw chunked");
      const double t_seq = Timed([&] {
        for (size_t k = sizes.size(); k-- > 0;) {
          RawAllreduce(grads.in[k].data(), grads.out[k].data(), sizes[k], 0);
        }
      });
      grads.CheckAll();
      if (r >= 0) {
        ours.push_back(t_ours), fused.push_back(t_fused), chunked.push_back(t_chunked);
        sequential.push_back(t_seq);
      }
    }
    const bool chunked_better = bench::Percentile(chunked, 0.5) < bench::Percentile(fused, 0.5);
    if (want.count("G3")) {
      bench::Figure f{"G3", "resnet50_step_vs_prefused"};
      f.ours_ms = ours;
      f.base_ms = chunked_better ? chunked : fused;
      f.baseline = chunked_better ? "chunked_raw_MPI_Allreduce" : "one_raw_MPI_Allreduce";
      f.ratio = RatioOfP50(f.base_ms, ours);
      f.target = ">=0.85";
      std::ostringstream extra;
      extra << "one_call_p50_ms=" << bench::Percentile(fused, 0.5)
            << " chunked_p50_ms=" << bench::Percentile(chunked, 0.5);
      f.extra = extra.str();
      Print(f, tcp, f.ratio >= 0.85);
    }
    if (want.count("G4")) {
      bench::Figure f{"G4", "resnet50_step_vs_per_tensor"};
      f.ours_ms = ours;
      f.base_ms = sequential;
      f.baseline = "161_sequential_MPI_Allreduce";
      f.ratio = RatioOfP50(sequential, ours);
      const double target = tcp ? 3.0 : 1.1;
      f.target = tcp ? ">=3" : ">=1.1";
      Print(f, true, f.ratio >= target);
    }
    if (want.count("G10")) {
      for (int r = 0; r < 3; ++r) grads.Step();
      const int steps = 10;
      Sync();
      const long before = bench::MinorFaults();
      std::vector<double> times;
      for (int r = 0; r < steps; ++r) times.push_back(Timed([&] { grads.Step(); }));
      const double per_step = static_cast<double>(bench::MinorFaults() - before) / steps;
      grads.CheckAll();
      bench::Figure f{"G10", "minor_page_faults_per_resnet50_step"};
      f.ours_ms = times;
      std::ostringstream extra;
      extra << "faults_per_step=" << per_step;
      f.extra = extra.str();
      f.target = "faults_per_step<10";
      Print(f, true, per_step < 10);
    }
  }

  if (want.count("G5")) {
    float in = static_cast<float>(g_rank + 1), out = 0;
    bench::Figure f{"G5", "lone_4_byte_allreduce"};
    f.baseline = "MPI_Allreduce";
    for (int r = -50; r < latency_reps; ++r) {
      const double t_ours = Timed([&] {
        Ok(hvd::Allreduce(hvd::View(&in, {1}), hvd::View(&out, {1}), "g5", SumOptions()),
           "Allreduce");
      });
      Check(&out, 1, "G5");
      const double t_raw = Timed([&] { RawAllreduce(&in, &out, 1, 0); });
      if (r >= 0) f.ours_ms.push_back(t_ours), f.base_ms.push_back(t_raw);
    }
    f.ratio = RatioOfP50(f.base_ms, f.ours_ms);
    f.target = "p50<=0.050ms";  // a shared-memory target
    Print(f, !tcp, bench::Percentile(f.ours_ms, 0.5) <= 0.050);
  }

  if (want.count("G7")) {
    Sync();
    const double cpu0 = bench::ThreadCpuSeconds("hvd-bg");
    std::this_thread::sleep_for(std::chrono::duration<double>(idle_seconds));
    const double percent = (bench::ThreadCpuSeconds("hvd-bg") - cpu0) / idle_seconds * 100.0;
    double worst = 0;
    MPI_Reduce(&percent, &worst, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    bench::Figure f{"G7", "idle_background_cpu"};
    f.ours_ms = {idle_seconds * 1000};
    std::ostringstream extra;
    extra << "cpu_percent_of_a_core=" << worst << " (worst rank)";
    f.extra = extra.str();
    f.target = "<=1%";
    Print(f, true, worst <= 1.0);
  }

  if (want.count("G9")) {
    const int tensors = 16;
    const int64_t n = int64_t{4} << 20 >> 2;  // 4 MiB of floats each
    std::vector<int64_t> sizes(tensors, n);
    GradientSet grads(sizes, "g9.");
    std::vector<float> fused_in(static_cast<size_t>(n * tensors)),
        fused_out(static_cast<size_t>(n * tensors));
    Fill(fused_in);
    bench::Figure f{"G9", "64MiB_fused_default_chunking"};
    f.baseline = "one_raw_64MiB_MPI_Allreduce";
    for (int r = -2; r < reps; ++r) {
      const double t_ours = Timed([&] { grads.Step(); });
      grads.CheckAll();
      const double t_raw =
          Timed([&] { RawAllreduce(fused_in.data(), fused_out.data(), n * tensors, 0); });
      Check(fused_out.data(), n * tensors, "raw G9");
      if (r >= 0) f.ours_ms.push_back(t_ours), f.base_ms.push_back(t_raw);
    }
    f.ratio = RatioOfP50(f.base_ms, f.ours_ms);
    f.target = ">=1.5";
    Print(f, true, f.ratio >= 1.5);
  }

  Ok(hvd::Shutdown(), "Shutdown");
  MPI_Finalize();
  return 0;
}
