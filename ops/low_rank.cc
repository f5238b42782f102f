// horovod_cpp — Apache-2.0
#include "ops/low_rank.h"

#include <algorithm>
#include <cmath>
#include <system_error>
#include <thread>
#include <vector>

#include "ops/reduce_kernels.h"

// This file is compiled with -O3 -ffp-contract=off (CMakeLists.txt): loops vectorized, and no
// multiply-add contracted into an FMA, which would round differently from CPUs without one.

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define HVD_LOW_RANK_AVX2 1
#endif

namespace hvd {
namespace ops {
namespace {

// The sum of a[j] * b[j] in a fixed order whatever the vector width: eight running sums (lane
// j % 8), added pairwise, then the tail in order.
__attribute__((always_inline)) inline float Dot(const float* a, const float* b, int64_t m) {
  float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  int64_t j = 0;
  for (; j + 8 <= m; j += 8) {
    for (int l = 0; l < 8; ++l) acc[l] += a[j + l] * b[j + l];
  }
  float s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
  for (; j < m; ++j) s += a[j] * b[j];
  return s;
}

__attribute__((always_inline)) inline void StartRows(float* matrix, const float* error,
                                                     const float* qt, int64_t r, int64_t n,
                                                     int64_t m, float* pt, int64_t begin,
                                                     int64_t end) {
  for (int64_t i = begin; i < end; ++i) {
    float* row = matrix + i * m;
    if (error != nullptr) {
      const float* e = error + i * m;
      for (int64_t j = 0; j < m; ++j) row[j] += e[j];
    }
    for (int64_t k = 0; k < r; ++k) pt[k * n + i] = Dot(row, qt + k * m, m);
  }
}

__attribute__((always_inline)) inline void FinishRows(float* matrix, const float* pt,
                                                      const float* qt, int64_t r, int64_t n,
                                                      int64_t m, float* out, int64_t begin,
                                                      int64_t end) {
  for (int64_t i = begin; i < end; ++i) {
    float* g = out + i * m;
    const float p0 = pt[i];
    for (int64_t j = 0; j < m; ++j) g[j] = p0 * qt[j];
    for (int64_t k = 1; k < r; ++k) {
      const float pk = pt[k * n + i];
      const float* q = qt + k * m;
      for (int64_t j = 0; j < m; ++j) g[j] += pk * q[j];
    }
    if (out != matrix) {
      float* row = matrix + i * m;
      for (int64_t j = 0; j < m; ++j) row[j] -= g[j];
    }
  }
}

void StartGeneric(float* matrix, const float* error, const float* qt, int64_t r, int64_t n,
                  int64_t m, float* pt, int64_t begin, int64_t end) {
  StartRows(matrix, error, qt, r, n, m, pt, begin, end);
}

void FinishGeneric(float* matrix, const float* pt, const float* qt, int64_t r, int64_t n,
                   int64_t m, float* out, int64_t begin, int64_t end) {
  FinishRows(matrix, pt, qt, r, n, m, out, begin, end);
}

#ifdef HVD_LOW_RANK_AVX2
// The same loops compiled for AVX2 (without FMA): the same operations in the same order, on
// 8 lanes; worth it where the matrix is in cache and the rank is above 1.
__attribute__((target("avx2"))) void StartAvx2(float* matrix, const float* error,
                                               const float* qt, int64_t r, int64_t n, int64_t m,
                                               float* pt, int64_t begin, int64_t end) {
  StartRows(matrix, error, qt, r, n, m, pt, begin, end);
}

__attribute__((target("avx2"))) void FinishAvx2(float* matrix, const float* pt, const float* qt,
                                                int64_t r, int64_t n, int64_t m, float* out,
                                                int64_t begin, int64_t end) {
  FinishRows(matrix, pt, qt, r, n, m, out, begin, end);
}
#endif

#ifdef HVD_LOW_RANK_AVX2
#define HVD_AVX2_OR_NULL(kernel) (kernel)
#else
#define HVD_AVX2_OR_NULL(kernel) nullptr
#endif

// The AVX2 copy of a kernel where there is one and the CPU has AVX2, else the generic one.
template <typename Kernel>
Kernel* Pick(Kernel* generic, Kernel* avx2) {
#ifdef HVD_LOW_RANK_AVX2
  if (avx2 != nullptr && CpuHasAvx2()) return avx2;
#endif
  (void)avx2;
  return generic;
}

// Runs body(begin, end) over row blocks: on the calling thread alone unless `threads` > 1 and
// each thread gets at least 64 Ki elements (a thread's start costs tens of microseconds).
template <typename Body>
void ForRowBlocks(int64_t n, int64_t m, int threads, Body body) {
  constexpr int64_t kMinElementsPerThread = int64_t{1} << 16;
  const int64_t useful = std::min<int64_t>(n, (n * m) / kMinElementsPerThread);
  const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>(threads, useful));
  if (blocks == 1) {
    body(0, n);
    return;
  }
  std::vector<std::thread> workers;
  workers.reserve(static_cast<size_t>(blocks - 1));
  int64_t b = 1;
  for (; b < blocks; ++b) {
    try {
      workers.emplace_back(body, b * n / blocks, (b + 1) * n / blocks);
    } catch (const std::system_error&) {
      break;  // no thread to be had: the rest on this one
    }
  }
  body(0, n / blocks);
  for (int64_t rest = b; rest < blocks; ++rest) body(rest * n / blocks, (rest + 1) * n / blocks);
  for (std::thread& w : workers) w.join();
}

}  // namespace

void LowRankOrthogonalize(float* rows, int64_t r, int64_t n, double epsilon) {
  auto dot = [n](const float* a, const float* b) {
    double s = 0.0;
    for (int64_t j = 0; j < n; ++j) s += static_cast<double>(a[j]) * b[j];
    return s;
  };
  for (int64_t i = 0; i < r; ++i) {
    float* row = rows + i * n;
    const double norm = std::sqrt(dot(row, row));
    if (norm == 0.0) continue;  // a zero column stays zero (not NaN), whatever epsilon
    const float divisor = static_cast<float>(norm + epsilon);
    for (int64_t j = 0; j < n; ++j) row[j] /= divisor;
    for (int64_t k = i + 1; k < r; ++k) {
      float* other = rows + k * n;
      const float c = static_cast<float>(dot(other, row));
      for (int64_t j = 0; j < n; ++j) other[j] -= c * row[j];
    }
  }
}

void LowRankStart(float* matrix, const float* error, const float* qt, int64_t r, int64_t n,
                  int64_t m, float* pt, int threads) {
  if (n <= 0 || m <= 0 || r <= 0) return;
  auto start = Pick(&StartGeneric, HVD_AVX2_OR_NULL(&StartAvx2));
  ForRowBlocks(n, m, threads, [=](int64_t begin, int64_t end) {
    start(matrix, error, qt, r, n, m, pt, begin, end);
  });
}

void LowRankFinish(float* matrix, const float* pt, const float* qt, int64_t r, int64_t n,
                   int64_t m, float* out, int threads) {
  if (n <= 0 || m <= 0 || r <= 0) return;
  auto finish = Pick(&FinishGeneric, HVD_AVX2_OR_NULL(&FinishAvx2));
  ForRowBlocks(n, m, threads, [=](int64_t begin, int64_t end) {
    finish(matrix, pt, qt, r, n, m, out, begin, end);
  });
}

}  // namespace ops
}  // namespace hvd
