// horovod_cpp — Apache-2.0
#pragma once
// Helpers shared by the multi-rank tests: typed buffers whose elements are set and read as
// doubles, tolerances per dtype, and text helpers for expected error messages.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/horovod.h"
#include "ops/half.h"

namespace hvd {
namespace test {

inline int R() { return *Rank(); }
inline int N() { return *Size(); }

inline bool EnvIs(const char* name, const char* value) {
  const char* v = std::getenv(name);
  return v != nullptr && std::string(v) == value;
}

// ---- typed buffers: values are stored and read as doubles ------------------------------------

// Element i of a buffer of `dtype`, written and read as a double.
inline void WriteAs(DataType dtype, void* base, int64_t i, double v) {
  void* p = static_cast<uint8_t*>(base) + i * DataTypeSize(dtype);
  switch (dtype) {
    case DataType::kUInt8:
      *static_cast<uint8_t*>(p) = static_cast<uint8_t>(v);
      break;
    case DataType::kInt8:
      *static_cast<int8_t*>(p) = static_cast<int8_t>(v);
      break;
    case DataType::kUInt16:
      *static_cast<uint16_t*>(p) = static_cast<uint16_t>(v);
      break;
    case DataType::kInt16:
      *static_cast<int16_t*>(p) = static_cast<int16_t>(v);
      break;
    case DataType::kInt32:
      *static_cast<int32_t*>(p) = static_cast<int32_t>(v);
      break;
    case DataType::kInt64:
      *static_cast<int64_t*>(p) = static_cast<int64_t>(v);
      break;
    case DataType::kFloat32:
      *static_cast<float*>(p) = static_cast<float>(v);
      break;
    case DataType::kFloat64:
      *static_cast<double*>(p) = v;
      break;
    case DataType::kBool:
      *static_cast<bool*>(p) = v != 0;
      break;
    case DataType::kFloat16:
      *static_cast<uint16_t*>(p) = ops::FloatToHalf(static_cast<float>(v));
      break;
    case DataType::kBFloat16:
      *static_cast<uint16_t*>(p) = ops::FloatToBFloat16(static_cast<float>(v));
      break;
  }
}

inline double ReadAs(DataType dtype, const void* base, int64_t i) {
  const void* p = static_cast<const uint8_t*>(base) + i * DataTypeSize(dtype);
  switch (dtype) {
    case DataType::kUInt8:
      return *static_cast<const uint8_t*>(p);
    case DataType::kInt8:
      return *static_cast<const int8_t*>(p);
    case DataType::kUInt16:
      return *static_cast<const uint16_t*>(p);
    case DataType::kInt16:
      return *static_cast<const int16_t*>(p);
    case DataType::kInt32:
      return *static_cast<const int32_t*>(p);
    case DataType::kInt64:
      return static_cast<double>(*static_cast<const int64_t*>(p));
    case DataType::kFloat32:
      return *static_cast<const float*>(p);
    case DataType::kFloat64:
      return *static_cast<const double*>(p);
    case DataType::kBool:
      return *static_cast<const bool*>(p) ? 1 : 0;
    case DataType::kFloat16:
      return ops::HalfToFloat(*static_cast<const uint16_t*>(p));
    case DataType::kBFloat16:
      return ops::BFloat16ToFloat(*static_cast<const uint16_t*>(p));
  }
  return NAN;
}

struct Buffer {
  DataType dtype;
  std::vector<uint8_t> bytes;
  Buffer(DataType t, int64_t n) : dtype(t), bytes(static_cast<size_t>(n * DataTypeSize(t)), 0xAB) {}
  int64_t size() const { return static_cast<int64_t>(bytes.size()) / DataTypeSize(dtype); }
  TensorView View(TensorShape shape) { return TensorView{bytes.data(), dtype, std::move(shape)}; }
  TensorView View() { return View({size()}); }

  void Set(int64_t i, double v) { WriteAs(dtype, bytes.data(), i, v); }
  double Get(int64_t i) const { return ReadAs(dtype, bytes.data(), i); }
};

inline constexpr DataType kNumericTypes[] = {
    DataType::kUInt8,   DataType::kInt8,   DataType::kUInt16,  DataType::kInt16,
    DataType::kInt32,   DataType::kInt64,  DataType::kFloat16, DataType::kBFloat16,
    DataType::kFloat32, DataType::kFloat64};

inline bool IsUnsigned(DataType t) { return t == DataType::kUInt8 || t == DataType::kUInt16; }

inline double Tolerance(DataType t, double expected) {
  switch (t) {
    case DataType::kFloat16:
      return std::ldexp(1.0, -10) * std::max(1.0, std::fabs(expected));
    case DataType::kBFloat16:
      return std::ldexp(1.0, -7) * std::max(1.0, std::fabs(expected));
    case DataType::kFloat32:
      return 1e-6 * std::max(1.0, std::fabs(expected));
    case DataType::kFloat64:
      return 1e-12 * std::max(1.0, std::fabs(expected));
    default:
      return 0.0;  // integers are exact
  }
}

// "rank 0" / "ranks 1, 2, 3"
inline std::string RanksText(int first, int last) {
  std::string s = first == last ? "rank " : "ranks ";
  for (int r = first; r <= last; ++r) s += (r == first ? "" : ", ") + std::to_string(r);
  return s;
}

}  // namespace test
}  // namespace hvd
