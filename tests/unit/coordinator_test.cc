// horovod_cpp — Apache-2.0
// The coordinator with N simulated ranks: readiness, ordering and every mismatch message.
#include "common/negotiation/coordinator.h"

#include <gtest/gtest.h>

namespace hvd {
namespace {

using Clock = Coordinator::Clock;

// N simulated ranks, all in the global set; set 1 = {0, 1} and set 2 = {1, 2} when present.
Coordinator Make(int n) {
  return Coordinator([n](int32_t id) {
    std::vector<int> ranks;
    if (id == kGlobalProcessSetId) {
      for (int r = 0; r < n; ++r) ranks.push_back(r);
    } else if (id == 1) {
      ranks = {0, 1};
    } else if (id == 2) {
      ranks = {1, 2};
    }
    return ranks;
  });
}

Request Allreduce(const std::string& name, int rank, TensorShape shape = {4},
                  DataType dtype = DataType::kFloat32, ReduceOp op = ReduceOp::kSum) {
  Request r;
  r.request_rank = rank;
  r.type = OpType::kAllreduce;
  r.dtype = dtype;
  r.reduce_op = op;
  r.tensor_name = name;
  r.shape = std::move(shape);
  return r;
}

Request Broadcast(const std::string& name, int rank, int root, TensorShape shape = {3}) {
  Request r = Allreduce(name, rank, std::move(shape));
  r.type = OpType::kBroadcast;
  r.root_rank = root;
  return r;
}

std::vector<std::string> Names(const std::vector<Response>& rs) {
  std::vector<std::string> out;
  for (const Response& r : rs) out.push_back(r.tensor_names.at(0));
  return out;
}

TEST(Coordinator, ReadyOnlyWhenEveryRankAsked) {
  Coordinator c = Make(3);
  const auto t = Clock::now();
  c.AddRequests(0, {Allreduce("a", 0)}, t);
  c.AddRequests(2, {Allreduce("a", 2)}, t);
  EXPECT_TRUE(c.TakeReadyResponses().empty());
  EXPECT_EQ(c.pending_count(), 1u);
  c.AddRequests(1, {Allreduce("a", 1)}, t);
  std::vector<Response> ready = c.TakeReadyResponses();
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0].type, OpType::kAllreduce);
  EXPECT_EQ(ready[0].tensor_names, std::vector<std::string>{"a"});
  EXPECT_EQ(ready[0].tensor_sizes, std::vector<int64_t>{4});
  EXPECT_EQ(ready[0].reduce_op, ReduceOp::kSum);
  EXPECT_EQ(c.pending_count(), 0u);
  EXPECT_TRUE(c.TakeReadyResponses().empty());
}

TEST(Coordinator, ReadyTensorsComeOutInFirstSeenOrderWhateverTheRanksOrder) {
  Coordinator c = Make(2);
  const auto t = Clock::now();
  c.AddRequests(0, {Allreduce("x", 0), Allreduce("y", 0), Allreduce("z", 0)}, t);
  c.AddRequests(1, {Allreduce("z", 1), Allreduce("x", 1), Allreduce("y", 1)}, t);
  EXPECT_EQ(Names(c.TakeReadyResponses()), (std::vector<std::string>{"x", "y", "z"}));
}

TEST(Coordinator, TensorsCompleteAcrossCycles) {
  Coordinator c = Make(2);
  const auto t = Clock::now();
  c.AddRequests(0, {Allreduce("p", 0), Allreduce("q", 0)}, t);
  c.AddRequests(1, {Allreduce("q", 1)}, t);
  EXPECT_EQ(Names(c.TakeReadyResponses()), std::vector<std::string>{"q"});
  c.AddRequests(0, {}, t);
  c.AddRequests(1, {Allreduce("p", 1)}, t);
  EXPECT_EQ(Names(c.TakeReadyResponses()), std::vector<std::string>{"p"});
}

void ExpectError(const std::vector<Request>& by_rank, const std::string& message) {
  Response r = ConstructResponse(by_rank);
  EXPECT_EQ(r.type, OpType::kError);
  EXPECT_EQ(r.error_message, message);
  EXPECT_EQ(r.tensor_names, std::vector<std::string>{by_rank[0].tensor_name});
}

TEST(Coordinator, ShapeMismatchNamesTensorAndEveryRanksShape) {
  ExpectError(
      {Allreduce("grad.fc1.weight", 0, {128, 64}), Allreduce("grad.fc1.weight", 1, {128, 64}),
       Allreduce("grad.fc1.weight", 2, {128, 32}), Allreduce("grad.fc1.weight", 3, {128, 64})},
      "allreduce 'grad.fc1.weight': mismatched shapes: ranks 0, 1, 3 sent [128, 64]; "
      "rank 2 sent [128, 32]");
}

TEST(Coordinator, MismatchNamesEveryRanksCallSite) {
  std::vector<Request> reqs = {Allreduce("g", 0, {4}), Allreduce("g", 1, {5}),
                               Allreduce("g", 2, {4})};
  reqs[0].call_site = reqs[2].call_site = "train.py:42";
  reqs[1].call_site = "train.py:57";
  ExpectError(reqs,
              "allreduce 'g': mismatched shapes: ranks 0, 2 sent [4]; rank 1 sent [5]. "
              "Called from: ranks 0, 2 at train.py:42; rank 1 at train.py:57");
}

TEST(Coordinator, DtypeMismatch) {
  ExpectError(
      {Allreduce("t", 0, {4}, DataType::kFloat32), Allreduce("t", 1, {4}, DataType::kFloat16)},
      "allreduce 't': mismatched data types: rank 0 sent float32; rank 1 sent float16");
}

TEST(Coordinator, OperationMismatch) {
  ExpectError({Allreduce("t", 0), Broadcast("t", 1, 0, {4})},
              "allreduce 't': mismatched operations: rank 0 sent ALLREDUCE; rank 1 sent BROADCAST");
}

TEST(Coordinator, ReductionOpMismatch) {
  ExpectError({Allreduce("t", 0, {4}, DataType::kFloat32, ReduceOp::kSum),
               Allreduce("t", 1, {4}, DataType::kFloat32, ReduceOp::kAverage),
               Allreduce("t", 2, {4}, DataType::kFloat32, ReduceOp::kSum)},
              "allreduce 't': mismatched reduction ops: ranks 0, 2 sent Sum; rank 1 sent Average");
}

TEST(Coordinator, ScaleFactorMismatch) {
  Request a = Allreduce("t", 0), b = Allreduce("t", 1);
  b.prescale_factor = 0.1;
  ExpectError({a, b}, "allreduce 't': mismatched prescale factors: rank 0 sent 1; rank 1 sent 0.1");
  b = Allreduce("t", 1);
  b.postscale_factor = 1.0 / 3.0;
  ExpectError({a, b},
              "allreduce 't': mismatched postscale factors: rank 0 sent 1; rank 1 sent "
              "0.3333333333333333");
}

TEST(Coordinator, DeviceMismatch) {
  Request a = Allreduce("t", 0), b = Allreduce("t", 1);
  b.device = 0;
  ExpectError({a, b},
              "allreduce 't': mismatched devices (CPU vs GPU): rank 0 sent CPU; rank 1 sent GPU");
}

TEST(Coordinator, OneGpuPerRankIsNotAMismatch) {
  Request a = Allreduce("t", 0), b = Allreduce("t", 1);
  a.device = 0;
  b.device = 1;
  const Response r = ConstructResponse({a, b});
  EXPECT_EQ(r.type, OpType::kAllreduce) << r.error_message;
}

TEST(Coordinator, BroadcastRootAndShapeMismatch) {
  ExpectError({Broadcast("w", 0, 0), Broadcast("w", 1, 1), Broadcast("w", 2, 0)},
              "broadcast 'w': mismatched root ranks: ranks 0, 2 sent 0; rank 1 sent 1");
  ExpectError({Broadcast("w", 0, 1, {3}), Broadcast("w", 1, 1, {2})},
              "broadcast 'w': mismatched shapes: rank 0 sent [3]; rank 1 sent [2]");
}

TEST(Coordinator, FirstDisagreementWinsInAFixedOrder) {
  // dtype is checked before shape.
  ExpectError({Allreduce("t", 0, {1}, DataType::kInt32), Allreduce("t", 1, {2}, DataType::kInt64)},
              "allreduce 't': mismatched data types: rank 0 sent int32; rank 1 sent int64");
}

TEST(Coordinator, AgreeingBroadcastKeepsRoot) {
  Response r = ConstructResponse({Broadcast("w", 0, 1), Broadcast("w", 1, 1)});
  EXPECT_EQ(r.type, OpType::kBroadcast);
  EXPECT_EQ(r.root_rank, 1);
  EXPECT_EQ(r.tensor_sizes, std::vector<int64_t>{3});
}

TEST(Coordinator, DuplicateSubmissionBecomesAnError) {
  Coordinator c = Make(2);
  const auto t = Clock::now();
  c.AddRequests(0, {Allreduce("d", 0)}, t);
  c.AddRequests(0, {Allreduce("d", 0)}, t);
  c.AddRequests(1, {Allreduce("d", 1)}, t);
  std::vector<Response> ready = c.TakeReadyResponses();
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0].type, OpType::kError);
  EXPECT_EQ(ready[0].error_message,
            "tensor 'd' was submitted twice by rank 0 before the first submission completed");
}

TEST(Coordinator, PendingSinceListsMissingRanks) {
  Coordinator c = Make(4);
  const auto t0 = Clock::now();
  const auto t1 = t0 + std::chrono::seconds(10);
  c.AddRequests(0, {Allreduce("old", 0)}, t0);
  c.AddRequests(2, {Allreduce("old", 2)}, t0);
  c.AddRequests(1, {Allreduce("new", 1)}, t1);
  auto stalled = c.PendingSince(t0 + std::chrono::seconds(5));
  ASSERT_EQ(stalled.size(), 1u);
  EXPECT_EQ(stalled[0].key.name, "old");
  EXPECT_EQ(stalled[0].missing_ranks, (std::vector<int>{1, 3}));
  EXPECT_EQ(c.PendingSince(t1).size(), 2u);
}

}  // namespace
}  // namespace hvd

namespace hvd {
namespace {

Request Op(OpType type, const std::string& name, int rank, TensorShape shape = {4},
           int32_t set = kGlobalProcessSetId) {
  Request r = Allreduce(name, rank, std::move(shape));
  r.type = type;
  r.process_set_id = set;
  return r;
}

Request JoinReq(int rank) {
  Request r;
  r.type = OpType::kJoin;
  r.request_rank = rank;
  r.tensor_name = "__hvd.join";
  return r;
}

TEST(CoordinatorJoin, JoinedRanksCountAsPresentForAllreduceOnly) {
  Coordinator c = Make(3);
  const auto t = Clock::now();
  c.AddRequests(2, {JoinReq(2)}, t);
  EXPECT_EQ(c.joined_ranks(), std::vector<int>{2});
  c.AddRequests(0, {Allreduce("a", 0), Op(OpType::kAllgather, "b", 0, {2, 3})}, t);
  c.AddRequests(1, {Allreduce("a", 1), Op(OpType::kAllgather, "b", 1, {1, 3})}, t);
  std::vector<Response> ready = c.TakeReadyResponses();
  ASSERT_EQ(ready.size(), 2u);
  EXPECT_EQ(ready[0].type, OpType::kAllreduce);  // rank 2 will contribute zeros
  EXPECT_EQ(ready[0].tensor_sizes, std::vector<int64_t>{4});
  EXPECT_EQ(ready[1].type, OpType::kError);
  EXPECT_EQ(ready[1].error_message,
            "allgather 'b': not supported while rank 2 has called Join; only allreduce accepts "
            "joined ranks (they contribute zeros). With DistributedOptimizer, use "
            "sparse_as_dense=True");
  // The others join; the last one to do so is reported to everyone.
  c.AddRequests(0, {JoinReq(0)}, t);
  EXPECT_TRUE(c.TakeReadyResponses().empty());
  // Rank 1 joins and, in the same batch, asks for "c": the joined ranks contribute zeros to
  // it, and the JOIN response comes after it.
  c.AddRequests(1, {JoinReq(1), Allreduce("c", 1)}, t);
  ready = c.TakeReadyResponses();
  ASSERT_EQ(ready.size(), 2u);
  EXPECT_EQ(ready[0].tensor_names[0], "c");
  EXPECT_EQ(ready[1].type, OpType::kJoin);
  EXPECT_EQ(ready[1].last_joined_rank, 1);
  EXPECT_TRUE(c.joined_ranks().empty());
}

TEST(CoordinatorJoin, JoinResponseComesAfterTensorsTheLastJoinCompleted) {
  Coordinator c = Make(2);
  const auto t = Clock::now();
  c.AddRequests(0, {JoinReq(0)}, t);
  c.AddRequests(1, {Allreduce("x", 1)}, t);  // ready at once: rank 0 contributes zeros
  c.AddRequests(1, {Allreduce("y", 1)}, t);
  c.AddRequests(1, {JoinReq(1)}, t);
  std::vector<Response> ready = c.TakeReadyResponses();
  ASSERT_EQ(ready.size(), 3u);
  EXPECT_EQ(ready[0].tensor_names[0], "x");
  EXPECT_EQ(ready[1].tensor_names[0], "y");
  EXPECT_EQ(ready[2].type, OpType::kJoin);
  EXPECT_EQ(ready[2].last_joined_rank, 1);
}

TEST(CoordinatorGroups, MembersAreReleasedTogetherInOrder) {
  Coordinator c = Make(2);
  const auto t = Clock::now();
  auto member = [](const std::string& n, int rank) {
    Request r = Allreduce(n, rank);
    r.group_name = "g";
    r.group_size = 2;
    return r;
  };
  c.AddRequests(0, {member("g_0of2", 0), member("g_1of2", 0), Allreduce("solo", 0)}, t);
  c.AddRequests(1, {member("g_1of2", 1), Allreduce("solo", 1)}, t);
  EXPECT_EQ(Names(c.TakeReadyResponses()), std::vector<std::string>{"solo"});
  c.AddRequests(1, {member("g_0of2", 1)}, t);
  std::vector<Response> ready = c.TakeReadyResponses();
  EXPECT_EQ(Names(ready), (std::vector<std::string>{"g_0of2", "g_1of2"}));
  EXPECT_EQ(ready[0].group_size, 2);
}

TEST(CoordinatorOps, AllgatherCarriesEveryRanksFirstDimension) {
  Response r = ConstructResponse({Op(OpType::kAllgather, "g", 0, {2, 3, 4}),
                                  Op(OpType::kAllgather, "g", 1, {5, 3, 4}),
                                  Op(OpType::kAllgather, "g", 2, {0, 3, 4})});
  EXPECT_EQ(r.type, OpType::kAllgather);
  EXPECT_EQ(r.tensor_sizes, std::vector<int64_t>{12});
  EXPECT_EQ(r.rank_sizes, (std::vector<int64_t>{2, 5, 0}));
}

TEST(CoordinatorOps, AllgatherShapeMismatchesNameEveryRank) {
  ExpectError({Op(OpType::kAllgather, "g", 0, {2, 4}), Op(OpType::kAllgather, "g", 1, {3, 5})},
              "allgather 'g': mismatched shapes beyond the first dimension: rank 0 sent [*, 4]; "
              "rank 1 sent [*, 5]");
  ExpectError({Op(OpType::kAllgather, "g", 0, {2, 4}), Op(OpType::kAllgather, "g", 1, {2})},
              "allgather 'g': mismatched number of dimensions: rank 0 sent 2; rank 1 sent 1");
}

TEST(CoordinatorOps, AlltoallCarriesTheSplitMatrix) {
  Request a = Op(OpType::kAlltoall, "t", 0, {3, 2}), b = Op(OpType::kAlltoall, "t", 1, {4, 2});
  a.splits = {1, 2};
  b.splits = {4, 0};
  Response r = ConstructResponse({a, b});
  EXPECT_EQ(r.type, OpType::kAlltoall);
  EXPECT_EQ(r.tensor_sizes, std::vector<int64_t>{2});
  EXPECT_EQ(r.rank_sizes, (std::vector<int64_t>{1, 2, 4, 0}));
}

TEST(CoordinatorOps, ReducescatterNeedsTheSameShapeAndOp) {
  ExpectError(
      {Op(OpType::kReducescatter, "r", 0, {4, 2}), Op(OpType::kReducescatter, "r", 1, {5, 2})},
      "reducescatter 'r': mismatched shapes: rank 0 sent [4, 2]; rank 1 sent [5, 2]");
  Request avg = Op(OpType::kReducescatter, "r", 1, {4, 2});
  avg.reduce_op = ReduceOp::kAverage;
  ExpectError({Op(OpType::kReducescatter, "r", 0, {4, 2}), avg},
              "reducescatter 'r': mismatched reduction ops: rank 0 sent Sum; rank 1 sent Average");
}

TEST(CoordinatorOps, GroupMismatchIsAnError) {
  Request a = Allreduce("m", 0), b = Allreduce("m", 1);
  a.group_name = "g";
  a.group_size = 2;
  ExpectError({a, b},
              "allreduce 'm': mismatched groups: rank 0 sent group 'g' of 2; rank 1 sent "
              "no group");
}

TEST(CoordinatorOps, ProcessSetAdditionNeedsTheSameRanks) {
  Request a = Op(OpType::kProcessSetAdd, "__hvd.process_set.add.0", 0, {});
  Request b = Op(OpType::kProcessSetAdd, "__hvd.process_set.add.0", 1, {});
  a.splits = b.splits = {0, 2};
  Response ok = ConstructResponse({a, b});
  EXPECT_EQ(ok.type, OpType::kProcessSetAdd);
  EXPECT_EQ(ok.rank_sizes, (std::vector<int64_t>{0, 2}));
  b.splits = {1, 2};
  ExpectError({a, b},
              "add_process_set '__hvd.process_set.add.0': mismatched process set ranks: "
              "rank 0 sent [0, 2]; rank 1 sent [1, 2]");
}

TEST(CoordinatorSets, ATensorOfASubsetIsReadyWhenItsMembersAsked) {
  Coordinator c = Make(3);
  const auto t = Clock::now();
  c.AddRequests(0, {Op(OpType::kAllreduce, "s", 0, {4}, 1)}, t);
  EXPECT_TRUE(c.TakeReadyResponses().empty());
  c.AddRequests(1, {Op(OpType::kAllreduce, "s", 1, {4}, 1)}, t);
  std::vector<Response> ready = c.TakeReadyResponses();
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0].process_set_id, 1);
  EXPECT_EQ(ready[0].type, OpType::kAllreduce);
}

TEST(CoordinatorSets, CrossedProcessSetsAreAnErrorForBoth) {
  // Ranks 0 and 1 are in both the global set (of 2) and set 1; they name different sets.
  Coordinator c = Make(2);
  const auto t = Clock::now();
  c.AddRequests(0, {Op(OpType::kAllreduce, "x", 0, {4}, 1)}, t);
  c.AddRequests(1, {Op(OpType::kAllreduce, "x", 1, {4}, kGlobalProcessSetId)}, t);
  std::vector<Response> ready = c.TakeReadyResponses();
  ASSERT_EQ(ready.size(), 2u);
  for (const Response& r : ready) {
    EXPECT_EQ(r.type, OpType::kError);
    EXPECT_EQ(r.error_message,
              "allreduce 'x': mismatched process sets: rank 0 sent 1; rank 1 sent 0");
  }
  EXPECT_EQ(c.pending_count(), 0u);
}

TEST(CoordinatorSets, CrossedSetsWaitForEveryRankSoTheMessageIsComplete) {
  // Set 1 = {0, 1} inside a global set of 3: rank 2 is late.
  Coordinator c = Make(3);
  const auto t = Clock::now();
  c.AddRequests(0, {Op(OpType::kAllreduce, "x", 0, {4}, 1)}, t);
  c.AddRequests(1, {Op(OpType::kAllreduce, "x", 1, {4}, kGlobalProcessSetId)}, t);
  EXPECT_TRUE(c.TakeReadyResponses().empty());
  c.AddRequests(2, {Op(OpType::kAllreduce, "x", 2, {4}, kGlobalProcessSetId)}, t);
  std::vector<Response> ready = c.TakeReadyResponses();
  ASSERT_EQ(ready.size(), 2u);
  EXPECT_EQ(ready[0].error_message,
            "allreduce 'x': mismatched process sets: rank 0 sent 1; ranks 1, 2 sent 0");
  EXPECT_EQ(ready[1].error_message, ready[0].error_message);
  EXPECT_EQ(c.pending_count(), 0u);
}

TEST(CoordinatorSets, TheSameNameInOverlappingSetsInTheSameOrderIsFine) {
  Coordinator c = Make(2);
  const auto t = Clock::now();
  c.AddRequests(0, {Op(OpType::kAllreduce, "x", 0, {4}, 1), Op(OpType::kAllreduce, "x", 0)}, t);
  c.AddRequests(1, {Op(OpType::kAllreduce, "x", 1)}, t);
  std::vector<Response> ready = c.TakeReadyResponses();
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0].type, OpType::kAllreduce);
  EXPECT_EQ(ready[0].process_set_id, kGlobalProcessSetId);
  c.AddRequests(1, {Op(OpType::kAllreduce, "x", 1, {4}, 1)}, t);
  ready = c.TakeReadyResponses();
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0].process_set_id, 1);
  EXPECT_EQ(ready[0].type, OpType::kAllreduce);
}

TEST(CoordinatorSets, UnknownOrDroppedSets) {
  Coordinator c = Make(3);
  const auto t = Clock::now();
  c.AddRequests(1, {Op(OpType::kAllreduce, "u", 1, {4}, 9)}, t);
  std::vector<Response> ready = c.TakeReadyResponses();
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0].error_message,
            "allreduce 'u': process set 9 does not exist (it was removed while the operation was "
            "in flight)");
  c.AddRequests(1, {Op(OpType::kAllreduce, "d", 1, {4}, 2)}, t);
  EXPECT_EQ(c.pending_count(), 1u);
  c.DropProcessSet(2);
  EXPECT_EQ(c.pending_count(), 0u);
  c.AddRequests(2, {Op(OpType::kAllreduce, "d", 2, {4}, 2)}, t);
  EXPECT_TRUE(c.TakeReadyResponses().empty());  // a fresh entry, waiting for rank 1 again
}

TEST(Split, ReducescatterGivesTheFirstRanksTheExtraRows) {
  EXPECT_EQ(ReducescatterRows(10, 3, 0), 4);
  EXPECT_EQ(ReducescatterRows(10, 3, 1), 3);
  EXPECT_EQ(ReducescatterRows(10, 3, 2), 3);
  EXPECT_EQ(ReducescatterRows(2, 4, 1), 1);
  EXPECT_EQ(ReducescatterRows(2, 4, 2), 0);
  EXPECT_EQ(ReducescatterRows(8, 4, 3), 2);
}

}  // namespace
}  // namespace hvd
