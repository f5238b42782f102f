// horovod_cpp — Apache-2.0
// Multi-rank tests of allgather, alltoall, reducescatter and grouped ops, for every dtype,
// against values computed independently here from what each rank contributes.

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "common/horovod.h"
#include "tests/mpi/test_util.h"

namespace hvd {
namespace {

using namespace test;  // NOLINT

constexpr int64_t kCols = 3;

// The value rank r puts at row i, column j of its tensor: small and exact in every dtype.
double Cell(DataType t, int r, int64_t i, int64_t j) {
  if (t == DataType::kBool) return (r + i + j) % 2;
  const double v = static_cast<double>((r * 7 + i * 3 + j) % 11);
  return IsUnsigned(t) || !IsFloatingPoint(t) ? v : v * 0.5;
}

std::vector<DataType> AllTypes() {
  std::vector<DataType> types(std::begin(kNumericTypes), std::end(kNumericTypes));
  types.push_back(DataType::kBool);
  return types;
}

// The suite runs on every host backend (ctest's _gloo_ and _ccl_ variants): make sure it runs
// on the one it was asked for, not on a fallback.
TEST(Backend, IsTheOneAskedFor) {
  const char* cpu = std::getenv("HOROVOD_CPU_OPERATIONS");
  const char* controller = std::getenv("HOROVOD_CONTROLLER");
  const std::string want = cpu != nullptr && std::string(cpu) == "ccl"         ? "oneCCL"
                           : controller != nullptr && std::string(controller) == "gloo" ? "Gloo"
                                                                                       : "MPI";
  EXPECT_EQ(*HostBackendName(), want);
}

TEST(Allgather, VariableFirstDimensionEveryDtype) {
  // Rank r contributes r + 1 rows; the result is every rank's rows, in rank order.
  const int64_t total_rows = N() * (N() + 1) / 2;
  std::vector<Buffer> ins;
  std::vector<Handle> hs;
  const std::vector<DataType> types = AllTypes();
  for (DataType t : types) ins.emplace_back(t, (R() + 1) * kCols);
  for (size_t k = 0; k < types.size(); ++k) {
    for (int64_t i = 0; i <= R(); ++i) {
      for (int64_t j = 0; j < kCols; ++j) ins[k].Set(i * kCols + j, Cell(types[k], R(), i, j));
    }
    auto h = EnqueueAllgather(ins[k].View({R() + 1, kCols}),
                              std::string("ag.") + DataTypeName(types[k]));
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    hs.push_back(*h);
  }
  for (size_t k = 0; k < types.size(); ++k) {
    Result<std::vector<Output>> out = WaitOutputs(hs[k]);
    ASSERT_TRUE(out.ok()) << out.status().ToString();
    ASSERT_EQ(out->size(), 1u);
    const Output& o = out->front();
    EXPECT_EQ(o.dtype, types[k]);
    ASSERT_EQ(o.shape, (TensorShape{total_rows, kCols}));
    int64_t row = 0;
    for (int r = 0; r < N(); ++r) {
      for (int64_t i = 0; i <= r; ++i, ++row) {
        for (int64_t j = 0; j < kCols; ++j) {
          ASSERT_EQ(ReadAs(types[k], o.data.get(), row * kCols + j), Cell(types[k], r, i, j))
              << DataTypeName(types[k]) << " rank " << r << " row " << i;
        }
      }
    }
  }
}

TEST(Allgather, IntoAGivenOutputOfTheResultsSizeWritesItThereAndOtherwiseNot) {
  // Rank r contributes r + 1 rows of 3; the output is the result's size (every rank knows
  // it): the result is the output itself. Small (fused with the next) and large (alone)
  // tensors; then an output one row short: the result in the runtime's buffer, the output
  // untouched, and every rank done (no rank waits).
  const int64_t rows = N() * (N() + 1) / 2;
  for (int64_t cols : {int64_t{3}, int64_t{1} << 18}) {
    std::vector<float> in((R() + 1) * cols), out(rows * cols, -1.0f), short_out(
        (rows - 1) * cols, -1.0f);
    for (size_t i = 0; i < in.size(); ++i) in[i] = R() * 1000.0f + static_cast<float>(i % 997);
    const std::string tag = std::to_string(cols);
    auto h1 = EnqueueAllgatherInto(View(in.data(), {R() + 1, cols}), View(out.data(), {rows, cols}),
                                   "into.fits." + tag);
    auto h2 = EnqueueAllgatherInto(View(in.data(), {R() + 1, cols}),
                                   View(short_out.data(), {rows - 1, cols}), "into.short." + tag);
    ASSERT_TRUE(h1.ok()) << h1.status().ToString();
    ASSERT_TRUE(h2.ok()) << h2.status().ToString();
    Result<std::vector<Output>> o1 = WaitOutputs(*h1), o2 = WaitOutputs(*h2);
    ASSERT_TRUE(o1.ok()) << o1.status().ToString();
    ASSERT_TRUE(o2.ok()) << o2.status().ToString();
    EXPECT_EQ(o1->front().data.get(), static_cast<void*>(out.data()));
    EXPECT_EQ(o1->front().shape, (TensorShape{rows, cols}));
    EXPECT_NE(o2->front().data.get(), static_cast<void*>(short_out.data()));
    int64_t row = 0;
    for (int r = 0; r < N(); ++r) {
      for (int64_t i = 0; i <= r; ++i, ++row) {
        for (int64_t j = 0; j < cols; j += cols > 3 ? 4099 : 1) {
          const float want = r * 1000.0f + static_cast<float>((i * cols + j) % 997);
          ASSERT_EQ(out[row * cols + j], want) << "rank " << r << " row " << i;
          ASSERT_EQ(static_cast<const float*>(o2->front().data.get())[row * cols + j], want);
        }
      }
    }
    for (float v : short_out) ASSERT_EQ(v, -1.0f);
  }
  // An output on another device than the input is refused at once, on the calling rank.
  std::vector<float> in(2), out(2 * N());
  TensorView device = View(out.data(), {2 * N()});
  device.device = 0;
  EXPECT_FALSE(EnqueueAllgatherInto(View(in.data(), {2}), device, "into.device").ok());
}

TEST(Allgather, ZeroRowsOnSomeRanksAndGroupedAllgather) {
  // Rank r contributes r rows (rank 0 none) to two tensors gathered as one group.
  std::vector<float> a(R() * 2), b(R() * 4);
  for (size_t i = 0; i < a.size(); ++i) a[i] = R() * 100.0f + i;
  for (size_t i = 0; i < b.size(); ++i) b[i] = -R() * 100.0f - i;
  auto h = EnqueueGroupedAllgather({View(a.data(), {R(), 2}), View(b.data(), {R(), 2, 2})}, "agg");
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  Result<std::vector<Output>> out = WaitOutputs(*h);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  ASSERT_EQ(out->size(), 2u);
  const int64_t rows = N() * (N() - 1) / 2;
  EXPECT_EQ((*out)[0].shape, (TensorShape{rows, 2}));
  EXPECT_EQ((*out)[1].shape, (TensorShape{rows, 2, 2}));
  const float* ga = static_cast<const float*>((*out)[0].data.get());
  const float* gb = static_cast<const float*>((*out)[1].data.get());
  int64_t pa = 0, pb = 0;
  for (int r = 0; r < N(); ++r) {
    for (int64_t i = 0; i < r * 2; ++i) ASSERT_EQ(ga[pa++], r * 100.0f + i);
    for (int64_t i = 0; i < r * 4; ++i) ASSERT_EQ(gb[pb++], -r * 100.0f - i);
  }
}

TEST(Allgather, AGroupMixingTensorsAboveAndBelowTheChunkSizeIsGatheredExactly) {
  // Tensors gathering to at least HOROVOD_COLLECTIVE_CHUNK_BYTES (1 MiB by default) go
  // straight into their results, the others through the fusion buffer, in one group: small,
  // big, small. Rank r contributes r + 1 rows.
  const int64_t big_cols = (int64_t{1} << 20) / 4 / N() + 1;  // > 1 MiB gathered
  std::vector<float> s1((R() + 1) * 3), big((R() + 1) * big_cols), s2((R() + 1) * 5);
  auto fill = [](std::vector<float>& v, float base) {
    for (size_t i = 0; i < v.size(); ++i) v[i] = base + static_cast<float>(i % 1000);
  };
  fill(s1, R() * 10000.0f);
  fill(big, -R() * 10000.0f);
  fill(s2, R() * 20000.0f + 7);
  auto h = EnqueueGroupedAllgather({View(s1.data(), {R() + 1, 3}),
                                    View(big.data(), {R() + 1, big_cols}),
                                    View(s2.data(), {R() + 1, 5})},
                                   "ag.mixed");
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  Result<std::vector<Output>> out = WaitOutputs(*h);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  ASSERT_EQ(out->size(), 3u);
  const int64_t rows = N() * (N() + 1) / 2;
  const int64_t cols[] = {3, big_cols, 5};
  const float base[] = {10000.0f, -10000.0f, 20000.0f};
  for (size_t t = 0; t < 3; ++t) {
    ASSERT_EQ((*out)[t].shape, (TensorShape{rows, cols[t]})) << "tensor " << t;
    const float* g = static_cast<const float*>((*out)[t].data.get());
    int64_t at = 0;
    for (int r = 0; r < N(); ++r) {
      for (int64_t i = 0; i < (r + 1) * cols[t]; ++i, ++at) {
        const float want = r * base[t] + (t == 2 ? 7 : 0) + static_cast<float>(i % 1000);
        ASSERT_EQ(g[at], want) << "tensor " << t << " rank " << r << " element " << i;
      }
    }
  }
}

TEST(Allgather, MismatchedTrailingDimensionsFailOnEveryRank) {
  std::vector<int32_t> x(2 * (R() + 2), 1);
  Result<Output> out = Allgather(View(x.data(), {2, R() + 2}), "ag.bad");
  ASSERT_FALSE(out.ok());
  std::string want = "allgather 'ag.bad': mismatched shapes beyond the first dimension: ";
  for (int r = 0; r < N(); ++r) {
    want += (r ? "; " : "") + std::string("rank ") + std::to_string(r) + " sent [*, " +
            std::to_string(r + 2) + "]";
  }
  EXPECT_EQ(out.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(out.status().message(), want);
  float scalar = 1;
  EXPECT_NE(EnqueueAllgather(View(&scalar, {}), "ag.scalar")
                .status()
                .message()
                .find("a scalar cannot be gathered"),
            std::string::npos);
}

TEST(Alltoall, EqualSplitsEveryDtype) {
  // Each rank sends 2 rows to every rank; row k of rank r goes to rank k / 2.
  const int64_t rows = 2 * N();
  for (DataType t : AllTypes()) {
    Buffer in(t, rows * kCols);
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t j = 0; j < kCols; ++j) in.Set(i * kCols + j, Cell(t, R(), i, j));
    }
    Result<Output> out =
        Alltoall(in.View({rows, kCols}), {}, std::string("a2a.") + DataTypeName(t));
    ASSERT_TRUE(out.ok()) << out.status().ToString();
    ASSERT_EQ(out->shape, (TensorShape{rows, kCols}));
    EXPECT_EQ(out->received_splits, std::vector<int64_t>(N(), 2));
    for (int src = 0; src < N(); ++src) {
      for (int64_t i = 0; i < 2; ++i) {
        const int64_t sent_row = 2 * R() + i;  // the rows src addressed to this rank
        for (int64_t j = 0; j < kCols; ++j) {
          ASSERT_EQ(ReadAs(t, out->data.get(), (2 * src + i) * kCols + j),
                    Cell(t, src, sent_row, j))
              << DataTypeName(t);
        }
      }
    }
  }
}

TEST(Alltoall, ExplicitUnevenSplits) {
  // Rank r sends (r + d) % 3 rows to rank d; the value of each row names sender and receiver.
  std::vector<int64_t> splits(N());
  int64_t rows = 0;
  for (int d = 0; d < N(); ++d) rows += splits[d] = (R() + d) % 3;
  std::vector<int64_t> data;
  for (int d = 0; d < N(); ++d) {
    for (int64_t i = 0; i < splits[d]; ++i) data.push_back(1000 * R() + 10 * d + i);
  }
  Result<Output> out = Alltoall(View(data.data(), {rows}), splits, "a2a.splits");
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  std::vector<int64_t> expect_splits, expect_data;
  for (int src = 0; src < N(); ++src) {
    const int64_t n = (src + R()) % 3;
    expect_splits.push_back(n);
    for (int64_t i = 0; i < n; ++i) expect_data.push_back(1000 * src + 10 * R() + i);
  }
  EXPECT_EQ(out->received_splits, expect_splits);
  ASSERT_EQ(out->shape, (TensorShape{static_cast<int64_t>(expect_data.size())}));
  const int64_t* got = static_cast<const int64_t*>(out->data.get());
  EXPECT_EQ(std::vector<int64_t>(got, got + expect_data.size()), expect_data);
}

TEST(Alltoall, BadSplitsAreRejectedLocally) {
  std::vector<float> x(2 * N() + 1, 1.0f);
  const int64_t odd = 2 * N() + 1;
  auto msg = [&](const std::vector<int64_t>& splits, int64_t rows) {
    return EnqueueAlltoall(View(x.data(), {rows}), splits, "a2a.bad").status().message();
  };
  EXPECT_EQ(msg({}, odd), "alltoall 'a2a.bad': splits not given, and the first dimension (" +
                              std::to_string(odd) + ") is not divisible by the " +
                              std::to_string(N()) +
                              " ranks of the process set; pass splits explicitly");
  EXPECT_EQ(msg({1}, 1), "alltoall 'a2a.bad': 1 splits given, but the process set has " +
                             std::to_string(N()) + " ranks");
  std::vector<int64_t> too_many(N(), 1);
  EXPECT_EQ(msg(too_many, odd), "alltoall 'a2a.bad': splits sum to " + std::to_string(N()) +
                                    ", but the first dimension is " + std::to_string(odd));
  std::vector<int64_t> negative(N(), 0);
  negative[0] = -1;
  EXPECT_EQ(msg(negative, 0), "alltoall 'a2a.bad': splits must not be negative");
}

// Reference reducescatter: rank `me` of N receives its rows of the sum over ranks.
double RsExpected(DataType t, int64_t i_global, int64_t j, bool average) {
  double sum = 0;
  for (int r = 0; r < N(); ++r) sum += Cell(t, r, i_global, j);
  if (!average) return sum;
  if (IsFloatingPoint(t)) return sum / N();
  return static_cast<double>(static_cast<int64_t>(sum) / N());
}

TEST(Reducescatter, UnevenRowsSumAndAverageEveryNumericDtype) {
  const int64_t rows = 2 * N() + 1;  // the first rank gets one extra row
  const int64_t my_rows = 2 + (R() == 0 ? 1 : 0);
  const int64_t first_row = R() == 0 ? 0 : 2 * R() + 1;
  for (DataType t : kNumericTypes) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage}) {
      Buffer in(t, rows * kCols), out(t, my_rows * kCols);
      for (int64_t i = 0; i < rows; ++i) {
        for (int64_t j = 0; j < kCols; ++j) in.Set(i * kCols + j, Cell(t, R(), i, j));
      }
      Result<TensorShape> shape = ReducescatterShape({rows, kCols});
      ASSERT_TRUE(shape.ok());
      ASSERT_EQ(*shape, (TensorShape{my_rows, kCols}));
      Status s = Reducescatter(in.View({rows, kCols}), out.View({my_rows, kCols}),
                               std::string("rs.") + DataTypeName(t) + "." + ReduceOpName(op), {op});
      ASSERT_TRUE(s.ok()) << s.ToString();
      for (int64_t i = 0; i < my_rows; ++i) {
        for (int64_t j = 0; j < kCols; ++j) {
          const double want = RsExpected(t, first_row + i, j, op == ReduceOp::kAverage);
          ASSERT_NEAR(out.Get(i * kCols + j), want, Tolerance(t, want))
              << DataTypeName(t) << " " << ReduceOpName(op) << " row " << i;
        }
      }
    }
  }
}

// Buffers of 1 MiB and more take the MPI backend's ring (ops/mpi_backend.cc); uneven rows,
// every numeric dtype, Sum and Average, against the same reference.
TEST(Reducescatter, LargeBuffersUnevenRowsEveryNumericDtype) {
  const int64_t rows = 2 * N() + 1, cols = int64_t{1} << 18;  // >= 1 MiB even for 1-byte types
  const int64_t my_rows = 2 + (R() == 0 ? 1 : 0);
  const int64_t first_row = R() == 0 ? 0 : 2 * R() + 1;
  for (DataType t : kNumericTypes) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage}) {
      Buffer in(t, rows * cols), out(t, my_rows * cols);
      for (int64_t i = 0; i < rows; ++i) {
        for (int64_t j = 0; j < cols; ++j) in.Set(i * cols + j, Cell(t, R(), i, j % kCols));
      }
      Status s = Reducescatter(in.View({rows, cols}), out.View({my_rows, cols}),
                               std::string("rs.big.") + DataTypeName(t) + "." + ReduceOpName(op),
                               {op});
      ASSERT_TRUE(s.ok()) << s.ToString();
      for (int64_t i = 0; i < my_rows; ++i) {
        for (int64_t j = 0; j < cols; j += 997) {  // a spread of columns in every row
          const double want = RsExpected(t, first_row + i, j % kCols, op == ReduceOp::kAverage);
          ASSERT_NEAR(out.Get(i * cols + j), want, Tolerance(t, want))
              << DataTypeName(t) << " " << ReduceOpName(op) << " row " << i << " col " << j;
        }
        const int64_t last = cols - 1;
        ASSERT_NEAR(out.Get(i * cols + last),
                    RsExpected(t, first_row + i, last % kCols, op == ReduceOp::kAverage),
                    Tolerance(t, RsExpected(t, first_row + i, last % kCols,
                                            op == ReduceOp::kAverage)));
      }
    }
  }
}

TEST(Reducescatter, FusedGroupedAndScaled) {
  // Three tensors of different heights in one group, with prescale 2 and postscale 0.5:
  // the factors cancel, so each output row is the plain sum.
  const std::vector<int64_t> heights = {1, N() + 2, 3 * N()};
  std::vector<std::vector<double>> ins, outs;
  std::vector<TensorView> in_views, out_views;
  for (size_t t = 0; t < heights.size(); ++t) {
    ins.emplace_back(heights[t] * 2);
    for (size_t k = 0; k < ins[t].size(); ++k) ins[t][k] = (R() + 1) * 1000.0 + t * 100 + k;
    const int64_t mine = heights[t] / N() + (R() < heights[t] % N() ? 1 : 0);
    outs.emplace_back(mine * 2, -1.0);
  }
  for (size_t t = 0; t < heights.size(); ++t) {
    in_views.push_back(View(ins[t].data(), {heights[t], 2}));
    out_views.push_back(View(outs[t].data(), {static_cast<int64_t>(outs[t].size() / 2), 2}));
  }
  auto h = EnqueueGroupedReducescatter(in_views, out_views, "rsg", {ReduceOp::kSum, 2.0, 0.5});
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  ASSERT_TRUE(Wait(*h).ok());
  const double rank_sum = N() * (N() + 1) / 2.0;
  for (size_t t = 0; t < heights.size(); ++t) {
    int64_t first = 0;
    for (int r = 0; r < R(); ++r) first += heights[t] / N() + (r < heights[t] % N() ? 1 : 0);
    for (size_t k = 0; k < outs[t].size(); ++k) {
      const double global_k = first * 2 + k;
      ASSERT_DOUBLE_EQ(outs[t][k], rank_sum * 1000.0 + N() * (t * 100 + global_k))
          << "tensor " << t << " element " << k;
    }
  }
}

TEST(Reducescatter, BadArgumentsAreRejectedLocally) {
  std::vector<float> x(8, 1.0f), y(8, 0.0f);
  auto s =
      EnqueueReducescatter(View(x.data(), {8}), View(y.data(), {8}), "rs.max", {ReduceOp::kMax});
  EXPECT_EQ(
      s.status().message(),
      "reducescatter 'rs.max': op Max is not supported; reducescatter supports Sum and Average");
  s = EnqueueReducescatter(View(x.data(), {}), View(y.data(), {}), "rs.scalar", {ReduceOp::kSum});
  EXPECT_NE(s.status().message().find("a scalar cannot be scattered"), std::string::npos);
  s = EnqueueReducescatter(View(x.data(), {8}), View(y.data(), {8}), "rs.shape", {ReduceOp::kSum});
  if (N() > 1) {
    EXPECT_NE(s.status().message().find("does not match this rank's share"), std::string::npos);
  }
}

TEST(Grouped, AllreduceGroupHasOneHandleAndExactResults) {
  std::vector<std::vector<float>> bufs(6);
  std::vector<TensorView> views;
  for (size_t t = 0; t < bufs.size(); ++t) {
    bufs[t].assign(t + 1, static_cast<float>((R() + 1) * (t + 1)));
    views.push_back(View(bufs[t].data(), {static_cast<int64_t>(t + 1)}));
  }
  const Stats before = *GetStats();
  auto h = EnqueueGroupedAllreduce(views, views, "gar", {ReduceOp::kSum});
  ASSERT_TRUE(h.ok());
  ASSERT_TRUE(Wait(*h).ok());
  for (size_t t = 0; t < bufs.size(); ++t) {
    EXPECT_EQ(bufs[t].back(), static_cast<float>(N() * (N() + 1) / 2 * (t + 1)));
  }
  if (!EnvIs("HOROVOD_FUSION_THRESHOLD", "0")) {
    EXPECT_EQ(GetStats()->allreduce_calls - before.allreduce_calls, 1u);  // released together
  }
  // A member name already in flight fails the whole group at enqueue.
  std::vector<float> z(1, 0.0f);
  auto h1 = EnqueueAllreduce(View(z.data(), {1}), View(z.data(), {1}), "dupgroup_0of2");
  ASSERT_TRUE(h1.ok());
  auto h2 = EnqueueGroupedAllreduce({View(z.data(), {1}), View(z.data(), {1})},
                                    {View(z.data(), {1}), View(z.data(), {1})}, "dupgroup");
  EXPECT_FALSE(h2.ok());
  ASSERT_TRUE(Wait(*h1).ok());
}

TEST(Broadcast, FromEveryRootForEveryOpsDtypeIncludingBool) {
  for (int root = 0; root < N(); ++root) {
    Buffer b(DataType::kBool, 9);
    for (int64_t i = 0; i < 9; ++i) b.Set(i, R() == root ? (i + root) % 2 : 0);
    ASSERT_TRUE(Broadcast(b.View(), b.View(), root, "bb." + std::to_string(root)).ok());
    for (int64_t i = 0; i < 9; ++i) ASSERT_EQ(b.Get(i), (i + root) % 2);
  }
}

}  // namespace
}  // namespace hvd
