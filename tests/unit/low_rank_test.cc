// horovod_cpp — Apache-2.0
// PowerSGD's fused passes (ops/low_rank.h) against the same algebra in float64, written out
// here element by element, and for the same bits whatever the thread count.
#include "ops/low_rank.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <tuple>
#include <vector>

namespace hvd {
namespace ops {
namespace {

std::vector<float> Random(size_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(count);
  for (float& x : v) x = dist(rng);
  return v;
}

// |got - want| within a few float32 roundings of the terms' magnitude.
void ExpectClose(const std::vector<float>& got, const std::vector<double>& want,
                 const std::vector<double>& scale, const char* what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], 1e-6 * (1.0 + scale[i])) << what << " at " << i;
  }
}

class LowRankShapes : public ::testing::TestWithParam<std::tuple<int64_t, int64_t, int64_t>> {};

TEST_P(LowRankShapes, StartAddsTheErrorAndTakesPTransposed) {
  const auto [r, n, m] = GetParam();
  std::vector<float> matrix = Random(n * m, 1), error = Random(n * m, 2), qt = Random(r * m, 3);
  std::vector<double> sum(n * m), pt_want(r * n), pt_scale(r * n), ones(n * m, 0.0);
  for (int64_t i = 0; i < n * m; ++i) sum[i] = double(matrix[i]) + double(error[i]);
  for (int64_t k = 0; k < r; ++k) {
    for (int64_t i = 0; i < n; ++i) {
      double s = 0, a = 0;
      for (int64_t j = 0; j < m; ++j) {
        const double t = double(float(sum[i * m + j])) * qt[k * m + j];
        s += t;
        a += std::fabs(t);
      }
      pt_want[k * n + i] = s;
      pt_scale[k * n + i] = a;
    }
  }
  std::vector<float> pt(r * n, -1.0f);
  LowRankStart(matrix.data(), error.data(), qt.data(), r, n, m, pt.data(), 1);
  ExpectClose(matrix, sum, ones, "M + E");
  ExpectClose(pt, pt_want, pt_scale, "P^T");

  // Without an error: M unchanged, P^T = Q^T M^T.
  std::vector<float> again = Random(n * m, 1), pt2(r * n);
  const std::vector<float> before = again;
  LowRankStart(again.data(), nullptr, qt.data(), r, n, m, pt2.data(), 1);
  EXPECT_EQ(again, before);
  for (int64_t k = 0; k < r; ++k) {
    for (int64_t i = 0; i < n; ++i) {
      double s = 0, a = 0;
      for (int64_t j = 0; j < m; ++j) {
        s += double(before[i * m + j]) * qt[k * m + j];
        a += std::fabs(double(before[i * m + j]) * qt[k * m + j]);
      }
      ASSERT_NEAR(pt2[k * n + i], s, 1e-6 * (1.0 + a)) << k << "," << i;
    }
  }
}

TEST_P(LowRankShapes, FinishWritesPQTransposedAndLeavesTheErrorInM) {
  const auto [r, n, m] = GetParam();
  std::vector<float> matrix = Random(n * m, 4), pt = Random(r * n, 5), qt = Random(r * m, 6);
  std::vector<double> approx(n * m), error(n * m), scale(n * m);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < m; ++j) {
      double s = 0, a = 0;
      for (int64_t k = 0; k < r; ++k) {
        s += double(pt[k * n + i]) * qt[k * m + j];
        a += std::fabs(double(pt[k * n + i]) * qt[k * m + j]);
      }
      approx[i * m + j] = s;
      error[i * m + j] = matrix[i * m + j] - s;
      scale[i * m + j] = a + std::fabs(matrix[i * m + j]);
    }
  }
  std::vector<float> out(n * m, 7.0f), work = matrix;
  LowRankFinish(work.data(), pt.data(), qt.data(), r, n, m, out.data(), 1);
  ExpectClose(out, approx, scale, "P Q^T");
  ExpectClose(work, error, scale, "M - P Q^T");
  // The error is M minus exactly the gradient written, so nothing is lost between the two.
  for (int64_t i = 0; i < n * m; ++i) ASSERT_EQ(work[i], matrix[i] - out[i]) << i;

  // out == M: M becomes P Q^T (no error kept), the same bits as `out` above.
  std::vector<float> in_place = matrix;
  LowRankFinish(in_place.data(), pt.data(), qt.data(), r, n, m, in_place.data(), 1);
  EXPECT_EQ(in_place, out);
}

TEST_P(LowRankShapes, ThreadsGiveTheSameBits) {
  const auto [r, n, m] = GetParam();
  const std::vector<float> matrix = Random(n * m, 7), error = Random(n * m, 8),
                           qt = Random(r * m, 9);
  std::vector<float> m1 = matrix, p1(r * n), out1(n * m);
  LowRankStart(m1.data(), error.data(), qt.data(), r, n, m, p1.data(), 1);
  LowRankFinish(m1.data(), p1.data(), qt.data(), r, n, m, out1.data(), 1);
  for (int threads : {2, 3, 8}) {
    std::vector<float> mt = matrix, pt(r * n), outt(n * m);
    LowRankStart(mt.data(), error.data(), qt.data(), r, n, m, pt.data(), threads);
    LowRankFinish(mt.data(), pt.data(), qt.data(), r, n, m, outt.data(), threads);
    EXPECT_EQ(std::memcmp(pt.data(), p1.data(), p1.size() * sizeof(float)), 0) << threads;
    EXPECT_EQ(std::memcmp(outt.data(), out1.data(), out1.size() * sizeof(float)), 0) << threads;
    EXPECT_EQ(std::memcmp(mt.data(), m1.data(), m1.size() * sizeof(float)), 0) << threads;
  }
}

TEST(LowRankOrthogonalize, MakesTheRowsOrthonormalAsGramSchmidt) {
  const int64_t r = 4, n = 37;
  const std::vector<float> input = Random(r * n, 10);
  std::vector<float> rows = input;
  LowRankOrthogonalize(rows.data(), r, n, 0.0);
  // Orthonormal: rows . rows^T = I.
  for (int64_t a = 0; a < r; ++a) {
    for (int64_t b = 0; b < r; ++b) {
      double s = 0;
      for (int64_t j = 0; j < n; ++j) s += double(rows[a * n + j]) * rows[b * n + j];
      EXPECT_NEAR(s, a == b ? 1.0 : 0.0, 1e-6) << a << "," << b;
    }
  }
  // Gram-Schmidt: row 0 is input row 0 over its norm; row 1 is input row 1 less its part along
  // row 0, normalized.
  double norm0 = 0;
  for (int64_t j = 0; j < n; ++j) norm0 += double(input[j]) * input[j];
  norm0 = std::sqrt(norm0);
  for (int64_t j = 0; j < n; ++j) ASSERT_NEAR(rows[j], input[j] / norm0, 1e-6) << j;
  double c = 0, norm1 = 0;
  for (int64_t j = 0; j < n; ++j) c += double(input[n + j]) * input[j] / norm0;
  std::vector<double> r1(n);
  for (int64_t j = 0; j < n; ++j) {
    r1[j] = input[n + j] - c * input[j] / norm0;
    norm1 += r1[j] * r1[j];
  }
  for (int64_t j = 0; j < n; ++j) ASSERT_NEAR(rows[n + j], r1[j] / std::sqrt(norm1), 1e-5) << j;
}

TEST(LowRankOrthogonalize, AZeroRowStaysZeroAndEpsilonDivides) {
  const int64_t n = 5;
  std::vector<float> rows = {0, 0, 0, 0, 0, 3, 4, 0, 0, 0};
  LowRankOrthogonalize(rows.data(), 2, n, 0.0);
  EXPECT_EQ(rows, (std::vector<float>{0, 0, 0, 0, 0, 0.6f, 0.8f, 0, 0, 0}));
  std::vector<float> one = {3, 4, 0, 0, 0};
  LowRankOrthogonalize(one.data(), 1, n, 5.0);  // divided by |row| + epsilon = 10
  EXPECT_FLOAT_EQ(one[0], 0.3f);
  EXPECT_FLOAT_EQ(one[1], 0.4f);
}

// Ranks 1-4; rows and columns that are not multiples of the 8 lanes; matrices large enough to
// be split among threads (>= 64 Ki elements a thread) and small ones that are not.
INSTANTIATE_TEST_SUITE_P(Shapes, LowRankShapes,
                         ::testing::Values(std::make_tuple(1, 1, 1), std::make_tuple(1, 3, 13),
                                           std::make_tuple(2, 37, 9), std::make_tuple(3, 64, 64),
                                           std::make_tuple(4, 5, 1031),
                                           std::make_tuple(1, 700, 301),
                                           std::make_tuple(4, 513, 520)));

}  // namespace
}  // namespace ops
}  // namespace hvd
