// horovod_cpp — Apache-2.0
#pragma once
// Status and Result<T>: how every fallible call in the core reports failure.
//
// The core never throws across threads: a failure is a Status value that travels back to the
// caller (or, for asynchronous work, into the handle's completion). Codes follow absl's
// canonical meanings (see docs/errors.md for when to use which):
//   kInvalidArgument     bad local input: dtype, shape, root out of range, malformed env value.
//   kFailedPrecondition  the call is valid but the state is not: not initialized, duplicate
//                        name in flight, ranks disagree on a tensor (mismatch).
//   kAborted             the runtime shut down (explicitly, or because a peer stopped).
//   kDeadlineExceeded    a stall exceeded its shutdown time.
//   kUnavailable         a transport (MPI/NCCL) call failed.
//   kInternal            a bug in horovod_cpp.

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <utility>

namespace hvd {

enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument = 1,
  kFailedPrecondition = 2,
  kAborted = 3,
  kDeadlineExceeded = 4,
  kUnavailable = 5,
  kInternal = 6,
};

const char* StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status OK() { return Status(); }
  static Status InvalidArgument(std::string msg) {
    return {StatusCode::kInvalidArgument, std::move(msg)};
  }
  static Status FailedPrecondition(std::string msg) {
    return {StatusCode::kFailedPrecondition, std::move(msg)};
  }
  static Status Aborted(std::string msg) { return {StatusCode::kAborted, std::move(msg)}; }
  static Status DeadlineExceeded(std::string msg) {
    return {StatusCode::kDeadlineExceeded, std::move(msg)};
  }
  static Status Unavailable(std::string msg) { return {StatusCode::kUnavailable, std::move(msg)}; }
  static Status Internal(std::string msg) { return {StatusCode::kInternal, std::move(msg)}; }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "INVALID_ARGUMENT: <message>", or "OK".
  std::string ToString() const;

  // Marks a deliberately ignored status (e.g. best-effort cleanup).
  void IgnoreError() const {}

  bool operator==(const Status& other) const {
    return code_ == other.code_ && message_ == other.message_;
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// Either a value or an error Status. value() on an error is a bug: it aborts with the message.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}         // NOLINT: implicit
  Result(Status status) : status_(std::move(status)) {  // NOLINT: implicit
    if (status_.ok()) status_ = Status::Internal("Result constructed from an OK status");
  }

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }

  const T& value() const& {
    CheckOk();
    return *value_;
  }
  T& value() & {
    CheckOk();
    return *value_;
  }
  T&& value() && {
    CheckOk();
    return std::move(*value_);
  }
  const T& operator*() const& { return value(); }
  T& operator*() & { return value(); }
  const T* operator->() const { return &value(); }
  T* operator->() { return &value(); }

 private:
  void CheckOk() const {
    if (!status_.ok()) {
      std::fprintf(stderr, "horovod_cpp: Result::value() on error: %s\n",
                   status_.ToString().c_str());
      std::abort();
    }
  }

  Status status_;
  std::optional<T> value_;
};

}  // namespace hvd

#define HVD_STATUS_CONCAT_INNER(a, b) a##b
#define HVD_STATUS_CONCAT(a, b) HVD_STATUS_CONCAT_INNER(a, b)

// Returns the Status from the enclosing function if `expr` is not OK.
#define HVD_RETURN_IF_ERROR(expr)              \
  do {                                         \
    ::hvd::Status hvd_status_ = (expr);        \
    if (!hvd_status_.ok()) return hvd_status_; \
  } while (0)

// `HVD_ASSIGN_OR_RETURN(auto x, FunctionReturningResult());`
#define HVD_ASSIGN_OR_RETURN(lhs, expr) \
  HVD_ASSIGN_OR_RETURN_IMPL(HVD_STATUS_CONCAT(hvd_result_, __LINE__), lhs, expr)
#define HVD_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return tmp.status();             \
  lhs = std::move(tmp).value()

// Invariant check for bugs (never for user input): prints file:line and aborts.
// " (<file>:<line>)" of the expanding line: appended to the message of a failed library call
// (HVD_MPI_CHECK, HVD_NCCL_CHECK, HVD_CUDA_CHECK) so the report says where it was made.
#define HVD_WHERE() (std::string(" (" __FILE__ ":") + std::to_string(__LINE__) + ")")

#define HVD_CHECK(cond)                                                                            \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      std::fprintf(stderr, "horovod_cpp: check failed at %s:%d: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                                \
    }                                                                                              \
  } while (0)
