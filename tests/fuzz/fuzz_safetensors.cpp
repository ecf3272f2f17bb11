// libFuzzer target: the safetensors header parser and loader on arbitrary bytes. Any input must
// either parse or raise a myriad::Error; a parsed file must load every supported tensor and
// survive a serialise/parse round trip unchanged.
#include <cstdlib>
#include <cstring>

#include "io/safetensors.h"

using namespace myriad;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  safetensors::SafetensorsFile f;
  try {
    f = safetensors::SafetensorsFile::from_bytes({data, size}, "fuzz.safetensors");
  } catch (const Error&) {
    return 0;
  }
  std::map<std::string, Tensor> loaded;
  for (const auto& [name, info] : f.infos()) {
    auto raw = f.raw(name);
    if (raw.size() != info.nbytes()) std::abort();
    if (!info.supported) continue;
    Tensor t = f.load(name);
    if (t.shape() != info.shape || t.nbytes() != info.nbytes()) std::abort();
    if (t.nbytes() && std::memcmp(t.data_ptr(), raw.data(), raw.size()) != 0) std::abort();
    loaded.emplace(name, t);
  }
  if (loaded.size() != f.infos().size() || loaded.count("__metadata__")) return 0;
  // Round trip: what we write parses back to the same tensors and metadata.
  std::vector<uint8_t> out = safetensors::serialize(loaded, f.metadata());
  auto g = safetensors::SafetensorsFile::from_bytes(out, "roundtrip.safetensors");
  if (g.metadata() != f.metadata() || g.names() != f.names()) std::abort();
  for (const auto& [name, info] : f.infos()) {
    const auto& gi = g.info(name);
    auto a = f.raw(name), b = g.raw(name);
    if (gi.shape != info.shape || gi.dtype != info.dtype || a.size() != b.size()) std::abort();
    if (a.size() && std::memcmp(a.data(), b.data(), a.size()) != 0) std::abort();
  }
  return 0;
}
