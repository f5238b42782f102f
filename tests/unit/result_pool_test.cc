// horovod_cpp — Apache-2.0
// ResultPool: released result blocks are reused for the same size, the cache stays within its
// bound (latest release first), small blocks bypass it, and blocks may outlive the pool.

#include "common/state/result_pool.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <thread>
#include <vector>

namespace hvd {
namespace {

constexpr int64_t kMiB = 1 << 20;

TEST(ResultPool, AReleasedBlockIsReusedForTheSameSize) {
  ResultPool pool(16 * kMiB);
  void* first = nullptr;
  {
    std::shared_ptr<void> a = pool.Allocate(4 * kMiB);
    first = a.get();
    std::memset(a.get(), 1, 4 * kMiB);  // writable, the whole size
    EXPECT_EQ(pool.cached_bytes(), 0);
  }
  EXPECT_EQ(pool.cached_bytes(), 4 * kMiB);
  std::shared_ptr<void> b = pool.Allocate(4 * kMiB - 100);  // same 4 KiB size class
  EXPECT_EQ(b.get(), first);
  EXPECT_EQ(pool.cached_bytes(), 0);
  std::shared_ptr<void> c = pool.Allocate(2 * kMiB);  // another size: fresh
  EXPECT_NE(c.get(), first);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(c.get()) % 64, 0u);
}

TEST(ResultPool, TheCacheStaysWithinItsBoundKeepingTheLatestReleases) {
  ResultPool pool(5 * kMiB);
  std::shared_ptr<void> a = pool.Allocate(2 * kMiB), b = pool.Allocate(2 * kMiB);
  std::shared_ptr<void> c = pool.Allocate(3 * kMiB);
  void* c_block = c.get();
  a.reset();
  b.reset();
  EXPECT_EQ(pool.cached_bytes(), 4 * kMiB);
  c.reset();  // 3 MiB more does not fit: 2 MiB blocks make room, the latest release is kept
  EXPECT_LE(pool.cached_bytes(), 5 * kMiB);
  EXPECT_EQ(pool.Allocate(3 * kMiB).get(), c_block);
  std::shared_ptr<void> huge = pool.Allocate(6 * kMiB);  // above the bound: never cached
  huge.reset();
  EXPECT_LE(pool.cached_bytes(), 5 * kMiB);
}

TEST(ResultPool, SmallBlocksBypassTheCacheAndEmptyResultsHaveAnAddress) {
  ResultPool pool(16 * kMiB);
  pool.Allocate(ResultPool::kMinPooledBytes - 1).reset();
  EXPECT_EQ(pool.cached_bytes(), 0);
  EXPECT_NE(pool.Allocate(0).get(), nullptr);
}

TEST(ResultPool, BlocksOutliveThePoolAndMayBeReleasedOnAnyThread) {
  std::shared_ptr<void> kept;
  {
    ResultPool pool(16 * kMiB);
    kept = pool.Allocate(kMiB);
  }
  std::thread([&] { kept.reset(); }).join();  // the cache is freed with its last block
  SUCCEED();
}

}  // namespace
}  // namespace hvd
