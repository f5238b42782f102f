// horovod_cpp — Apache-2.0
#include "ops/reduce_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "ops/half.h"

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <immintrin.h>
// x86 with GCC or clang: the F16C and AVX2 copies of the conversions, chosen at run time.
#define HVD_X86_KERNEL_COPIES 1
#endif

namespace hvd {
namespace ops {

#ifdef HVD_X86_KERNEL_COPIES
// float16 <-> float32 with the F16C instructions (8 per instruction, round to nearest even, as
// FloatToHalf; subnormals exact): the scalar conversions' branches made an fp16-compressed
// allreduce twice as slow as an uncompressed one at 10 Gbit/s (docs/compression.md). Compiled
// for F16C whatever the build's flags, and used only where the CPU has it.
namespace {
__attribute__((target("avx,f16c"))) void HalvesToFloatsF16C(const uint16_t* src, float* dst,
                                                             int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(dst + i,
                     _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  }
  for (; i < n; ++i) dst[i] = HalfToFloat(src[i]);
}

__attribute__((target("avx,f16c"))) void FloatsToHalvesF16C(const float* src, uint16_t* dst,
                                                             int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
  }
  for (; i < n; ++i) dst[i] = FloatToHalf(src[i]);
}
}  // namespace

namespace {
// CPUID leaf 1: F16C and AVX, and the OS saving the YMM registers (OSXSAVE, then XCR0's SSE
// and AVX bits). Not __builtin_cpu_supports("f16c"), which clang 14 does not know.
bool CpuHasF16C() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return false;
  constexpr unsigned kOsxsave = 1u << 27, kAvx = 1u << 28, kF16c = 1u << 29;
  if ((ecx & (kOsxsave | kAvx | kF16c)) != (kOsxsave | kAvx | kF16c)) return false;
  unsigned xcr0_lo = 0, xcr0_hi = 0;
  __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  return (xcr0_lo & 6u) == 6u;
}
}  // namespace

bool HalfConversionsVectorized() {
  static const bool yes = CpuHasF16C();
  return yes;
}
#else
bool HalfConversionsVectorized() { return false; }
#endif

void HalvesToFloats(const uint16_t* src, float* dst, int64_t n) {
#ifdef HVD_X86_KERNEL_COPIES
  if (HalfConversionsVectorized()) return HalvesToFloatsF16C(src, dst, n);
#endif
  for (int64_t i = 0; i < n; ++i) dst[i] = HalfToFloat(src[i]);
}

void FloatsToHalves(const float* src, uint16_t* dst, int64_t n) {
#ifdef HVD_X86_KERNEL_COPIES
  if (HalfConversionsVectorized()) return FloatsToHalvesF16C(src, dst, n);
#endif
  for (int64_t i = 0; i < n; ++i) dst[i] = FloatToHalf(src[i]);
}

// bfloat16 <-> float32 as BFloat16ToFloat and FloatToBFloat16 (ops/half.h), bit for bit, written
// without branches so that the compiler vectorizes them (the scalar loop with its NaN branch made
// a bfloat16 allreduce as slow as a float32 one of twice the bytes). The NaN test compares as
// signed integers (both sides are below 2^31), which SSE2 and AVX2 have.
namespace {
__attribute__((always_inline)) inline void BFloat16sToFloatsLoop(const uint16_t* src, float* dst,
                                                                int64_t n) {
  static_assert(sizeof(float) == sizeof(uint32_t), "float is 32 bits");
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t bits = static_cast<uint32_t>(src[i]) << 16;
    std::memcpy(dst + i, &bits, sizeof bits);
  }
}

__attribute__((always_inline)) inline void FloatsToBFloat16sLoop(const float* src, uint16_t* dst,
                                                                int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    uint32_t x;
    std::memcpy(&x, src + i, sizeof x);
    const uint32_t rounded = (x + 0x7FFFu + ((x >> 16) & 1u)) >> 16;  // to nearest even
    const uint32_t quiet_nan = (x >> 16) | 0x40u;
    const bool nan = static_cast<int32_t>(x & 0x7FFFFFFFu) > 0x7F800000;
    dst[i] = static_cast<uint16_t>(nan ? quiet_nan : rounded);
  }
}

#ifdef HVD_X86_KERNEL_COPIES
// The same loops on 8 lanes where the CPU has AVX2 (the baseline build has 4: SSE2); ~2x on
// the conversions of a bfloat16 reduction.
__attribute__((target("avx2"))) void BFloat16sToFloatsAvx2(const uint16_t* src, float* dst,
                                                           int64_t n) {
  BFloat16sToFloatsLoop(src, dst, n);
}

__attribute__((target("avx2"))) void FloatsToBFloat16sAvx2(const float* src, uint16_t* dst,
                                                           int64_t n) {
  FloatsToBFloat16sLoop(src, dst, n);
}
#endif
}  // namespace

bool CpuHasAvx2() {
#ifdef HVD_X86_KERNEL_COPIES
  static const bool yes = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") != 0;
  }();
  return yes;
#else
  return false;
#endif
}

void BFloat16sToFloats(const uint16_t* src, float* dst, int64_t n) {
#ifdef HVD_X86_KERNEL_COPIES
  if (CpuHasAvx2()) return BFloat16sToFloatsAvx2(src, dst, n);
#endif
  BFloat16sToFloatsLoop(src, dst, n);
}

void FloatsToBFloat16s(const float* src, uint16_t* dst, int64_t n) {
#ifdef HVD_X86_KERNEL_COPIES
  if (CpuHasAvx2()) return FloatsToBFloat16sAvx2(src, dst, n);
#endif
  FloatsToBFloat16sLoop(src, dst, n);
}

namespace {

template <typename T>
void ReduceTyped(T* inout, const T* in, int64_t n, ReduceOp op) {
  // One switch outside the loop so each loop body vectorises.
  switch (op) {
    case ReduceOp::kMin:
      for (int64_t i = 0; i < n; ++i) inout[i] = std::min(inout[i], in[i]);
      break;
    case ReduceOp::kMax:
      for (int64_t i = 0; i < n; ++i) inout[i] = std::max(inout[i], in[i]);
      break;
    case ReduceOp::kProduct:
      for (int64_t i = 0; i < n; ++i) inout[i] = static_cast<T>(inout[i] * in[i]);
      break;
    default:
      for (int64_t i = 0; i < n; ++i) inout[i] = static_cast<T>(inout[i] + in[i]);
      break;
  }
}

// float16 or bfloat16 through float32 in blocks that stay in L1: the same float operation and
// one rounding per element as converting each element on its own, so the same bits (NaN
// payloads aside), with conversions and operation vectorized.
template <void (*ToFloats)(const uint16_t*, float*, int64_t),
          void (*FromFloats)(const float*, uint16_t*, int64_t), typename FloatOp>
void ThroughFloats(uint16_t* inout, const uint16_t* in, int64_t n, FloatOp op) {
  constexpr int64_t kBlock = 512;
  float a[kBlock], b[kBlock];
  for (int64_t start = 0; start < n; start += kBlock) {
    const int64_t m = std::min(kBlock, n - start);
    ToFloats(inout + start, a, m);
    if (in != nullptr) ToFloats(in + start, b, m);
    op(a, b, m);
    FromFloats(a, inout + start, m);
  }
}

template <typename FloatOp>
void ThroughFloats16(DataType dtype, uint16_t* inout, const uint16_t* in, int64_t n, FloatOp op) {
  if (dtype == DataType::kFloat16) {
    ThroughFloats<HalvesToFloats, FloatsToHalves>(inout, in, n, op);
  } else {
    ThroughFloats<BFloat16sToFloats, FloatsToBFloat16s>(inout, in, n, op);
  }
}

template <typename T>
void ScaleTyped(T* buf, int64_t n, double factor) {
  if constexpr (std::is_floating_point_v<T>) {
    const T f = static_cast<T>(factor);
    for (int64_t i = 0; i < n; ++i) buf[i] *= f;
  } else {
    // Saturate before converting: an out-of-range float-to-int conversion is undefined.
    // (For int64, `hi` rounds up to 2^63, hence >= rather than >.)
    constexpr double lo = static_cast<double>(std::numeric_limits<T>::min());
    constexpr double hi = static_cast<double>(std::numeric_limits<T>::max());
    for (int64_t i = 0; i < n; ++i) {
      const double v = factor * static_cast<double>(buf[i]);
      if (v >= hi) {
        buf[i] = std::numeric_limits<T>::max();
      } else if (v <= lo) {
        buf[i] = std::numeric_limits<T>::min();
      } else {
        buf[i] = static_cast<T>(v);  // truncates toward zero
      }
    }
  }
}

template <typename T>
void DivideTyped(T* buf, int64_t n, int64_t divisor) {
  const T d = static_cast<T>(divisor);
  for (int64_t i = 0; i < n; ++i) buf[i] = static_cast<T>(buf[i] / d);
}

// Calls f(TypeTag<T>{}) with the C++ storage type of `dtype`; float16 and bfloat16 (stored as
// uint16_t) get a tag of their own so that the callee converts them through float32.
struct Half16Tag {};
template <typename T>
struct TypeTag {
  using type = T;
};

template <typename F>
void VisitType(DataType dtype, F&& f) {
  switch (dtype) {
    case DataType::kUInt8:
      return f(TypeTag<uint8_t>{});
    case DataType::kInt8:
      return f(TypeTag<int8_t>{});
    case DataType::kUInt16:
      return f(TypeTag<uint16_t>{});
    case DataType::kInt16:
      return f(TypeTag<int16_t>{});
    case DataType::kInt32:
      return f(TypeTag<int32_t>{});
    case DataType::kInt64:
      return f(TypeTag<int64_t>{});
    case DataType::kFloat32:
      return f(TypeTag<float>{});
    case DataType::kFloat64:
      return f(TypeTag<double>{});
    case DataType::kBool:
      return f(TypeTag<bool>{});
    case DataType::kFloat16:
    case DataType::kBFloat16:
      return f(TypeTag<Half16Tag>{});
  }
}

#ifdef HVD_X86_KERNEL_COPIES
// float32 squares summed in float64 on AVX2 + FMA: 16 floats per iteration widened to doubles
// into four accumulators (a scalar loop cannot be vectorised: it would reorder the sum).
bool CpuHasAvx2Fma() {
  static const bool yes = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") != 0 && __builtin_cpu_supports("fma") != 0;
  }();
  return yes;
}

template <bool kCopy>
__attribute__((target("avx2,fma"))) double FloatSquaresAvx2(float* dst, const float* src,
                                                            int64_t n) {
  __m256d acc[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(),
                    _mm256_setzero_pd()};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 x = _mm256_loadu_ps(src + i), y = _mm256_loadu_ps(src + i + 8);
    if constexpr (kCopy) {
      _mm256_storeu_ps(dst + i, x);
      _mm256_storeu_ps(dst + i + 8, y);
    }
    const __m256d w[4] = {_mm256_cvtps_pd(_mm256_castps256_ps128(x)),
                          _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1)),
                          _mm256_cvtps_pd(_mm256_castps256_ps128(y)),
                          _mm256_cvtps_pd(_mm256_extractf128_ps(y, 1))};
    for (int k = 0; k < 4; ++k) acc[k] = _mm256_fmadd_pd(w[k], w[k], acc[k]);
  }
  alignas(32) double lanes[4];
  _mm256_store_pd(lanes, _mm256_add_pd(_mm256_add_pd(acc[0], acc[1]),
                                       _mm256_add_pd(acc[2], acc[3])));
  double total = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
  for (; i < n; ++i) {
    if constexpr (kCopy) dst[i] = src[i];
    total += static_cast<double>(src[i]) * static_cast<double>(src[i]);
  }
  return total;
}
#endif

#ifdef HVD_X86_KERNEL_COPIES
// buf[i] /= d (exactly as DivideTyped: one float division) and the squares of the results.
__attribute__((target("avx2,fma"))) double FloatDivideSquaresAvx2(float* buf, int64_t n,
                                                                  float d) {
  const __m256 vd = _mm256_set1_ps(d);
  __m256d acc[2] = {_mm256_setzero_pd(), _mm256_setzero_pd()};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_div_ps(_mm256_loadu_ps(buf + i), vd);
    _mm256_storeu_ps(buf + i, x);
    const __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(x));
    const __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
    acc[0] = _mm256_fmadd_pd(lo, lo, acc[0]);
    acc[1] = _mm256_fmadd_pd(hi, hi, acc[1]);
  }
  alignas(32) double lanes[4];
  _mm256_store_pd(lanes, _mm256_add_pd(acc[0], acc[1]));
  double total = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
  for (; i < n; ++i) {
    buf[i] = buf[i] / d;
    total += static_cast<double>(buf[i]) * static_cast<double>(buf[i]);
  }
  return total;
}
#endif

// Sum of squares in float64, with four independent accumulators so that the loop is not one
// chain of dependent additions; when `dst` is set, each element is also stored there.
template <typename T>
double SquaresTyped(T* dst, const T* src, int64_t n) {
  double acc[4] = {0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    for (int k = 0; k < 4; ++k) {
      const T v = src[i + k];
      if (dst != nullptr) dst[i + k] = v;
      const double d = static_cast<double>(v);
      acc[k] += d * d;
    }
  }
  for (; i < n; ++i) {
    const T v = src[i];
    if (dst != nullptr) dst[i] = v;
    const double d = static_cast<double>(v);
    acc[0] += d * d;
  }
  return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

double Squares(void* dst, const void* src, int64_t n, DataType dtype) {
  double total = 0;
  VisitType(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_same_v<T, Half16Tag>) {
      // Widened in L1-sized blocks (exact), copied as the raw 16-bit values.
      constexpr int64_t kBlock = 512;
      float a[kBlock];
      const auto* in = static_cast<const uint16_t*>(src);
      auto* out = static_cast<uint16_t*>(dst);
      for (int64_t start = 0; start < n; start += kBlock) {
        const int64_t m = std::min(kBlock, n - start);
        if (out != nullptr) std::memcpy(out + start, in + start, static_cast<size_t>(m) * 2);
        if (dtype == DataType::kFloat16) {
          HalvesToFloats(in + start, a, m);
        } else {
          BFloat16sToFloats(in + start, a, m);
        }
        total += SquaresTyped<float>(nullptr, a, m);
      }
    } else if constexpr (std::is_same_v<T, bool>) {
      total = SquaresTyped(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), n);
#ifdef HVD_X86_KERNEL_COPIES
    } else if constexpr (std::is_same_v<T, float>) {
      const auto* in = static_cast<const float*>(src);
      auto* out = static_cast<float*>(dst);
      if (!CpuHasAvx2Fma()) {
        total = SquaresTyped(out, in, n);
      } else if (out != nullptr) {
        total = FloatSquaresAvx2<true>(out, in, n);
      } else {
        total = FloatSquaresAvx2<false>(nullptr, in, n);
      }
#endif
    } else {
      total = SquaresTyped(static_cast<T*>(dst), static_cast<const T*>(src), n);
    }
  });
  return total;
}

}  // namespace

void ReduceInto(void* inout, const void* in, int64_t n, DataType dtype, ReduceOp op) {
  VisitType(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_same_v<T, Half16Tag>) {
      ThroughFloats16(dtype, static_cast<uint16_t*>(inout), static_cast<const uint16_t*>(in), n,
                      [op](float* a, const float* b, int64_t m) { ReduceTyped(a, b, m, op); });
    } else if constexpr (std::is_same_v<T, bool>) {  // as bytes (the API rejects bool reductions)
      ReduceTyped(static_cast<uint8_t*>(inout), static_cast<const uint8_t*>(in), n, op);
    } else {
      ReduceTyped(static_cast<T*>(inout), static_cast<const T*>(in), n, op);
    }
  });
}

void ScaleBuffer(void* buf, int64_t n, DataType dtype, double factor) {
  if (factor == 1.0) return;
  VisitType(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_same_v<T, Half16Tag>) {
      ThroughFloats16(dtype, static_cast<uint16_t*>(buf), nullptr, n,
                      [factor](float* a, const float*, int64_t m) { ScaleTyped(a, m, factor); });
    } else if constexpr (!std::is_same_v<T, bool>) {  // scaling a bool means nothing
      ScaleTyped(static_cast<T*>(buf), n, factor);
    }
  });
}

void DivideBuffer(void* buf, int64_t n, DataType dtype, int64_t divisor) {
  if (divisor == 1) return;
  VisitType(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_same_v<T, Half16Tag>) {
      ThroughFloats16(dtype, static_cast<uint16_t*>(buf), nullptr, n,
                      [divisor](float* a, const float*, int64_t m) { DivideTyped(a, m, divisor); });
    } else if constexpr (!std::is_same_v<T, bool>) {
      DivideTyped(static_cast<T*>(buf), n, divisor);
    }
  });
}

double SquaredNorm(const void* buf, int64_t n, DataType dtype) {
  return Squares(nullptr, buf, n, dtype);
}

double CopySquaredNorm(void* dst, const void* src, int64_t n, DataType dtype) {
  return Squares(dst, src, n, dtype);
}

double DivideBufferSquaredNorm(void* buf, int64_t n, DataType dtype, int64_t divisor) {
#ifdef HVD_X86_KERNEL_COPIES
  if (dtype == DataType::kFloat32 && CpuHasAvx2Fma()) {
    return FloatDivideSquaresAvx2(static_cast<float*>(buf), n, static_cast<float>(divisor));
  }
#endif
  DivideBuffer(buf, n, dtype, divisor);
  return SquaredNorm(buf, n, dtype);
}

}  // namespace ops
}  // namespace hvd
