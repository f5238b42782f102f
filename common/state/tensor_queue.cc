// horovod_cpp — Apache-2.0
#include "common/state/tensor_queue.h"

#include <algorithm>
#include <thread>
#include <unordered_set>

namespace hvd {

Status TensorQueue::Add(std::vector<TensorTableEntry> entries, Handle handle) {
  {
    MutexLock lock(mu_);
    if (closed_) return closed_status_;
    std::unordered_set<std::string> seen;
    for (const TensorTableEntry& e : entries) {
      const Request& r = e.request;
      if (removed_sets_.count(r.process_set_id)) {
        return Status::InvalidArgument(std::string(OpTypeLowerName(r.type)) + " '" + r.tensor_name +
                                       "': process set " + std::to_string(r.process_set_id) +
                                       " has been removed");
      }
      if (reserved_.count(r.key()) || !seen.insert(r.tensor_name).second) {
        return Status::FailedPrecondition(
            std::string(OpTypeLowerName(r.type)) + " '" + r.tensor_name +
            "': a tensor with this name is already in flight (submitted, and its handle not "
            "yet synchronized); synchronize it first, or give each concurrent operation a "
            "unique name");
      }
    }
    const bool was_idle = new_requests_.empty();
    std::vector<TensorKey>& names = reserved_by_handle_[handle];
    for (TensorTableEntry& e : entries) {
      new_requests_.push_back(e.request);
      TensorKey key = e.request.key();
      reserved_.insert(key);
      names.push_back(key);
      table_.emplace(std::move(key), std::move(e));
    }
    if (!was_idle) return Status::OK();  // the background thread has already been woken
  }
  cv_.NotifyOne();
  return Status::OK();
}

void TensorQueue::BeginWait(Handle handle, const std::string& call_site) {
  {
    MutexLock lock(mu_);
    Waiters& w = waiting_[handle];
    ++w.threads;
    if (!call_site.empty()) w.call_site = call_site;
  }
  cv_.NotifyOne();  // ends a gathering background thread's wait (WaitForWork)
}

void TensorQueue::EndWait(Handle handle) {
  MutexLock lock(mu_);
  auto it = waiting_.find(handle);
  if (it != waiting_.end() && --it->second.threads == 0) waiting_.erase(it);
}

template <typename Visit>
bool TensorQueue::VisitBlockedLocked(const Visit& visit) const {
  for (const auto& [handle, waiters] : waiting_) {
    auto names = reserved_by_handle_.find(handle);
    if (names == reserved_by_handle_.end()) continue;
    for (const TensorKey& key : names->second) {
      auto it = table_.find(key);
      if (it != table_.end() && visit(it->second.request, waiters.call_site)) return true;
    }
  }
  return false;
}

bool TensorQueue::Blocked() const {
  MutexLock lock(mu_);
  return VisitBlockedLocked([](const Request&, const std::string&) { return true; });
}

std::vector<Request> TensorQueue::BlockedOn() const {
  std::vector<Request> out;
  MutexLock lock(mu_);
  VisitBlockedLocked([&](const Request& r, const std::string& waiter_site) {
    out.push_back(r);
    if (out.back().call_site.empty()) out.back().call_site = waiter_site;
    return false;
  });
  return out;
}

size_t TensorQueue::FailKeys(const std::vector<TensorKey>& keys, const Status& status) {
  std::vector<TensorTableEntry> failed;
  {
    MutexLock lock(mu_);
    for (const TensorKey& key : keys) {
      auto it = table_.find(key);
      if (it == table_.end()) continue;
      failed.push_back(std::move(it->second));
      table_.erase(it);
    }
  }
  for (TensorTableEntry& e : failed) {
    if (e.callback) e.callback(status);
  }
  return failed.size();
}

void TensorQueue::ReleaseNames(Handle handle) {
  MutexLock lock(mu_);
  auto it = reserved_by_handle_.find(handle);
  if (it == reserved_by_handle_.end()) return;
  for (const TensorKey& key : it->second) reserved_.erase(key);
  reserved_by_handle_.erase(it);
}

std::vector<Request> TensorQueue::PopNewRequests() {
  MutexLock lock(mu_);
  std::vector<Request> out;
  out.swap(new_requests_);
  return out;
}

std::vector<std::optional<TensorTableEntry>> TensorQueue::Take(
    int32_t process_set_id, const std::vector<std::string>& names) {
  std::vector<std::optional<TensorTableEntry>> out;
  out.reserve(names.size());
  MutexLock lock(mu_);
  for (const std::string& name : names) {
    auto it = table_.find(TensorKey{process_set_id, name});
    if (it == table_.end()) {
      out.emplace_back(std::nullopt);
      continue;
    }
    out.emplace_back(std::move(it->second));
    table_.erase(it);
  }
  return out;
}

size_t TensorQueue::FailProcessSet(int32_t process_set_id, const Status& status) {
  std::vector<TensorTableEntry> failed;
  size_t unpopped = 0;
  {
    MutexLock lock(mu_);
    removed_sets_.insert(process_set_id);
    for (auto it = table_.begin(); it != table_.end();) {
      if (it->first.process_set_id != process_set_id) {
        ++it;
        continue;
      }
      failed.push_back(std::move(it->second));
      it = table_.erase(it);
    }
    auto keep = std::remove_if(new_requests_.begin(), new_requests_.end(), [&](const Request& r) {
      return r.process_set_id == process_set_id;
    });
    unpopped = static_cast<size_t>(new_requests_.end() - keep);
    new_requests_.erase(keep, new_requests_.end());
  }
  for (TensorTableEntry& e : failed) {
    if (e.callback) e.callback(status);
  }
  return failed.size() - unpopped;
}

void TensorQueue::WaitForWork(Clock::time_point deadline, Clock::duration gap,
                              Clock::duration longest_gather) {
  UniqueLock lock(mu_);
  while (new_requests_.empty() && !shutdown_requested_) {
    if (!cv_.WaitUntil(lock, deadline)) break;
  }
  if (new_requests_.empty() || gap <= Clock::duration::zero()) return;
  // Gather the rest of a burst: a thread submitting one tensor after another (a Python loop of
  // allreduce_async_, backward hooks firing) gets its tensors negotiated in one cycle, and this
  // thread stays off the CPU the submitting thread needs meanwhile. Ends as soon as a thread
  // blocks on a handle (BeginWait notifies), submissions pause for `gap`, or after
  // `longest_gather`.
  const Clock::time_point gather_end = Clock::now() + longest_gather;
  // First a short yielding spin: a blocking op's Wait follows its enqueue within microseconds,
  // and sleeping until BeginWait's notification would add a wake-up (~20 us) to every lone
  // blocking op. Yielding leaves a shared core to the submitting thread meanwhile.
  const Clock::time_point spin_end = Clock::now() + std::min<Clock::duration>(gap, kGatherSpin);
  const size_t first_seen = new_requests_.size();
  while (waiting_.empty() && !shutdown_requested_ && new_requests_.size() == first_seen &&
         Clock::now() < spin_end) {
    lock.Unlock();
    std::this_thread::yield();
    lock.Lock();
  }
  while (waiting_.empty() && !shutdown_requested_) {
    const size_t seen = new_requests_.size();
    const Clock::time_point until = std::min(gather_end, Clock::now() + gap);
    cv_.WaitUntil(lock, until);
    if (Clock::now() >= gather_end) break;
    if (new_requests_.size() == seen) break;  // the burst is over (a waiter ends the loop too)
  }
}

void TensorQueue::RequestShutdown() {
  {
    MutexLock lock(mu_);
    shutdown_requested_ = true;
  }
  cv_.NotifyOne();
}

bool TensorQueue::shutdown_requested() const {
  MutexLock lock(mu_);
  return shutdown_requested_;
}

void TensorQueue::Close(const Status& status) {
  std::vector<TensorTableEntry> pending;
  {
    MutexLock lock(mu_);
    closed_ = true;
    closed_status_ = status;
    for (auto& [key, entry] : table_) pending.push_back(std::move(entry));
    table_.clear();
    new_requests_.clear();
  }
  for (TensorTableEntry& e : pending) {
    if (e.callback) e.callback(status);
  }
}

void TensorQueue::Reset() {
  MutexLock lock(mu_);
  closed_ = false;
  closed_status_ = Status::OK();
  shutdown_requested_ = false;
  table_.clear();
  new_requests_.clear();
  removed_sets_.clear();
  reserved_.clear();
  reserved_by_handle_.clear();
  waiting_.clear();
}

size_t TensorQueue::size() const {
  MutexLock lock(mu_);
  return table_.size();
}

size_t TensorQueue::reserved() const {
  MutexLock lock(mu_);
  return reserved_.size();
}

}  // namespace hvd
