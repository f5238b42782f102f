// horovod_cpp — Apache-2.0
// Multi-rank tests of the core runtime: run under mpirun at 2, 3 and 4 ranks (and once with
// fusion and the response cache off). Every expectation is computed independently here from
// what each rank contributes (rank r contributes a known function of r), never by asking the
// library.

#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/horovod.h"
#include "tests/mpi/mpi_wait.h"
#include "tests/mpi/test_util.h"

namespace hvd {
namespace {

using namespace test;  // NOLINT

// What rank r contributes at index i for dtype t: small values whose sums and products fit
// every type (unsigned: 1..3; signed: -2..2; floating: -1..1 in steps of 0.5).
double Contribution(DataType t, int r, int64_t i) {
  const int64_t k = r + i;
  if (IsUnsigned(t)) return static_cast<double>(k % 3 + 1);
  if (IsFloatingPoint(t)) return static_cast<double>(k % 5 - 2) * 0.5;
  return static_cast<double>(k % 5 - 2);
}

double Expected(DataType t, ReduceOp op, int size, int64_t i) {
  double acc = Contribution(t, 0, i);
  for (int r = 1; r < size; ++r) {
    const double v = Contribution(t, r, i);
    switch (op) {
      case ReduceOp::kMin:
        acc = std::min(acc, v);
        break;
      case ReduceOp::kMax:
        acc = std::max(acc, v);
        break;
      case ReduceOp::kProduct:
        acc *= v;
        break;
      default:
        acc += v;
        break;
    }
  }
  if (op == ReduceOp::kAverage) {
    if (IsFloatingPoint(t)) return acc / size;
    return static_cast<double>(static_cast<int64_t>(acc) / size);  // C++ truncates toward zero
  }
  return acc;
}

// ---- tests -----------------------------------------------------------------------------------

TEST(Core, TopologyMatchesMpi) {
  int mpi_rank = 0, mpi_size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &mpi_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &mpi_size);
  EXPECT_EQ(R(), mpi_rank);
  EXPECT_EQ(N(), mpi_size);
  // The expectation from the hosts' names (one host, or the multi-host test bed): local
  // ranks share this rank's host name, cross ranks are the hosts in order of first rank.
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  MPI_Get_processor_name(name, &len);
  std::vector<char> all(static_cast<size_t>(mpi_size) * MPI_MAX_PROCESSOR_NAME);
  hvd::test::SleepingAllgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all.data(),
                               MPI_MAX_PROCESSOR_NAME, MPI_CHAR);
  std::vector<std::string> hosts;
  for (int r = 0; r < mpi_size; ++r) hosts.emplace_back(&all[r * MPI_MAX_PROCESSOR_NAME]);
  int local_size = 0, local_rank = 0;
  std::vector<std::string> distinct;
  for (int r = 0; r < mpi_size; ++r) {
    if (hosts[r] == hosts[mpi_rank]) {
      if (r < mpi_rank) ++local_rank;
      ++local_size;
    }
    if (std::find(distinct.begin(), distinct.end(), hosts[r]) == distinct.end()) {
      distinct.push_back(hosts[r]);
    }
  }
  const int host_index = static_cast<int>(
      std::find(distinct.begin(), distinct.end(), hosts[mpi_rank]) - distinct.begin());
  EXPECT_EQ(*LocalSize(), local_size);
  EXPECT_EQ(*LocalRank(), local_rank);
  EXPECT_EQ(*CrossSize(), static_cast<int>(distinct.size()));
  EXPECT_EQ(*CrossRank(), host_index);
  EXPECT_TRUE(IsInitialized());
  EXPECT_TRUE(Init().ok());  // idempotent
  const char* controller = std::getenv("HOROVOD_CONTROLLER");
  const bool gloo = controller != nullptr && std::string(controller) == "gloo";
  const char* cpu = std::getenv("HOROVOD_CPU_OPERATIONS");
  const bool ccl = cpu != nullptr && std::string(cpu) == "ccl";
  EXPECT_EQ(*HostBackendName(), ccl ? "oneCCL" : gloo ? "Gloo" : "MPI");
  EXPECT_EQ(*MpiThreadsSupported(), !gloo);  // Gloo's runs report no MPI threading
}

TEST(Core, EveryDtypeAndOpAgainstIndependentValues) {
  const int64_t n = 37;
  const ReduceOp ops[] = {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMin, ReduceOp::kMax,
                          ReduceOp::kProduct};
  struct Case {
    DataType dtype;
    ReduceOp op;
    Buffer in, out;
    bool in_place;
    Handle handle;
  };
  std::vector<Case> cases;
  for (DataType t : kNumericTypes) {
    for (ReduceOp op : ops) {
      cases.push_back({t, op, Buffer(t, n), Buffer(t, n), cases.size() % 2 == 0, 0});
    }
  }
  // Enqueue all 50 at once: they are negotiated together and fused by (dtype, op).
  for (Case& c : cases) {
    for (int64_t i = 0; i < n; ++i) c.in.Set(i, Contribution(c.dtype, R(), i));
    TensorView out = c.in_place ? c.in.View() : c.out.View();
    auto h = EnqueueAllreduce(
        c.in.View(), out, std::string("every.") + DataTypeName(c.dtype) + "." + ReduceOpName(c.op),
        {c.op});
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    c.handle = *h;
  }
  for (Case& c : cases) {
    ASSERT_TRUE(Wait(c.handle).ok());
    const Buffer& result = c.in_place ? c.in : c.out;
    for (int64_t i = 0; i < n; ++i) {
      const double want = Expected(c.dtype, c.op, N(), i);
      ASSERT_NEAR(result.Get(i), want, Tolerance(c.dtype, want))
          << DataTypeName(c.dtype) << " " << ReduceOpName(c.op) << " i=" << i;
      if (!c.in_place) {
        ASSERT_EQ(c.in.Get(i), Contribution(c.dtype, R(), i)) << "input was modified";
      }
    }
  }
}

TEST(Core, TwoHundredMixedTensorsInADifferentRandomOrderOnEachRank) {
  struct Tensor {
    std::string name;
    Buffer buf;
  };
  std::mt19937 shapes(42);  // same shapes on every rank
  std::vector<Tensor> tensors;
  const DataType types[] = {DataType::kFloat32, DataType::kFloat64, DataType::kInt32};
  for (int t = 0; t < 200; ++t) {
    const int64_t n = (t % 10 == 0) ? 20000 + shapes() % 20000 : 1 + shapes() % 3000;
    tensors.push_back({"mixed." + std::to_string(t), Buffer(types[t % 3], n)});
  }
  const Stats before = *GetStats();
  const double rank_sum = N() * (N() + 1) / 2.0;
  for (int iter = 0; iter < 3; ++iter) {  // iterations 2 and 3 take the cache fast path
    std::vector<int> order(tensors.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
    std::mt19937 rng(1000 * iter + R());
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<Handle> handles(tensors.size());
    for (int t : order) {
      Buffer& b = tensors[t].buf;
      for (int64_t i = 0; i < b.size(); ++i) b.Set(i, (R() + 1) * ((t + i + iter) % 7));
      auto h = EnqueueAllreduce(b.View(), b.View(), tensors[t].name, {ReduceOp::kSum});
      ASSERT_TRUE(h.ok()) << h.status().ToString();
      handles[t] = *h;
    }
    for (size_t t = 0; t < tensors.size(); ++t) {
      ASSERT_TRUE(Wait(handles[t]).ok());
      const Buffer& b = tensors[t].buf;
      for (int64_t i = 0; i < b.size(); ++i) {
        ASSERT_EQ(b.Get(i), rank_sum * ((t + i + iter) % 7)) << tensors[t].name << " i=" << i;
      }
    }
  }
  const Stats after = *GetStats();
  EXPECT_EQ(after.tensors_completed - before.tensors_completed, 600u);
  if (!EnvIs("HOROVOD_CACHE_CAPACITY", "0")) {
    // The second and third passes are negotiated from the response cache.
    EXPECT_GE(after.cache_hits - before.cache_hits, 400u);
  } else {
    EXPECT_EQ(after.cache_hits, before.cache_hits);
  }
}

TEST(Core, PrescaleAndPostscale) {
  const int64_t n = 9;
  const double rank_sum = N() * (N() + 1) / 2.0;
  // Out of place, single tensor: the caller's input must not be scaled.
  std::vector<float> in(n), out(n);
  for (int64_t i = 0; i < n; ++i) in[i] = static_cast<float>((R() + 1) * (i + 1));
  ASSERT_TRUE(Allreduce(View(in.data(), {n}), View(out.data(), {n}), "scale.f32",
                        {ReduceOp::kSum, 0.5, 3.0})
                  .ok());
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_FLOAT_EQ(out[i], static_cast<float>(3.0 * 0.5 * rank_sum * (i + 1)));
    EXPECT_EQ(in[i], static_cast<float>((R() + 1) * (i + 1)));
  }
  // Average with a postscale: (sum / size) * 2.
  std::vector<double> d(n, R() + 1.0);
  ASSERT_TRUE(Allreduce(View(d.data(), {n}), View(d.data(), {n}), "scale.avg",
                        {ReduceOp::kAverage, 1.0, 2.0})
                  .ok());
  EXPECT_DOUBLE_EQ(d[0], 2.0 * rank_sum / N());
  // Integer prescale: 3 * (r + 1), summed, averaged with truncation toward zero.
  std::vector<int32_t> k(n, R() + 1);
  ASSERT_TRUE(Allreduce(View(k.data(), {n}), View(k.data(), {n}), "scale.int",
                        {ReduceOp::kAverage, 3.0, 1.0})
                  .ok());
  EXPECT_EQ(k[0], static_cast<int32_t>(3 * N() * (N() + 1) / 2 / N()));
  // Several tensors with the same factors go through the fusion buffer.
  std::vector<std::vector<float>> fused(5, std::vector<float>(n));
  std::vector<Handle> hs;
  for (int t = 0; t < 5; ++t) {
    for (int64_t i = 0; i < n; ++i) fused[t][i] = static_cast<float>((R() + 1) * t);
    hs.push_back(*EnqueueAllreduce(View(fused[t].data(), {n}), View(fused[t].data(), {n}),
                                   "scale.fused." + std::to_string(t),
                                   {ReduceOp::kSum, 2.0, 0.25}));
  }
  for (int t = 0; t < 5; ++t) {
    ASSERT_TRUE(Wait(hs[t]).ok());
    EXPECT_FLOAT_EQ(fused[t][n - 1], static_cast<float>(0.25 * 2.0 * rank_sum * t));
  }
}

// Gradient statistics (AllreduceOptions::stats_group): the squared norms of each rank's inputs
// (before any prescale) and of the results, summed per group, against sums computed here from
// every rank's known contribution. Tensors small enough to be fused and large enough to run
// alone (the chunked runs split both across calls), float32 and float64 in one group, a
// prescaled Sum in another, an unmeasured tensor beside them, and reducescatter's shares.
double StatValue(int r, int t, int64_t i) { return ((r + 1) * (i % 7) - 3 + t) * 0.25; }

TEST(Core, GradStatsMeasureInputsAndResultsPerGroup) {
  const std::vector<int64_t> sizes = {1, 3, 17, 300, 5000};
  std::vector<std::vector<float>> f32(sizes.size());
  std::vector<std::vector<double>> f64(sizes.size()), other(sizes.size());
  std::vector<Handle> hs;
  double local[2] = {0, 0}, reduced[2] = {0, 0};
  int64_t elements[2] = {0, 0};
  for (size_t t = 0; t < sizes.size(); ++t) {
    const int64_t n = sizes[t];
    f32[t].resize(n);
    f64[t].resize(n);
    other[t].assign(n, 1.0);
    for (int64_t i = 0; i < n; ++i) {
      f32[t][i] = static_cast<float>(StatValue(R(), t, i));
      f64[t][i] = StatValue(R(), t + 1, i);
      local[0] += f32[t][i] * static_cast<double>(f32[t][i]);
      local[1] += f64[t][i] * f64[t][i];
      double sum32 = 0, sum64 = 0;
      for (int r = 0; r < N(); ++r) {
        sum32 += StatValue(r, t, i);
        sum64 += StatValue(r, t + 1, i);
      }
      const double avg32 = sum32 / N(), scaled64 = 0.5 * 2.0 * sum64;  // prescale 2, postscale 0.5
      reduced[0] += avg32 * avg32;
      reduced[1] += scaled64 * scaled64;
    }
    elements[0] += n;
    elements[1] += n;
    const std::string k = std::to_string(t);
    AllreduceOptions avg;
    avg.stats_group = 0;
    hs.push_back(*EnqueueAllreduce(View(f32[t].data(), {n}), View(f32[t].data(), {n}),
                                   "stats.f32." + k, avg));
    AllreduceOptions sum{ReduceOp::kSum, 2.0, 0.5};
    sum.stats_group = 1;
    hs.push_back(*EnqueueAllreduce(View(f64[t].data(), {n}), View(f64[t].data(), {n}),
                                   "stats.f64." + k, sum));
    hs.push_back(*EnqueueAllreduce(View(other[t].data(), {n}), View(other[t].data(), {n}),
                                   "stats.none." + k, {ReduceOp::kSum}));
  }
  for (Handle h : hs) ASSERT_TRUE(Wait(h).ok());
  for (int g = 0; g < 2; ++g) {
    Result<GradStats> s = TakeGradStats(kGlobalProcessSetId, g);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    EXPECT_NEAR(s->local_sq, local[g], 1e-12 * local[g]) << "group " << g;
    EXPECT_NEAR(s->reduced_sq, reduced[g], 1e-6 * reduced[g]) << "group " << g;
    EXPECT_EQ(s->elements, elements[g]);
    EXPECT_EQ(s->tensors, static_cast<int64_t>(sizes.size()));
    // Taking resets the sums.
    Result<GradStats> again = TakeGradStats(kGlobalProcessSetId, g);
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(again->local_sq, 0.0);
    EXPECT_EQ(again->tensors, 0);
  }
  EXPECT_EQ(TakeGradStats(kGlobalProcessSetId, 7)->elements, 0);  // nothing measured there

  // Reducescatter, alone and grouped: local is the whole input, reduced this rank's share;
  // the shares' sums over the ranks make the whole average's norm.
  const int64_t cols = 5, rows = 2 * N() + 1;
  std::vector<std::vector<double>> in(3, std::vector<double>(rows * cols));
  double want_local = 0, want_global = 0;
  for (int t = 0; t < 3; ++t) {
    for (int64_t i = 0; i < rows * cols; ++i) {
      in[t][i] = StatValue(R(), t, i);
      want_local += in[t][i] * in[t][i];
      double sum = 0;
      for (int r = 0; r < N(); ++r) sum += StatValue(r, t, i);
      want_global += (sum / N()) * (sum / N());
    }
  }
  const TensorShape share = *ReducescatterShape({rows, cols});
  std::vector<std::vector<double>> out(3, std::vector<double>(NumElements(share)));
  AllreduceOptions rs;
  rs.stats_group = 3;
  ASSERT_TRUE(Reducescatter(View(in[0].data(), {rows, cols}), View(out[0].data(), share),
                            "stats.rs.alone", rs)
                  .ok());
  Handle g = *EnqueueGroupedReducescatter(
      {View(in[1].data(), {rows, cols}), View(in[2].data(), {rows, cols})},
      {View(out[1].data(), share), View(out[2].data(), share)}, "stats.rs.grouped", rs);
  ASSERT_TRUE(Wait(g).ok());
  GradStats s = *TakeGradStats(kGlobalProcessSetId, 3);
  EXPECT_NEAR(s.local_sq, want_local, 1e-12 * want_local);
  EXPECT_EQ(s.tensors, 3);
  double mine = 0;
  for (const auto& o : out) {
    for (double v : o) mine += v * v;
  }
  EXPECT_NEAR(s.reduced_sq, mine, 1e-12 * mine + 1e-300);
  double global = 0;
  MPI_Allreduce(&s.reduced_sq, &global, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  EXPECT_NEAR(global, want_global, 1e-9 * want_global);

  // A grouped allreduce with one group per member, read back in one TakeAll.
  std::vector<std::vector<float>> parts(3, std::vector<float>(4));
  std::vector<TensorView> views;
  for (int t = 0; t < 3; ++t) {
    for (int i = 0; i < 4; ++i) parts[t][i] = static_cast<float>(StatValue(R(), t, i));
    views.push_back(View(parts[t].data(), {4}));
  }
  AllreduceOptions per;
  per.stats_groups = {10, 12, 11};
  Handle gh = *EnqueueGroupedAllreduce(views, views, "stats.grouped", per);
  ASSERT_TRUE(Wait(gh).ok());
  auto all = TakeAllGradStats(kGlobalProcessSetId);
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 3u);
  const int member_of[3] = {0, 2, 1};  // groups 10, 11, 12 in order
  for (int k = 0; k < 3; ++k) {
    EXPECT_EQ((*all)[k].first, 10 + k);
    double want = 0;
    for (int i = 0; i < 4; ++i)
      want += StatValue(R(), member_of[k], i) * StatValue(R(), member_of[k], i);
    EXPECT_NEAR((*all)[k].second.local_sq, want, 1e-12 * want) << k;
    EXPECT_EQ((*all)[k].second.tensors, 1);
  }
  EXPECT_TRUE(TakeAllGradStats(kGlobalProcessSetId)->empty());
  per.stats_groups = {1, 2};  // two groups for three tensors
  Result<Handle> wrong = EnqueueGroupedAllreduce(views, views, "stats.wrong", per);
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("2 stats groups for 3 tensors"), std::string::npos)
      << wrong.status().ToString();

  AllreduceOptions bad;
  bad.stats_group = -2;
  std::vector<float> x(3);
  Result<Handle> r = EnqueueAllreduce(View(x.data(), {3}), View(x.data(), {3}), "stats.bad", bad);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("stats group -2"), std::string::npos)
      << r.status().ToString();
}

TEST(Core, BroadcastFromEveryRootEveryDtype) {
  std::vector<DataType> types(std::begin(kNumericTypes), std::end(kNumericTypes));
  types.push_back(DataType::kBool);
  const int64_t n = 23;
  for (int root = 0; root < N(); ++root) {
    std::vector<Buffer> ins, outs;
    std::vector<Handle> hs;
    for (size_t k = 0; k < types.size(); ++k) {
      ins.emplace_back(types[k], n);
      outs.emplace_back(types[k], n);
    }
    for (size_t k = 0; k < types.size(); ++k) {
      if (R() == root) {
        for (int64_t i = 0; i < n; ++i)
          ins[k].Set(i, (root + i) % 2 + (types[k] == DataType::kBool ? 0 : root));
      }
      const bool in_place = k % 2 == 0;
      auto h = EnqueueBroadcast(ins[k].View(), in_place ? ins[k].View() : outs[k].View(), root,
                                "bcast." + std::to_string(root) + "." + DataTypeName(types[k]));
      ASSERT_TRUE(h.ok()) << h.status().ToString();
      hs.push_back(*h);
    }
    for (size_t k = 0; k < types.size(); ++k) {
      ASSERT_TRUE(Wait(hs[k]).ok());
      const Buffer& got = (k % 2 == 0) ? ins[k] : outs[k];
      for (int64_t i = 0; i < n; ++i) {
        const double want = (root + i) % 2 + (types[k] == DataType::kBool ? 0 : root);
        ASSERT_EQ(got.Get(i), want) << DataTypeName(types[k]) << " root " << root << " i=" << i;
      }
    }
  }
  // Same-root broadcasts of one dtype are fused into one call; tensors of at least the chunk
  // size (the chunked variant: 100 bytes) are broadcast in place, one call each.
  const Stats before = *GetStats();
  std::vector<std::vector<double>> params(20, std::vector<double>(100));
  std::vector<Handle> hs;
  for (int p = 0; p < 20; ++p) {
    for (double& x : params[p]) x = R() == 0 ? p + 0.5 : -1.0;
    hs.push_back(*EnqueueBroadcast(View(params[p].data(), {100}), View(params[p].data(), {100}), 0,
                                   "bcast.param." + std::to_string(p)));
  }
  for (int p = 0; p < 20; ++p) {
    ASSERT_TRUE(Wait(hs[p]).ok());
    EXPECT_EQ(params[p][99], p + 0.5);
  }
  const Stats after = *GetStats();
  if (EnvIs("HOROVOD_COLLECTIVE_CHUNK_BYTES", "100")) {
    EXPECT_EQ(after.broadcast_calls - before.broadcast_calls, 20u);
  } else if (!EnvIs("HOROVOD_FUSION_THRESHOLD", "0")) {
    EXPECT_LT(after.broadcast_calls - before.broadcast_calls, 20u);
  }
}

TEST(Core, MismatchesGiveTheSameErrorOnEveryRankAndTheJobContinues) {
  // Shapes: rank r sends [2, r + 1].
  std::vector<float> buf(2 * N(), 1.0f);
  Status s = Allreduce(View(buf.data(), {2, R() + 1}), View(buf.data(), {2, R() + 1}),
                       "mismatch.shape", {ReduceOp::kSum});
  std::string want = "allreduce 'mismatch.shape': mismatched shapes: ";
  for (int r = 0; r < N(); ++r) {
    want += (r ? "; " : "") + std::string("rank ") + std::to_string(r) + " sent [2, " +
            std::to_string(r + 1) + "]";
  }
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(), want);

  // Dtypes: rank 0 float32, the others float64.
  std::vector<double> dbl(4, 1.0);
  std::vector<float> flt(4, 1.0f);
  s = R() == 0 ? Allreduce(View(flt.data(), {4}), View(flt.data(), {4}), "mismatch.dtype")
               : Allreduce(View(dbl.data(), {4}), View(dbl.data(), {4}), "mismatch.dtype");
  EXPECT_EQ(s.message(),
            "allreduce 'mismatch.dtype': mismatched data types: rank 0 sent float32; " +
                RanksText(1, N() - 1) + " sent float64");

  // Broadcast roots: rank 0 says root 0, the others say root 1.
  s = Broadcast(View(flt.data(), {4}), View(flt.data(), {4}), R() == 0 ? 0 : 1, "mismatch.root");
  EXPECT_EQ(s.message(), "broadcast 'mismatch.root': mismatched root ranks: rank 0 sent 0; " +
                             RanksText(1, N() - 1) + " sent 1");

  // Operations: rank 0 allreduces, the others broadcast.
  s = R() == 0 ? Allreduce(View(flt.data(), {4}), View(flt.data(), {4}), "mismatch.op")
               : Broadcast(View(flt.data(), {4}), View(flt.data(), {4}), 0, "mismatch.op");
  EXPECT_EQ(s.message(), "allreduce 'mismatch.op': mismatched operations: rank 0 sent ALLREDUCE; " +
                             RanksText(1, N() - 1) + " sent BROADCAST");

  // Reduction ops: the last rank asks for Max.
  s = Allreduce(View(flt.data(), {4}), View(flt.data(), {4}), "mismatch.redop",
                {R() == N() - 1 ? ReduceOp::kMax : ReduceOp::kSum});
  EXPECT_EQ(s.message(),
            "allreduce 'mismatch.redop': mismatched reduction ops: " + RanksText(0, N() - 2) +
                " sent Sum; " + RanksText(N() - 1, N() - 1) + " sent Max");

  // The same name now works, and so does the next allreduce.
  std::vector<float> ok(4, static_cast<float>(R() + 1));
  ASSERT_TRUE(
      Allreduce(View(ok.data(), {4}), View(ok.data(), {4}), "mismatch.shape", {ReduceOp::kSum})
          .ok());
  EXPECT_EQ(ok[3], N() * (N() + 1) / 2.0f);
}

TEST(Core, DuplicateNameInFlightIsRejectedAtEnqueue) {
  // The last rank enqueues only after the others have tried the duplicate, so on those ranks
  // the first "dup" is certainly still in flight when the second one arrives.
  std::vector<float> a(8, 1.0f), b(8, 1.0f);
  const bool last = R() == N() - 1;
  if (last) hvd::test::SleepingBarrier();
  auto h = EnqueueAllreduce(View(a.data(), {8}), View(a.data(), {8}), "dup", {ReduceOp::kSum});
  ASSERT_TRUE(h.ok());
  if (!last) {
    auto again =
        EnqueueAllreduce(View(b.data(), {8}), View(b.data(), {8}), "dup", {ReduceOp::kSum});
    EXPECT_FALSE(again.ok());
    EXPECT_EQ(again.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(again.status().message().find("'dup': a tensor with this name is already in flight"),
              std::string::npos);
    hvd::test::SleepingBarrier();
  }
  ASSERT_TRUE(Wait(*h).ok());
  EXPECT_EQ(a[0], static_cast<float>(N()));
  EXPECT_EQ(b[0], 1.0f);  // the rejected tensor was never touched
}

// A name stays reserved until its handle is waited, not only until its collective has run:
// with a fast core the first operation is usually complete before the caller submits the name
// again, and that second submission would never find a partner on the other ranks. For every
// operation kind (grouped forms too): the first one is complete (Poll says so), the second
// is still rejected; after Wait the name can be used again.
TEST(Core, DuplicateNameIsRejectedUntilItsHandleIsWaited) {
  std::vector<float> v(static_cast<size_t>(2 * N()), static_cast<float>(R() + 1));
  std::vector<float> out(v.size()), out2(v.size());
  const TensorShape full{2 * N()}, share{2};
  auto in = [&] { return View(v.data(), full); };
  struct Kind {
    const char* name;
    std::function<Result<Handle>(const std::string&)> submit;
  };
  const std::vector<Kind> kinds = {
      {"allreduce",
       [&](const std::string& n) {
         return EnqueueAllreduce(in(), View(out.data(), full), n, {ReduceOp::kSum});
       }},
      {"broadcast",
       [&](const std::string& n) {
         return EnqueueBroadcast(in(), View(out.data(), full), 0, n);
       }},
      {"allgather", [&](const std::string& n) { return EnqueueAllgather(in(), n); }},
      {"alltoall", [&](const std::string& n) { return EnqueueAlltoall(in(), {}, n); }},
      {"reducescatter",
       [&](const std::string& n) {
         return EnqueueReducescatter(in(), View(out.data(), share), n, {ReduceOp::kSum});
       }},
      {"grouped_allreduce",
       [&](const std::string& n) {
         return EnqueueGroupedAllreduce({in(), in()},
                                        {View(out.data(), full), View(out2.data(), full)}, n,
                                        {ReduceOp::kSum});
       }},
      {"grouped_allgather",
       [&](const std::string& n) { return EnqueueGroupedAllgather({in(), in()}, n); }},
      {"grouped_reducescatter",
       [&](const std::string& n) {
         return EnqueueGroupedReducescatter(
             {in(), in()}, {View(out.data(), share), View(out2.data(), share)}, n,
             {ReduceOp::kSum});
       }},
  };
  for (const Kind& kind : kinds) {
    const std::string name = std::string("reserved.") + kind.name;
    Result<Handle> first = kind.submit(name);
    ASSERT_TRUE(first.ok()) << first.status().ToString();
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!*Poll(*first) && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ASSERT_TRUE(*Poll(*first)) << kind.name << " did not complete";
    Result<Handle> again = kind.submit(name);
    ASSERT_FALSE(again.ok()) << kind.name << ": the second submission was accepted";
    EXPECT_EQ(again.status().code(), StatusCode::kFailedPrecondition) << kind.name;
    EXPECT_NE(again.status().message().find("already in flight"), std::string::npos)
        << again.status().message();
    ASSERT_TRUE(WaitOutputs(*first).ok()) << kind.name;
    // Waited: the name is free again, on every rank alike, and the operation pairs up.
    Result<Handle> third = kind.submit(name);
    ASSERT_TRUE(third.ok()) << kind.name << ": " << third.status().ToString();
    ASSERT_TRUE(WaitOutputs(*third).ok()) << kind.name;
  }
  EXPECT_EQ(GetStats()->reserved_names, 0u);
}

TEST(Core, AllreduceOnEitherSideOfGloosDirectExchangeBound) {
  // The Gloo backend exchanges every rank's block directly while a call's (N-1) x bytes is at
  // most 1 MiB, and runs Gloo's ring above that; buffers are reduced in chunks of at most 1 MiB.
  // Lengths below, at and just above the bound, and a few chunks long, with every op, enqueued
  // together (so fused too), against values computed here: they are multiples of 0.5 of small
  // magnitude, exact in float32 however the ranks' blocks are combined.
  const int64_t bound = (int64_t{1} << 20) / std::max(1, N() - 1) / 4;  // float32 elements
  const int64_t lengths[] = {3, bound, bound + 1, 3 * bound + 7};
  const ReduceOp ops[] = {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct};
  struct Case {
    ReduceOp op;
    std::vector<float> x;
    Handle handle;
  };
  std::vector<Case> cases;
  for (int64_t n : lengths) {
    for (ReduceOp op : ops) {
      Case c{op, std::vector<float>(static_cast<size_t>(n)), 0};
      for (int64_t i = 0; i < n; ++i) {
        c.x[static_cast<size_t>(i)] = static_cast<float>(Contribution(DataType::kFloat32, R(), i));
      }
      cases.push_back(std::move(c));
    }
  }
  for (Case& c : cases) {
    const int64_t n = static_cast<int64_t>(c.x.size());
    auto h = EnqueueAllreduce(View(c.x.data(), {n}), View(c.x.data(), {n}),
                              "bound." + std::to_string(n) + "." + ReduceOpName(c.op), {c.op});
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    c.handle = *h;
  }
  for (Case& c : cases) {
    ASSERT_TRUE(Wait(c.handle).ok());
    for (size_t i = 0; i < c.x.size(); ++i) {
      ASSERT_EQ(c.x[i], static_cast<float>(Expected(DataType::kFloat32, c.op, N(),
                                                    static_cast<int64_t>(i))))
          << ReduceOpName(c.op) << " length " << c.x.size() << " element " << i;
    }
  }
}

TEST(Core, FusionMergesSmallTensorsIntoFewCalls) {
  const Stats before = *GetStats();
  std::vector<std::vector<float>> t(100, std::vector<float>(16));
  std::vector<Handle> hs;
  for (int k = 0; k < 100; ++k) {
    std::fill(t[k].begin(), t[k].end(), static_cast<float>(R() * k));
    hs.push_back(*EnqueueAllreduce(View(t[k].data(), {16}), View(t[k].data(), {16}),
                                   "fusion." + std::to_string(k), {ReduceOp::kSum}));
  }
  for (Handle h : hs) ASSERT_TRUE(Wait(h).ok());
  for (int k = 0; k < 100; ++k) EXPECT_EQ(t[k][15], static_cast<float>(k * N() * (N() - 1) / 2));
  const uint64_t calls = GetStats()->allreduce_calls - before.allreduce_calls;
  if (R() == 0)
    std::printf("[rank 0] 100 small allreduces took %llu allreduce calls\n",
                static_cast<unsigned long long>(calls));
  const char* chunk = std::getenv("HOROVOD_COLLECTIVE_CHUNK_BYTES");
  if (EnvIs("HOROVOD_FUSION_THRESHOLD", "0")) {
    EXPECT_EQ(calls, 100u);
  } else if (chunk != nullptr && std::atoll(chunk) > 0) {
    // Fused buffers are reduced in chunks: at most one partial chunk per fused group (<= 25).
    const uint64_t bytes = 100 * 16 * sizeof(float), c = std::strtoull(chunk, nullptr, 10);
    EXPECT_LE(calls, (bytes + c - 1) / c + 25);
  } else {
    EXPECT_LE(calls, 25u);
  }
}

TEST(Core, OperationsAreAsynchronous) {
  // Nothing can complete before rank 0 enqueues, and rank 0 waits 200 ms first.
  std::vector<float> x(4, 1.0f);
  if (R() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  std::atomic<int> callbacks{0};
  Status seen = Status::Internal("callback never ran");
  auto h = EnqueueAllreduce(View(x.data(), {4}), View(x.data(), {4}), "async", {ReduceOp::kSum},
                            [&](const Status& s) {
                              seen = s;
                              ++callbacks;
                            });
  ASSERT_TRUE(h.ok());
  if (R() != 0) {
    EXPECT_FALSE(*Poll(*h));
  }
  ASSERT_TRUE(Wait(*h).ok());
  EXPECT_EQ(callbacks.load(), 1);
  EXPECT_TRUE(seen.ok());
  EXPECT_EQ(x[0], static_cast<float>(N()));
  EXPECT_EQ(Poll(*h).status().code(), StatusCode::kInvalidArgument);  // released by Wait
}

TEST(Core, BadInputIsRejectedLocallyWithAClearError) {
  std::vector<float> f(4, 1.0f);
  std::vector<float> g(5, 1.0f);
  bool flags[4] = {true, false, true, false};
  auto code_and_text = [](const Result<Handle>& r, const std::string& text) {
    EXPECT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().ToString();
    EXPECT_NE(r.status().message().find(text), std::string::npos) << r.status().message();
  };
  code_and_text(EnqueueAllreduce(TensorView{nullptr, DataType::kFloat32, {4}},
                                 TensorView{nullptr, DataType::kFloat32, {4}}, "bad.null"),
                "allreduce 'bad.null': tensor data pointer is null");
  code_and_text(EnqueueAllreduce(View(f.data(), {-1}), View(f.data(), {-1}), "bad.neg"),
                "negative dimension in shape [-1]");
  code_and_text(EnqueueAllreduce(View(f.data(), {4}), View(g.data(), {5}), "bad.shape"),
                "output shape [5] differs from input shape [4]");
  code_and_text(EnqueueAllreduce(View(flags, {4}), View(flags, {4}), "bad.bool"),
                "dtype bool is not supported for this operation");
  code_and_text(
      EnqueueAllreduce(View(f.data(), {4}), View(f.data(), {4}), "bad.adasum", {ReduceOp::kAdasum}),
      "Adasum is not supported");
  code_and_text(EnqueueAllreduce(View(f.data(), {4}), View(f.data(), {4}), "bad.set",
                                 {ReduceOp::kSum, 1.0, 1.0, 7}),
                "unknown process set 7");
  code_and_text(EnqueueAllreduce(View(f.data(), {4}), View(f.data(), {4}), "bad.nan",
                                 {ReduceOp::kSum, NAN, 1.0}),
                "must be finite");
  code_and_text(EnqueueBroadcast(View(f.data(), {4}), View(f.data(), {4}), N(), "bad.root"),
                "broadcast 'bad.root': root rank " + std::to_string(N()) + " is out of range");
  code_and_text(EnqueueBroadcast(View(f.data(), {4}), View(f.data(), {4}), -1, "bad.root2"),
                "root rank -1 is out of range");
  TensorView gpu = View(f.data(), {4});
  gpu.device = 0;
  if (NcclBuilt() == 0) {
    code_and_text(EnqueueAllreduce(gpu, gpu, "bad.gpu"),
                  "tensor is on GPU:0, but this horovod_cpp was built without NCCL");
  }
  TensorView odd = View(f.data(), {4});
  odd.device = -7;
  code_and_text(EnqueueAllreduce(odd, odd, "bad.device"), "invalid device -7");
  code_and_text(EnqueueAllreduce(View(f.data(), {4}), gpu, "bad.mixed"),
                "output is on GPU:0 but input is on CPU");
  // The process keeps working.
  ASSERT_TRUE(
      Allreduce(View(f.data(), {4}), View(f.data(), {4}), "bad.after", {ReduceOp::kSum}).ok());
  EXPECT_EQ(f[0], static_cast<float>(N()));
}

// More elements than an MPI count (a 32-bit int) can hold: 2^31 + 64 int8 values, reduced in
// place. Runs only where HVD_TEST_HUGE=1 (its own ctest entries at np=2: 2 GiB per rank), with
// the default chunking and with HOROVOD_COLLECTIVE_CHUNK_BYTES=0 (one call, which the MPI
// backend must split itself).
TEST(Core, HugeElementCountIsSplitIntoValidMpiCalls) {
  const char* huge = std::getenv("HVD_TEST_HUGE");
  if (huge == nullptr || std::string(huge) != "1") GTEST_SKIP() << "set HVD_TEST_HUGE=1";
  const int64_t n = (int64_t{1} << 31) + 64;
  std::vector<int8_t> x(static_cast<size_t>(n));
  // Rank r puts r + 1 everywhere, and marks the two ends and the 2^31 boundary with its rank.
  std::fill(x.begin(), x.end(), static_cast<int8_t>(R() + 1));
  const int64_t marks[] = {0, (int64_t{1} << 31) - 1, int64_t{1} << 31, n - 1};
  for (int64_t i : marks) x[static_cast<size_t>(i)] = static_cast<int8_t>(R());
  ASSERT_TRUE(Allreduce(View(x.data(), {n}), View(x.data(), {n}), "huge", {ReduceOp::kMax}).ok());
  for (int64_t i : marks) EXPECT_EQ(x[static_cast<size_t>(i)], N() - 1) << "index " << i;
  for (int64_t i : {int64_t{1}, int64_t{1} << 30, (int64_t{1} << 31) + 1, n - 2}) {
    EXPECT_EQ(x[static_cast<size_t>(i)], N()) << "index " << i;
  }
  int64_t wrong = 0;
  for (int64_t i = 0; i < n; ++i) wrong += x[static_cast<size_t>(i)] != N();
  EXPECT_EQ(wrong, 4);  // exactly the marks
}

TEST(Core, ScalarsEmptyTensorsAndUnnamedOps) {
  double scalar = R() + 1.0;
  ASSERT_TRUE(Allreduce(View(&scalar, {}), View(&scalar, {}), "scalar", {ReduceOp::kMax}).ok());
  EXPECT_EQ(scalar, static_cast<double>(N()));
  std::vector<float> empty;
  ASSERT_TRUE(Allreduce(TensorView{nullptr, DataType::kFloat32, {0, 3}},
                        TensorView{nullptr, DataType::kFloat32, {0, 3}}, "empty")
                  .ok());
  // Unnamed ops get per-process numbered names, the same on every rank.
  int32_t a = R(), b = 2 * R();
  ASSERT_TRUE(Allreduce(View(&a, {}), View(&a, {}), "", {ReduceOp::kSum}).ok());
  ASSERT_TRUE(Allreduce(View(&b, {}), View(&b, {}), "", {ReduceOp::kSum}).ok());
  EXPECT_EQ(a, N() * (N() - 1) / 2);
  EXPECT_EQ(b, N() * (N() - 1));
}

TEST(Core, BarrierWaitsForEveryRank) {
  // The last rank arrives 300 ms late; nobody may leave the barrier before it arrives.
  // (The previous test ended in a collective, so the ranks start this one nearly together.)
  const double start = MPI_Wtime();
  if (R() == N() - 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ASSERT_TRUE(Barrier().ok());
  EXPECT_GE(MPI_Wtime() - start, 0.25);
  ASSERT_TRUE(Barrier().ok());
}

}  // namespace
}  // namespace hvd
