// horovod_cpp — Apache-2.0
#include "common/tensor_queue.h"

#include <unordered_set>

namespace hvd {

Status TensorQueue::Add(std::vector<TensorTableEntry> entries) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return closed_status_;
    std::unordered_set<std::string> seen;
    for (const TensorTableEntry& e : entries) {
      const Request& r = e.request;
      if (table_.count(Key{r.process_set_id, r.tensor_name}) || !seen.insert(r.tensor_name).second) {
        return Status::FailedPrecondition(
            std::string(OpTypeLowerName(r.type)) + " '" + r.tensor_name +
            "': a tensor with this name is already in flight; wait for it to complete, or give "
            "each concurrent operation a unique name");
      }
    }
    const bool was_idle = new_requests_.empty();
    for (TensorTableEntry& e : entries) {
      new_requests_.push_back(e.request);
      Key key{e.request.process_set_id, e.request.tensor_name};
      table_.emplace(std::move(key), std::move(e));
    }
    if (!was_idle) return Status::OK();  // the background thread has already been woken
  }
  cv_.notify_one();
  return Status::OK();
}

std::vector<Request> TensorQueue::PopNewRequests() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Request> out;
  out.swap(new_requests_);
  return out;
}

std::vector<TensorTableEntry> TensorQueue::Take(int32_t process_set_id,
                                                const std::vector<std::string>& names) {
  std::vector<TensorTableEntry> out;
  out.reserve(names.size());
  std::lock_guard<std::mutex> lock(mu_);
  for (const std::string& name : names) {
    auto it = table_.find(Key{process_set_id, name});
    HVD_CHECK(it != table_.end());
    out.push_back(std::move(it->second));
    table_.erase(it);
  }
  return out;
}

void TensorQueue::WaitForWork(Clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_until(lock, deadline, [this] { return !new_requests_.empty() || shutdown_requested_; });
}

void TensorQueue::RequestShutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    shutdown_requested_ = true;
  }
  cv_.notify_one();
}

bool TensorQueue::shutdown_requested() const {
  std::lock_guard<std::mutex> lock(mu_);
  return shutdown_requested_;
}

void TensorQueue::Close(const Status& status) {
  std::vector<TensorTableEntry> pending;
  {
    std::lock_guard<std::mutex> lock(mu_);
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
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = false;
  closed_status_ = Status::OK();
  shutdown_requested_ = false;
  table_.clear();
  new_requests_.clear();
}

size_t TensorQueue::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return table_.size();
}

}  // namespace hvd
