// Image input for the vision tower (MODEL.md §10, issue 14): PNG / JPEG decoding (stb_image), the
// preprocessing of transformers' Kimi K2.5 image processor (kimi_k25, torchvision backend) and
// data: URL decoding for the OpenAI protocol.
//
// preprocess() reproduces Kimi_K25ImageProcessor step by step:
//   1. RGB as its convert_to_rgb makes it from a PIL image: gray replicated, any alpha
//      composited onto white with PIL's alpha_composite integer arithmetic;
//   2. navit_resize: the patch budget and per-side limits give a scale <= 1 (never an upscale);
//   3. torchvision resize(uint8, BICUBIC, antialias=True), i.e. ATen's separable uint8 kernel:
//      Pillow's a = -0.5 cubic with the support widened by the downscale factor, weights rounded
//      to int16 fixed point, horizontal pass then vertical, each rounded to uint8;
//   4. zero padding at the bottom and right to a multiple of merge·patch;
//   5. (x - 127.5) / 127.5 in float32 (rescale 1/255 fused with mean = std = 0.5);
//   6. patches in raster order, each flattened channel-major (c, y, x).
// On the CPU this is bit-identical to the processor for PNGs (tests/vision/test_image.cpp).
// JPEG decoding is stb's, not libjpeg's, so JPEG pixels can differ by a few levels. EXIF
// orientation is not applied (the processor does not apply it to the PIL images it is given).
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"
#include "vision/tower.h"

namespace myriad::vision {

// A decoded image: height × width × 3 bytes, row-major, interleaved RGB.
struct Image {
  int64_t width = 0, height = 0, channels = 3;
  std::vector<uint8_t> rgb;
};

enum class ImageFormat { Png, Jpeg };
const char* format_name(ImageFormat f);  // "PNG" | "JPEG"

struct DecodeOptions {
  int64_t max_pixels = int64_t{1} << 25;  // width × height, checked from the header
  size_t max_bytes = size_t{32} << 20;    // the encoded size
  bool check_crc = true;  // PNG chunk CRCs (off only to let a fuzzer reach the decoder)
};

struct ImageInfo {
  ImageFormat format = ImageFormat::Png;
  int64_t width = 0, height = 0;
};

// The format, size and structure without decoding the pixels: PNG chunks (lengths, CRCs, IHDR
// first, IEND present) or JPEG markers (a frame header, scans, EOI), and the limits. Throws
// myriad::Error for empty, oversized, truncated, corrupt or unsupported (GIF, BMP, WebP, ...)
// input.
ImageInfo probe_image(std::span<const uint8_t> bytes, const DecodeOptions& opt = {});
ImageInfo probe_image(std::string_view bytes, const DecodeOptions& opt = {});

// probe_image, then the pixels as RGB (see step 1 above). Throws myriad::Error.
Image decode_image(std::span<const uint8_t> bytes, const DecodeOptions& opt = {});
Image decode_image(std::string_view bytes, const DecodeOptions& opt = {});

// The bytes of a `data:image/png;base64,...` or `data:image/jpeg;base64,...` URL (strict base64:
// padded, no whitespace). http(s) and other schemes, other media types and malformed URLs throw
// myriad::Error (the server never fetches remote images).
std::string decode_data_url(std::string_view url, size_t max_bytes = DecodeOptions{}.max_bytes);

// The processor's options (transformers' names in comments).
struct PreprocessOptions {
  int64_t patch_size = 14;           // patch_size
  int64_t merge_h = 2, merge_w = 2;  // merge_size (the processor has one for both)
  int64_t max_patches = 16384;       // max_patches: the patch budget of the resize
  int64_t max_side_patches = 512;    // size["max_height"] == size["max_width"], in patches
  void validate() const;
  // patch_size and merge kernel from the tower's config, the rest the processor's defaults.
  static PreprocessOptions from(const VisionConfig& c) {
    PreprocessOptions o;
    o.patch_size = c.patch_size;
    o.merge_h = c.merge_kernel_h;
    o.merge_w = c.merge_kernel_w;
    return o;
  }
};

// navit_resize: the resized size (scale <= 1) and the padded size (multiples of merge·patch).
struct ResizePlan {
  int64_t height = 0, width = 0, pad_height = 0, pad_width = 0;
};
ResizePlan navit_resize(int64_t height, int64_t width, const PreprocessOptions& opt);

// torchvision's resize of a uint8 image (BICUBIC, antialias=True) on the CPU, bit for bit.
Image resize_bicubic(const Image& img, int64_t height, int64_t width);

struct Processed {
  Tensor pixel_values;  // [h·w, 3·p·p] f32, the processor's patch order
  Grid grid;            // t = 1, h × w patches (padded size / patch)
  int64_t tokens = 0;   // placeholder tokens: h·w / (merge_h·merge_w)
};
Processed preprocess(const Image& img, const PreprocessOptions& opt = {});

// Several images for one tower call: pixel_values concatenated image after image.
struct ProcessedBatch {
  Tensor pixel_values;  // [Σ h·w, 3·p·p] f32
  std::vector<Grid> grids;
  std::vector<int64_t> tokens;
};
ProcessedBatch preprocess(std::span<const Image> images, const PreprocessOptions& opt = {});

}  // namespace myriad::vision
