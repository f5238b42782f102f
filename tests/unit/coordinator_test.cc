// horovod_cpp — Apache-2.0
// The coordinator with N simulated ranks: readiness, ordering and every mismatch message.
#include <gtest/gtest.h>

#include "common/coordinator.h"

namespace hvd {
namespace {

using Clock = Coordinator::Clock;

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
  Coordinator c(3);
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
  Coordinator c(2);
  const auto t = Clock::now();
  c.AddRequests(0, {Allreduce("x", 0), Allreduce("y", 0), Allreduce("z", 0)}, t);
  c.AddRequests(1, {Allreduce("z", 1), Allreduce("x", 1), Allreduce("y", 1)}, t);
  EXPECT_EQ(Names(c.TakeReadyResponses()), (std::vector<std::string>{"x", "y", "z"}));
}

TEST(Coordinator, TensorsCompleteAcrossCycles) {
  Coordinator c(2);
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
  ExpectError({Allreduce("grad.fc1.weight", 0, {128, 64}), Allreduce("grad.fc1.weight", 1, {128, 64}),
               Allreduce("grad.fc1.weight", 2, {128, 32}), Allreduce("grad.fc1.weight", 3, {128, 64})},
              "allreduce 'grad.fc1.weight': mismatched shapes: ranks 0, 1, 3 sent [128, 64]; "
              "rank 2 sent [128, 32]");
}

TEST(Coordinator, DtypeMismatch) {
  ExpectError({Allreduce("t", 0, {4}, DataType::kFloat32), Allreduce("t", 1, {4}, DataType::kFloat16)},
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
  ExpectError({a, b}, "allreduce 't': mismatched devices: rank 0 sent CPU; rank 1 sent GPU:0");
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
  Coordinator c(2);
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
  Coordinator c(4);
  const auto t0 = Clock::now();
  const auto t1 = t0 + std::chrono::seconds(10);
  c.AddRequests(0, {Allreduce("old", 0)}, t0);
  c.AddRequests(2, {Allreduce("old", 2)}, t0);
  c.AddRequests(1, {Allreduce("new", 1)}, t1);
  auto stalled = c.PendingSince(t0 + std::chrono::seconds(5));
  ASSERT_EQ(stalled.size(), 1u);
  EXPECT_EQ(stalled[0].name, "old");
  EXPECT_EQ(stalled[0].missing_ranks, (std::vector<int>{1, 3}));
  EXPECT_EQ(c.PendingSince(t1).size(), 2u);
}

}  // namespace
}  // namespace hvd
