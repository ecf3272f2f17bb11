#include "core/device.h"

#include <charconv>

#include "core/error.h"

namespace myriad {

Device Device::parse(std::string_view s) {
  if (s == "cpu") return kCPU;
  if (s == "cuda") return cuda(0);
  if (s.starts_with("cuda:")) {
    int idx = -1;
    auto tail = s.substr(5);
    auto [p, ec] = std::from_chars(tail.data(), tail.data() + tail.size(), idx);
    if (ec == std::errc() && p == tail.data() + tail.size() && idx >= 0) return cuda(idx);
  }
  throw Error(cat("unknown device '", s, "' (expected cpu, cuda or cuda:N)"));
}

}  // namespace myriad
