// horovod_cpp — Apache-2.0
#pragma once
// What the LibTorch C++ API's sources share (torch.cc, torch_stage3.cc); not installed.

#include <torch/torch.h>

#include <string>
#include <utility>
#include <vector>

#include "bindings/torch.h"

namespace hvd {
namespace torch {
namespace internal {

[[noreturn]] inline void Throw(const Status& s) { throw Error(s); }

inline void Check(const Status& s) {
  if (!s.ok()) Throw(s);
}

template <typename T>
T Get(Result<T> r) {
  if (!r.ok()) Throw(r.status());
  return std::move(r).value();
}

// [start, end) of rank `rank` of `size` in a flat buffer of `length` elements: reducescatter's
// split (the first length % size ranks one element more).
inline std::pair<int64_t, int64_t> ShardRange(int64_t length, int size, int rank) {
  const int64_t base = length / size, rem = length % size;
  const int64_t start = rank * base + std::min<int64_t>(rank, rem);
  return {start, start + base + (rank < rem ? 1 : 0)};
}

inline int64_t Bytes(const ::torch::Tensor& t) {
  return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0;
}

// Clips the slices' gradients by the norm of the whole gradient (one scalar allreduce over the
// process set, named `name`); returns that norm.
double ClipSlicesByGlobalNorm(const std::vector<::torch::Tensor>& slices, double max_norm,
                              double norm_type, int32_t process_set_id, const std::string& name);

// Bytes of SGD's and Adam(W)'s state buffers in `optimizer`.
int64_t OptimizerStateBytes(const ::torch::optim::Optimizer& optimizer);

}  // namespace internal
}  // namespace torch
}  // namespace hvd
