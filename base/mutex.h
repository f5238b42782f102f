// horovod_cpp — Apache-2.0
#pragma once
// A std::mutex and std::condition_variable that clang's -Wthread-safety can check.
//
//   Mutex mu_;
//   int n_ HVD_GUARDED_BY(mu_);
//   { MutexLock lock(mu_); ++n_; }                   // scoped
//   { UniqueLock lock(mu_);                          // scoped, can be released and retaken
//     while (n_ == 0) cv_.Wait(lock); }              // predicates stay in the caller, where
//                                                    // the analysis sees the lock held
// Zero cost: every member is an inline call to the standard type.

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "base/thread_annotations.h"

namespace hvd {

class HVD_CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;
  void Lock() HVD_ACQUIRE() { mu_.lock(); }
  void Unlock() HVD_RELEASE() { mu_.unlock(); }

 private:
  friend class UniqueLock;
  std::mutex mu_;
};

// Holds `mu` for its scope.
class HVD_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mu) HVD_ACQUIRE(mu) : mu_(mu) { mu_.Lock(); }
  ~MutexLock() HVD_RELEASE() { mu_.Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex& mu_;
};

// Holds `mu` for its scope, except between Unlock() and Lock(); what CondVar waits with.
class HVD_SCOPED_CAPABILITY UniqueLock {
 public:
  explicit UniqueLock(Mutex& mu) HVD_ACQUIRE(mu) : lock_(mu.mu_) {}
  ~UniqueLock() HVD_RELEASE() {}
  UniqueLock(const UniqueLock&) = delete;
  UniqueLock& operator=(const UniqueLock&) = delete;
  void Lock() HVD_ACQUIRE() { lock_.lock(); }
  void Unlock() HVD_RELEASE() { lock_.unlock(); }

 private:
  friend class CondVar;
  std::unique_lock<std::mutex> lock_;
};

// Waits release the lock while asleep and hold it again on return (spurious wake-ups
// included: call them in a loop on the condition).
class CondVar {
 public:
  void Wait(UniqueLock& lock) { cv_.wait(lock.lock_); }
  // false once `deadline` has passed.
  template <class Clock, class Duration>
  bool WaitUntil(UniqueLock& lock, const std::chrono::time_point<Clock, Duration>& deadline) {
    return cv_.wait_until(lock.lock_, deadline) == std::cv_status::no_timeout;
  }
  void NotifyOne() { cv_.notify_one(); }
  void NotifyAll() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

}  // namespace hvd
