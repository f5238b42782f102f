// horovod_cpp — Apache-2.0
#include "base/logging.h"

#include <unistd.h>

#include <string>

namespace hvd {
namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::kWarning)};
std::atomic<int> g_rank{-1};
}  // namespace

const char* LogLevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kTrace:
      return "TRACE";
    case LogLevel::kDebug:
      return "DEBUG";
    case LogLevel::kInfo:
      return "INFO";
    case LogLevel::kWarning:
      return "WARNING";
    case LogLevel::kError:
      return "ERROR";
    case LogLevel::kFatal:
      return "FATAL";
  }
  return "?";
}

void SetLogLevel(LogLevel level) { g_level.store(static_cast<int>(level)); }
LogLevel GetLogLevel() { return static_cast<LogLevel>(g_level.load(std::memory_order_relaxed)); }
void SetLogRank(int rank) { g_rank.store(rank); }

namespace detail {

bool LogEnabled(LogLevel level) {
  return static_cast<int>(level) >= g_level.load(std::memory_order_relaxed);
}

LogMessage::~LogMessage() {
  std::string line = "[horovod_cpp rank " + std::to_string(g_rank.load()) + "] " +
                     LogLevelName(level_) + ": " + stream_.str() + "\n";
  // One write() per message so lines from different threads and ranks do not interleave.
  ssize_t ignored = ::write(STDERR_FILENO, line.data(), line.size());
  (void)ignored;
}

}  // namespace detail
}  // namespace hvd
