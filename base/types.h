// horovod_cpp — Apache-2.0
#pragma once
// Value types shared by the whole runtime: data types, reduction ops, operation kinds,
// devices and shapes. Plain data, no threads, no MPI.

#include <cstdint>
#include <string>
#include <vector>

namespace hvd {

// Numbering follows Horovod's DataType so that logs and wire dumps read the same;
// bfloat16 (absent from Horovod) is appended.
enum class DataType : uint8_t {
  kUInt8 = 0,
  kInt8 = 1,
  kUInt16 = 2,
  kInt16 = 3,
  kInt32 = 4,
  kInt64 = 5,
  kFloat16 = 6,
  kFloat32 = 7,
  kFloat64 = 8,
  kBool = 9,
  kBFloat16 = 10,
};
constexpr int kNumDataTypes = 11;

// Numbering follows horovod.torch: Average=0, Sum=1, Adasum=2, Min=3, Max=4, Product=5.
enum class ReduceOp : uint8_t {
  kAverage = 0,
  kSum = 1,
  kAdasum = 2,
  kMin = 3,
  kMax = 4,
  kProduct = 5,
};
constexpr int kNumReduceOps = 6;

// What a rank asks for. Responses use the same kinds plus kError.
enum class OpType : uint8_t {
  kAllreduce = 0,
  kAllgather = 1,
  kBroadcast = 2,
  kJoin = 3,
  kAdasum = 4,
  kAlltoall = 5,
  kBarrier = 6,
  kReducescatter = 7,
  kError = 8,
  kProcessSetAdd = 9,  // collective registration of a dynamic process set
  kProcessSetRemove = 10,
};
constexpr int kNumOpTypes = 11;

// Device of a tensor: kCpuDevice, or a CUDA device ordinal >= 0.
constexpr int32_t kCpuDevice = -1;

// The global process set (every rank).
constexpr int32_t kGlobalProcessSetId = 0;

bool IsValid(DataType dtype);
bool IsValid(ReduceOp op);
bool IsValid(OpType type);

// Bytes per element (bool is one byte).
int64_t DataTypeSize(DataType dtype);
// "float32", "bfloat16", ... (the torch spelling, as users see it).
const char* DataTypeName(DataType dtype);
bool IsFloatingPoint(DataType dtype);
// "Average", "Sum", ... (the Python constant names).
const char* ReduceOpName(ReduceOp op);
// "ALLREDUCE", "BROADCAST", ... (the timeline and error-message spelling).
const char* OpTypeName(OpType type);
// "allreduce", "broadcast", ... (used to build default tensor names and error prefixes).
const char* OpTypeLowerName(OpType type);
// "NEGOTIATE_ALLREDUCE", ... (timeline span names; string literals).
const char* NegotiateName(OpType type);

using TensorShape = std::vector<int64_t>;

// Product of the dimensions; 1 for a scalar (empty shape).
int64_t NumElements(const TensorShape& shape);
// Elements of one row along dim 0: the product of the dimensions after the first.
int64_t RowElements(const TensorShape& shape);
// Where each of `counts` starts when they are laid out back to back (exclusive prefix sums).
std::vector<int64_t> Displacements(const std::vector<int64_t>& counts);
// Rows of dim 0 that `rank_in_set` receives from a reducescatter of `dim0` rows over
// `set_size` ranks: the first dim0 % set_size ranks get one extra row.
int64_t ReducescatterRows(int64_t dim0, int set_size, int rank_in_set);

// "[128, 64]"; "[]" for a scalar.
std::string ShapeToString(const TensorShape& shape);
// "CPU" or "GPU:<ordinal>".
std::string DeviceToString(int32_t device);

}  // namespace hvd
