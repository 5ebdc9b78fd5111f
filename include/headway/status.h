// Status: the result of every public Headway call that can fail.
//
// A call that returns a non-OK Status has not written to anything the caller
// owns. The message names the bad argument and the value that was rejected,
// e.g.
//   "Softmax: x.stride (3) is shorter than x.cols (4)".
#ifndef HEADWAY_STATUS_H_
#define HEADWAY_STATUS_H_

#include <string>
#include <utility>

#include "headway/export.h"

namespace headway {

enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument = 1,  // a null pointer, a bad shape, stride, scale or name
  kOutOfRange = 2,  // a size or position beyond what a buffer or cache holds
  kResourceExhausted =
      3,  // memory could not be allocated, or a byte count overflows
  kFailedPrecondition = 4,  // the call is valid but not in the current state
  kInternal = 5,            // a bug in Headway: please report it
};

// Name of a code, e.g. "INVALID_ARGUMENT".
HEADWAY_API const char* StatusCodeName(StatusCode code);

class [[nodiscard]] HEADWAY_API Status {
 public:
  // OK.
  Status() = default;
  Status(StatusCode code, std::string message)
      : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  static Status InvalidArgument(std::string message) {
    return Status(StatusCode::kInvalidArgument, std::move(message));
  }
  static Status OutOfRange(std::string message) {
    return Status(StatusCode::kOutOfRange, std::move(message));
  }
  static Status ResourceExhausted(std::string message) {
    return Status(StatusCode::kResourceExhausted, std::move(message));
  }
  static Status FailedPrecondition(std::string message) {
    return Status(StatusCode::kFailedPrecondition, std::move(message));
  }
  static Status Internal(std::string message) {
    return Status(StatusCode::kInternal, std::move(message));
  }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "OK", or "INVALID_ARGUMENT: <message>".
  std::string ToString() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

}  // namespace headway

#endif  // HEADWAY_STATUS_H_
