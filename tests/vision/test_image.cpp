// Image input (src/vision/image.h): PNG / JPEG decoding against PIL's pixels, preprocessing
// against transformers' Kimi_K25ImageProcessor (tests/fixtures/images, written by
// tools/reference/image_fixtures.py), the resampler against torchvision, navit_resize against
// the Python, every decode error, and data: URLs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/file.h"
#include "io/safetensors.h"
#include "vision/image.h"

using namespace myriad;
using namespace myriad::vision;

namespace {

const std::string kDir = std::string(MYRIAD_SOURCE_DIR) + "/tests/fixtures/images/";

std::string file(const std::string& name) {
  return io::read_file(kDir + name);
}

const safetensors::SafetensorsFile& fixtures() {
  static const auto f = safetensors::SafetensorsFile::open(kDir + "processor.safetensors");
  return f;
}

// The message of the myriad::Error that f throws ("" when it throws none).
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_ERROR(stmt, needle)                                                        \
  do {                                                                                    \
    const std::string msg_ = error_of([&] { (void)(stmt); });                             \
    EXPECT_NE(msg_.find(needle), std::string::npos)                                       \
        << "expected an error containing \"" << (needle) << "\", got \"" << msg_ << "\""; \
  } while (0)

std::string base64(const std::string& s) {
  static const char* k = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 2 < s.size(); i += 3) {
    const uint32_t v =
        uint32_t(uint8_t(s[i])) << 16 | uint32_t(uint8_t(s[i + 1])) << 8 | uint8_t(s[i + 2]);
    for (int k6 = 18; k6 >= 0; k6 -= 6) out += k[(v >> k6) & 63];
  }
  if (i + 1 == s.size()) {
    const uint32_t v = uint32_t(uint8_t(s[i])) << 16;
    out += std::string{k[v >> 18], k[(v >> 12) & 63]} + "==";
  } else if (i + 2 == s.size()) {
    const uint32_t v = uint32_t(uint8_t(s[i])) << 16 | uint32_t(uint8_t(s[i + 1])) << 8;
    out += std::string{k[v >> 18], k[(v >> 12) & 63], k[(v >> 6) & 63]} + "=";
  }
  return out;
}

uint32_t crc32(const std::string& s) {
  uint32_t c = 0xFFFFFFFFu;
  for (unsigned char b : s) {
    c ^= b;
    for (int k = 0; k < 8; ++k) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
  }
  return c ^ 0xFFFFFFFFu;
}

std::string be32(uint32_t v) {
  return {char(v >> 24), char(v >> 16), char(v >> 8), char(v)};
}

// A PNG chunk with a valid CRC.
std::string chunk(const std::string& type, const std::string& data) {
  return be32(uint32_t(data.size())) + type + data + be32(crc32(type + data));
}

const std::string kSig("\x89PNG\r\n\x1a\n", 8);

// An 8-bit RGB PNG header of w × h with one (bogus) IDAT and IEND: well-formed chunks.
std::string png_header_only(uint32_t w, uint32_t h) {
  const std::string ihdr = be32(w) + be32(h) + std::string("\x08\x02\x00\x00\x00", 5);
  return kSig + chunk("IHDR", ihdr) + chunk("IDAT", "xx") + chunk("IEND", "");
}

struct Case {
  const char* name;
  const char* file;
};
const Case kPngs[] = {{"rgb_pad", "rgb_pad.png"},   {"rgb_down", "rgb_down.png"},
                      {"rgb_side", "rgb_side.png"}, {"gray", "gray.png"},
                      {"rgba", "rgba.png"},         {"la", "la.png"},
                      {"palette", "palette.png"},   {"gray16", "gray16.png"}};

PreprocessOptions options_of(const std::string& name) {
  const Tensor o = fixtures().load(name + ".options");
  const int64_t* v = o.data<int64_t>();
  PreprocessOptions p;
  p.patch_size = v[0];
  p.merge_h = p.merge_w = v[1];
  p.max_patches = v[2];
  p.max_side_patches = v[3];
  return p;
}

// Max |C++ - processor| of pixel_values in [0, 1] pixel units (normalised values are
// (x - 0.5) / 0.5, so one pixel unit is half a normalised unit).
double parity(const std::string& name, const std::string& path) {
  const Processed p = preprocess(decode_image(file(path)), options_of(name));
  const Tensor want = fixtures().load(name + ".pixel_values");
  const Tensor grid = fixtures().load(name + ".grid");
  const int64_t* g = grid.data<int64_t>();
  EXPECT_EQ(p.grid, (Grid{g[0], g[1], g[2]})) << name;
  EXPECT_EQ(p.tokens, g[1] * g[2] / (options_of(name).merge_h * options_of(name).merge_w));
  EXPECT_EQ(p.pixel_values.shape(), want.shape()) << name;
  if (p.pixel_values.shape() != want.shape()) return 1e9;
  double worst = 0;
  for (int64_t i = 0; i < want.numel(); ++i)
    worst = std::max(worst, 0.5 * std::abs(double(p.pixel_values.data<float>()[i]) -
                                           double(want.data<float>()[i])));
  return worst;
}

}  // namespace

TEST(Image, DecodesPngsLikePil) {
  // Gray, gray + alpha, RGBA, palette + tRNS and 16-bit gray all reach PIL's RGB exactly.
  for (const Case& c : kPngs) {
    const Image img = decode_image(file(c.file));
    const Tensor want = fixtures().load(std::string(c.name) + ".rgb");
    ASSERT_EQ(want.dim(), 3);
    EXPECT_EQ(img.height, want.shape()[0]) << c.name;
    EXPECT_EQ(img.width, want.shape()[1]) << c.name;
    EXPECT_EQ(img.channels, 3);
    ASSERT_EQ(img.rgb.size(), size_t(want.numel())) << c.name;
    const uint8_t* w = want.data<uint8_t>();
    EXPECT_TRUE(std::equal(img.rgb.begin(), img.rgb.end(), w)) << c.name;
    const ImageInfo info = probe_image(file(c.file));
    EXPECT_EQ(info.format, ImageFormat::Png);
    EXPECT_EQ(info.width, img.width);
    EXPECT_EQ(info.height, img.height);
  }
}

TEST(Image, DecodesJpegCloseToPil) {
  // stb_image's JPEG decoder is not libjpeg's: its IDCT and chroma upsampling round differently.
  const Image img = decode_image(file("photo.jpg"));
  const Tensor want = fixtures().load("photo.rgb");
  EXPECT_EQ(probe_image(file("photo.jpg")).format, ImageFormat::Jpeg);
  EXPECT_EQ(img.width, 48);
  EXPECT_EQ(img.height, 40);
  ASSERT_EQ(img.rgb.size(), size_t(want.numel()));
  int worst = 0;
  double sum = 0;
  for (size_t i = 0; i < img.rgb.size(); ++i) {
    const int d = std::abs(int(img.rgb[i]) - int(want.data<uint8_t>()[i]));
    worst = std::max(worst, d);
    sum += d;
  }
  std::printf("photo.jpg: stb vs PIL max |diff| %d levels, mean %.3f\n", worst,
              sum / double(img.rgb.size()));
  EXPECT_LE(worst, 4);  // measured: 2 levels, mean 0.09
  EXPECT_LE(sum / double(img.rgb.size()), 0.5);
}

TEST(Image, PreprocessMatchesProcessor) {
  // Padding only, a patch-budget downscale, a per-side downscale, gray, RGBA, LA, palette and
  // 16-bit gray, each with the processor options it was made with.
  for (const Case& c : kPngs) {
    const double d = parity(c.name, c.file);
    std::printf("%-9s max |pixel_values diff| = %.3g pixel units\n", c.name, d);
    EXPECT_LE(d, 1.0 / 255) << c.name;
  }
  const double d = parity("photo", "photo.jpg");
  std::printf("%-9s max |pixel_values diff| = %.3g pixel units (JPEG decoder differs)\n", "photo",
              d);
  EXPECT_LE(d, 4.0 / 255);
}

TEST(Image, ResizeIsBitExactWithTorchvision) {
  // resize(uint8, BICUBIC, antialias=True): an upscale (the processor itself never upscales) and
  // an uneven downscale.
  const Tensor in = fixtures().load("resize.input");  // [3, H, W]
  Image img{in.shape()[2], in.shape()[1], 3, {}};
  for (int64_t y = 0; y < img.height; ++y)
    for (int64_t x = 0; x < img.width; ++x)
      for (int64_t c = 0; c < 3; ++c)
        img.rgb.push_back(in.data<uint8_t>()[(c * img.height + y) * img.width + x]);
  for (const char* name : {"resize_up", "resize_down"}) {
    const Tensor want = fixtures().load(std::string(name) + ".output");
    const int64_t h = want.shape()[1], w = want.shape()[2];
    const Image r = resize_bicubic(img, h, w);
    ASSERT_EQ(r.rgb.size(), size_t(3 * h * w));
    int mismatches = 0;
    for (int64_t y = 0; y < h; ++y)
      for (int64_t x = 0; x < w; ++x)
        for (int64_t c = 0; c < 3; ++c)
          mismatches +=
              r.rgb[size_t((y * w + x) * 3 + c)] != want.data<uint8_t>()[(c * h + y) * w + x];
    EXPECT_EQ(mismatches, 0) << name;
  }
  // Same size: unchanged.
  EXPECT_EQ(resize_bicubic(img, img.height, img.width).rgb, img.rgb);
}

TEST(Image, NavitResizeMatchesPython) {
  // Values from transformers' navit_resize (height, width, patch, merge, max_patches, max side).
  struct Row {
    int64_t h, w, p, m, max_patches, side;
    ResizePlan want;
  };
  const Row rows[] = {
      {3000, 2000, 14, 2, 16384, 512, {2202, 1468, 2212, 1484}},
      {13, 100000, 14, 2, 16384, 512, {1, 7167, 28, 7168}},  // int(100000 · 0.07168) = 7167
      {1, 1, 14, 2, 16384, 512, {1, 1, 28, 28}},
      {480, 640, 14, 2, 16384, 512, {480, 640, 504, 644}},
      {50, 37, 4, 2, 64, 512, {38, 28, 40, 32}},
      {7000, 300, 14, 2, 16384, 4, {56, 2, 56, 28}},
      {1000, 1000, 16, 3, 100, 512, {161, 161, 192, 192}},
  };
  for (const Row& r : rows) {
    PreprocessOptions o;
    o.patch_size = r.p;
    o.merge_h = o.merge_w = r.m;
    o.max_patches = r.max_patches;
    o.max_side_patches = r.side;
    const ResizePlan got = navit_resize(r.h, r.w, o);
    EXPECT_EQ(got.height, r.want.height) << r.h << "x" << r.w;
    EXPECT_EQ(got.width, r.want.width) << r.h << "x" << r.w;
    EXPECT_EQ(got.pad_height, r.want.pad_height) << r.h << "x" << r.w;
    EXPECT_EQ(got.pad_width, r.want.pad_width) << r.h << "x" << r.w;
  }
  PreprocessOptions bad;
  bad.patch_size = 0;
  EXPECT_ERROR(navit_resize(10, 10, bad), "patch_size");
}

TEST(Image, PreprocessShapesAndBatch) {
  const Image a = decode_image(file("rgb_pad.png"));  // 40 × 30
  const Image b = decode_image(file("gray.png"));     // 50 × 37
  VisionConfig cfg;
  cfg.patch_size = 4;
  const PreprocessOptions o = PreprocessOptions::from(cfg);
  EXPECT_EQ(o.patch_size, 4);
  EXPECT_EQ(o.merge_h, 2);
  const Processed pa = preprocess(a, o);
  EXPECT_EQ(pa.grid, (Grid{1, 8, 10}));  // 30 -> 32, 40 -> 40 (multiples of 8)
  EXPECT_EQ(pa.tokens, 20);
  EXPECT_EQ(pa.pixel_values.shape(), (Shape{80, 48}));
  // The last patch row of the image holds two padding rows: -1 after normalisation.
  const float* last = pa.pixel_values.data<float>() + (79 * 48);
  EXPECT_EQ(last[0 * 16 + 3 * 4 + 0], -1.0f);  // channel 0, y 3 (image row 31)
  EXPECT_NE(last[0 * 16 + 1 * 4 + 0], -1.0f);  // y 1 (row 29): a pixel (not black there)
  const std::vector<Image> both{a, b};
  const ProcessedBatch batch = preprocess(both, o);
  ASSERT_EQ(batch.grids.size(), 2u);
  EXPECT_EQ(batch.grids[0], pa.grid);
  const Processed pb = preprocess(b, o);
  EXPECT_EQ(batch.grids[1], pb.grid);
  EXPECT_EQ(batch.tokens, (std::vector<int64_t>{pa.tokens, pb.tokens}));
  ASSERT_EQ(batch.pixel_values.shape()[0], pa.pixel_values.shape()[0] + pb.pixel_values.shape()[0]);
  EXPECT_TRUE(std::equal(pa.pixel_values.data<float>(),
                         pa.pixel_values.data<float>() + pa.pixel_values.numel(),
                         batch.pixel_values.data<float>()));
  EXPECT_TRUE(std::equal(pb.pixel_values.data<float>(),
                         pb.pixel_values.data<float>() + pb.pixel_values.numel(),
                         batch.pixel_values.data<float>() + pa.pixel_values.numel()));
  EXPECT_EQ(preprocess(std::vector<Image>{}, o).pixel_values.shape(), (Shape{0, 48}));
}

TEST(Image, DecodeErrors) {
  const std::string png = file("rgb_pad.png"), jpg = file("photo.jpg");
  EXPECT_ERROR(decode_image(std::string()), "empty image data");
  // Truncated PNGs: inside the signature, inside IHDR, inside IDAT, before IEND.
  EXPECT_ERROR(decode_image(png.substr(0, 5)), "unrecognised image data");
  EXPECT_ERROR(decode_image(png.substr(0, 20)), "truncated PNG");
  EXPECT_ERROR(decode_image(png.substr(0, png.size() / 2)), "truncated PNG");
  EXPECT_ERROR(decode_image(png.substr(0, png.size() - 12)), "truncated PNG");  // no IEND
  EXPECT_ERROR(decode_image(png.substr(0, png.size() - 1)), "truncated PNG");
  // A flipped byte in the compressed data: the chunk CRC no longer matches.
  std::string flipped = png;
  flipped[png.size() / 2] = char(flipped[png.size() / 2] ^ 0x40);
  EXPECT_ERROR(decode_image(flipped), "bad CRC");
  // Without the CRC check the corruption reaches stb's inflate, which must fail cleanly or
  // decode something of the right size.
  DecodeOptions no_crc;
  no_crc.check_crc = false;
  try {
    EXPECT_EQ(decode_image(flipped, no_crc).rgb.size(), 40u * 30u * 3u);
  } catch (const Error&) {
  }
  std::string bad_ihdr = png;
  bad_ihdr[12] = 'X';  // chunk type IHDR -> XHDR
  EXPECT_ERROR(decode_image(bad_ihdr), "bad CRC");
  EXPECT_ERROR(decode_image(bad_ihdr, no_crc), "first chunk must be a 13-byte IHDR");
  EXPECT_ERROR(decode_image(kSig + chunk("IHDR", std::string(13, '\0')) + chunk("IEND", "")),
               "no IDAT");
  EXPECT_ERROR(decode_image(png_header_only(0, 5)), "corrupt PNG: image of 0x5");
  EXPECT_ERROR(decode_image(png_header_only(4, 4)), "corrupt or unsupported PNG");  // bogus IDAT
  // JPEG: cut before the end, and with its EOI marker removed.
  EXPECT_ERROR(decode_image(jpg.substr(0, jpg.size() / 2)), "truncated JPEG");
  EXPECT_ERROR(decode_image(jpg.substr(0, jpg.size() - 2)), "truncated JPEG");
  EXPECT_ERROR(decode_image(jpg.substr(0, 3)), "truncated JPEG");
  EXPECT_ERROR(decode_image(std::string("\xFF\xD8\xFF\xD9", 4)), "EOI before any scan");
  // A Huffman table with more than 256 codes (stb_image 2.27 would write past its tables; found
  // by fuzz_image): the 16 code counts of the first DHT set to 32 each.
  std::string dht = jpg;
  const size_t at = dht.find("\xFF\xC4");
  ASSERT_NE(at, std::string::npos);
  for (size_t i = 0; i < 16; ++i) dht[at + 5 + i] = 32;
  EXPECT_ERROR(decode_image(dht), "Huffman table with 512 codes, more than 256");
  // Random bytes and other formats.
  EXPECT_ERROR(decode_image(std::string("hello, world")), "unrecognised image data");
  EXPECT_ERROR(decode_image(file("tiny.gif")), "unsupported image format GIF");
  EXPECT_ERROR(decode_image(file("tiny.bmp")), "unsupported image format BMP");
  EXPECT_ERROR(decode_image(std::string("RIFF\0\0\0\0WEBPVP8 ", 16)),
               "unsupported image format WebP");
  // Limits: pixels from the header (before any decoding), and encoded bytes.
  DecodeOptions small;
  small.max_pixels = 40 * 30 - 1;
  EXPECT_ERROR(decode_image(png, small), "40x30 = 1200 pixels exceeds the limit of 1199");
  small.max_pixels = 48 * 40 - 1;
  EXPECT_ERROR(decode_image(jpg, small), "exceeds the limit");
  EXPECT_ERROR(probe_image(png_header_only(60000, 60000)), "exceeds the limit");
  EXPECT_ERROR(probe_image(png_header_only(70000, 1)), "each side may be at most 65536");
  DecodeOptions few_bytes;
  few_bytes.max_bytes = 100;
  EXPECT_ERROR(decode_image(png, few_bytes), "exceeds the limit of 100 bytes");
}

TEST(Image, DataUrls) {
  const std::string png = file("rgb_pad.png"), jpg = file("photo.jpg");
  EXPECT_EQ(decode_data_url("data:image/png;base64," + base64(png)), png);
  EXPECT_EQ(decode_data_url("data:image/jpeg;base64," + base64(jpg)), jpg);
  EXPECT_EQ(decode_data_url("DATA:Image/JPEG;name=x.jpg;BASE64," + base64(jpg)), jpg);
  EXPECT_EQ(decode_data_url("data:image/png;base64," + base64("ab")), "ab");  // one '='
  EXPECT_EQ(decode_data_url("data:image/png;base64," + base64("a")), "a");    // two '='
  EXPECT_EQ(decode_image(decode_data_url("data:image/png;base64," + base64(png))).width, 40);

  EXPECT_ERROR(decode_data_url("https://example.com/cat.png"), "does not fetch");
  EXPECT_ERROR(decode_data_url("HTTP://example.com/cat.png"), "does not fetch");
  EXPECT_ERROR(decode_data_url("ftp://example.com/cat.png"), "expected a data URL");
  EXPECT_ERROR(decode_data_url(""), "expected a data URL");
  EXPECT_ERROR(decode_data_url("data:image/png;base64"), "no ','");
  EXPECT_ERROR(decode_data_url("data:image/png," + png), "must be base64");
  EXPECT_ERROR(decode_data_url("data:image/gif;base64,R0lG"), "'image/gif' is not supported");
  EXPECT_ERROR(decode_data_url("data:;base64,AAAA"), "'(none)' is not supported");
  EXPECT_ERROR(decode_data_url("data:image/png;base64,"), "empty base64");
  EXPECT_ERROR(decode_data_url("data:image/png;base64,QUJD R"), "not a multiple of 4");
  EXPECT_ERROR(decode_data_url("data:image/png;base64,QUJD\nQUJD"), "not a multiple of 4");
  EXPECT_ERROR(decode_data_url("data:image/png;base64,QU JDQUJ"), "whitespace");
  EXPECT_ERROR(decode_data_url("data:image/png;base64,QU*DQUJD"), "invalid base64 character '*'");
  EXPECT_ERROR(decode_data_url("data:image/png;base64,QU-_QUJD"), "invalid base64 character '-'");
  EXPECT_ERROR(decode_data_url("data:image/png;base64,QQ=AQUJD"), "'=' inside");
  EXPECT_ERROR(decode_data_url("data:image/png;base64,QUJD===="), "'=' inside");
  EXPECT_ERROR(decode_data_url("data:image/png;base64,QR=="), "non-canonical");
  EXPECT_ERROR(decode_data_url("data:image/png;base64," + base64(png), 100),
               "exceeds the limit of 100 bytes");
  // Valid base64 of something that is not an image: the URL decodes, the image does not.
  EXPECT_ERROR(decode_image(decode_data_url("data:image/png;base64," + base64("not an image"))),
               "unrecognised image data");
}
