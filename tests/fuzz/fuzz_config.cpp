// libFuzzer target: config.json parsing and validation on arbitrary text. Any input must either
// give a valid ModelConfig or raise a myriad::Error; a valid one must survive a write/read round
// trip exactly.
#include <cstdlib>

#include "core/error.h"
#include "model/config.h"

using namespace myriad;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  model::ModelConfig c;
  try {
    c = model::ModelConfig::from_json({reinterpret_cast<const char*>(data), size}, "fuzz.json");
    c.validate();
  } catch (const Error&) {
    return 0;
  }
  std::string text = c.to_json();
  model::ModelConfig d = model::ModelConfig::from_json(text, "roundtrip.json");
  d.validate();
  if (!(d == c) || d.to_json() != text) std::abort();
  return 0;
}
