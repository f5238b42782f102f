// horovod_cpp — Apache-2.0
#include "common/state/process_set.h"

#include <gtest/gtest.h>

namespace hvd {
namespace {

TEST(ProcessSetTable, GlobalSetAndAddedSets) {
  ProcessSetTable t;
  t.Reset(4, 2);
  Result<ProcessSetInfo> g = t.Get(0);
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->ranks, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(g->rank, 2);
  EXPECT_TRUE(g->included);
  Result<int32_t> a = t.Add({0, 1});
  Result<int32_t> b = t.Add({1, 2, 3});
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a, 1);
  EXPECT_EQ(*b, 2);
  EXPECT_FALSE(t.Get(1)->included);
  EXPECT_EQ(t.Get(1)->rank, -1);
  EXPECT_EQ(t.Get(2)->rank, 1);
  EXPECT_EQ(t.Get(2)->size, 3);
  EXPECT_EQ(t.IdsIncluding(2), (std::vector<int32_t>{0, 2}));
  EXPECT_EQ(t.Ids(), (std::vector<int32_t>{0, 1, 2}));
}

TEST(ProcessSetTable, RejectsBadAndDuplicateSetsAndNeverReusesIds) {
  ProcessSetTable t;
  t.Reset(3, 0);
  EXPECT_EQ(t.Add({}).status().message(), "process set a process set needs at least one rank");
  EXPECT_EQ(t.Add({0, 3}).status().message(),
            "process set rank 3 is out of range (the job has 3 ranks)");
  EXPECT_EQ(t.Add({1, 0}).status().message(),
            "process set ranks must be sorted and distinct, got [1, 0]");
  ASSERT_EQ(*t.Add({0, 1}), 1);
  EXPECT_EQ(t.Add({0, 1}).status().message(),
            "a process set with ranks [0, 1] already exists (id 1)");
  EXPECT_EQ(t.Add({0, 1, 2}).status().message(),
            "a process set with ranks [0, 1, 2] already exists (id 0)");
  EXPECT_EQ(t.Remove(0).message(), "the global process set (id 0) cannot be removed");
  ASSERT_TRUE(t.Remove(1).ok());
  EXPECT_EQ(t.Remove(1).message(), "unknown process set 1 (never added, or already removed)");
  EXPECT_FALSE(t.Get(1).ok());
  EXPECT_EQ(*t.Add({0, 1}), 2);  // a new id, never 1 again
  EXPECT_TRUE(t.Ranks(7).empty());
}

}  // namespace
}  // namespace hvd
