// horovod_cpp — Apache-2.0
// ops::CreateBackends is the one place that chooses backends, and the loop runs CUDA tensors
// on whatever device backend it is handed (here a recording fake, as tests hand it a
// LocalBackend for the host).

#include "ops/factory.h"

#include <cstdlib>

#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "common/loop/background_loop.h"
#include "ops/nccl_info.h"
#include "tests/unit/local_backend.h"

namespace hvd {
namespace {

TEST(BackendFactory, MakesTheMpiHostBackendAndTheDeviceBackendThisBuildHas) {
  Result<ops::Backends> b = ops::CreateBackends();
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  ASSERT_NE(b->host, nullptr);
  EXPECT_STREQ(b->host->name(), "MPI");
  // A device backend exactly when this build has NCCL.
  EXPECT_EQ(b->device != nullptr, ops::NcclVersionCode() != 0);
  b->device.reset();  // before the host it points to
}

TEST(BackendFactory, AnUnknownHostBackendIsAClearError) {
  ops::BackendOptions options;
  options.host = "carrier-pigeon";
  Result<ops::Backends> b = ops::CreateBackends(options);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().message(), "unknown host backend 'carrier-pigeon' (known: mpi, gloo)");
}

// oneCCL wraps the controller's backend where the build has it, and is a clear error where not.
TEST(BackendFactory, CclWrapsTheControllerOrIsAClearErrorWithoutIt) {
  ops::BackendOptions options;
  options.cpu_operations = "ccl";
  Result<ops::Backends> b = ops::CreateBackends(options);
  if (ops::CclBuilt()) {
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    EXPECT_STREQ(b->host->name(), "oneCCL");
    EXPECT_STREQ(b->host->ActivityName(OpType::kAllreduce), "CCL_ALLREDUCE");
    b->device.reset();
  } else {
    ASSERT_FALSE(b.ok());
    EXPECT_NE(b.status().message().find("this build of horovod_cpp has no oneCCL"),
              std::string::npos)
        << b.status().message();
  }
}

TEST(BackendFactory, HorovodsVariablesChooseControllerAndCpuOperations) {
  struct Case {
    const char* controller;
    const char* cpu;
    const char* host;       // expected controller, or nullptr for an error
    const char* cpu_ops;    // expected cpu_operations
  };
  const Case cases[] = {
      {nullptr, nullptr, "mpi", ""},   {"gloo", nullptr, "gloo", ""},
      {nullptr, "GLOO", "gloo", ""},   {"mpi", "ccl", "mpi", "ccl"},
      {"gloo", "ccl", "gloo", "ccl"},  {nullptr, "ccl", "mpi", "ccl"},
      {"gloo", "mpi", nullptr, ""},    {"ccl", nullptr, nullptr, ""},
      {nullptr, "nccl", nullptr, ""},
  };
  for (const Case& c : cases) {
    c.controller ? setenv("HOROVOD_CONTROLLER", c.controller, 1) : unsetenv("HOROVOD_CONTROLLER");
    c.cpu ? setenv("HOROVOD_CPU_OPERATIONS", c.cpu, 1) : unsetenv("HOROVOD_CPU_OPERATIONS");
    Result<ops::BackendOptions> o = ops::BackendOptions::FromEnv();
    const std::string label = std::string(c.controller ? c.controller : "-") + "/" +
                              (c.cpu ? c.cpu : "-");
    if (c.host == nullptr) {
      EXPECT_FALSE(o.ok()) << label;
      continue;
    }
    ASSERT_TRUE(o.ok()) << label << ": " << o.status().ToString();
    EXPECT_EQ(o->host, c.host) << label;
    EXPECT_EQ(o->cpu_operations, c.cpu_ops) << label;
  }
  unsetenv("HOROVOD_CONTROLLER");
  unsetenv("HOROVOD_CPU_OPERATIONS");
}

// Records what the loop asks of it; only Allreduce is expected.
class RecordingDevice : public ops::DeviceCollectives {
 public:
  std::vector<std::string> calls;
  int device = -1;
  int64_t count = 0;

  const char* name() const override { return "RECORDING"; }
  const char* ActivityName(OpType) const override { return "RECORDING_ALLREDUCE"; }
  Result<std::shared_ptr<void>> Allocate(int, int64_t) override { return Unexpected("allocate"); }
  Result<ops::Event> Allreduce(int32_t, int, int, int dev, void*,
                               const std::vector<ops::DeviceTensor>& tensors, DataType, ReduceOp,
                               double) override {
    calls.push_back("allreduce");
    device = dev;
    for (const auto& t : tensors) count += t.count;
    return ops::Event();
  }
  Result<ops::Event> Broadcast(int32_t, int, int, int, void*, const void*, void*, int64_t,
                               int) override {
    return Unexpected("broadcast");
  }
  Result<ops::Event> Allgatherv(int32_t, int, int, int, void*, const void*, void*,
                                const std::vector<int64_t>&, const std::vector<int64_t>&,
                                DataType) override {
    return Unexpected("allgather");
  }
  Result<ops::Event> Alltoallv(int32_t, int, int, int, void*, const void*,
                               const std::vector<int64_t>&, const std::vector<int64_t>&, void*,
                               const std::vector<int64_t>&, const std::vector<int64_t>&,
                               DataType) override {
    return Unexpected("alltoall");
  }
  Result<ops::Event> ReduceScatter(int32_t, int, int, int, void*, const void*, void*,
                                   const std::vector<int64_t>&, DataType, ReduceOp,
                                   double) override {
    return Unexpected("reducescatter");
  }
  void RemoveProcessSet(int32_t) override {}

 private:
  Status Unexpected(const std::string& what) {
    calls.push_back(what);
    return Status::Internal("unexpected " + what);
  }
};

TEST(BackendInjection, TheLoopRunsCudaTensorsOnTheDeviceBackendItIsGiven) {
  TensorQueue queue;
  ProcessSetTable sets;
  Counters counters;
  BackgroundLoop loop(&queue, &sets, &counters);
  auto recording = std::make_unique<RecordingDevice>();
  RecordingDevice* device = recording.get();
  ops::Backends backends;
  backends.host = test::CreateLocalBackend(std::make_shared<test::LocalWorld>(1), 0);
  backends.device = std::move(recording);
  ASSERT_TRUE(loop.Start(Config{}, {}, std::move(backends)).ok());

  std::vector<float> data(6, 1.0f);
  TensorTableEntry e;
  e.input = e.output = TensorView{data.data(), DataType::kFloat32, {6}, /*device=*/2};
  e.result = std::make_shared<Output>();
  e.request.type = OpType::kAllreduce;
  e.request.dtype = DataType::kFloat32;
  e.request.reduce_op = ReduceOp::kSum;
  e.request.tensor_name = "grad";
  e.request.shape = {6};
  e.request.device = 2;
  std::promise<Status> done;
  e.callback = [&done](const Status& s) { done.set_value(s); };
  std::vector<TensorTableEntry> entries;
  entries.push_back(std::move(e));
  ASSERT_TRUE(queue.Add(std::move(entries), /*handle=*/1).ok());
  std::future<Status> finished = done.get_future();
  ASSERT_EQ(finished.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  const Status status = finished.get();
  EXPECT_TRUE(status.ok()) << status.ToString();
  // Read before Stop, which destroys the device backend with the loop's other state.
  EXPECT_EQ(device->calls, std::vector<std::string>{"allreduce"});
  EXPECT_EQ(device->device, 2);
  EXPECT_EQ(device->count, 6);
  loop.Stop();
}

}  // namespace
}  // namespace hvd
