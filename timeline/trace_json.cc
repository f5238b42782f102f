// horovod_cpp — Apache-2.0
#include "timeline/trace_json.h"

#include <cmath>
#include <cstdio>

namespace hvd {
namespace timeline {
namespace {

// Length of the valid UTF-8 sequence starting at s[i], or 0 if it is not valid.
size_t Utf8Length(const std::string& s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  size_t n;
  uint32_t cp;
  if (c < 0x80) return 1;
  if ((c & 0xE0) == 0xC0) {
    n = 2;
    cp = c & 0x1F;
  } else if ((c & 0xF0) == 0xE0) {
    n = 3;
    cp = c & 0x0F;
  } else if ((c & 0xF8) == 0xF0) {
    n = 4;
    cp = c & 0x07;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((b(i + k) & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (b(i + k) & 0x3F);
  }
  // Reject overlong forms, surrogates and values beyond U+10FFFF.
  static const uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < kMin[n] || (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) return 0;
  return n;
}

void AppendInt(std::string* out, int64_t v) { *out += std::to_string(v); }

}  // namespace

void AppendJsonString(std::string* out, const std::string& s) {
  *out += '"';
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c == '"' || c == '\\') {
      *out += '\\';
      *out += static_cast<char>(c);
      ++i;
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      *out += buf;
      ++i;
    } else {
      const size_t n = Utf8Length(s, i);
      if (n == 0) {
        *out += "\xEF\xBF\xBD";  // U+FFFD for a byte that is not valid UTF-8
        ++i;
      } else {
        out->append(s, i, n);
        i += n;
      }
    }
  }
  *out += '"';
}

void AppendStartMetadata(std::string* out, int64_t epoch_micros) {
  *out +=
      R"({"name":"process_name","ph":"M","pid":0,"args":{"name":"horovod_cpp","start_time_since_epoch_in_micros":)";
  AppendInt(out, epoch_micros);
  *out += "}}";
}

void AppendTensorMetadata(std::string* out, int pid, const std::string& tensor_name) {
  *out += R"({"name":"process_name","ph":"M","pid":)";
  AppendInt(out, pid);
  *out += R"(,"args":{"name":)";
  AppendJsonString(out, tensor_name);
  *out += "}},\n";
  *out += R"({"name":"process_sort_index","ph":"M","pid":)";
  AppendInt(out, pid);
  *out += R"(,"args":{"sort_index":)";
  AppendInt(out, pid);
  *out += "}}";
}

void AppendBegin(std::string* out, int pid, const char* name, int64_t ts_micros) {
  *out += R"({"name":")";
  *out += name;  // activity names are fixed identifiers, never user text
  *out += R"(","ph":"B","ts":)";
  AppendInt(out, ts_micros);
  *out += R"(,"pid":)";
  AppendInt(out, pid);
  *out += R"(,"tid":0})";
}

void AppendEnd(std::string* out, int pid, int64_t ts_micros) {
  *out += R"({"ph":"E","ts":)";
  AppendInt(out, ts_micros);
  *out += R"(,"pid":)";
  AppendInt(out, pid);
  *out += R"(,"tid":0})";
}

void AppendInstant(std::string* out, int pid, const std::string& name, int64_t ts_micros,
                   bool global) {
  *out += R"({"name":)";
  AppendJsonString(out, name);
  *out += R"(,"ph":"i","ts":)";
  AppendInt(out, ts_micros);
  *out += R"(,"pid":)";
  AppendInt(out, pid);
  *out += global ? R"(,"tid":0,"s":"g"})" : R"(,"tid":0,"s":"p"})";
}

void AppendCounter(std::string* out, int64_t ts_micros, const std::string& name,
                   const std::vector<std::pair<std::string, double>>& values) {
  *out += R"({"name":)";
  AppendJsonString(out, name);
  *out += R"(,"ph":"C","ts":)";
  AppendInt(out, ts_micros);
  *out += R"(,"pid":0,"args":{)";
  for (size_t i = 0; i < values.size(); ++i) {
    if (i) *out += ",";
    AppendJsonString(out, values[i].first);
    *out += ":";
    const double v = values[i].second;
    if (std::isfinite(v)) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.9g", v);
      *out += buf;
    } else {
      *out += "null";
    }
  }
  *out += "}}";
}

void AppendDroppedCounter(std::string* out, int64_t ts_micros, uint64_t dropped) {
  *out += R"({"name":"dropped_events","ph":"C","ts":)";
  AppendInt(out, ts_micros);
  *out += R"(,"pid":0,"args":{"dropped":)";
  AppendInt(out, static_cast<int64_t>(dropped));
  *out += "}}";
}

}  // namespace timeline
}  // namespace hvd
