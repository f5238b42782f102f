// horovod_cpp — Apache-2.0
#include "common/state/result_pool.h"

#include <cstdlib>
#include <iterator>
#include <map>
#include <vector>

#include "base/mutex.h"
#include "base/status.h"

namespace hvd {

struct ResultPool::Cache {
  explicit Cache(int64_t max) : max_bytes(max) {}
  ~Cache() {
    for (auto& [size, blocks] : free_blocks) {
      for (void* p : blocks) std::free(p);
    }
  }
  const int64_t max_bytes;
  mutable Mutex mu;
  std::map<int64_t, std::vector<void*>> free_blocks HVD_GUARDED_BY(mu);  // by rounded size
  int64_t bytes HVD_GUARDED_BY(mu) = 0;
};

namespace {

constexpr int64_t kAlign = 64;
constexpr int64_t kGranule = 4096;  // blocks of sizes within one page share a size class

}  // namespace

ResultPool::ResultPool(int64_t max_cached_bytes)
    : cache_(std::make_shared<Cache>(max_cached_bytes)) {}

std::shared_ptr<void> ResultPool::Allocate(int64_t bytes) {
  if (bytes < kMinPooledBytes) {
    void* p = std::malloc(static_cast<size_t>(bytes > 0 ? bytes : 1));
    HVD_CHECK(p != nullptr);
    return std::shared_ptr<void>(p, std::free);
  }
  const int64_t size = (bytes + kGranule - 1) / kGranule * kGranule;
  void* p = nullptr;
  {
    MutexLock lock(cache_->mu);
    auto it = cache_->free_blocks.find(size);
    if (it != cache_->free_blocks.end() && !it->second.empty()) {
      p = it->second.back();
      it->second.pop_back();
      cache_->bytes -= size;
    }
  }
  if (p == nullptr) p = std::aligned_alloc(kAlign, static_cast<size_t>(size));
  HVD_CHECK(p != nullptr);
  std::shared_ptr<Cache> cache = cache_;
  return std::shared_ptr<void>(p, [cache, size](void* block) {
    std::vector<void*> evicted;
    {
      MutexLock lock(cache->mu);
      if (size > cache->max_bytes) {
        evicted.push_back(block);
      } else {
        // The latest release wins: blocks of other sizes make room (a job's sizes change
        // rarely; a stale size must not hold the cache forever).
        for (auto it = cache->free_blocks.begin();
             cache->bytes + size > cache->max_bytes && it != cache->free_blocks.end();) {
          while (!it->second.empty() && cache->bytes + size > cache->max_bytes) {
            evicted.push_back(it->second.back());
            it->second.pop_back();
            cache->bytes -= it->first;
          }
          it = it->second.empty() ? cache->free_blocks.erase(it) : std::next(it);
        }
        cache->free_blocks[size].push_back(block);
        cache->bytes += size;
      }
    }
    for (void* p : evicted) std::free(p);
  });
}

int64_t ResultPool::cached_bytes() const {
  MutexLock lock(cache_->mu);
  return cache_->bytes;
}

}  // namespace hvd
