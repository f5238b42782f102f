// horovod_cpp — Apache-2.0
#pragma once
// Logging: `HVD_LOG(WARNING) << "text";` writes one line to stderr,
// "[horovod_cpp rank 3] WARNING: text", when the level is at least HOROVOD_LOG_LEVEL.
// A disabled level costs one relaxed atomic load and a branch. Thread-safe: each message
// is written with a single write call.

#include <atomic>
#include <sstream>

namespace hvd {

enum class LogLevel : int { kTrace = 0, kDebug, kInfo, kWarning, kError, kFatal };

// "TRACE" ... "FATAL".
const char* LogLevelName(LogLevel level);


void SetLogLevel(LogLevel level);
LogLevel GetLogLevel();
// The rank printed in the prefix (-1 until known).
void SetLogRank(int rank);

namespace detail {

constexpr LogLevel kLogTRACE = LogLevel::kTrace;
constexpr LogLevel kLogDEBUG = LogLevel::kDebug;
constexpr LogLevel kLogINFO = LogLevel::kInfo;
constexpr LogLevel kLogWARNING = LogLevel::kWarning;
constexpr LogLevel kLogERROR = LogLevel::kError;
constexpr LogLevel kLogFATAL = LogLevel::kFatal;

bool LogEnabled(LogLevel level);

struct LogVoidify {
  void operator&(std::ostream&) {}
};

class LogMessage {
 public:
  explicit LogMessage(LogLevel level) : level_(level) {}
  ~LogMessage();
  LogMessage(const LogMessage&) = delete;
  LogMessage& operator=(const LogMessage&) = delete;
  std::ostringstream& stream() { return stream_; }

 private:
  LogLevel level_;
  std::ostringstream stream_;
};

}  // namespace detail
}  // namespace hvd

// The conditional-expression form (as glog does) keeps `if (x) HVD_LOG(...) << y; else ...`
// unambiguous: `&` binds looser than `<<`, so the whole stream expression is one operand.
#define HVD_LOG(severity)                                   \
  !::hvd::detail::LogEnabled(::hvd::detail::kLog##severity) \
      ? (void)0                                             \
      : ::hvd::detail::LogVoidify() &                       \
            ::hvd::detail::LogMessage(::hvd::detail::kLog##severity).stream()
