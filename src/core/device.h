// Devices: cpu, or cuda:N.
#pragma once
#include <cstdint>
#include <ostream>
#include <string>
#include <string_view>

namespace myriad {

enum class DeviceType : uint8_t { CPU = 0, CUDA = 1 };
constexpr int kNumDeviceTypes = 2;

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;
  bool operator==(const Device&) const = default;
  bool is_cpu() const { return type == DeviceType::CPU; }
  bool is_cuda() const { return type == DeviceType::CUDA; }
  std::string str() const { return is_cpu() ? "cpu" : "cuda:" + std::to_string(index); }
  static Device parse(std::string_view s);  // "cpu", "cuda", "cuda:1"; throws on anything else
};
inline const Device kCPU{};
inline Device cuda(int index = 0) {
  return {DeviceType::CUDA, index};
}
inline std::ostream& operator<<(std::ostream& os, const Device& d) {
  return os << d.str();
}

}  // namespace myriad
