// horovod_cpp — Apache-2.0
#include "common/execution/collective_layout.h"

#include <algorithm>

namespace hvd {

Layout LayoutOf(std::vector<int64_t> counts) {
  Layout l;
  l.displs = Displacements(counts);
  for (int64_t c : counts) l.total += c;
  l.counts = std::move(counts);
  return l;
}

Layout AllgatherTensor(const Response& r, size_t t, int set_size) {
  const size_t n = static_cast<size_t>(set_size);
  std::vector<int64_t> counts(n);
  for (size_t q = 0; q < n; ++q) counts[q] = r.rank_sizes[t * n + q] * r.tensor_sizes[t];
  return LayoutOf(std::move(counts));
}

Layout AllgatherFused(const Response& r, int set_size) {
  const size_t n = static_cast<size_t>(set_size);
  std::vector<int64_t> counts(n, 0);
  for (size_t q = 0; q < n; ++q) {
    for (size_t t = 0; t < r.tensor_sizes.size(); ++t) {
      counts[q] += r.rank_sizes[t * n + q] * r.tensor_sizes[t];
    }
  }
  return LayoutOf(std::move(counts));
}

int64_t AllgatherRows(const Response& r, size_t t, int set_size) {
  const size_t n = static_cast<size_t>(set_size);
  int64_t rows = 0;
  for (size_t q = 0; q < n; ++q) rows += r.rank_sizes[t * n + q];
  return rows;
}

AlltoallLayout AlltoallOf(const Response& r, int set_size, int set_rank) {
  const size_t n = static_cast<size_t>(set_size), me = static_cast<size_t>(set_rank);
  const int64_t row = r.tensor_sizes.front();
  // rank_sizes[q * n + d]: rows rank q of the set sends to rank d.
  std::vector<int64_t> send(n), recv(n);
  AlltoallLayout l;
  l.received_rows.resize(n);
  for (size_t d = 0; d < n; ++d) {
    send[d] = r.rank_sizes[me * n + d] * row;
    l.received_rows[d] = r.rank_sizes[d * n + me];
    recv[d] = l.received_rows[d] * row;
    l.rows_in += l.received_rows[d];
  }
  l.send = LayoutOf(std::move(send));
  l.recv = LayoutOf(std::move(recv));
  return l;
}

Layout ReducescatterTensor(const TensorShape& shape, int set_size) {
  return ReducescatterFused({shape}, set_size);
}

Layout ReducescatterFused(const std::vector<TensorShape>& shapes, int set_size) {
  std::vector<int64_t> counts(static_cast<size_t>(set_size), 0);
  for (int q = 0; q < set_size; ++q) {
    for (const TensorShape& shape : shapes) {
      counts[static_cast<size_t>(q)] +=
          ReducescatterRows(shape[0], set_size, q) * RowElements(shape);
    }
  }
  return LayoutOf(std::move(counts));
}

int RootInSet(const std::vector<int>& ranks, int root_rank) {
  return static_cast<int>(std::lower_bound(ranks.begin(), ranks.end(), root_rank) - ranks.begin());
}

}  // namespace hvd
