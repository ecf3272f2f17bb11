// libFuzzer target: image input (src/vision/image.h) on arbitrary bytes, which may only throw
// myriad::Error or succeed:
// - probe_image with PNG CRCs checked (the structure walkers), then decode_image without them, so
//   mutated PNGs reach stb_image's inflate and filters;
// - a decoded image goes through preprocess with options taken from the input's last bytes, and
//   the result must have the promised shape, grid and token count and values in [-1, 1];
// - the input as a data: URL.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "core/error.h"
#include "vision/image.h"

using namespace myriad;
using namespace myriad::vision;

namespace {

void check(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  DecodeOptions opt;
  opt.max_pixels = 1 << 20;  // keeps each run fast; the limit itself is tested in test_vision
  try {
    probe_image(in, opt);
  } catch (const Error&) {
  }
  opt.check_crc = false;
  try {
    const Image img = decode_image(in, opt);
    check(img.width >= 1 && img.height >= 1 && img.channels == 3);
    check(img.rgb.size() == static_cast<size_t>(img.width * img.height * 3));
    PreprocessOptions p;
    const uint8_t a = size > 0 ? data[size - 1] : 0, b = size > 1 ? data[size - 2] : 0;
    p.patch_size = 1 + a % 16;
    p.merge_h = 1 + b % 3;
    p.merge_w = 1 + (b / 3) % 3;
    p.max_patches = 1 + (a * 131 + b) % 2048;
    p.max_side_patches = 1 + (b * 7) % 128;
    const Processed out = preprocess(img, p);
    const int64_t pp = 3 * p.patch_size * p.patch_size;
    check(out.grid.t == 1 && out.grid.h >= 1 && out.grid.w >= 1);
    check(out.grid.h % p.merge_h == 0 && out.grid.w % p.merge_w == 0);
    check(out.tokens * p.merge_h * p.merge_w == out.grid.h * out.grid.w);
    check(out.pixel_values.shape() == Shape{out.grid.h * out.grid.w, pp});
    const float* v = out.pixel_values.data<float>();
    for (int64_t i = 0; i < out.pixel_values.numel(); ++i) check(v[i] >= -1.0f && v[i] <= 1.0f);
  } catch (const Error&) {
  }
  try {
    const std::string bytes = decode_data_url(in, 1 << 16);
    check(bytes.size() <= size);
  } catch (const Error&) {
  }
  return 0;
}
