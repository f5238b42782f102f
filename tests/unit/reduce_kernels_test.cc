// horovod_cpp — Apache-2.0
#include "ops/reduce_kernels.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>

#include "ops/half.h"

namespace hvd {
namespace ops {
namespace {

// Reduces `ranks` buffers pairwise, as MPI does, and compares with a float64 reference.
template <float (*ToF)(uint16_t), uint16_t (*FromF)(float)>
void Check16BitReduction(DataType dtype, double unit_roundoff) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> dist(-100.0f, 100.0f);
  const int ranks = 4, n = 4096;
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct}) {
    std::vector<std::vector<uint16_t>> bufs(ranks, std::vector<uint16_t>(n));
    for (auto& b : bufs) {
      for (auto& x : b) {
        float v = dist(rng);
        if (op == ReduceOp::kProduct) v = 0.5f + std::fabs(v) / 100.0f;  // keep products small
        x = FromF(v);
      }
    }
    std::vector<uint16_t> acc = bufs[0];
    for (int r = 1; r < ranks; ++r) ReduceInto(acc.data(), bufs[r].data(), n, dtype, op);
    for (int i = 0; i < n; ++i) {
      double exact = ToF(bufs[0][i]), magnitude = std::fabs(exact);
      for (int r = 1; r < ranks; ++r) {
        const double v = ToF(bufs[r][i]);
        switch (op) {
          case ReduceOp::kSum:
            exact += v;
            magnitude += std::fabs(v);
            break;
          case ReduceOp::kMin:
            exact = std::min(exact, v);
            break;
          case ReduceOp::kMax:
            exact = std::max(exact, v);
            break;
          default:
            exact *= v;
            magnitude = std::fabs(exact);
            break;
        }
      }
      const double got = ToF(acc[i]);
      if (op == ReduceOp::kMin || op == ReduceOp::kMax) {
        ASSERT_EQ(got, exact) << "i=" << i;
      } else {
        // ranks-1 roundings, each at most one unit roundoff of the running magnitude.
        const double bound = (ranks - 1) * unit_roundoff * magnitude * 1.01 + 1e-30;
        ASSERT_LE(std::fabs(got - exact), bound) << "op " << ReduceOpName(op) << " i=" << i;
      }
    }
  }
}

TEST(ReduceKernels, Float16ReductionMatchesFloat64Reference) {
  Check16BitReduction<HalfToFloat, FloatToHalf>(DataType::kFloat16, std::ldexp(1.0, -11));
}

TEST(ReduceKernels, BFloat16ReductionMatchesFloat64Reference) {
  Check16BitReduction<BFloat16ToFloat, FloatToBFloat16>(DataType::kBFloat16, std::ldexp(1.0, -8));
}

// The vectorized conversions (F16C where the CPU has it) against the scalar ones: every half,
// and floats around every rounding boundary, subnormals, overflow and odd lengths (the tail).
TEST(ReduceKernels, VectorizedHalfConversionsMatchTheScalarOnesBitForBit) {
  std::vector<uint16_t> halves(65536 + 5);
  for (size_t i = 0; i < halves.size(); ++i) halves[i] = static_cast<uint16_t>(i);
  std::vector<float> floats(halves.size());
  HalvesToFloats(halves.data(), floats.data(), static_cast<int64_t>(halves.size()));
  for (size_t i = 0; i < halves.size(); ++i) {
    const float want = HalfToFloat(halves[i]);
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(floats[i])) << i;
    } else {
      ASSERT_EQ(std::memcmp(&floats[i], &want, sizeof want), 0) << i;
    }
  }
  std::mt19937 rng(7);
  std::vector<float> in;
  for (uint32_t h = 0; h < 0x7C00u; ++h) {  // each positive finite half and its neighbours
    const float f = HalfToFloat(static_cast<uint16_t>(h));
    for (float v : {f, std::nextafter(f, 0.0f), std::nextafter(f, 1e9f),
                    (f + HalfToFloat(static_cast<uint16_t>(h + 1))) / 2.0f}) {  // ties
      in.push_back(v);
      in.push_back(-v);
    }
  }
  for (int i = 0; i < 100000; ++i) {
    uint32_t bits = static_cast<uint32_t>(rng());
    float v;
    std::memcpy(&v, &bits, sizeof v);
    if (!std::isnan(v)) in.push_back(v);
  }
  in.push_back(65520.0f);  // rounds to infinity
  in.push_back(std::numeric_limits<float>::infinity());
  in.push_back(1e-8f);  // below half the smallest subnormal
  std::vector<uint16_t> out(in.size());
  for (int64_t len : {static_cast<int64_t>(in.size()), int64_t{7}, int64_t{13}}) {
    FloatsToHalves(in.data(), out.data(), len);
    for (int64_t i = 0; i < len; ++i) ASSERT_EQ(out[i], FloatToHalf(in[i])) << in[i];
  }
  std::printf("vectorized half conversions: %s\n", HalfConversionsVectorized() ? "F16C" : "scalar");
}

// The branch-free bfloat16 conversions against the scalar ones: every bfloat16, and floats around
// every rounding boundary (ties to even), NaNs (quieted), infinities and odd lengths.
TEST(ReduceKernels, VectorizedBFloat16ConversionsMatchTheScalarOnesBitForBit) {
  std::vector<uint16_t> bfs(65536 + 3);
  for (size_t i = 0; i < bfs.size(); ++i) bfs[i] = static_cast<uint16_t>(i);
  std::vector<float> floats(bfs.size());
  BFloat16sToFloats(bfs.data(), floats.data(), static_cast<int64_t>(bfs.size()));
  for (size_t i = 0; i < bfs.size(); ++i) {
    const float want = BFloat16ToFloat(bfs[i]);
    ASSERT_EQ(std::memcmp(&floats[i], &want, sizeof want), 0) << i;
  }
  std::vector<float> in;
  for (uint32_t b = 0; b < 0x10000u; ++b) {  // each bfloat16's bits with every low half pattern
    for (uint32_t low : {0x0000u, 0x0001u, 0x7FFFu, 0x8000u, 0x8001u, 0xFFFFu}) {
      const uint32_t bits = (b << 16) | low;
      float v;
      std::memcpy(&v, &bits, sizeof v);
      in.push_back(v);  // NaNs included: signalling ones must come back quiet, as the scalar
    }
  }
  std::vector<uint16_t> out(in.size());
  for (int64_t len : {static_cast<int64_t>(in.size()), int64_t{5}, int64_t{17}}) {
    FloatsToBFloat16s(in.data(), out.data(), len);
    for (int64_t i = 0; i < len; ++i) ASSERT_EQ(out[i], FloatToBFloat16(in[i])) << i;
  }
}

TEST(ReduceKernels, IntegerOps) {
  std::vector<int32_t> a = {1, -5, 7, 0}, b = {3, 2, -7, 9};
  std::vector<int32_t> x = a;
  ReduceInto(x.data(), b.data(), 4, DataType::kInt32, ReduceOp::kSum);
  EXPECT_EQ(x, (std::vector<int32_t>{4, -3, 0, 9}));
  x = a;
  ReduceInto(x.data(), b.data(), 4, DataType::kInt32, ReduceOp::kMin);
  EXPECT_EQ(x, (std::vector<int32_t>{1, -5, -7, 0}));
  x = a;
  ReduceInto(x.data(), b.data(), 4, DataType::kInt32, ReduceOp::kMax);
  EXPECT_EQ(x, (std::vector<int32_t>{3, 2, 7, 9}));
  x = a;
  ReduceInto(x.data(), b.data(), 4, DataType::kInt32, ReduceOp::kProduct);
  EXPECT_EQ(x, (std::vector<int32_t>{3, -10, -49, 0}));
  std::vector<uint8_t> u = {250, 3}, v = {10, 4};
  ReduceInto(u.data(), v.data(), 2, DataType::kUInt8, ReduceOp::kSum);
  EXPECT_EQ(u, (std::vector<uint8_t>{4, 7}));  // wraps like the C type
}

TEST(ReduceKernels, IntegerScalingTruncatesTowardZeroAndSaturates) {
  std::vector<int32_t> i32 = {-5, 5, 7, -7};
  ScaleBuffer(i32.data(), 4, DataType::kInt32, 0.5);
  EXPECT_EQ(i32, (std::vector<int32_t>{-2, 2, 3, -3}));
  std::vector<int8_t> i8 = {100, -100, 3};
  ScaleBuffer(i8.data(), 3, DataType::kInt8, 2.0);
  EXPECT_EQ(i8, (std::vector<int8_t>{127, -128, 6}));
  std::vector<uint8_t> u8 = {200, 3};
  ScaleBuffer(u8.data(), 2, DataType::kUInt8, -1.0);
  EXPECT_EQ(u8, (std::vector<uint8_t>{0, 0}));
  std::vector<int64_t> i64 = {INT64_MAX / 2 + 10};
  ScaleBuffer(i64.data(), 1, DataType::kInt64, 4.0);
  EXPECT_EQ(i64[0], INT64_MAX);
}

TEST(ReduceKernels, DivisionIsExactForIntegers) {
  // 6 * (1/3) in double is 1.9999999999999998: multiplying would truncate to 1.
  std::vector<int64_t> x = {6, -5, 5, 9, -9};
  DivideBuffer(x.data(), 5, DataType::kInt64, 3);
  EXPECT_EQ(x, (std::vector<int64_t>{2, -1, 1, 3, -3}));
  std::vector<int16_t> y = {-5, 5};
  DivideBuffer(y.data(), 2, DataType::kInt16, 2);
  EXPECT_EQ(y, (std::vector<int16_t>{-2, 2}));
  std::vector<double> d = {1.0, 2.0};
  DivideBuffer(d.data(), 2, DataType::kFloat64, 3);
  EXPECT_EQ(d[0], 1.0 / 3.0);
  std::vector<uint16_t> h = {FloatToHalf(3.0f)};
  DivideBuffer(h.data(), 1, DataType::kFloat16, 2);
  EXPECT_EQ(HalfToFloat(h[0]), 1.5f);
}

TEST(ReduceKernels, FloatScaling) {
  std::vector<float> f = {1.0f, -2.0f};
  ScaleBuffer(f.data(), 2, DataType::kFloat32, 0.25);
  EXPECT_EQ(f, (std::vector<float>{0.25f, -0.5f}));
  std::vector<uint16_t> b = {FloatToBFloat16(3.0f)};
  ScaleBuffer(b.data(), 1, DataType::kBFloat16, 2.0);
  EXPECT_EQ(BFloat16ToFloat(b[0]), 6.0f);
}

TEST(ReduceKernels, SquaredNormAccumulatesInDouble) {
  // 1e8 + 1 squared in float would lose the 1s; every length around the 4-way unrolling.
  for (int n : {0, 1, 3, 4, 5, 7, 8, 1001}) {
    std::vector<float> f(n);
    double expected = 0;
    for (int i = 0; i < n; ++i) {
      f[i] = (i % 3 == 0 ? -1.0f : 1.0f) * (0.5f + static_cast<float>(i));
      expected += static_cast<double>(f[i]) * static_cast<double>(f[i]);
    }
    EXPECT_EQ(SquaredNorm(f.data(), n, DataType::kFloat32), expected) << n;
    std::vector<float> copy(n, 7.0f);
    EXPECT_EQ(CopySquaredNorm(copy.data(), f.data(), n, DataType::kFloat32), expected) << n;
    EXPECT_EQ(copy, f);
  }
  std::vector<float> big = {1e4f, 1.0f};  // 1e8 + 1: exact in double, not in float
  EXPECT_EQ(SquaredNorm(big.data(), 2, DataType::kFloat32), 100000001.0);
  // 4097 x 4097^2 ~ 6.9e10 is exact in double; a float accumulator (24 bits) would round it.
  // Long enough for the vector loop (16 floats at a time) and its tail.
  std::vector<float> many(4097, 4097.0f), copy(4097);
  const double want = 4097.0 * 4097.0 * 4097.0;
  EXPECT_EQ(SquaredNorm(many.data(), 4097, DataType::kFloat32), want);
  EXPECT_EQ(CopySquaredNorm(copy.data(), many.data(), 4097, DataType::kFloat32), want);
  EXPECT_EQ(copy, many);
}

TEST(ReduceKernels, SquaredNormOfEveryDtype) {
  std::vector<double> d = {1.5, -2.0};
  EXPECT_EQ(SquaredNorm(d.data(), 2, DataType::kFloat64), 6.25);
  std::vector<int32_t> i = {-3, 4};
  EXPECT_EQ(SquaredNorm(i.data(), 2, DataType::kInt32), 25.0);
  std::vector<int8_t> i8 = {-128, 2};
  EXPECT_EQ(SquaredNorm(i8.data(), 2, DataType::kInt8), 16388.0);
  // Half types widen exactly; 600 of them cross the 512-element conversion block.
  std::vector<uint16_t> h(600), b(600), hc(600), bc(600);
  double expected = 0;
  for (int k = 0; k < 600; ++k) {
    const float v = static_cast<float>(k % 7) - 3.25f;  // exact in both half types
    h[k] = FloatToHalf(v);
    b[k] = FloatToBFloat16(v);
    expected += static_cast<double>(v) * v;
  }
  EXPECT_EQ(SquaredNorm(h.data(), 600, DataType::kFloat16), expected);
  EXPECT_EQ(SquaredNorm(b.data(), 600, DataType::kBFloat16), expected);
  EXPECT_EQ(CopySquaredNorm(hc.data(), h.data(), 600, DataType::kFloat16), expected);
  EXPECT_EQ(CopySquaredNorm(bc.data(), b.data(), 600, DataType::kBFloat16), expected);
  EXPECT_EQ(hc, h);
  EXPECT_EQ(bc, b);
}

TEST(ReduceKernels, DivideBufferSquaredNormIsDivideThenSquaredNorm) {
  for (int n : {0, 1, 7, 8, 9, 1000}) {
    std::vector<float> a(n), b;
    for (int i = 0; i < n; ++i) a[i] = static_cast<float>(i % 13) * 0.37f - 2.0f;
    b = a;
    const double norm = DivideBufferSquaredNorm(a.data(), n, DataType::kFloat32, 3);
    DivideBuffer(b.data(), n, DataType::kFloat32, 3);
    EXPECT_EQ(a, b) << n;  // the same float division, bit for bit
    const double want = SquaredNorm(b.data(), n, DataType::kFloat32);
    EXPECT_NEAR(norm, want, 1e-12 * want) << n;
  }
  std::vector<int32_t> k = {-7, 9};  // other dtypes: divide, then measure
  EXPECT_EQ(DivideBufferSquaredNorm(k.data(), 2, DataType::kInt32, 2), 9.0 + 16.0);
  EXPECT_EQ(k, (std::vector<int32_t>{-3, 4}));
}

}  // namespace
}  // namespace ops
}  // namespace hvd
