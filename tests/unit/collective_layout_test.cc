// horovod_cpp — Apache-2.0
// The layouts both executors use, against counts worked out by hand.

#include "common/execution/collective_layout.h"

#include <gtest/gtest.h>

#include <vector>

namespace hvd {
namespace {

using V = std::vector<int64_t>;

TEST(CollectiveLayout, AllgatherOfOneTensorCountsEachRanksRows) {
  // 3 ranks contribute 2, 0 and 5 rows of 4 elements.
  Response r;
  r.tensor_sizes = {4};
  r.rank_sizes = {2, 0, 5};
  const Layout l = AllgatherTensor(r, 0, 3);
  EXPECT_EQ(l.counts, (V{8, 0, 20}));
  EXPECT_EQ(l.displs, (V{0, 8, 8}));
  EXPECT_EQ(l.total, 28);
  EXPECT_EQ(AllgatherRows(r, 0, 3), 7);
}

TEST(CollectiveLayout, FusedAllgatherHasOneBlockPerRankWithEveryTensor) {
  // 2 ranks, 2 tensors: tensor 0 has rows of 3 (rank 0: 1 row, rank 1: 2 rows); tensor 1
  // rows of 2 (rank 0: 4 rows, rank 1: 0 rows). rank_sizes is tensor-major.
  Response r;
  r.tensor_sizes = {3, 2};
  r.rank_sizes = {1, 2, 4, 0};
  const Layout l = AllgatherFused(r, 2);
  EXPECT_EQ(l.counts, (V{1 * 3 + 4 * 2, 2 * 3 + 0}));
  EXPECT_EQ(l.displs, (V{0, 11}));
  EXPECT_EQ(l.total, 17);
  EXPECT_EQ(AllgatherTensor(r, 1, 2).counts, (V{8, 0}));
  EXPECT_EQ(AllgatherRows(r, 1, 2), 4);
}

TEST(CollectiveLayout, AlltoallSendsItsRowAndReceivesItsColumn) {
  // 3 ranks, rows of 2 elements; rank_sizes[q * 3 + d] = rows q sends to d.
  Response r;
  r.tensor_sizes = {2};
  r.rank_sizes = {1, 2, 3,   // rank 0 sends
                  4, 5, 6,   // rank 1
                  7, 8, 9};  // rank 2
  const AlltoallLayout l = AlltoallOf(r, 3, 1);
  EXPECT_EQ(l.send.counts, (V{8, 10, 12}));
  EXPECT_EQ(l.send.displs, (V{0, 8, 18}));
  EXPECT_EQ(l.received_rows, (V{2, 5, 8}));
  EXPECT_EQ(l.recv.counts, (V{4, 10, 16}));
  EXPECT_EQ(l.recv.displs, (V{0, 4, 14}));
  EXPECT_EQ(l.rows_in, 15);
}

TEST(CollectiveLayout, ReducescatterGivesTheFirstRanksTheExtraRows) {
  // 10 rows of 3 over 4 ranks: 3, 3, 2, 2 rows.
  const Layout one = ReducescatterTensor({10, 3}, 4);
  EXPECT_EQ(one.counts, (V{9, 9, 6, 6}));
  EXPECT_EQ(one.total, 30);
  // Fused with a [3] tensor (rows of 1): 1, 1, 1, 0 more elements, rank-major.
  const Layout fused = ReducescatterFused({{10, 3}, {3}}, 4);
  EXPECT_EQ(fused.counts, (V{10, 10, 7, 6}));
  EXPECT_EQ(fused.displs, (V{0, 10, 20, 27}));
}

TEST(CollectiveLayout, RootInSetIsThePositionOfTheGlobalRank) {
  EXPECT_EQ(RootInSet({1, 4, 6}, 4), 1);
  EXPECT_EQ(RootInSet({1, 4, 6}, 1), 0);
  EXPECT_EQ(RootInSet({0, 1, 2, 3}, 3), 3);
}

}  // namespace
}  // namespace hvd
