// horovod_cpp — Apache-2.0
#include "common/state/tensor_queue.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <thread>

#include "common/state/handle_table.h"

namespace hvd {
namespace {

TensorTableEntry Entry(const std::string& name, int32_t set = 0, std::atomic<int>* calls = nullptr,
                       Status* last = nullptr) {
  TensorTableEntry e;
  e.request.tensor_name = name;
  e.request.process_set_id = set;
  e.callback = [calls, last](const Status& s) {
    if (calls) ++*calls;
    if (last) *last = s;
  };
  return e;
}

// A fresh handle per Add, as Submit() allocates one.
Handle NextHandle() {
  static Handle next = 1;
  return next++;
}

std::vector<TensorTableEntry> One(TensorTableEntry e) {
  std::vector<TensorTableEntry> v;
  v.push_back(std::move(e));
  return v;
}

TEST(TensorQueue, AddPopTake) {
  TensorQueue q;
  ASSERT_TRUE(q.Add(One(Entry("a")), NextHandle()).ok());
  ASSERT_TRUE(q.Add(One(Entry("b")), NextHandle()).ok());
  std::vector<Request> reqs = q.PopNewRequests();
  ASSERT_EQ(reqs.size(), 2u);
  EXPECT_EQ(reqs[0].tensor_name, "a");
  EXPECT_EQ(reqs[1].tensor_name, "b");
  EXPECT_TRUE(q.PopNewRequests().empty());
  EXPECT_EQ(q.size(), 2u);
  auto taken = q.Take(0, {"b", "missing", "a"});
  ASSERT_EQ(taken.size(), 3u);
  ASSERT_TRUE(taken[0].has_value());
  EXPECT_EQ(taken[0]->request.tensor_name, "b");
  EXPECT_FALSE(taken[1].has_value());
  EXPECT_EQ(taken[2]->request.tensor_name, "a");
  EXPECT_EQ(q.size(), 0u);
}

TEST(TensorQueue, DuplicateNameInFlightIsRejectedAtomically) {
  TensorQueue q;
  const Handle w = NextHandle();
  ASSERT_TRUE(q.Add(One(Entry("w")), w).ok());
  Status dup = q.Add(One(Entry("w")), NextHandle());
  EXPECT_EQ(dup.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(dup.message().find("'w': a tensor with this name is already in flight"),
            std::string::npos);
  // Same name in another process set is a different tensor.
  EXPECT_TRUE(q.Add(One(Entry("w", 1)), NextHandle()).ok());
  // A batch with one duplicate adds nothing.
  std::vector<TensorTableEntry> batch;
  batch.push_back(Entry("x"));
  batch.push_back(Entry("x"));
  EXPECT_FALSE(q.Add(std::move(batch), NextHandle()).ok());
  EXPECT_EQ(q.size(), 2u);
  // Taken (its collective has run, its callback fired) is not enough: the name stays
  // reserved until the caller has waited for the handle.
  q.Take(0, {"w"});
  EXPECT_EQ(q.Add(One(Entry("w")), NextHandle()).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(q.reserved(), 2u);  // "w" in sets 0 and 1
  q.ReleaseNames(w);
  q.ReleaseNames(w);  // idempotent
  EXPECT_EQ(q.reserved(), 1u);
  EXPECT_TRUE(q.Add(One(Entry("w")), NextHandle()).ok());
}

TEST(TensorQueue, ResetForgetsReservationsOfAnEarlierInit) {
  TensorQueue q;
  const Handle old = NextHandle();
  ASSERT_TRUE(q.Add(One(Entry("a")), old).ok());
  q.Close(Status::Aborted("shut down"));
  q.Reset();
  const Handle now = NextHandle();
  ASSERT_TRUE(q.Add(One(Entry("a")), now).ok());
  q.ReleaseNames(old);  // a stale handle waited after the restart frees nothing
  EXPECT_EQ(q.Add(One(Entry("a")), NextHandle()).code(), StatusCode::kFailedPrecondition);
  q.ReleaseNames(now);
  EXPECT_EQ(q.reserved(), 0u);
}

TEST(TensorQueue, BlockedWhileAThreadWaitsOnAnOperationThatHasNotStarted) {
  TensorQueue q;
  const Handle h = NextHandle(), other = NextHandle();
  std::vector<TensorTableEntry> two;
  two.push_back(Entry("g.a"));
  two.push_back(Entry("g.b"));
  ASSERT_TRUE(q.Add(std::move(two), h).ok());
  ASSERT_TRUE(q.Add(One(Entry("free")), other).ok());
  EXPECT_FALSE(q.Blocked());  // queued, but nobody waits
  q.BeginWait(h);
  q.BeginWait(h);  // two threads on one handle
  EXPECT_TRUE(q.Blocked());
  std::vector<Request> on = q.BlockedOn();
  ASSERT_EQ(on.size(), 2u);  // each request once, whatever the number of waiters
  std::vector<std::string> names{on[0].tensor_name, on[1].tensor_name};
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"g.a", "g.b"}));
  q.Take(0, {"g.a"});  // one member started running: the other still blocks
  ASSERT_EQ(q.BlockedOn().size(), 1u);
  q.EndWait(h);
  EXPECT_TRUE(q.Blocked());  // the second waiter is still there
  q.Take(0, {"g.b"});
  EXPECT_FALSE(q.Blocked());  // everything it waits for is running
  q.EndWait(h);
  EXPECT_TRUE(q.BlockedOn().empty());
}

TEST(TensorQueue, CloseCompletesEveryEntryOnceAndRejectsLaterAdds) {
  TensorQueue q;
  std::atomic<int> calls{0};
  Status last;
  for (const char* n : {"a", "b", "c"}) ASSERT_TRUE(q.Add(One(Entry(n, 0, &calls, &last)), NextHandle()).ok());
  q.Close(Status::Aborted("shut down"));
  EXPECT_EQ(calls.load(), 3);
  EXPECT_EQ(last, Status::Aborted("shut down"));
  EXPECT_EQ(q.Add(One(Entry("d", 0, &calls)), NextHandle()), Status::Aborted("shut down"));
  q.Close(Status::Aborted("again"));
  EXPECT_EQ(calls.load(), 3);  // nothing completed twice
  q.Reset();
  EXPECT_TRUE(q.Add(One(Entry("d")), NextHandle()).ok());
}

TEST(TensorQueue, FailProcessSetCompletesItsEntriesAndRejectsLaterAdds) {
  TensorQueue q;
  std::atomic<int> calls{0};
  Status last;
  ASSERT_TRUE(q.Add(One(Entry("popped", 3, &calls, &last)), NextHandle()).ok());
  ASSERT_TRUE(q.Add(One(Entry("other", 0, &calls)), NextHandle()).ok());
  (void)q.PopNewRequests();  // the background thread has seen these two
  ASSERT_TRUE(q.Add(One(Entry("unpopped", 3, &calls, &last)), NextHandle()).ok());
  const size_t popped = q.FailProcessSet(3, Status::Aborted("set 3 removed"));
  EXPECT_EQ(popped, 1u);
  EXPECT_EQ(calls.load(), 2);
  EXPECT_EQ(last, Status::Aborted("set 3 removed"));
  EXPECT_EQ(q.size(), 1u);                  // "other" stays
  EXPECT_TRUE(q.PopNewRequests().empty());  // "unpopped" will never reach the loop
  Status again = q.Add(One(Entry("late", 3)), NextHandle());
  EXPECT_EQ(again.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(again.message().find("process set 3 has been removed"), std::string::npos);
}

TEST(TensorQueue, AddWakesTheWaiterBeforeItsDeadline) {
  TensorQueue q;
  const auto start = std::chrono::steady_clock::now();
  std::thread waiter([&] { q.WaitForWork(start + std::chrono::seconds(30)); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_TRUE(q.Add(One(Entry("a")), NextHandle()).ok());
  waiter.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
}

TEST(TensorQueue, ShutdownRequestWakesTheWaiter) {
  TensorQueue q;
  const auto start = std::chrono::steady_clock::now();
  std::thread waiter([&] { q.WaitForWork(start + std::chrono::seconds(30)); });
  q.RequestShutdown();
  waiter.join();
  EXPECT_TRUE(q.shutdown_requested());
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
}

// A burst of submissions less than the gap apart is collected in one wake-up; the generous
// gap (10 s) against 2 ms spacing keeps the test independent of the machine's speed.
TEST(TensorQueue, GathersABurstOfSubmissions) {
  TensorQueue q;
  const auto start = std::chrono::steady_clock::now();
  std::thread producer([&] {
    for (int i = 0; i < 5; ++i) {
      ASSERT_TRUE(q.Add(One(Entry("b" + std::to_string(i))), NextHandle()).ok());
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    q.BeginWait(12345);  // the submitting thread now blocks on a handle: the burst is over
  });
  q.WaitForWork(start + std::chrono::seconds(30), std::chrono::seconds(10),
                std::chrono::seconds(30));
  producer.join();
  EXPECT_EQ(q.PopNewRequests().size(), 5u);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(9));
}

TEST(TensorQueue, GatheringEndsWhenSubmissionsPauseOrAtTheLongestGather) {
  TensorQueue q;
  ASSERT_TRUE(q.Add(One(Entry("a")), NextHandle()).ok());
  auto start = std::chrono::steady_clock::now();
  q.WaitForWork(start + std::chrono::seconds(30), std::chrono::milliseconds(5),
                std::chrono::seconds(30));  // nothing more comes: ends after one 5 ms gap
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
  EXPECT_EQ(q.PopNewRequests().size(), 1u);

  std::atomic<bool> stop{false};
  std::thread producer([&] {  // submits every millisecond until told to stop
    for (int i = 0; !stop && i < 100000; ++i) {
      ASSERT_TRUE(q.Add(One(Entry("c" + std::to_string(i))), NextHandle()).ok());
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  start = std::chrono::steady_clock::now();
  q.WaitForWork(start + std::chrono::seconds(30), std::chrono::seconds(10),
                std::chrono::milliseconds(50));  // a gap never comes: the cap ends it
  const auto took = std::chrono::steady_clock::now() - start;
  stop = true;
  producer.join();
  EXPECT_GE(took, std::chrono::milliseconds(50));
  EXPECT_LT(took, std::chrono::seconds(9));
  EXPECT_FALSE(q.PopNewRequests().empty());
}

TEST(HandleTable, DeferredWakeupsAreDeliveredWhenTheScopeEnds) {
  HandleTable t;
  std::vector<Handle> handles;
  for (int i = 0; i < 3; ++i) handles.push_back(t.Allocate());
  std::atomic<int> woken{0};
  std::vector<std::thread> waiters;
  for (Handle h : handles) {
    waiters.emplace_back([&, h] {
      EXPECT_TRUE(t.Wait(h).ok());
      ++woken;
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // let them block (or not)
  {
    HandleTable::DeferWakeups outer;
    t.Complete(handles[0], Status::OK());
    {
      HandleTable::DeferWakeups inner;  // nested: only the outermost scope wakes
      t.Complete(handles[1], Status::OK());
    }
    t.Complete(handles[2], Status::OK());
  }
  for (std::thread& w : waiters) w.join();  // a lost wake-up would hang here
  EXPECT_EQ(woken, 3);
  EXPECT_EQ(t.size(), 0u);
}

TEST(HandleTable, PollWaitAndRelease) {
  HandleTable t;
  Handle h = t.Allocate();
  EXPECT_FALSE(*t.Poll(h));
  std::thread completer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    t.Complete(h, Status::Aborted("bye"));
  });
  EXPECT_EQ(t.Wait(h), Status::Aborted("bye"));
  completer.join();
  EXPECT_EQ(t.Poll(h).status().code(), StatusCode::kInvalidArgument);  // released
  EXPECT_EQ(t.Wait(h).code(), StatusCode::kInvalidArgument);
  Handle h2 = t.Allocate();
  EXPECT_NE(h2, h);
  t.Complete(h2, Status::OK());
  EXPECT_TRUE(*t.Poll(h2));
  EXPECT_TRUE(t.Wait(h2).ok());
  EXPECT_EQ(t.size(), 0u);
}

}  // namespace
}  // namespace hvd
