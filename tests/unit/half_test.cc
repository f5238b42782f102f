// horovod_cpp — Apache-2.0
// float16/bfloat16 conversions against independent references: GCC's _Float16 for float16,
// and a nearest-value search in double precision for bfloat16.
#include "ops/half.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

namespace hvd {
namespace ops {
namespace {

// The compiler's own float16 is the reference; clang before 15 has none on x86 (the
// thread-safety build uses clang 14), and GCC, which every other build uses, has it.
#if defined(__FLT16_MANT_DIG__)
#define HVD_REF_FLOAT16 1
uint16_t RefFloatToHalf(float f) {
  _Float16 h = static_cast<_Float16>(f);
  uint16_t bits;
  std::memcpy(&bits, &h, 2);
  return bits;
}

float RefHalfToFloat(uint16_t bits) {
  _Float16 h;
  std::memcpy(&h, &bits, 2);
  return static_cast<float>(h);
}
#else
#define HVD_REF_FLOAT16 0
uint16_t RefFloatToHalf(float) { return 0; }
float RefHalfToFloat(uint16_t) { return 0; }
#endif

#define HVD_NEEDS_REF_FLOAT16() \
  if (!HVD_REF_FLOAT16) GTEST_SKIP() << "this compiler has no _Float16 to compare with"

uint32_t Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

float FromBits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

TEST(Half, EveryHalfValueConvertsToTheSameFloatAsTheCompiler) {
  HVD_NEEDS_REF_FLOAT16();
  for (uint32_t h = 0; h <= 0xFFFF; ++h) {
    const float ours = HalfToFloat(static_cast<uint16_t>(h));
    const float ref = RefHalfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(ref)) {
      EXPECT_TRUE(std::isnan(ours)) << std::hex << h;
    } else {
      EXPECT_EQ(Bits(ours), Bits(ref)) << std::hex << h;  // bitwise: keeps -0
    }
  }
}

TEST(Half, EveryHalfRoundTrips) {
  HVD_NEEDS_REF_FLOAT16();
  for (uint32_t h = 0; h <= 0xFFFF; ++h) {
    if (std::isnan(RefHalfToFloat(static_cast<uint16_t>(h)))) continue;
    EXPECT_EQ(FloatToHalf(HalfToFloat(static_cast<uint16_t>(h))), h) << std::hex << h;
  }
}

TEST(Half, FloatToHalfRoundsToNearestEvenLikeTheCompiler) {
  HVD_NEEDS_REF_FLOAT16();
  std::mt19937 rng(7);
  std::vector<float> samples;
  // Exact midpoints between neighbouring halves (ties) and their float neighbours.
  for (uint32_t h = 0; h < 0x7C00; h += 7) {
    const double lo = HalfToFloat(static_cast<uint16_t>(h));
    const double hi = HalfToFloat(static_cast<uint16_t>(h + 1));
    const float mid = static_cast<float>((lo + hi) / 2);
    samples.push_back(mid);
    samples.push_back(std::nextafter(mid, 0.0f));
    samples.push_back(std::nextafter(mid, 1e30f));
  }
  for (int i = 0; i < 1000000; ++i) samples.push_back(FromBits(static_cast<uint32_t>(rng())));
  for (float f : {0.0f, -0.0f, 65504.0f, 65519.99f, 65520.0f, 1e-8f, 2.98e-8f, 5.96e-8f, 6.1e-5f,
                  INFINITY, -INFINITY}) {
    samples.push_back(f);
  }
  for (float f : samples) {
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(f))));
      continue;
    }
    ASSERT_EQ(FloatToHalf(f), RefFloatToHalf(f)) << "f=" << f << " bits=" << std::hex << Bits(f);
  }
}

// bfloat16 reference: the nearest of the two neighbouring bfloat16 values, computed in double;
// ties go to the even one; beyond the largest finite value, infinity counts as 2^128.
uint16_t RefFloatToBFloat16(float f) {
  const uint32_t x = Bits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t ax = x & 0x7FFFFFFFu;
  const uint16_t lo = static_cast<uint16_t>(ax >> 16);
  const uint16_t hi = static_cast<uint16_t>(lo + 1);
  auto value = [](uint16_t b) {
    return b == 0x7F80 ? std::ldexp(1.0, 128) : static_cast<double>(FromBits(uint32_t{b} << 16));
  };
  const double v = FromBits(ax);
  const double dlo = v - value(lo), dhi = value(hi) - v;
  uint16_t pick = dlo < dhi ? lo : dhi < dlo ? hi : ((lo & 1) ? hi : lo);
  return static_cast<uint16_t>(sign | pick);
}

TEST(BFloat16, RoundsToNearestEven) {
  std::mt19937 rng(11);
  for (int i = 0; i < 1000000; ++i) {
    uint32_t x = static_cast<uint32_t>(rng());
    if ((x & 0x7F800000u) == 0x7F800000u) continue;   // inf/NaN checked below
    if (i % 4 == 0) x = (x & 0xFFFF0000u) | 0x8000u;  // exact ties
    const float f = FromBits(x);
    ASSERT_EQ(FloatToBFloat16(f), RefFloatToBFloat16(f)) << std::hex << x;
  }
  EXPECT_EQ(FloatToBFloat16(INFINITY), 0x7F80);
  EXPECT_EQ(FloatToBFloat16(-INFINITY), 0xFF80);
  EXPECT_TRUE(std::isnan(BFloat16ToFloat(FloatToBFloat16(NAN))));
  EXPECT_EQ(BFloat16ToFloat(0x3F80), 1.0f);
  EXPECT_EQ(BFloat16ToFloat(0xC040), -3.0f);
}

}  // namespace
}  // namespace ops
}  // namespace hvd
