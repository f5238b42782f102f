// horovod_cpp — Apache-2.0
// Process sets under mpirun (run with HOROVOD_DYNAMIC_PROCESS_SETS=1): disjoint sets running
// different operations at once, membership errors, removal with operations pending, crossed
// set mismatches, and static sets given to Init.

#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <set>
#include <tuple>
#include <string>
#include <vector>

#include "common/horovod.h"
#include "tests/mpi/mpi_wait.h"
#include "tests/mpi/test_util.h"

namespace hvd {
namespace {

using namespace test;  // NOLINT

std::vector<int> Evens(int n = N()) {
  std::vector<int> v;
  for (int r = 0; r < n; r += 2) v.push_back(r);
  return v;
}
std::vector<int> Odds(int n = N()) {
  std::vector<int> v;
  for (int r = 1; r < n; r += 2) v.push_back(r);
  return v;
}

TEST(ProcessSets, DisjointSetsRunDifferentOpsAtOnce) {
  Result<int32_t> evens = AddProcessSet(Evens());
  ASSERT_TRUE(evens.ok()) << evens.status().ToString();
  Result<int32_t> odds = AddProcessSet(Odds());
  ASSERT_TRUE(odds.ok()) << odds.status().ToString();
  const bool even = R() % 2 == 0;
  const int32_t mine = even ? *evens : *odds;
  const std::vector<int> members = even ? Evens() : Odds();
  Result<ProcessSetInfo> info = GetProcessSet(mine);
  ASSERT_TRUE(info.ok());
  EXPECT_TRUE(info->included);
  EXPECT_EQ(info->size, static_cast<int>(members.size()));
  EXPECT_EQ(info->rank, R() / 2);
  EXPECT_EQ(info->ranks, members);
  EXPECT_FALSE(GetProcessSet(even ? *odds : *evens)->included);

  // Same tensor names in both sets, different operations, in flight at the same time.
  std::vector<double> x(1000, R() + 1.0);
  std::vector<double> g(2, R());
  Handle h1 = *EnqueueAllreduce(View(x.data(), {1000}), View(x.data(), {1000}), "work",
                                {ReduceOp::kSum, 1.0, 1.0, mine});
  Handle h2 = even ? *EnqueueBroadcast(View(g.data(), {2}), View(g.data(), {2}), members.back(),
                                       "side", mine)
                   : *EnqueueAllgather(View(g.data(), {2}), "side", mine);
  double expected = 0;
  for (int r : members) expected += r + 1.0;
  ASSERT_TRUE(Wait(h1).ok());
  EXPECT_EQ(x[999], expected);
  if (even) {
    ASSERT_TRUE(Wait(h2).ok());
    EXPECT_EQ(g[0], members.back());
  } else {
    Result<std::vector<Output>> out = WaitOutputs(h2);
    ASSERT_TRUE(out.ok());
    const double* all = static_cast<const double*>(out->front().data.get());
    ASSERT_EQ(out->front().shape, (TensorShape{2 * static_cast<int64_t>(members.size())}));
    for (size_t i = 0; i < members.size(); ++i) EXPECT_EQ(all[2 * i], members[i]);
  }
  ASSERT_TRUE(Barrier(mine).ok());
  ASSERT_TRUE(RemoveProcessSet(*evens).ok());
  ASSERT_TRUE(RemoveProcessSet(*odds).ok());
}

TEST(ProcessSets, ATensorWaitingInOneSetHoldsUpNoOtherSet) {
  if (N() < 3) GTEST_SKIP() << "needs a set with two members and another set";
  Result<int32_t> evens = AddProcessSet(Evens());
  Result<int32_t> odds = AddProcessSet(Odds());
  ASSERT_TRUE(evens.ok() && odds.ok());
  const bool even = R() % 2 == 0;
  // Rank 0 starts "held" in the even set; the other evens hold back until the end.
  std::vector<float> held(2, 1.0f);
  Handle held_handle = 0;
  if (R() == 0) {
    held_handle = *EnqueueAllreduce(View(held.data(), {2}), View(held.data(), {2}), "held",
                                    {ReduceOp::kSum, 1, 1, *evens});
  }
  // Meanwhile both sets and the global set complete other operations, several times.
  for (int k = 0; k < 5; ++k) {
    float v = 1;
    const int32_t mine = even ? *evens : *odds;
    ASSERT_TRUE(Allreduce(View(&v, {}), View(&v, {}), "free." + std::to_string(k),
                          {ReduceOp::kSum, 1, 1, mine})
                    .ok());
    EXPECT_EQ(v, static_cast<float>(even ? Evens().size() : Odds().size()));
    float g = 1;
    ASSERT_TRUE(
        Allreduce(View(&g, {}), View(&g, {}), "global." + std::to_string(k), {ReduceOp::kSum})
            .ok());
    EXPECT_EQ(g, static_cast<float>(N()));
  }
  if (R() == 0) {
    EXPECT_FALSE(*Poll(held_handle));  // still waiting for the other even ranks
  } else if (even) {
    ASSERT_TRUE(Allreduce(View(held.data(), {2}), View(held.data(), {2}), "held",
                          {ReduceOp::kSum, 1, 1, *evens})
                    .ok());
  }
  if (R() == 0) {
    ASSERT_TRUE(Wait(held_handle).ok());
  }
  if (even) {
    EXPECT_EQ(held[0], static_cast<float>(Evens().size()));
  }
  ASSERT_TRUE(RemoveProcessSet(*evens).ok());
  ASSERT_TRUE(RemoveProcessSet(*odds).ok());
}

// HOROVOD_HIERARCHICAL_ALLREDUCE applies to process sets too (run so across test hosts by
// tests/multihost/run.sh): a set whose hosts each run the same number (> 1) of its ranks, on
// more than one host, reduces hierarchically; any other set flat. The test works out which
// from every rank's host name, independently of the runtime, and checks the sums either way.
TEST(ProcessSets, HierarchicalAllreduceWhereTheSetsHostsAreAlike) {
  char name[MPI_MAX_PROCESSOR_NAME] = {0};
  int len = 0;
  MPI_Get_processor_name(name, &len);
  std::vector<char> names(static_cast<size_t>(N()) * MPI_MAX_PROCESSOR_NAME);
  hvd::test::SleepingAllgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, names.data(),
                               MPI_MAX_PROCESSOR_NAME, MPI_CHAR);
  auto host = [&](int r) {
    return std::string(&names[static_cast<size_t>(r) * MPI_MAX_PROCESSOR_NAME]);
  };
  // Ranks per host of a set: (fewest, most, hosts).
  auto layout = [&](const std::vector<int>& ranks) {
    std::map<std::string, int> per_host;
    for (int r : ranks) ++per_host[host(r)];
    int lo = N(), hi = 0;
    for (const auto& [h, n] : per_host) lo = std::min(lo, n), hi = std::max(hi, n);
    return std::make_tuple(lo, hi, static_cast<int>(per_host.size()));
  };
  std::vector<int> all, first_of_each_host, two_of_each_host, all_but_last, all_but_last_host;
  std::map<std::string, int> taken;
  for (int r = 0; r < N(); ++r) {
    all.push_back(r);
    const int k = taken[host(r)]++;
    if (k == 0) first_of_each_host.push_back(r);
    if (k < 2) two_of_each_host.push_back(r);
    if (r + 1 < N()) all_but_last.push_back(r);
    if (host(r) != host(N() - 1)) all_but_last_host.push_back(r);
  }
  const bool requested = EnvIs("HOROVOD_HIERARCHICAL_ALLREDUCE", "1");
  struct Case {
    std::vector<int> ranks;
    bool global;
  };
  // Each set once, and none that equals the global set (one rank a host: the first of each
  // host is every rank, and adding it again is refused as a duplicate).
  std::vector<Case> cases = {{all, true}};
  auto add_case = [&](const std::vector<int>& ranks) {
    if (ranks.empty()) return;
    for (const Case& c : cases) {
      if (c.ranks == ranks) return;
    }
    cases.push_back({ranks, false});
  };
  add_case(first_of_each_host);
  add_case(all_but_last);
  add_case(two_of_each_host);
  // (3 hosts x 2: the first two hosts' ranks, a set that goes hierarchical)
  add_case(all_but_last_host);
  for (const Case& c : cases) {
    const std::vector<int>& ranks = c.ranks;
    int32_t id = kGlobalProcessSetId;
    if (!c.global) {
      Result<int32_t> added = AddProcessSet(ranks);
      ASSERT_TRUE(added.ok()) << added.status().ToString();
      id = *added;
    }
    // The global set: every host the same number of ranks. Another set: that, more than one
    // rank a host, more than one host.
    const auto [lo, hi, hosts] = layout(ranks);
    const bool expected =
        requested && lo == hi && (c.global || (lo > 1 && hosts > 1));
    const bool member = std::find(ranks.begin(), ranks.end(), R()) != ranks.end();
    if (member) {
      Result<Stats> before = GetStats();
      ASSERT_TRUE(before.ok());
      // 3000 floats (slices per local rank that do not divide evenly) and, in place, 7.
      std::vector<float> in(3000), out(3000), small(7);
      for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>((R() + 1) * (i % 11));
      for (size_t i = 0; i < small.size(); ++i) small[i] = static_cast<float>(R() * 100 + i);
      Result<Handle> a = EnqueueAllreduce(TensorView{in.data(), DataType::kFloat32, {3000}},
                                          TensorView{out.data(), DataType::kFloat32, {3000}},
                                          "hier.big", {ReduceOp::kSum, 1.0, 1.0, id});
      Result<Handle> b = EnqueueAllreduce(TensorView{small.data(), DataType::kFloat32, {7}},
                                          TensorView{small.data(), DataType::kFloat32, {7}},
                                          "hier.small", {ReduceOp::kSum, 1.0, 1.0, id});
      ASSERT_TRUE(a.ok() && b.ok());
      ASSERT_TRUE(Wait(*a).ok());
      ASSERT_TRUE(Wait(*b).ok());
      double rank_sum = 0, rank_plus_one = 0;
      for (int r : ranks) rank_sum += r, rank_plus_one += r + 1;
      for (size_t i = 0; i < out.size(); ++i) {
        ASSERT_EQ(out[i], rank_plus_one * (i % 11)) << i;
      }
      for (size_t i = 0; i < small.size(); ++i) {
        ASSERT_EQ(small[i], 100 * rank_sum + static_cast<double>(ranks.size()) * i) << i;
      }
      Result<Stats> after = GetStats();
      ASSERT_TRUE(after.ok());
      const uint64_t hierarchical =
          after->hierarchical_allreduce_calls - before->hierarchical_allreduce_calls;
      if (expected) {
        EXPECT_GT(hierarchical, 0u) << ranks.size() << " ranks on " << hosts << " hosts";
      } else {
        EXPECT_EQ(hierarchical, 0u) << ranks.size() << " ranks on " << hosts << " hosts";
      }
    }
    if (!c.global) {
      ASSERT_TRUE(RemoveProcessSet(id).ok());
    }
  }
}

TEST(ProcessSets, MembershipAndUnknownSetErrors) {
  Result<int32_t> first = AddProcessSet({0});
  ASSERT_TRUE(first.ok());
  std::vector<float> x(2, 1.0f);
  auto h = EnqueueAllreduce(View(x.data(), {2}), View(x.data(), {2}), "m",
                            {ReduceOp::kSum, 1, 1, *first});
  if (R() == 0) {
    ASSERT_TRUE(h.ok());
    ASSERT_TRUE(Wait(*h).ok());
    EXPECT_EQ(x[0], 1.0f);  // a set of one
  } else {
    EXPECT_EQ(h.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(h.status().message(), "allreduce 'm': rank " + std::to_string(R()) +
                                        " is not a member of process set " +
                                        std::to_string(*first) + " (ranks [0])");
  }
  // A root outside the set.
  if (R() == 0 && N() > 1) {
    auto b = EnqueueBroadcast(View(x.data(), {2}), View(x.data(), {2}), 1, "b", *first);
    EXPECT_EQ(b.status().message(), "broadcast 'b': root rank 1 is not a member of process set " +
                                        std::to_string(*first) + " (ranks [0])");
  }
  // Duplicates and bad lists.
  Result<int32_t> dup = AddProcessSet({0});
  EXPECT_EQ(dup.status().message(),
            "a process set with ranks [0] already exists (id " + std::to_string(*first) + ")");
  EXPECT_EQ(AddProcessSet({N()}).status().message(),
            "add_process_set: rank " + std::to_string(N()) + " is out of range (the job has " +
                std::to_string(N()) + " ranks)");
  ASSERT_TRUE(RemoveProcessSet(*first).ok());
  // The removed set is gone for good.
  auto gone = EnqueueAllreduce(View(x.data(), {2}), View(x.data(), {2}), "m2",
                               {ReduceOp::kSum, 1, 1, *first});
  EXPECT_EQ(gone.status().message(), "allreduce 'm2': unknown process set " +
                                         std::to_string(*first) +
                                         " (never added, or already removed)");
  EXPECT_EQ(RemoveProcessSet(0).message(),
            "remove_process_set: the global process set (id 0) cannot be removed");
  EXPECT_EQ(RemoveProcessSet(999).message(),
            "unknown process set 999 (never added, or already removed)");
}

TEST(ProcessSets, RemovingASetFailsItsPendingOperations) {
  // With two ranks, {0, 1} would be the global set itself.
  if (N() < 3) GTEST_SKIP() << "needs three ranks";
  Result<int32_t> set = AddProcessSet({0, 1});
  ASSERT_TRUE(set.ok());
  std::vector<float> x(3, 1.0f);
  Handle pending = 0;
  if (R() == 0) {  // only rank 0 of the set submits: this can never complete
    pending = *EnqueueAllreduce(View(x.data(), {3}), View(x.data(), {3}), "orphan",
                                {ReduceOp::kSum, 1, 1, *set});
  }
  ASSERT_TRUE(RemoveProcessSet(*set).ok());
  if (R() == 0) {
    Status s = Wait(pending);
    EXPECT_EQ(s.code(), StatusCode::kAborted);
    EXPECT_EQ(s.message(), "process set " + std::to_string(*set) +
                               " was removed while this operation was pending");
  }
  // The global set still works.
  float one = 1;
  ASSERT_TRUE(Allreduce(View(&one, {}), View(&one, {}), "after.remove", {ReduceOp::kSum}).ok());
  EXPECT_EQ(one, static_cast<float>(N()));
}

TEST(ProcessSets, CrossedSetsGiveTheSameErrorOnEveryRank) {
  // Crossing needs two ranks in both sets, and a second set that is not the global one.
  if (N() < 3) GTEST_SKIP() << "needs three ranks";
  Result<int32_t> pair = AddProcessSet({0, 1});
  ASSERT_TRUE(pair.ok());
  // Rank 0 submits "cross" to the pair, every other rank to the global set.
  float v = 1;
  Status s = Allreduce(View(&v, {}), View(&v, {}), "cross",
                       {ReduceOp::kSum, 1, 1, R() == 0 ? *pair : kGlobalProcessSetId});
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(), "allreduce 'cross': mismatched process sets: rank 0 sent " +
                             std::to_string(*pair) + "; " + RanksText(1, N() - 1) + " sent 0");
  ASSERT_TRUE(RemoveProcessSet(*pair).ok());
}

TEST(ProcessSets, StaticSetsFromInitAndDisabledDynamicSets) {
  const int n = N(), rank = R();
  if (n < 2) GTEST_SKIP() << "needs two ranks";
  // Shutting down stops every rank: wait until all have finished the previous tests.
  hvd::test::SleepingBarrier();
  ASSERT_TRUE(Shutdown().ok());
  // Every rank must pass the same sets; otherwise every rank's Init fails.
  InitOptions bad;
  bad.process_sets = {{rank == 0 ? 0 : n - 1}};
  Status s = Init(bad);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("every rank must pass the same process sets to Init"),
            std::string::npos);
  // Agreed sets get ids 1, 2, ... in order; dynamic changes are refused without the env var.
  setenv("HOROVOD_DYNAMIC_PROCESS_SETS", "0", 1);
  InitOptions good;
  good.process_sets = {Evens(n), {n - 1}};
  ASSERT_TRUE(Init(good).ok());
  EXPECT_EQ(*ProcessSetIds(), (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(GetProcessSet(1)->ranks, Evens());
  EXPECT_EQ(GetProcessSet(2)->included, R() == N() - 1);
  EXPECT_EQ(AddProcessSet({0}).status().message(),
            "add_process_set: dynamic process sets are disabled; set "
            "HOROVOD_DYNAMIC_PROCESS_SETS=1 before Init (or pass the sets to Init)");
  if (R() % 2 == 0) {
    int64_t v = R();
    ASSERT_TRUE(Allreduce(View(&v, {}), View(&v, {}), "static", {ReduceOp::kMax, 1, 1, 1}).ok());
    EXPECT_EQ(v, Evens().back());
  }
  ASSERT_TRUE(Barrier().ok());
}

}  // namespace
}  // namespace hvd
