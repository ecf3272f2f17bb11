// How the OpenMP runtime waits, read once (see threads_sleep in cpu.h).
#include <cctype>
#include <cstdlib>
#include <string>

#include "backend/cpu/cpu.h"

namespace myriad::cpu {

bool threads_sleep() {
  static const bool sleep = [] {
    const char* v = std::getenv("OMP_WAIT_POLICY");
    std::string s = v ? v : "";
    for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s == "passive";
  }();
  return sleep;
}

}  // namespace myriad::cpu
