// horovod_cpp — Apache-2.0
#include "base/types.h"

namespace hvd {

bool IsValid(DataType dtype) { return static_cast<int>(dtype) < kNumDataTypes; }
bool IsValid(ReduceOp op) { return static_cast<int>(op) < kNumReduceOps; }
bool IsValid(OpType type) { return static_cast<int>(type) < kNumOpTypes; }

int64_t DataTypeSize(DataType dtype) {
  switch (dtype) {
    case DataType::kUInt8:
    case DataType::kInt8:
    case DataType::kBool:
      return 1;
    case DataType::kUInt16:
    case DataType::kInt16:
    case DataType::kFloat16:
    case DataType::kBFloat16:
      return 2;
    case DataType::kInt32:
    case DataType::kFloat32:
      return 4;
    case DataType::kInt64:
    case DataType::kFloat64:
      return 8;
  }
  return 0;
}

const char* DataTypeName(DataType dtype) {
  switch (dtype) {
    case DataType::kUInt8:
      return "uint8";
    case DataType::kInt8:
      return "int8";
    case DataType::kUInt16:
      return "uint16";
    case DataType::kInt16:
      return "int16";
    case DataType::kInt32:
      return "int32";
    case DataType::kInt64:
      return "int64";
    case DataType::kFloat16:
      return "float16";
    case DataType::kFloat32:
      return "float32";
    case DataType::kFloat64:
      return "float64";
    case DataType::kBool:
      return "bool";
    case DataType::kBFloat16:
      return "bfloat16";
  }
  return "invalid-dtype";
}

bool IsFloatingPoint(DataType dtype) {
  return dtype == DataType::kFloat16 || dtype == DataType::kBFloat16 ||
         dtype == DataType::kFloat32 || dtype == DataType::kFloat64;
}

const char* ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kAverage:
      return "Average";
    case ReduceOp::kSum:
      return "Sum";
    case ReduceOp::kAdasum:
      return "Adasum";
    case ReduceOp::kMin:
      return "Min";
    case ReduceOp::kMax:
      return "Max";
    case ReduceOp::kProduct:
      return "Product";
  }
  return "invalid-op";
}

const char* OpTypeName(OpType type) {
  switch (type) {
    case OpType::kAllreduce:
      return "ALLREDUCE";
    case OpType::kAllgather:
      return "ALLGATHER";
    case OpType::kBroadcast:
      return "BROADCAST";
    case OpType::kJoin:
      return "JOIN";
    case OpType::kAdasum:
      return "ADASUM";
    case OpType::kAlltoall:
      return "ALLTOALL";
    case OpType::kBarrier:
      return "BARRIER";
    case OpType::kReducescatter:
      return "REDUCESCATTER";
    case OpType::kError:
      return "ERROR";
    case OpType::kProcessSetAdd:
      return "PROCESS_SET_ADD";
    case OpType::kProcessSetRemove:
      return "PROCESS_SET_REMOVE";
  }
  return "INVALID";
}

const char* OpTypeLowerName(OpType type) {
  switch (type) {
    case OpType::kAllreduce:
      return "allreduce";
    case OpType::kAllgather:
      return "allgather";
    case OpType::kBroadcast:
      return "broadcast";
    case OpType::kJoin:
      return "join";
    case OpType::kAdasum:
      return "adasum";
    case OpType::kAlltoall:
      return "alltoall";
    case OpType::kBarrier:
      return "barrier";
    case OpType::kReducescatter:
      return "reducescatter";
    case OpType::kError:
      return "error";
    case OpType::kProcessSetAdd:
      return "add_process_set";
    case OpType::kProcessSetRemove:
      return "remove_process_set";
  }
  return "invalid";
}

const char* NegotiateName(OpType type) {
  switch (type) {
    case OpType::kAllreduce:
      return "NEGOTIATE_ALLREDUCE";
    case OpType::kAllgather:
      return "NEGOTIATE_ALLGATHER";
    case OpType::kBroadcast:
      return "NEGOTIATE_BROADCAST";
    case OpType::kJoin:
      return "NEGOTIATE_JOIN";
    case OpType::kAdasum:
      return "NEGOTIATE_ADASUM";
    case OpType::kAlltoall:
      return "NEGOTIATE_ALLTOALL";
    case OpType::kBarrier:
      return "NEGOTIATE_BARRIER";
    case OpType::kReducescatter:
      return "NEGOTIATE_REDUCESCATTER";
    case OpType::kError:
      return "NEGOTIATE_ERROR";
    case OpType::kProcessSetAdd:
      return "NEGOTIATE_PROCESS_SET_ADD";
    case OpType::kProcessSetRemove:
      return "NEGOTIATE_PROCESS_SET_REMOVE";
  }
  return "NEGOTIATE";
}

int64_t NumElements(const TensorShape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string ShapeToString(const TensorShape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

std::string DeviceToString(int32_t device) {
  return device == kCpuDevice ? "CPU" : "GPU:" + std::to_string(device);
}

int64_t RowElements(const TensorShape& shape) {
  int64_t n = 1;
  for (size_t i = 1; i < shape.size(); ++i) n *= shape[i];
  return n;
}

std::vector<int64_t> Displacements(const std::vector<int64_t>& counts) {
  std::vector<int64_t> d(counts.size(), 0);
  for (size_t i = 1; i < counts.size(); ++i) d[i] = d[i - 1] + counts[i - 1];
  return d;
}

int64_t ReducescatterRows(int64_t dim0, int set_size, int rank_in_set) {
  return dim0 / set_size + (rank_in_set < dim0 % set_size ? 1 : 0);
}

}  // namespace hvd
