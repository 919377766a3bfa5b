// Error policy (docs/errors.md):
//  - Bugs and driver failures: QS_CHECK / QS_CHECK_MSG abort with file:line. Never used for input
//    a user can get wrong.
//  - User errors (bad file, bad flag, unsupported model, context too long, bad request) travel as
//    values: functions return Result<T> / Status, and the CLI or server prints error().message.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <variant>

namespace qs {

[[noreturn]] inline void check_failed(const char* file, int line, const char* expr,
                                      const std::string& msg) {
  std::fprintf(stderr, "quantspec: internal error at %s:%d: check failed: %s%s%s\n", file, line,
               expr, msg.empty() ? "" : ": ", msg.c_str());
  std::fflush(stderr);
  std::abort();
}

#define QS_CHECK(cond) \
  do { \
    if (!(cond)) ::qs::check_failed(__FILE__, __LINE__, #cond, ""); \
  } while (0)

#define QS_CHECK_MSG(cond, msg) \
  do { \
    if (!(cond)) ::qs::check_failed(__FILE__, __LINE__, #cond, (msg)); \
  } while (0)

// A user-facing error: one line saying what is wrong and, where it helps, what was expected.
struct Error {
  std::string message;
};

inline Error make_error(std::string message) { return Error{std::move(message)}; }

// Value-or-error. `Result<T> f() { if (bad) return make_error("..."); return value; }`
template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Error error) : v_(std::move(error)) {}  // NOLINT: implicit by design

  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }

  T& value() & {
    QS_CHECK_MSG(ok(), "value() on an error Result: " + std::get<1>(v_).message);
    return std::get<0>(v_);
  }
  const T& value() const& {
    QS_CHECK_MSG(ok(), "value() on an error Result: " + std::get<1>(v_).message);
    return std::get<0>(v_);
  }
  T&& value() && {
    QS_CHECK_MSG(ok(), "value() on an error Result: " + std::get<1>(v_).message);
    return std::get<0>(std::move(v_));
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

  const Error& error() const {
    QS_CHECK(!ok());
    return std::get<1>(v_);
  }

 private:
  std::variant<T, Error> v_;
};

// Success-or-error for functions with no value.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Error error) : error_(std::move(error)), failed_(true) {}  // NOLINT: implicit by design
  static Status ok_status() { return Status(); }

  bool ok() const { return !failed_; }
  explicit operator bool() const { return ok(); }
  const Error& error() const {
    QS_CHECK(failed_);
    return error_;
  }

 private:
  Error error_;
  bool failed_ = false;
};

// Propagate an error from a Status or Result expression.
#define QS_TRY(expr) \
  do { \
    auto qs_try_result_ = (expr); \
    if (!qs_try_result_.ok()) return qs_try_result_.error(); \
  } while (0)

#define QS_CONCAT_INNER(a, b) a##b
#define QS_CONCAT(a, b) QS_CONCAT_INNER(a, b)
// `QS_ASSIGN_OR_RETURN(auto x, make_x());`
#define QS_ASSIGN_OR_RETURN(lhs, expr) \
  auto QS_CONCAT(qs_aor_, __LINE__) = (expr); \
  if (!QS_CONCAT(qs_aor_, __LINE__).ok()) return QS_CONCAT(qs_aor_, __LINE__).error(); \
  lhs = std::move(QS_CONCAT(qs_aor_, __LINE__)).value()

}  // namespace qs
