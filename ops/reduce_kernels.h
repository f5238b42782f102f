// horovod_cpp — Apache-2.0
#pragma once
// CPU kernels on raw buffers: element-wise reduction of two buffers and in-place scaling,
// for every dtype. float16 and bfloat16 are computed in float32 and rounded once per element.
// Integer scaling truncates toward zero (Horovod's integer Average) and saturates at the
// type's limits instead of overflowing.

#include <cstdint>

#include "base/types.h"

namespace hvd {
namespace ops {

// inout[i] = op(inout[i], in[i]) for i < count. `op` is kSum, kMin, kMax or kProduct.
void ReduceInto(void* inout, const void* in, int64_t count, DataType dtype, ReduceOp op);

// buffer[i] *= factor. No-op for factor == 1 and for bool.
void ScaleBuffer(void* buffer, int64_t count, DataType dtype, double factor);

// buffer[i] /= divisor, exactly as the type divides: integers truncate toward zero
// (-5 / 2 == -2), floating types round once. Used for Average, where multiplying by 1/size
// would turn 6 * (1/3) into 1.999... and truncate it to 1.
void DivideBuffer(void* buffer, int64_t count, DataType dtype, int64_t divisor);

// The sum of squares of n elements, accumulated in float64 (float16 and bfloat16 widened
// exactly first). Integers count as their values; bool as 0 or 1. For the gradient
// statistics (common/state/grad_stats.h), computed on data the caller is touching anyway.
double SquaredNorm(const void* buffer, int64_t count, DataType dtype);
// Copies n elements from `src` to `dst` (which must not overlap) and returns their
// SquaredNorm, in one pass: the copy into or out of the fusion buffer that also measures.
double CopySquaredNorm(void* dst, const void* src, int64_t count, DataType dtype);
// DivideBuffer, then returns the result's SquaredNorm; one pass for float32 (the Average that
// finishes a reduction, measured as it is written).
double DivideBufferSquaredNorm(void* buffer, int64_t count, DataType dtype, int64_t divisor);

// float16 (as uint16_t) to and from float32 for n elements, as HalfToFloat and FloatToHalf
// (ops/half.h) give them, bit for bit except NaN payloads; with the CPU's F16C instructions
// where it has them (HalfConversionsVectorized()).
void HalvesToFloats(const uint16_t* src, float* dst, int64_t n);
void FloatsToHalves(const float* src, uint16_t* dst, int64_t n);
bool HalfConversionsVectorized();

// bfloat16 (as uint16_t) to and from float32 for n elements, as BFloat16ToFloat and
// FloatToBFloat16 (ops/half.h) give them, bit for bit; vectorized by the compiler, with an AVX2
// copy used where the CPU has AVX2.
void BFloat16sToFloats(const uint16_t* src, float* dst, int64_t n);
void FloatsToBFloat16s(const float* src, uint16_t* dst, int64_t n);

// Whether this CPU (and OS) runs AVX2 code: chooses the kernels' AVX2 copies (here and
// ops/low_rank.cc). false off x86.
bool CpuHasAvx2();

}  // namespace ops
}  // namespace hvd
