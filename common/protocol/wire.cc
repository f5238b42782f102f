// horovod_cpp — Apache-2.0
#include "common/protocol/wire.h"

#include <array>
#include <cstring>

namespace hvd {
namespace wire {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the wire format is little-endian; add byte swapping for big-endian hosts");

namespace {
std::array<uint32_t, 256> MakeCrcTable() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    table[i] = c;
  }
  return table;
}
}  // namespace

uint32_t Crc32(const uint8_t* data, size_t n) {
  static const std::array<uint32_t, 256> table = MakeCrcTable();
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) c = table[(c ^ data[i]) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

void Writer::Raw(const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  bytes_.insert(bytes_.end(), b, b + n);
}

void Writer::Str(const std::string& s) {
  U32(static_cast<uint32_t>(s.size()));
  Raw(s.data(), s.size());
}

void Writer::I64Vec(const std::vector<int64_t>& v) {
  U32(static_cast<uint32_t>(v.size()));
  for (int64_t x : v) I64(x);
}

Status Reader::Raw(void* out, size_t n, const char* what) {
  if (remaining() < n) {
    return Status::InvalidArgument(std::string("truncated message: needed ") + std::to_string(n) +
                                   " bytes for " + what + ", " + std::to_string(remaining()) +
                                   " left");
  }
  std::memcpy(out, p_, n);
  p_ += n;
  return Status::OK();
}

Status Reader::U8(uint8_t* v, const char* what) { return Raw(v, sizeof *v, what); }
Status Reader::U16(uint16_t* v, const char* what) { return Raw(v, sizeof *v, what); }
Status Reader::U32(uint32_t* v, const char* what) { return Raw(v, sizeof *v, what); }
Status Reader::I32(int32_t* v, const char* what) { return Raw(v, sizeof *v, what); }
Status Reader::I64(int64_t* v, const char* what) { return Raw(v, sizeof *v, what); }
Status Reader::F64(double* v, const char* what) { return Raw(v, sizeof *v, what); }

Status Reader::Count(uint32_t* count, size_t min_item_bytes, const char* what) {
  HVD_RETURN_IF_ERROR(U32(count, what));
  if (min_item_bytes > 0 && *count > remaining() / min_item_bytes) {
    return Status::InvalidArgument(std::string("corrupt message: ") + what + " announces " +
                                   std::to_string(*count) + " items but only " +
                                   std::to_string(remaining()) + " bytes remain");
  }
  return Status::OK();
}

Status Reader::Str(std::string* s, size_t max_len, const char* what) {
  uint32_t len = 0;
  HVD_RETURN_IF_ERROR(Count(&len, 1, what));
  if (len > max_len) {
    return Status::InvalidArgument(std::string("corrupt message: ") + what + " of " +
                                   std::to_string(len) + " bytes exceeds the limit of " +
                                   std::to_string(max_len));
  }
  s->assign(reinterpret_cast<const char*>(p_), len);
  p_ += len;
  return Status::OK();
}

Status Reader::I64Vec(std::vector<int64_t>* v, size_t max_count, const char* what) {
  uint32_t n = 0;
  HVD_RETURN_IF_ERROR(Count(&n, sizeof(int64_t), what));
  if (n > max_count) {
    return Status::InvalidArgument(std::string("corrupt message: ") + what + " has " +
                                   std::to_string(n) + " entries, more than the limit of " +
                                   std::to_string(max_count));
  }
  v->resize(n);
  for (uint32_t i = 0; i < n; ++i) HVD_RETURN_IF_ERROR(I64(&(*v)[i], what));
  return Status::OK();
}

}  // namespace wire
}  // namespace hvd
