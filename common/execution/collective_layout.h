// horovod_cpp — Apache-2.0
#pragma once
// Where each rank's part of an agreed collective lies, in elements: the one copy of this
// arithmetic, used by the host executor (op_executor.cc) and the device executor
// (op_executor_device.cc) alike. Everything here is a pure function of the agreed Response
// (and, for reducescatter, the tensors' shapes), so every rank computes the same layout.

#include <cstdint>
#include <vector>

#include "base/types.h"
#include "common/protocol/message.h"

namespace hvd {

// Per-rank counts (elements), where each starts (exclusive prefix sums), and their total.
struct Layout {
  std::vector<int64_t> counts;
  std::vector<int64_t> displs;
  int64_t total = 0;
};
Layout LayoutOf(std::vector<int64_t> counts);

// Allgather, tensor `t` of `r` on its own: rank q contributes r.rank_sizes[t * n + q] rows of
// r.tensor_sizes[t] elements.
Layout AllgatherTensor(const Response& r, size_t t, int set_size);
// A fused allgather: one block per rank holding that rank's rows of every tensor in turn.
Layout AllgatherFused(const Response& r, int set_size);
// Rows of dim 0 of tensor t once gathered (the sum over ranks).
int64_t AllgatherRows(const Response& r, size_t t, int set_size);

// Alltoall of the one tensor of `r` as seen by `set_rank`: what it sends to and receives from
// each rank (elements), and the rows it receives from each (the output's received splits).
struct AlltoallLayout {
  Layout send;
  Layout recv;
  std::vector<int64_t> received_rows;
  int64_t rows_in = 0;
};
AlltoallLayout AlltoallOf(const Response& r, int set_size, int set_rank);

// Reducescatter of one tensor of `shape`: the elements each rank receives (ReducescatterRows
// rows of it, the first dim0 % size ranks one more).
Layout ReducescatterTensor(const TensorShape& shape, int set_size);
// Fused: rank-major, so rank q's rows of every tensor are contiguous in the send buffer.
Layout ReducescatterFused(const std::vector<TensorShape>& shapes, int set_size);

// The position of global rank `root_rank` in the set's (ascending) `ranks`.
int RootInSet(const std::vector<int>& ranks, int root_rank);

}  // namespace hvd
