// horovod_cpp — Apache-2.0
#include "common/negotiation/response_cache.h"

#include <gtest/gtest.h>

namespace hvd {
namespace {

Request Req(const std::string& name, TensorShape shape = {4}) {
  Request r;
  r.type = OpType::kAllreduce;
  r.tensor_name = name;
  r.shape = std::move(shape);
  return r;
}

Response Resp(const std::string& name) {
  Response r;
  r.type = OpType::kAllreduce;
  r.tensor_names = {name};
  r.tensor_sizes = {4};
  return r;
}

using State = ResponseCache::State;

TEST(ResponseCache, HitMissAndInvalid) {
  ResponseCache c(8);
  EXPECT_EQ(c.Find(Req("a")).state, State::kMiss);
  c.Put(Resp("a"), Req("a"));
  ResponseCache::Lookup hit = c.Find(Req("a"));
  EXPECT_EQ(hit.state, State::kHit);
  EXPECT_EQ(hit.bit, 0u);
  EXPECT_EQ(c.Touch(hit.bit).tensor_names, std::vector<std::string>{"a"});
  Request reshaped = Req("a", {5});
  EXPECT_EQ(c.Find(reshaped).state, State::kInvalid);
  Request other_op = Req("a");
  other_op.reduce_op = ReduceOp::kMax;
  EXPECT_EQ(c.Find(other_op).state, State::kInvalid);
  Request other_rank = Req("a");
  other_rank.request_rank = 5;  // who asks does not matter
  EXPECT_EQ(c.Find(other_rank).state, State::kHit);
}

TEST(ResponseCache, BitsAreAssignedLowestFreeFirst) {
  ResponseCache c(8);
  for (const char* n : {"a", "b", "c"}) c.Put(Resp(n), Req(n));
  EXPECT_EQ(c.Find(Req("c")).bit, 2u);
  EXPECT_EQ(c.num_bits(), 3u);
  c.Erase(1);
  EXPECT_EQ(c.Find(Req("b")).state, State::kMiss);
  c.Put(Resp("d"), Req("d"));
  EXPECT_EQ(c.Find(Req("d")).bit, 1u);
  EXPECT_EQ(c.num_bits(), 3u);
  EXPECT_EQ(c.size(), 3u);
}

TEST(ResponseCache, EvictsLeastRecentlyUsed) {
  ResponseCache c(2);
  c.Put(Resp("a"), Req("a"));
  c.Put(Resp("b"), Req("b"));
  c.Touch(c.Find(Req("a")).bit);  // b is now the least recently used
  c.Put(Resp("c"), Req("c"));
  EXPECT_EQ(c.Find(Req("b")).state, State::kMiss);
  EXPECT_EQ(c.Find(Req("a")).state, State::kHit);
  EXPECT_EQ(c.Find(Req("c")).bit, 1u);  // took b's bit
  EXPECT_EQ(c.evictions(), 1u);
  EXPECT_EQ(c.num_bits(), 2u);
}

TEST(ResponseCache, PutOfACachedNameReplacesIt) {
  ResponseCache c(4);
  c.Put(Resp("a"), Req("a"));
  c.Put(Resp("a"), Req("a", {9}));
  EXPECT_EQ(c.size(), 1u);
  EXPECT_EQ(c.Find(Req("a", {9})).state, State::kHit);
}

TEST(ResponseCache, ZeroCapacityCachesNothing) {
  ResponseCache c(0);
  c.Put(Resp("a"), Req("a"));
  EXPECT_EQ(c.Find(Req("a")).state, State::kMiss);
  EXPECT_EQ(c.num_bits(), 0u);
}

TEST(ResponseCache, OnlySingleUngroupedDataOpsAreCacheable) {
  Response r = Resp("x");
  for (OpType t : {OpType::kAllreduce, OpType::kBroadcast, OpType::kAllgather, OpType::kAlltoall,
                   OpType::kReducescatter}) {
    r.type = t;
    EXPECT_TRUE(ResponseCache::Cacheable(r)) << OpTypeName(t);
  }
  for (OpType t : {OpType::kBarrier, OpType::kJoin, OpType::kError, OpType::kProcessSetAdd}) {
    r.type = t;
    EXPECT_FALSE(ResponseCache::Cacheable(r)) << OpTypeName(t);
  }
  r.type = OpType::kAllreduce;
  r.group_size = 2;
  EXPECT_FALSE(ResponseCache::Cacheable(r));
}

TEST(ResponseCache, SameNameInTwoProcessSetsIsTwoEntries) {
  ResponseCache c(8);
  Request a = Req("g"), b = Req("g");
  b.process_set_id = 1;
  c.Put(Resp("g"), a);
  Response rb = Resp("g");
  rb.process_set_id = 1;
  c.Put(rb, b);
  EXPECT_EQ(c.size(), 2u);
  EXPECT_EQ(c.Find(a).bit, 0u);
  EXPECT_EQ(c.Find(b).bit, 1u);
  c.EraseProcessSet(1);
  EXPECT_EQ(c.Find(b).state, State::kMiss);
  EXPECT_EQ(c.Find(a).state, State::kHit);
}

TEST(ResponseCache, AGroupedRequestDoesNotHitAnUngroupedEntry) {
  ResponseCache c(8);
  c.Put(Resp("a"), Req("a"));
  Request grouped = Req("a");
  grouped.group_size = 2;
  grouped.group_name = "g";
  EXPECT_EQ(c.Find(grouped).state, State::kInvalid);
}

}  // namespace
}  // namespace hvd
