// horovod_cpp — Apache-2.0
#include "base/status.h"

#include <gtest/gtest.h>

#include "common/horovod.h"

namespace hvd {
namespace {

TEST(Status, OkAndErrorsPrintTheirCode) {
  EXPECT_TRUE(Status::OK().ok());
  EXPECT_EQ(Status::OK().ToString(), "OK");
  Status s = Status::InvalidArgument("bad dtype");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.ToString(), "INVALID_ARGUMENT: bad dtype");
  EXPECT_EQ(Status::Aborted("x").ToString(), "ABORTED: x");
}

Result<int> Half(int x) {
  if (x % 2) return Status::InvalidArgument("odd");
  return x / 2;
}

Status UseMacros(int x, int* out) {
  HVD_ASSIGN_OR_RETURN(int h, Half(x));
  HVD_RETURN_IF_ERROR(h > 10 ? Status::FailedPrecondition("too big") : Status::OK());
  *out = h;
  return Status::OK();
}

TEST(Result, CarriesValueOrError) {
  Result<int> ok = Half(8);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(*ok, 4);
  Result<int> bad = Half(3);
  EXPECT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "odd");
  Result<int> from_ok_status(Status::OK());
  EXPECT_EQ(from_ok_status.status().code(), StatusCode::kInternal);
}

TEST(Result, MacrosPropagate) {
  int out = 0;
  EXPECT_TRUE(UseMacros(8, &out).ok());
  EXPECT_EQ(out, 4);
  EXPECT_EQ(UseMacros(7, &out).message(), "odd");
  EXPECT_EQ(UseMacros(40, &out).code(), StatusCode::kFailedPrecondition);
}

TEST(ResultDeathTest, ValueOnErrorAbortsWithMessage) {
  Result<int> bad = Half(3);
  EXPECT_DEATH((void)bad.value(), "Result::value\\(\\) on error: INVALID_ARGUMENT: odd");
}

// The public API before Init: every call gives a clear error, nothing crashes.
TEST(ApiBeforeInit, EveryCallSaysNotInitialized) {
  const std::string expected = "horovod_cpp has not been initialized; call hvd::Init() first";
  EXPECT_FALSE(IsInitialized());
  for (Result<int> r : {Rank(), Size(), LocalRank(), LocalSize(), CrossRank(), CrossSize()}) {
    EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_EQ(r.status().message(), expected);
  }
  float x = 1;
  auto h = EnqueueAllreduce(View(&x, {1}), View(&x, {1}), "x");
  EXPECT_EQ(h.status().message(), expected);
  auto b = EnqueueBroadcast(View(&x, {1}), View(&x, {1}), 0, "x");
  EXPECT_EQ(b.status().message(), expected);
  EXPECT_EQ(Allreduce(View(&x, {1}), View(&x, {1})).message(), expected);
  EXPECT_EQ(Barrier().message(), expected);
  EXPECT_EQ(GetStats().status().message(), expected);
  EXPECT_EQ(Poll(12345).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Wait(12345).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Shutdown().ok());  // a no-op before Init
}

TEST(DataTypes, ViewPicksTheDtype) {
  double d[2];
  int8_t i8[3];
  EXPECT_EQ(View(d, {2}).dtype, DataType::kFloat64);
  EXPECT_EQ(View(i8, {3}).dtype, DataType::kInt8);
  EXPECT_EQ(View(i8, {3}).shape, (TensorShape{3}));
  EXPECT_EQ(DataTypeSize(DataType::kBFloat16), 2);
  EXPECT_EQ(NumElements({}), 1);
  EXPECT_EQ(NumElements({3, 0, 2}), 0);
  EXPECT_EQ(ShapeToString({128, 64}), "[128, 64]");
}

}  // namespace
}  // namespace hvd
