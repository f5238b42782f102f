// horovod_cpp — Apache-2.0
// The device path's logic without a GPU: the routing rule, and what OpExecutor asks of the
// device backend (ops/device.h) for each agreed response, recorded by a fake backend: which
// calls, on which stream, with which fused tensors, reduction and scale, and that every entry
// completes with the event the backend returned.

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "common/state/counters.h"
#include "common/execution/op_executor.h"
#include "common/state/process_set.h"
#include "ops/device.h"
#include "tests/unit/local_backend.h"

namespace hvd {
namespace {

struct Call {
  std::string what;
  int device = -1;
  void* stream = nullptr;
  size_t tensors = 0;
  ReduceOp op = ReduceOp::kSum;
  double scale = 1.0;
  int64_t bytes_or_count = 0;
  int root = -1;
};

class FakeDevice : public ops::DeviceCollectives {
 public:
  std::vector<Call> calls;
  Status fail = Status::OK();
  int events = 0;

  const char* name() const override { return "FAKE"; }
  const char* ActivityName(OpType) const override { return "FAKE_COLLECTIVE"; }
  Result<std::shared_ptr<void>> Allocate(int device, int64_t bytes) override {
    calls.push_back({"allocate", device, nullptr, 0, ReduceOp::kSum, 1.0, bytes});
    return std::shared_ptr<void>(new uint8_t[static_cast<size_t>(bytes) + 1],
                                 [](void* p) { delete[] static_cast<uint8_t*>(p); });
  }
  Result<ops::Event> Allreduce(int32_t, int, int, int device, void* stream,
                               const std::vector<ops::DeviceTensor>& tensors, DataType, ReduceOp op,
                               double scale) override {
    int64_t count = 0;
    for (const auto& t : tensors) count += t.count;
    calls.push_back({"allreduce", device, stream, tensors.size(), op, scale, count});
    return Event();
  }
  Result<ops::Event> Broadcast(int32_t, int, int, int device, void* stream, const void*, void*,
                               int64_t bytes, int root) override {
    calls.push_back({"broadcast", device, stream, 1, ReduceOp::kSum, 1.0, bytes, root});
    return Event();
  }
  Result<ops::Event> Allgatherv(int32_t, int, int, int device, void* stream, const void*, void*,
                                const std::vector<int64_t>& counts, const std::vector<int64_t>&,
                                DataType) override {
    calls.push_back({"allgather", device, stream, 1, ReduceOp::kSum, 1.0, counts.at(0)});
    return Event();
  }
  Result<ops::Event> Alltoallv(int32_t, int, int, int device, void* stream, const void*,
                               const std::vector<int64_t>& send_counts, const std::vector<int64_t>&,
                               void*, const std::vector<int64_t>&, const std::vector<int64_t>&,
                               DataType) override {
    calls.push_back({"alltoall", device, stream, 1, ReduceOp::kSum, 1.0, send_counts.at(0)});
    return Event();
  }
  Result<ops::Event> ReduceScatter(int32_t, int, int, int device, void* stream, const void*, void*,
                                   const std::vector<int64_t>& recv_counts, DataType, ReduceOp op,
                                   double scale) override {
    calls.push_back({"reducescatter", device, stream, 1, op, scale, recv_counts.at(0)});
    return Event();
  }
  void RemoveProcessSet(int32_t) override {}

 private:
  Result<ops::Event> Event() {
    if (!fail.ok()) return fail;
    ++events;
    return ops::Event(new int(events), [](void* p) { delete static_cast<int*>(p); });
  }
};

// One simulated rank (a world of 1) whose device tensors go to a FakeDevice.
class DeviceExecutorTest : public ::testing::Test {
 protected:
  DeviceExecutorTest()
      : host_(test::CreateLocalBackend(std::make_shared<test::LocalWorld>(1), 0)),
        executor_(host_.get(), &sets_, &counters_, nullptr, 1 << 20, &fake_) {
    sets_.Reset(1, 0);
  }

  // Entries of `n` float tensors of `elems` elements each on GPU 1, caller stream kStream.
  std::vector<TensorTableEntry> Entries(size_t n, int64_t elems) {
    std::vector<TensorTableEntry> entries(n);
    for (TensorTableEntry& e : entries) {
      buffers_.emplace_back(static_cast<size_t>(elems), 1.0f);
      e.input = e.output = TensorView{buffers_.back().data(), DataType::kFloat32, {elems}, 1};
      e.input.stream = e.output.stream = kStream;
      e.result = std::make_shared<Output>();
    }
    return entries;
  }

  static Response Make(OpType type, size_t n, int64_t elems) {
    Response r;
    r.type = type;
    r.device = 1;
    for (size_t i = 0; i < n; ++i) {
      r.tensor_names.push_back("t" + std::to_string(i));
      r.tensor_sizes.push_back(elems);
    }
    return r;
  }

  void* const kStream = reinterpret_cast<void*>(0x5eed);
  std::unique_ptr<ops::Backend> host_;
  ProcessSetTable sets_;
  Counters counters_;
  FakeDevice fake_;
  OpExecutor executor_;
  std::vector<std::vector<float>> buffers_;
};

TEST(DeviceRoute, CpuToHostGpuToDeviceOrAClearError) {
  EXPECT_EQ(*ops::RouteFor(kCpuDevice, false), ops::Route::kHost);
  EXPECT_EQ(*ops::RouteFor(kCpuDevice, true), ops::Route::kHost);
  EXPECT_EQ(*ops::RouteFor(3, true), ops::Route::kDevice);
  const auto without = ops::RouteFor(0, false);
  ASSERT_FALSE(without.ok());
  EXPECT_NE(without.status().message().find("built without NCCL"), std::string::npos);
  EXPECT_NE(ops::RouteFor(-2, true).status().message().find("invalid device -2"),
            std::string::npos);
}

TEST_F(DeviceExecutorTest, FusedAllreduceIsOneCallOnTheCallersStreamAndEveryEntryGetsItsEvent) {
  std::vector<TensorTableEntry> entries = Entries(3, 10);
  Response r = Make(OpType::kAllreduce, 3, 10);
  r.reduce_op = ReduceOp::kAverage;
  ASSERT_TRUE(executor_.Execute(r, entries).ok());
  ASSERT_EQ(fake_.calls.size(), 1u);
  const Call& c = fake_.calls[0];
  EXPECT_EQ(c.what, "allreduce");
  EXPECT_EQ(c.device, 1);
  EXPECT_EQ(c.stream, kStream);
  EXPECT_EQ(c.tensors, 3u);
  EXPECT_EQ(c.bytes_or_count, 30);
  EXPECT_EQ(c.op, ReduceOp::kAverage);  // NCCL's own average
  EXPECT_EQ(c.scale, 1.0);
  for (const TensorTableEntry& e : entries) {
    ASSERT_NE(e.result->ready_event, nullptr);
    EXPECT_EQ(e.result->ready_event, entries[0].result->ready_event);
  }
  EXPECT_EQ(buffers_[0][0], 1.0f);  // the host never touched device memory
}

TEST_F(DeviceExecutorTest, ScalingFoldsIntoOneFactorAndAverageBecomesScaledSum) {
  std::vector<TensorTableEntry> entries = Entries(1, 4);
  Response r = Make(OpType::kAllreduce, 1, 4);
  r.reduce_op = ReduceOp::kAverage;
  r.prescale_factor = 0.5;
  r.postscale_factor = 3.0;
  ASSERT_TRUE(executor_.Execute(r, entries).ok());
  ASSERT_EQ(fake_.calls.size(), 1u);
  EXPECT_EQ(fake_.calls[0].op, ReduceOp::kSum);
  EXPECT_DOUBLE_EQ(fake_.calls[0].scale, 1.5 / 1);  // divided by the set size (1 here)
}

TEST_F(DeviceExecutorTest, OtherFusedGroupsRunTensorByTensorInOrder) {
  std::vector<TensorTableEntry> entries = Entries(2, 6);
  Response r = Make(OpType::kBroadcast, 2, 6);
  r.root_rank = 0;
  ASSERT_TRUE(executor_.Execute(r, entries).ok());
  ASSERT_EQ(fake_.calls.size(), 2u);
  for (const Call& c : fake_.calls) {
    EXPECT_EQ(c.what, "broadcast");
    EXPECT_EQ(c.bytes_or_count, 6 * 4);
    EXPECT_EQ(c.root, 0);
    EXPECT_EQ(c.stream, kStream);
  }
  EXPECT_NE(entries[0].result->ready_event, entries[1].result->ready_event);
}

TEST_F(DeviceExecutorTest, AllgatherAllocatesItsResultOnTheDevice) {
  std::vector<TensorTableEntry> entries = Entries(1, 6);
  entries[0].input.shape = {2, 3};
  Response r = Make(OpType::kAllgather, 1, 3);  // row of 3 elements
  r.rank_sizes = {2};                           // this (only) rank sent 2 rows
  ASSERT_TRUE(executor_.Execute(r, entries).ok());
  ASSERT_EQ(fake_.calls.size(), 2u);
  EXPECT_EQ(fake_.calls[0].what, "allocate");
  EXPECT_EQ(fake_.calls[0].bytes_or_count, 6 * 4);
  EXPECT_EQ(fake_.calls[1].what, "allgather");
  EXPECT_EQ(entries[0].result->shape, (TensorShape{2, 3}));
  EXPECT_NE(entries[0].result->data, nullptr);
}

TEST_F(DeviceExecutorTest, ABackendErrorIsWhatTheEntriesCompleteWith) {
  fake_.fail = Status::Unavailable("NCCL error: unhandled system error");
  std::vector<TensorTableEntry> entries = Entries(2, 5);
  const Status s = executor_.Execute(Make(OpType::kAllreduce, 2, 5), entries);
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_EQ(entries[0].result->ready_event, nullptr);
}

TEST(DeviceExecutorWithoutNccl, CudaTensorsGetAClearError) {
  auto host = test::CreateLocalBackend(std::make_shared<test::LocalWorld>(1), 0);
  ProcessSetTable sets;
  sets.Reset(1, 0);
  Counters counters;
  OpExecutor executor(host.get(), &sets, &counters, nullptr, 1 << 20, nullptr);
  std::vector<float> x(4);
  std::vector<TensorTableEntry> entries(1);
  entries[0].input = entries[0].output = TensorView{x.data(), DataType::kFloat32, {4}, 0};
  entries[0].result = std::make_shared<Output>();
  Response r;
  r.device = 0;
  r.tensor_names = {"t"};
  r.tensor_sizes = {4};
  const Status s = executor.Execute(r, entries);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("CUDA tensors need a horovod_cpp built with NCCL"), std::string::npos);
}

}  // namespace
}  // namespace hvd
