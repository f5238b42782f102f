// horovod_cpp — Apache-2.0
#pragma once
// Rank-ordered blocks (allgatherv, alltoallv) for transports that take them back to back
// (Gloo, oneCCL): pack a layout with other displacements into a staging buffer, receive into
// one and unpack it.

#include <cstdint>
#include <cstring>
#include <vector>

namespace hvd {
namespace ops {

// Whether block r starts at the sum of the counts before it.
inline bool BackToBack(const std::vector<int64_t>& counts, const std::vector<int64_t>& displs) {
  int64_t at = 0;
  for (size_t r = 0; r < counts.size(); ++r) {
    if (displs[r] != at) return false;
    at += counts[r];
  }
  return true;
}

inline int64_t TotalCount(const std::vector<int64_t>& counts) {
  int64_t n = 0;
  for (int64_t c : counts) n += c;
  return n;
}

// `base`'s blocks back to back: `base` itself when they already are, else `*staging` filled.
inline const char* PackBlocks(const char* base, const std::vector<int64_t>& counts,
                              const std::vector<int64_t>& displs, int64_t elem,
                              std::vector<char>* staging) {
  if (BackToBack(counts, displs)) return base;
  staging->resize(static_cast<size_t>(TotalCount(counts) * elem));
  int64_t at = 0;
  for (size_t r = 0; r < counts.size(); ++r) {
    if (counts[r] > 0) {
      std::memcpy(staging->data() + at, base + displs[r] * elem,
                  static_cast<size_t>(counts[r] * elem));
    }
    at += counts[r] * elem;
  }
  return staging->data();
}

// Where blocks arriving back to back go: `out` itself when `displs` lay them so, else
// `*staging`, sized for them (then UnpackBlocks moves them to `out`).
inline char* ReceiveBlocks(char* out, const std::vector<int64_t>& counts,
                           const std::vector<int64_t>& displs, int64_t elem,
                           std::vector<char>* staging) {
  if (BackToBack(counts, displs)) return out;
  staging->resize(static_cast<size_t>(TotalCount(counts) * elem));
  return staging->data();
}

// Blocks back to back in `from` to their displacements in `out`.
inline void UnpackBlocks(const char* from, char* out, const std::vector<int64_t>& counts,
                         const std::vector<int64_t>& displs, int64_t elem) {
  int64_t at = 0;
  for (size_t r = 0; r < counts.size(); ++r) {
    if (counts[r] > 0) {
      std::memcpy(out + displs[r] * elem, from + at, static_cast<size_t>(counts[r] * elem));
    }
    at += counts[r] * elem;
  }
}

}  // namespace ops
}  // namespace hvd
