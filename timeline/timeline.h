// horovod_cpp — Apache-2.0
#pragma once
// Chrome-tracing timeline (HOROVOD_TIMELINE). This is the interface the runtime will call;
// the writer (its own thread, a bounded queue, the Chrome Trace Event format) is not built
// yet, so Start() reports that plainly instead of silently writing nothing.
//
// Depends on nothing else in horovod_cpp.

#include <string>

namespace hvd {
namespace timeline {

class Timeline {
 public:
  // Starts recording into `path`. Returns false with `error` set when recording is not
  // possible (in this build: always, the writer is not implemented yet).
  bool Start(const std::string& path, bool mark_cycles, std::string* error);
  void Stop() {}
  bool enabled() const { return false; }
};

}  // namespace timeline
}  // namespace hvd
