// The one builder of error messages. Every message a public call returns is
// "<function>: <text>", the text naming the argument and the rejected value:
//   return Fail(StatusCode::kInvalidArgument, fn, "x.stride (", x.stride,
//               ") is shorter than x.cols (", x.cols, ")");
// Shared checks (CheckPositive, CheckIndex) say the same thing the same way on
// every entry point.
#ifndef HEADWAY_LIB_CORE_MESSAGE_H_
#define HEADWAY_LIB_CORE_MESSAGE_H_

#include <cstdint>
#include <string>
#include <type_traits>

#include "headway/status.h"

namespace headway {
namespace internal {

// One piece of a message: text as it is, integers in decimal, floating-point
// values as std::to_string writes them ("0.125000", "nan", "inf").
inline void AppendPiece(std::string* out, const char* text) {
  out->append(text == nullptr ? "(null)" : text);
}
inline void AppendPiece(std::string* out, const std::string& text) {
  out->append(text);
}
template <typename T, typename = std::enable_if_t<std::is_arithmetic<T>::value>>
void AppendPiece(std::string* out, T value) {
  if constexpr (std::is_same<T, bool>::value) {
    out->append(value ? "true" : "false");
  } else if constexpr (std::is_floating_point<T>::value) {
    out->append(std::to_string(static_cast<double>(value)));
  } else if constexpr (std::is_signed<T>::value) {
    out->append(std::to_string(static_cast<long long>(value)));
  } else {
    out->append(std::to_string(static_cast<unsigned long long>(value)));
  }
}

// The pieces concatenated.
template <typename... Pieces>
std::string Cat(const Pieces&... pieces) {
  std::string out;
  (AppendPiece(&out, pieces), ...);
  return out;
}

// "[rows, cols]".
inline std::string Shape(int64_t rows, int64_t cols) {
  return Cat("[", rows, ", ", cols, "]");
}

// A Status with message "fn: " followed by the pieces.
template <typename... Pieces>
Status Fail(StatusCode code, const char* fn, const Pieces&... pieces) {
  return Status(code, Cat(fn, ": ", pieces...));
}

// "fn: name must be >= 1 (got value)". Name: a const char* or std::string
// (a template, so that a literal name costs nothing on success).
template <typename Name>
Status CheckPositive(const char* fn, const Name& name, int64_t value) {
  if (value >= 1) return Status::Ok();
  return Fail(StatusCode::kInvalidArgument, fn, name, " must be >= 1 (got ",
              value, ")");
}

// "fn: name (value) is out of range [0, limit)" (an index the caller chose:
// kInvalidArgument).
template <typename Name>
Status CheckIndex(const char* fn, const Name& name, int64_t value,
                  int64_t limit) {
  if (value >= 0 && value < limit) return Status::Ok();
  return Fail(StatusCode::kInvalidArgument, fn, name, " (", value,
              ") is out of range [0, ", limit, ")");
}

}  // namespace internal
}  // namespace headway

#endif  // HEADWAY_LIB_CORE_MESSAGE_H_
