// horovod_cpp — Apache-2.0
#pragma once
// Chrome Trace Event formatting
// (https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU). Pure functions
// that append one JSON object per event to a string; used by the writer thread only. Tensor names
// are escaped for JSON (quotes, backslashes, control characters), and bytes that are not valid
// UTF-8 become U+FFFD, so any name yields a parseable file.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace hvd {
namespace timeline {

// Appends `s` as a quoted JSON string.
void AppendJsonString(std::string* out, const std::string& s);

// {"name":"process_name","ph":"M","pid":0,"args":{"name":"horovod_cpp","start_time_since_epoch_in_micros":T}}
void AppendStartMetadata(std::string* out, int64_t epoch_micros);
// Row metadata of a tensor: its name and sort index.
void AppendTensorMetadata(std::string* out, int pid, const std::string& tensor_name);
// "B" / "E" span boundaries, "i" instants (scope "p": the tensor's row; "g": global).
void AppendBegin(std::string* out, int pid, const char* name, int64_t ts_micros);
void AppendEnd(std::string* out, int pid, int64_t ts_micros);
void AppendInstant(std::string* out, int pid, const std::string& name, int64_t ts_micros,
                   bool global);
// {"name":"dropped_events",...}: how many events the writer could not keep.
void AppendDroppedCounter(std::string* out, int64_t ts_micros, uint64_t dropped);
// {"name":NAME,"ph":"C","ts":T,"pid":0,"args":{KEY:VALUE,...}}: a counter track of the
// process row (adaptive training's batch size, noise scale, ...). Non-finite values are
// written as null, which chrome://tracing and Perfetto skip.
void AppendCounter(std::string* out, int64_t ts_micros, const std::string& name,
                   const std::vector<std::pair<std::string, double>>& values);

}  // namespace timeline
}  // namespace hvd
