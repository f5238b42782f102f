// horovod_cpp — Apache-2.0
#pragma once
// PowerSGD's passes over a gradient matrix, fused (docs/compression.md). With error feedback a
// compressed step used to pass over each n x m matrix M about nine times: M += E, P = M Q,
// Q = M^T P, the product P Q^T written to a new tensor, then M - P Q^T read it back. These two
// kernels do the first and last of those in one pass each (the middle product stays with the
// BLAS), and write the gradient into a buffer the caller keeps, so a step allocates nothing:
//
//   LowRankStart:  M += E (when E is given), then P^T = Q^T M^T, row by row while the row is
//                  in cache;
//   LowRankFinish: out = P Q^T, and M -= out (M then holds the new error) unless out is M.
//
// float32, row-major, contiguous; P and Q travel transposed (r x n and r x m, contiguous), as
// the Python and C++ optimizers hold them. Results are the same bits on every x86-64 CPU (and
// for any `threads`): sums in a fixed order, no fused multiply-add, an AVX2 copy where the CPU
// has it that performs the same operations. `threads` > 1 splits the rows among that many
// threads (the caller's intra-op thread count) when the matrix is large enough to pay.

#include <cstdint>

namespace hvd {
namespace ops {

// Gram-Schmidt on the r rows (each n long, contiguous) of `rows`, in place: each row divided
// by its norm + epsilon, then taken out of the rows after it. Sums in float64, in order; a row
// of zeros stays zero. (P and Q travel transposed, so their columns are these rows.) Called
// once per matrix for P and Q: in the core it costs a few microseconds, as torch's
// norm/item/div/mv/outer it cost ~0.1 ms a call here.
void LowRankOrthogonalize(float* rows, int64_t r, int64_t n, double epsilon);

void LowRankStart(float* matrix, const float* error, const float* qt, int64_t r, int64_t n,
                  int64_t m, float* pt, int threads);

void LowRankFinish(float* matrix, const float* pt, const float* qt, int64_t r, int64_t n,
                   int64_t m, float* out, int threads);

}  // namespace ops
}  // namespace hvd
