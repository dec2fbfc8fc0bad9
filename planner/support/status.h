// Errors as values for the planner (see STYLE.md): a failed step returns an
// Error whose message already names the file, node, field or line concerned.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace rannc {

/// A failure with a message that says what and where.
struct Error {
  std::string message;
};

/// Either a T or the Error that prevented it.
template <typename T> class Expected {
public:
  Expected(T value) : v_(std::move(value)) {}
  Expected(Error e) : v_(std::move(e)) {}

  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }
  T &value() & { return std::get<0>(v_); }
  T &&value() && { return std::get<0>(std::move(v_)); }
  const T &value() const & { return std::get<0>(v_); }
  T &operator*() & { return value(); }
  const T &operator*() const & { return value(); }
  T *operator->() { return &value(); }
  const T *operator->() const { return &value(); }
  const Error &error() const { return std::get<1>(v_); }

private:
  std::variant<T, Error> v_;
};

/// Success or an Error, for steps that produce nothing.
class Status {
public:
  Status() = default;
  Status(Error e) : error_(std::move(e.message)), failed_(true) {}
  static Status success() { return Status(); }
  bool ok() const { return !failed_; }
  explicit operator bool() const { return ok(); }
  const std::string &message() const { return error_; }

private:
  std::string error_;
  bool failed_ = false;
};

/// The first line of an exception's text: LibTorch's carry a backtrace after it.
inline std::string firstLine(std::string_view text) { return std::string(text.substr(0, text.find('\n'))); }

} // namespace rannc
