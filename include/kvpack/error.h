// kvpack error handling: every bad input becomes a kvpack::Error whose message names the file, field or shape
// and what is wrong. Library code throws; the CLI catches at the top and prints "error: ...".
#pragma once
#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace kvpack {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace kvpack

// KVPACK_CHECK(cond, "fmt {}", args...): throw kvpack::Error with the formatted message when cond is false.
#define KVPACK_CHECK(cond, ...)         \
  do {                                  \
    if (!(cond)) ::kvpack::fail(__VA_ARGS__); \
  } while (0)
