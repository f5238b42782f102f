// horovod_cpp — Apache-2.0
#include "tests/unit/local_backend.h"

#include <algorithm>
#include <cstring>

#include "ops/reduce_kernels.h"

namespace hvd {
namespace test {

int LocalGroup::IndexOf(int rank) const {
  auto it = std::find(ranks_.begin(), ranks_.end(), rank);
  return it == ranks_.end() ? -1 : static_cast<int>(it - ranks_.begin());
}

void LocalGroup::Wait() {
  std::unique_lock<std::mutex> lock(mu_);
  const uint64_t generation = generation_;
  if (++arrived_ == size()) {
    arrived_ = 0;
    ++generation_;
    cv_.notify_all();
    return;
  }
  cv_.wait(lock, [&] { return generation_ != generation; });
}

LocalWorld::LocalWorld(int size) : size_(size) {
  std::vector<int> all(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) all[static_cast<size_t>(r)] = r;
  groups_[kGlobalProcessSetId] = std::make_shared<LocalGroup>(all);
}

std::shared_ptr<LocalGroup> LocalWorld::Group(int32_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = groups_.find(id);
  return it == groups_.end() ? nullptr : it->second;
}

std::shared_ptr<LocalGroup> LocalWorld::AddGroup(int32_t id, const std::vector<int>& ranks) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& g = groups_[id];
  if (!g) g = std::make_shared<LocalGroup>(ranks);
  return g;
}

void LocalWorld::RemoveGroup(int32_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  groups_.erase(id);
}

namespace {

class LocalBackend : public ops::Backend {
 public:
  LocalBackend(std::shared_ptr<LocalWorld> world, int rank) : world_(std::move(world)) {
    topology_.rank = rank;
    topology_.size = world_->size();
    topology_.local_rank = rank;
    topology_.local_size = world_->size();
    topology_.threads_multiple = true;
    sets_[kGlobalProcessSetId] = world_->Group(kGlobalProcessSetId);
  }

  const char* name() const override { return "LOCAL"; }
  const char* ActivityName(OpType) const override { return "LOCAL_COLLECTIVE"; }
  Status Initialize() override { return Status::OK(); }
  Status Finalize() override { return Status::OK(); }
  const ops::Topology& topology() const override { return topology_; }

  Status AllreduceBitsAnd(uint64_t* words, int count) override {
    std::vector<uint64_t> result(words, words + count);
    Global()->Exchange(topology_.rank, words, [&](const std::vector<const void*>& all) {
      for (const void* p : all) {
        for (int i = 0; i < count; ++i) result[i] &= static_cast<const uint64_t*>(p)[i];
      }
    });
    std::copy(result.begin(), result.end(), words);
    return Status::OK();
  }

  Status GatherBytes(const std::vector<uint8_t>& mine,
                     std::vector<std::vector<uint8_t>>* at_root) override {
    Global()->Exchange(topology_.rank, &mine, [&](const std::vector<const void*>& all) {
      if (topology_.rank != 0) return;
      at_root->clear();
      for (const void* p : all) at_root->push_back(*static_cast<const std::vector<uint8_t>*>(p));
    });
    return Status::OK();
  }

  Status BroadcastBytes(std::vector<uint8_t>* bytes, int root) override {
    std::vector<uint8_t> copy;
    Global()->Exchange(topology_.rank, bytes, [&](const std::vector<const void*>& all) {
      copy = *static_cast<const std::vector<uint8_t>*>(all[static_cast<size_t>(root)]);
    });
    *bytes = std::move(copy);
    return Status::OK();
  }

  Status AddProcessSet(int32_t id, const std::vector<int>& ranks) override {
    Global()->Wait();
    sets_[id] = world_->AddGroup(id, ranks);
    Global()->Wait();
    return Status::OK();
  }

  Status RemoveProcessSet(int32_t id) override {
    Global()->Wait();
    sets_.erase(id);
    if (topology_.rank == 0) world_->RemoveGroup(id);
    Global()->Wait();
    return Status::OK();
  }

  Status Allreduce(int32_t ps, const void* send, void* recv, int64_t count, DataType dtype,
                   ReduceOp op) override {
    HVD_ASSIGN_OR_RETURN(auto g, Set(ps));
    const size_t bytes = static_cast<size_t>(count * DataTypeSize(dtype));
    std::vector<uint8_t> acc(bytes);
    const void* mine = send != nullptr ? send : recv;
    g.first->Exchange(g.second, mine, [&](const std::vector<const void*>& all) {
      if (bytes > 0) std::memcpy(acc.data(), all[0], bytes);
      for (size_t r = 1; r < all.size(); ++r) ops::ReduceInto(acc.data(), all[r], count, dtype, op);
    });
    if (bytes > 0) std::memcpy(recv, acc.data(), bytes);
    return Status::OK();
  }

  Status Broadcast(int32_t ps, void* buffer, int64_t bytes, int root) override {
    HVD_ASSIGN_OR_RETURN(auto g, Set(ps));
    std::vector<uint8_t> copy(static_cast<size_t>(bytes));
    g.first->Exchange(g.second, buffer, [&](const std::vector<const void*>& all) {
      if (bytes > 0) std::memcpy(copy.data(), all[static_cast<size_t>(root)], copy.size());
    });
    if (bytes > 0) std::memcpy(buffer, copy.data(), copy.size());
    return Status::OK();
  }

  Status Barrier(int32_t ps) override {
    HVD_ASSIGN_OR_RETURN(auto g, Set(ps));
    g.first->Wait();
    return Status::OK();
  }

  Status Allgatherv(int32_t ps, const void* send, int64_t send_count, void* recv,
                    const std::vector<int64_t>& counts, const std::vector<int64_t>& displs,
                    DataType dtype) override {
    (void)send_count;
    HVD_ASSIGN_OR_RETURN(auto g, Set(ps));
    const int64_t elem = DataTypeSize(dtype);
    int64_t total = 0;
    for (size_t r = 0; r < counts.size(); ++r) total = std::max(total, displs[r] + counts[r]);
    std::vector<uint8_t> out(static_cast<size_t>(total * elem));
    g.first->Exchange(g.second, send, [&](const std::vector<const void*>& all) {
      for (size_t r = 0; r < all.size(); ++r) {
        if (counts[r] > 0) {
          std::memcpy(out.data() + displs[r] * elem, all[r], static_cast<size_t>(counts[r] * elem));
        }
      }
    });
    if (!out.empty()) std::memcpy(recv, out.data(), out.size());
    return Status::OK();
  }

  Status Alltoallv(int32_t ps, const void* send, const std::vector<int64_t>& send_counts,
                   const std::vector<int64_t>& send_displs, void* recv,
                   const std::vector<int64_t>& recv_counts, const std::vector<int64_t>& recv_displs,
                   DataType dtype) override {
    (void)send_counts;
    HVD_ASSIGN_OR_RETURN(auto g, Set(ps));
    const int64_t elem = DataTypeSize(dtype);
    struct Posted {
      const void* send;
      const std::vector<int64_t>* displs;
    } mine{send, &send_displs};
    int64_t total = 0;
    for (size_t r = 0; r < recv_counts.size(); ++r) {
      total = std::max(total, recv_displs[r] + recv_counts[r]);
    }
    std::vector<uint8_t> out(static_cast<size_t>(total * elem));
    const size_t me = static_cast<size_t>(g.second);
    g.first->Exchange(g.second, &mine, [&](const std::vector<const void*>& all) {
      for (size_t r = 0; r < all.size(); ++r) {
        const auto* p = static_cast<const Posted*>(all[r]);
        if (recv_counts[r] == 0) continue;
        std::memcpy(out.data() + recv_displs[r] * elem,
                    static_cast<const uint8_t*>(p->send) + (*p->displs)[me] * elem,
                    static_cast<size_t>(recv_counts[r] * elem));
      }
    });
    if (!out.empty()) std::memcpy(recv, out.data(), out.size());
    return Status::OK();
  }

  Status ReduceScatter(int32_t ps, const void* send, void* recv,
                       const std::vector<int64_t>& recv_counts, DataType dtype,
                       ReduceOp op) override {
    HVD_ASSIGN_OR_RETURN(auto g, Set(ps));
    const int64_t elem = DataTypeSize(dtype);
    int64_t offset = 0;
    for (int r = 0; r < g.second; ++r) offset += recv_counts[static_cast<size_t>(r)];
    const int64_t count = recv_counts[static_cast<size_t>(g.second)];
    std::vector<uint8_t> acc(static_cast<size_t>(count * elem));
    g.first->Exchange(g.second, send, [&](const std::vector<const void*>& all) {
      for (size_t r = 0; r < all.size(); ++r) {
        const uint8_t* part = static_cast<const uint8_t*>(all[r]) + offset * elem;
        if (count == 0) continue;
        if (r == 0) {
          std::memcpy(acc.data(), part, acc.size());
        } else {
          ops::ReduceInto(acc.data(), part, count, dtype, op);
        }
      }
    });
    if (!acc.empty()) std::memcpy(recv, acc.data(), acc.size());
    return Status::OK();
  }

 private:
  LocalGroup* Global() { return sets_[kGlobalProcessSetId].get(); }

  Result<std::pair<LocalGroup*, int>> Set(int32_t ps) {
    auto it = sets_.find(ps);
    if (it == sets_.end()) return Status::InvalidArgument("no local process set");
    const int index = it->second->IndexOf(topology_.rank);
    if (index < 0) return Status::InvalidArgument("not a member of the local process set");
    return std::make_pair(it->second.get(), index);
  }

  std::shared_ptr<LocalWorld> world_;
  ops::Topology topology_;
  std::map<int32_t, std::shared_ptr<LocalGroup>> sets_;
};

}  // namespace

std::unique_ptr<ops::Backend> CreateLocalBackend(std::shared_ptr<LocalWorld> world, int rank) {
  return std::make_unique<LocalBackend>(std::move(world), rank);
}

}  // namespace test
}  // namespace hvd
