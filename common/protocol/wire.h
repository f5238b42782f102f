// horovod_cpp — Apache-2.0
#pragma once
// Byte-level codec helpers for the wire format: a little-endian Writer and a bounds-checked
// Reader. The Reader never reads past its buffer: every Read* checks the remaining length
// first and returns an error Status naming what was being read. Used by whatever crosses
// ranks as bytes: the messages (message.cc), the knobs rank 0 broadcasts (config/config.cc,
// config/autotune.cc), the controller's CRC of the request lists (negotiation/controller.cc)
// and the collective watchdog's side channel (loop/collective_watchdog.cc).

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"

namespace hvd {
namespace wire {

// CRC-32 (IEEE 802.3) of `n` bytes.
uint32_t Crc32(const uint8_t* data, size_t n);

class Writer {
 public:
  void U8(uint8_t v) { bytes_.push_back(v); }
  void U16(uint16_t v) { Raw(&v, sizeof v); }
  void U32(uint32_t v) { Raw(&v, sizeof v); }
  void I32(int32_t v) { Raw(&v, sizeof v); }
  void I64(int64_t v) { Raw(&v, sizeof v); }
  void F64(double v) { Raw(&v, sizeof v); }
  void Str(const std::string& s);
  void I64Vec(const std::vector<int64_t>& v);
  std::vector<uint8_t>& bytes() { return bytes_; }

 private:
  void Raw(const void* p, size_t n);  // little-endian hosts only (checked at compile time)
  std::vector<uint8_t> bytes_;
};

class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : p_(data), end_(data + size) {}
  Status U8(uint8_t* v, const char* what);
  Status U16(uint16_t* v, const char* what);
  Status U32(uint32_t* v, const char* what);
  Status I32(int32_t* v, const char* what);
  Status I64(int64_t* v, const char* what);
  Status F64(double* v, const char* what);
  // Strings longer than `max_len` are rejected before anything is allocated.
  Status Str(std::string* s, size_t max_len, const char* what);
  // Vectors with more than `max_count` elements are rejected before anything is allocated.
  Status I64Vec(std::vector<int64_t>* v, size_t max_count, const char* what);
  // Reads a count that announces `count` items of at least `min_item_bytes` each, and checks
  // that they can fit in what remains.
  Status Count(uint32_t* count, size_t min_item_bytes, const char* what);
  size_t remaining() const { return static_cast<size_t>(end_ - p_); }

 private:
  Status Raw(void* out, size_t n, const char* what);
  const uint8_t* p_;
  const uint8_t* end_;
};

}  // namespace wire
}  // namespace hvd
