// Errors: every failure in Myriad is a myriad::Error whose message names the op, the shapes and
// the devices involved.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace myriad {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Concatenates any streamable values into one string.
template <class... Args>
std::string cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

}  // namespace myriad

// MYRIAD_CHECK(cond, parts...) throws myriad::Error(cat(parts...)) when cond is false.
#define MYRIAD_CHECK(cond, ...)                          \
  do {                                                   \
    if (!(cond)) [[unlikely]]                            \
      throw ::myriad::Error(::myriad::cat(__VA_ARGS__)); \
  } while (0)
