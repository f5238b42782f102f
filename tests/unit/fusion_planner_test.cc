// horovod_cpp — Apache-2.0
#include "common/execution/fusion_planner.h"

#include <gtest/gtest.h>

namespace hvd {
namespace {

Response Ar(const std::string& name, int64_t elems, DataType dtype = DataType::kFloat32,
            ReduceOp op = ReduceOp::kSum, double pre = 1.0, double post = 1.0) {
  Response r;
  r.type = OpType::kAllreduce;
  r.dtype = dtype;
  r.reduce_op = op;
  r.prescale_factor = pre;
  r.postscale_factor = post;
  r.tensor_names = {name};
  r.tensor_sizes = {elems};
  return r;
}

Response Bc(const std::string& name, int64_t elems, int root) {
  Response r = Ar(name, elems);
  r.type = OpType::kBroadcast;
  r.root_rank = root;
  return r;
}

Response Barrier() {
  Response r;
  r.type = OpType::kBarrier;
  r.tensor_names = {"barrier.0"};
  return r;
}

std::vector<std::vector<std::string>> Groups(const std::vector<Response>& rs) {
  std::vector<std::vector<std::string>> out;
  for (const Response& r : rs) out.push_back(r.tensor_names);
  return out;
}

using G = std::vector<std::vector<std::string>>;

TEST(FusionPlanner, FusesCompatibleTensorsUpToThreshold) {
  // 4 floats = 16 bytes each; threshold 40 bytes fits two.
  auto fused = FuseResponses({Ar("a", 4), Ar("b", 4), Ar("c", 4), Ar("d", 4), Ar("e", 4)}, 40);
  EXPECT_EQ(Groups(fused), (G{{"a", "b"}, {"c", "d"}, {"e"}}));
  EXPECT_EQ(fused[0].tensor_sizes, (std::vector<int64_t>{4, 4}));
  EXPECT_EQ(ResponseBytes(fused[0]), 32);
}

TEST(FusionPlanner, ExactThresholdFits) {
  EXPECT_EQ(Groups(FuseResponses({Ar("a", 4), Ar("b", 4)}, 32)), (G{{"a", "b"}}));
  EXPECT_EQ(Groups(FuseResponses({Ar("a", 4), Ar("b", 4)}, 31)), (G{{"a"}, {"b"}}));
}

TEST(FusionPlanner, ZeroThresholdDisablesFusion) {
  EXPECT_EQ(Groups(FuseResponses({Ar("a", 1), Ar("b", 1)}, 0)), (G{{"a"}, {"b"}}));
}

TEST(FusionPlanner, GroupsByDtypeOpAndScaleWithLookAhead) {
  auto fused = FuseResponses({Ar("f1", 1), Ar("d1", 1, DataType::kFloat64), Ar("f2", 1),
                              Ar("avg", 1, DataType::kFloat32, ReduceOp::kAverage),
                              Ar("pre", 1, DataType::kFloat32, ReduceOp::kSum, 0.5),
                              Ar("post", 1, DataType::kFloat32, ReduceOp::kSum, 1.0, 2.0),
                              Ar("d2", 1, DataType::kFloat64), Ar("f3", 1)},
                             1 << 20);
  EXPECT_EQ(Groups(fused), (G{{"f1", "f2", "f3"}, {"d1", "d2"}, {"avg"}, {"pre"}, {"post"}}));
  EXPECT_EQ(fused[1].dtype, DataType::kFloat64);
}

TEST(FusionPlanner, OversizedTensorGoesAloneAndLaterOnesStillFuse) {
  EXPECT_EQ(Groups(FuseResponses({Ar("small", 2), Ar("huge", 1000), Ar("small2", 2)}, 64)),
            (G{{"small", "small2"}, {"huge"}}));
}

TEST(FusionPlanner, BroadcastsFuseOnlyWithTheSameRoot) {
  EXPECT_EQ(Groups(FuseResponses({Bc("a", 1, 0), Bc("b", 1, 1), Bc("c", 1, 0), Ar("x", 1)}, 1024)),
            (G{{"a", "c"}, {"b"}, {"x"}}));
}

TEST(FusionPlanner, BarrierClosesOpenGroups) {
  EXPECT_EQ(Groups(FuseResponses({Ar("a", 1), Barrier(), Ar("b", 1), Ar("c", 1)}, 1024)),
            (G{{"a"}, {"barrier.0"}, {"b", "c"}}));
}

TEST(FusionPlanner, ErrorsAreNeverFused) {
  Response e = Ar("bad", 1);
  e.type = OpType::kError;
  EXPECT_EQ(Groups(FuseResponses({Ar("a", 1), e, Ar("b", 1)}, 1024)), (G{{"a", "b"}, {"bad"}}));
}

Response Ag(const std::string& name, int64_t row, std::vector<int64_t> dims) {
  Response r = Ar(name, row);
  r.type = OpType::kAllgather;
  r.rank_sizes = std::move(dims);
  return r;
}

TEST(FusionPlanner, AllgathersFuseAndCountEveryRanksRows) {
  // 2 ranks; bytes = row * (rows of rank 0 + rows of rank 1) * 4.
  Response a = Ag("a", 3, {1, 2}), b = Ag("b", 2, {4, 0}), c = Ag("c", 1, {100, 100});
  EXPECT_EQ(ResponseBytes(a), 3 * 3 * 4);
  auto fused = FuseResponses({a, b, c}, 100);
  EXPECT_EQ(Groups(fused), (G{{"a", "b"}, {"c"}}));
  EXPECT_EQ(fused[0].tensor_sizes, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(fused[0].rank_sizes, (std::vector<int64_t>{1, 2, 4, 0}));
  EXPECT_EQ(ResponseBytes(fused[0]), (9 + 8) * 4);
}

TEST(FusionPlanner, ReducescattersFuseByOpAlltoallsNever) {
  Response r1 = Ar("r1", 4), r2 = Ar("r2", 4),
           r3 = Ar("r3", 4, DataType::kFloat32, ReduceOp::kAverage);
  r1.type = r2.type = r3.type = OpType::kReducescatter;
  Response t1 = Ag("t1", 1, {1, 1, 1, 1}), t2 = Ag("t2", 1, {1, 1, 1, 1});
  t1.type = t2.type = OpType::kAlltoall;
  EXPECT_EQ(Groups(FuseResponses({r1, t1, r2, r3, t2}, 1024)),
            (G{{"r1", "r2"}, {"t1"}, {"r3"}, {"t2"}}));
}

TEST(FusionPlanner, ProcessSetChangesAndJoinAreFences) {
  Response add;
  add.type = OpType::kProcessSetAdd;
  add.tensor_names = {"add"};
  Response join;
  join.type = OpType::kJoin;
  join.tensor_names = {"join"};
  EXPECT_EQ(Groups(FuseResponses({Ar("a", 1), add, Ar("b", 1), join, Ar("c", 1)}, 1024)),
            (G{{"a"}, {"add"}, {"b"}, {"join"}, {"c"}}));
}

TEST(FusionPlanner, SameNameInDifferentSetsIsNotFusedTogether) {
  Response a = Ar("g", 1), b = Ar("g", 1);
  b.process_set_id = 1;
  EXPECT_EQ(FuseResponses({a, b}, 1024).size(), 2u);
}

}  // namespace
}  // namespace hvd
