#include "vision/image.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "core/error.h"

namespace myriad::vision {
namespace {

// stb_image allocates through these: every single allocation is capped (per thread, set around
// each decode from the header's dimensions), so a PNG whose zlib stream inflates far past its
// declared size fails with "outofmem" instead of exhausting memory.
thread_local size_t t_alloc_cap = std::numeric_limits<size_t>::max();
void* capped_malloc(size_t n) {
  return n > t_alloc_cap ? nullptr : std::malloc(n);
}
void* capped_realloc(void* p, size_t n) {
  return n > t_alloc_cap ? nullptr : std::realloc(p, n);
}

}  // namespace
}  // namespace myriad::vision

// stb_image (Debian libstb-dev) as a private implementation: PNG and JPEG only, from memory only,
// every function static to this file. Its own warnings are not ours.
#define STB_IMAGE_IMPLEMENTATION
#define STB_IMAGE_STATIC
#define STBI_ONLY_PNG
#define STBI_ONLY_JPEG
#define STBI_NO_STDIO
#define STBI_NO_LINEAR
#define STBI_NO_HDR
#define STBI_MAX_DIMENSIONS (1 << 16)
#define STBI_MALLOC(sz) ::myriad::vision::capped_malloc(sz)
#define STBI_REALLOC(p, newsz) ::myriad::vision::capped_realloc(p, newsz)
#define STBI_FREE(p) std::free(p)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wall"
#pragma GCC diagnostic ignored "-Wextra"
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wsign-compare"
#pragma GCC diagnostic ignored "-Wcast-qual"
#pragma GCC diagnostic ignored "-Wconversion"
#pragma GCC diagnostic ignored "-Wdouble-promotion"
#pragma GCC diagnostic ignored "-Wimplicit-fallthrough"
// stb_image 2.27's JPEG decoder shifts by out-of-range counts and overflows int arithmetic on
// corrupt data (its bit reader can run below zero bits; later stb releases check): arithmetic UB,
// not memory errors. The sanitizer build (tests/fuzz) keeps checking stb's memory accesses and
// everything else but not those two.
#if defined(__clang__)
#pragma clang attribute push(__attribute__((no_sanitize("shift", "signed-integer-overflow"))), \
                             apply_to = function)
#endif
#include <stb/stb_image.h>
#if defined(__clang__)
#pragma clang attribute pop
#endif
#pragma GCC diagnostic pop

namespace myriad::vision {

namespace {

using namespace std::string_view_literals;

constexpr int64_t kMaxSide = int64_t{1} << 16;  // STBI_MAX_DIMENSIONS

uint32_t be32(const uint8_t* p) {
  return uint32_t(p[0]) << 24 | uint32_t(p[1]) << 16 | uint32_t(p[2]) << 8 | uint32_t(p[3]);
}

bool starts_with(std::span<const uint8_t> b, std::string_view magic, size_t at = 0) {
  return b.size() >= at + magic.size() &&
         std::memcmp(b.data() + at, magic.data(), magic.size()) == 0;
}

constexpr std::string_view kPngSig = "\x89PNG\r\n\x1a\n"sv;

// The other formats a client is likely to send, named in the error.
const char* other_format(std::span<const uint8_t> b) {
  if (starts_with(b, "GIF87a"sv) || starts_with(b, "GIF89a"sv)) return "GIF";
  if (starts_with(b, "BM"sv)) return "BMP";
  if (starts_with(b, "RIFF"sv) && starts_with(b, "WEBP"sv, 8)) return "WebP";
  if (starts_with(b, "II*\0"sv) || starts_with(b, "MM\0*"sv)) return "TIFF";
  if (starts_with(b, "ftyp"sv, 4)) return "HEIF/AVIF";
  if (starts_with(b, "\0\0\1\0"sv)) return "ICO";
  if (starts_with(b, "<svg"sv) || starts_with(b, "<?xml"sv)) return "SVG";
  if (starts_with(b, "%PDF"sv)) return "PDF";
  if (starts_with(b, "qoif"sv)) return "QOI";
  return nullptr;
}

// CRC-32 (ISO-HDLC, as PNG uses) with a table built once.
uint32_t crc32(const uint8_t* p, size_t n) {
  static const auto table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) c = table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

struct PngHeader {
  int64_t width = 0, height = 0;
  int depth = 0, color_type = 0;
};

// Walks the chunks: IHDR first with a valid size, every length inside the data, CRCs (when
// asked), at least one IDAT, and IEND (anything after it is ignored, as decoders do).
PngHeader walk_png(std::span<const uint8_t> b, bool check_crc) {
  size_t pos = kPngSig.size();
  PngHeader h;
  bool idat = false;
  for (int index = 0;; ++index) {
    MYRIAD_CHECK(b.size() - pos >= 8, "truncated PNG: the data ends after ", pos,
                 " bytes without an IEND chunk");
    const uint32_t len = be32(&b[pos]);
    const uint8_t* type = &b[pos + 4];
    const std::string name(reinterpret_cast<const char*>(type), 4);
    for (int k = 0; k < 4; ++k)
      MYRIAD_CHECK(std::isalpha(type[k]) != 0, "corrupt PNG: chunk ", index, " at byte ", pos,
                   " has an invalid type");
    MYRIAD_CHECK(len <= 0x7FFFFFFFu, "corrupt PNG: chunk ", name, " has length ", len);
    MYRIAD_CHECK(b.size() - pos - 8 >= size_t{len} + 4, "truncated PNG: chunk ", name, " of ", len,
                 " bytes at byte ", pos, " runs past the end of the data (", b.size(), " bytes)");
    if (check_crc) {
      const uint32_t want = be32(&b[pos + 8 + len]);
      MYRIAD_CHECK(crc32(type, size_t{len} + 4) == want, "corrupt PNG: chunk ", name, " at byte ",
                   pos, " has a bad CRC");
    }
    if (index == 0) {
      MYRIAD_CHECK(name == "IHDR" && len == 13,
                   "corrupt PNG: the first chunk must be a 13-byte IHDR");
      const uint8_t* d = &b[pos + 8];
      h.width = be32(d);
      h.height = be32(d + 4);
      h.depth = d[8];
      h.color_type = d[9];
    } else if (name == "CgBI") {
      // Apple's iOS-optimised variant (BGR, premultiplied, raw deflate): stb would decode it,
      // PIL does not.
      throw Error("unsupported PNG: Apple CgBI (iOS-optimised) PNGs are not accepted");
    } else if (name == "IDAT") {
      idat = true;
    } else if (name == "IEND") {
      MYRIAD_CHECK(idat, "corrupt PNG: no IDAT (image data) chunk before IEND");
      return h;
    }
    pos += 12 + size_t{len};
  }
}

// A DHT segment's tables (after the length): each a class/id byte, 16 code counts and as many
// symbols as the counts add up to, which is at most 256. stb_image 2.27 does not check that
// bound and writes past its tables for larger counts, so no DHT reaches it unchecked.
void check_dht(std::span<const uint8_t> d, size_t at) {
  size_t pos = 0;
  while (pos < d.size()) {
    MYRIAD_CHECK(d.size() - pos >= 17, "corrupt JPEG: short Huffman table (DHT at byte ", at, ")");
    const uint8_t q = d[pos];
    MYRIAD_CHECK((q >> 4) <= 1 && (q & 15) <= 3, "corrupt JPEG: bad Huffman table class/id ",
                 int(q), " (DHT at byte ", at, ")");
    size_t n = 0;
    for (size_t i = 1; i <= 16; ++i) n += d[pos + i];
    MYRIAD_CHECK(n <= 256, "corrupt JPEG: Huffman table with ", n,
                 " codes, more than 256 (DHT at byte ", at, ")");
    MYRIAD_CHECK(d.size() - pos - 17 >= n,
                 "corrupt JPEG: Huffman table runs past its segment "
                 "(DHT at byte ",
                 at, ")");
    pos += 17 + n;
  }
}

// Walks the markers: segment lengths inside the data, a frame header (SOFn) before the first
// scan, the entropy-coded data of every scan, and EOI. stb_image itself decodes a truncated JPEG
// without complaint (the missing rows come out gray), hence this check.
void walk_jpeg(std::span<const uint8_t> b) {
  const size_t n = b.size();
  size_t pos = 2;  // after SOI
  bool frame = false, scan = false;
  while (true) {
    MYRIAD_CHECK(pos < n, "truncated JPEG: the data ends after ", n,
                 " bytes without an EOI marker");
    MYRIAD_CHECK(b[pos] == 0xFF, "corrupt JPEG: expected a marker at byte ", pos);
    while (pos < n && b[pos] == 0xFF) ++pos;  // fill bytes
    MYRIAD_CHECK(pos < n, "truncated JPEG: the data ends after ", n,
                 " bytes without an EOI marker");
    const uint8_t m = b[pos++];
    if (m == 0xD9) {
      MYRIAD_CHECK(scan, "corrupt JPEG: EOI before any scan (no image data)");
      return;
    }
    if (m == 0x01 || (m >= 0xD0 && m <= 0xD7)) continue;  // TEM, RSTn: no length
    MYRIAD_CHECK(m != 0x00 && m != 0xD8, "corrupt JPEG: unexpected marker 0xFF",
                 (m == 0 ? "00" : "D8"), " at byte ", pos - 2);
    MYRIAD_CHECK(n - pos >= 2, "truncated JPEG: a segment header runs past the end of the data");
    const size_t len = size_t{b[pos]} << 8 | b[pos + 1];
    MYRIAD_CHECK(len >= 2, "corrupt JPEG: segment length ", len, " at byte ", pos);
    MYRIAD_CHECK(n - pos >= len, "truncated JPEG: a segment of ", len, " bytes at byte ", pos,
                 " runs past the end of the data (", n, " bytes)");
    if (m >= 0xC0 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC) frame = true;
    if (m == 0xC4) check_dht(b.subspan(pos + 2, len - 2), pos);
    pos += len;
    if (m != 0xDA) continue;
    MYRIAD_CHECK(frame, "corrupt JPEG: a scan (SOS) before the frame header (SOFn)");
    scan = true;
    // Entropy-coded data: 0xFF is followed by 0x00 (a stuffed byte), RSTn or fill bytes;
    // anything else is the next marker.
    while (true) {
      MYRIAD_CHECK(pos + 1 < n, "truncated JPEG: the data ends inside a scan (", n, " bytes)");
      if (b[pos] != 0xFF) {
        ++pos;
        continue;
      }
      const uint8_t next = b[pos + 1];
      if (next == 0x00 || (next >= 0xD0 && next <= 0xD7)) {
        pos += 2;
      } else if (next == 0xFF) {
        ++pos;
      } else {
        break;
      }
    }
  }
}

std::string stb_reason() {
  const char* r = stbi_failure_reason();
  return r ? r : "unknown error";
}

// Sets the allocation cap for the current thread while a decode runs.
struct AllocCap {
  explicit AllocCap(size_t cap) { t_alloc_cap = cap; }
  ~AllocCap() { t_alloc_cap = std::numeric_limits<size_t>::max(); }
  AllocCap(const AllocCap&) = delete;
  AllocCap& operator=(const AllocCap&) = delete;
};

// PIL's Image.alpha_composite of a pixel over opaque white (libImaging/AlphaComposite.c with the
// destination alpha 255), the integer arithmetic exactly: what convert_to_rgb does to images with
// transparency.
uint8_t over_white(uint32_t c, uint32_t a) {
  const uint32_t tmp = (c * a + 255 * (255 - a)) * 128 + (0x80 << 7);
  return static_cast<uint8_t>((((tmp >> 8) + tmp) >> 8) >> 7);
}

}  // namespace

const char* format_name(ImageFormat f) {
  return f == ImageFormat::Png ? "PNG" : "JPEG";
}

ImageInfo probe_image(std::span<const uint8_t> b, const DecodeOptions& opt) {
  MYRIAD_CHECK(!b.empty(), "empty image data");
  MYRIAD_CHECK(b.size() <= opt.max_bytes, "image data of ", b.size(),
               " bytes exceeds the limit of ", opt.max_bytes, " bytes");
  MYRIAD_CHECK(b.size() <= size_t{std::numeric_limits<int>::max()}, "image data of ", b.size(),
               " bytes is too large");
  const auto check_size = [&](int64_t w, int64_t h, const char* what) {
    MYRIAD_CHECK(w > 0 && h > 0, "corrupt ", what, ": image of ", w, "x", h, " pixels");
    MYRIAD_CHECK(w <= kMaxSide && h <= kMaxSide, "image of ", w, "x", h,
                 " pixels is too large: each side may be at most ", kMaxSide, " pixels");
    MYRIAD_CHECK(w * h <= opt.max_pixels, "image of ", w, "x", h, " = ", w * h,
                 " pixels exceeds the limit of ", opt.max_pixels, " pixels");
  };
  ImageInfo info;
  if (starts_with(b, kPngSig)) {
    info.format = ImageFormat::Png;
    const PngHeader h = walk_png(b, opt.check_crc);
    check_size(h.width, h.height, "PNG");  // before stb reads anything
    info.width = h.width;
    info.height = h.height;
  } else if (starts_with(b, "\xFF\xD8\xFF"sv)) {
    info.format = ImageFormat::Jpeg;
    walk_jpeg(b);
  } else if (const char* other = other_format(b)) {
    throw Error(cat("unsupported image format ", other, ": only PNG and JPEG are accepted"));
  } else {
    throw Error("unrecognised image data: not a PNG or JPEG file");
  }
  int w = 0, h = 0, comp = 0;
  MYRIAD_CHECK(stbi_info_from_memory(b.data(), static_cast<int>(b.size()), &w, &h, &comp) != 0,
               "corrupt or unsupported ", format_name(info.format), ": ", stb_reason());
  MYRIAD_CHECK(info.format == ImageFormat::Jpeg || (w == info.width && h == info.height),
               "corrupt PNG: inconsistent header");
  check_size(w, h, format_name(info.format));
  info.width = w;
  info.height = h;
  return info;
}

ImageInfo probe_image(std::string_view bytes, const DecodeOptions& opt) {
  return probe_image(std::span(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()), opt);
}

Image decode_image(std::span<const uint8_t> b, const DecodeOptions& opt) {
  const ImageInfo info = probe_image(b, opt);
  const size_t w = static_cast<size_t>(info.width), h = static_cast<size_t>(info.height);
  // The largest buffer a valid image needs: 16-bit RGBA rows plus filter bytes (PNG), or
  // components padded to whole 32-pixel MCUs (JPEG); 1 MiB for the small fixed ones.
  const AllocCap cap(8 * (w + 32) * (h + 32) + (size_t{1} << 20));
  const int len = static_cast<int>(b.size());
  int x = 0, y = 0, n = 0;
  Image img;
  img.width = info.width;
  img.height = info.height;
  img.rgb.resize(w * h * 3);
  // 16-bit grayscale PNGs are PIL mode I;16, whose conversion to RGB clips values to 255 (it
  // does not take the high byte, as for every other 16-bit PNG and as stb does).
  // stb reports the size it decoded; the pixels are read as the header's size.
  const auto same_size = [&](void* px) {
    if (x == info.width && y == info.height) return;
    stbi_image_free(px);
    throw Error(cat("corrupt ", format_name(info.format), ": decoded ", x, "x", y,
                    " pixels, the header says ", info.width, "x", info.height));
  };
  bool gray16 = false;
  if (info.format == ImageFormat::Png) {
    const uint8_t* ihdr = b.data() + kPngSig.size() + 8;
    gray16 = ihdr[8] == 16 && ihdr[9] == 0;
  }
  if (gray16) {
    stbi_us* px = stbi_load_16_from_memory(b.data(), len, &x, &y, &n, 2);
    MYRIAD_CHECK(px != nullptr, "corrupt or unsupported PNG: ", stb_reason());
    same_size(px);
    for (size_t i = 0; i < w * h; ++i) {
      const uint8_t v = static_cast<uint8_t>(std::min<uint32_t>(px[2 * i], 255));
      const uint8_t c = over_white(v, px[2 * i + 1] >> 8);
      std::fill_n(&img.rgb[3 * i], 3, c);
    }
    stbi_image_free(px);
  } else {
    stbi_uc* px = stbi_load_from_memory(b.data(), len, &x, &y, &n, 4);
    MYRIAD_CHECK(px != nullptr, "corrupt or unsupported ", format_name(info.format), ": ",
                 stb_reason());
    same_size(px);
    for (size_t i = 0; i < w * h; ++i)
      for (size_t c = 0; c < 3; ++c) img.rgb[3 * i + c] = over_white(px[4 * i + c], px[4 * i + 3]);
    stbi_image_free(px);
  }
  return img;
}

Image decode_image(std::string_view bytes, const DecodeOptions& opt) {
  return decode_image(std::span(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()), opt);
}

// ---- data: URLs ----

namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// Client text quoted in an error: at most 40 characters, non-printable bytes as '?'.
std::string shown(std::string_view s) {
  std::string out(s.substr(0, 40));
  for (char& c : out)
    if (std::isprint(static_cast<unsigned char>(c)) == 0) c = '?';
  return s.size() > 40 ? out + "..." : out;
}

int b64_value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

// RFC 4648 base64, strictly: the standard alphabet, padded to a multiple of 4, '=' only at the
// end, and zero bits in the last character's unused part (one encoding per byte string).
std::string decode_base64(std::string_view s, size_t max_bytes) {
  MYRIAD_CHECK(!s.empty(), "data URL: empty base64 data");
  MYRIAD_CHECK(s.size() % 4 == 0, "data URL: base64 data of ", s.size(),
               " characters is not a multiple of 4 (missing '=' padding or truncated)");
  const size_t pad = s.ends_with("==") ? 2 : s.ends_with('=') ? 1 : 0;
  const size_t out_size = s.size() / 4 * 3 - pad;
  MYRIAD_CHECK(out_size <= max_bytes, "data URL: image data of ", out_size,
               " bytes exceeds the limit of ", max_bytes, " bytes");
  std::string out;
  out.reserve(out_size);
  const size_t body = s.size() - pad;
  uint32_t acc = 0;
  int bits = 0;
  for (size_t i = 0; i < body; ++i) {
    const int v = b64_value(s[i]);
    if (v < 0) {
      const unsigned char c = static_cast<unsigned char>(s[i]);
      throw Error(c == '='               ? cat("data URL: '=' inside the base64 data at ", i)
                  : std::isspace(c) != 0 ? cat("data URL: whitespace in the base64 data at ", i)
                  : std::isprint(c) != 0
                      ? cat("data URL: invalid base64 character '", s[i], "' at ", i)
                      : cat("data URL: invalid base64 byte ", int(c), " at ", i));
    }
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xFF));
    }
  }
  MYRIAD_CHECK((acc & ((1u << bits) - 1)) == 0,
               "data URL: non-canonical base64 (nonzero bits before the padding)");
  return out;
}

}  // namespace

std::string decode_data_url(std::string_view url, size_t max_bytes) {
  const std::string head = lower(url.substr(0, std::min<size_t>(url.size(), 16)));
  MYRIAD_CHECK(
      !head.starts_with("http://") && !head.starts_with("https://"),
      "remote image URLs are not supported: this server does not fetch images; send the "
      "image inline as a data URL (data:image/png;base64,... or data:image/jpeg;base64,...)");
  MYRIAD_CHECK(head.starts_with("data:"), "unsupported image URL", url.empty() ? " (empty)" : "",
               ": expected a data URL (data:image/png;base64,... or "
               "data:image/jpeg;base64,...)");
  const size_t comma = url.find(',');
  MYRIAD_CHECK(comma != std::string_view::npos, "malformed data URL: no ',' before the data");
  // data:<media type>[;<param>=<value>]*;base64,<data>
  const std::string meta = lower(url.substr(5, comma - 5));
  MYRIAD_CHECK(meta.ends_with(";base64"),
               "data URL must be base64-encoded (data:image/png;base64,...)");
  const std::string type = meta.substr(0, meta.find(';'));
  MYRIAD_CHECK(type == "image/png" || type == "image/jpeg" || type == "image/jpg",
               "data URL media type '", type.empty() ? "(none)" : shown(type),
               "' is not supported: send image/png or image/jpeg");
  return decode_base64(url.substr(comma + 1), max_bytes);
}

// ---- preprocessing ----

void PreprocessOptions::validate() const {
  constexpr int64_t kBig = int64_t{1} << 20;
  MYRIAD_CHECK(patch_size >= 1 && patch_size <= 1024, "preprocess: patch_size ", patch_size,
               " out of range [1, 1024]");
  MYRIAD_CHECK(merge_h >= 1 && merge_h <= 64 && merge_w >= 1 && merge_w <= 64,
               "preprocess: merge kernel ", merge_h, "x", merge_w, " out of range [1, 64]");
  MYRIAD_CHECK(max_patches >= 1 && max_patches <= kBig, "preprocess: max_patches ", max_patches,
               " out of range [1, ", kBig, "]");
  MYRIAD_CHECK(max_side_patches >= 1 && max_side_patches <= kBig, "preprocess: max_side_patches ",
               max_side_patches, " out of range [1, ", kBig, "]");
}

ResizePlan navit_resize(int64_t height, int64_t width, const PreprocessOptions& o) {
  o.validate();
  MYRIAD_CHECK(height >= 1 && width >= 1, "preprocess: empty image ", width, "x", height);
  // The Python in double precision, operation for operation.
  const double nph = std::max<double>(1.0, static_cast<double>(height / o.patch_size));
  const double npw = std::max<double>(1.0, static_cast<double>(width / o.patch_size));
  const double side = static_cast<double>(o.max_side_patches * o.patch_size);
  const double scale =
      std::min({1.0, std::sqrt(static_cast<double>(o.max_patches) / (nph * npw)),
                side / static_cast<double>(height), side / static_cast<double>(width)});
  ResizePlan p;
  const int64_t max_px = o.max_side_patches * o.patch_size;
  // Python's int() truncates toward zero; the products are positive.
  p.height = std::min(
      std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(height) * scale)), max_px);
  p.width = std::min(std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(width) * scale)),
                     max_px);
  const int64_t fh = o.merge_h * o.patch_size, fw = o.merge_w * o.patch_size;
  p.pad_height = (fh - p.height % fh) % fh + p.height;
  p.pad_width = (fw - p.width % fw) % fw + p.width;
  return p;
}

namespace {

// One axis of ATen's uint8 antialiased resampling (UpSampleKernel.cpp,
// HelperInterpBase::_compute_indices_min_size_weights_aa and _compute_index_ranges_int16_weights
// with align_corners = false and no scale factor): for each output index the first input index,
// the tap count and int16 fixed-point weights with `precision` fractional bits.
struct AxisWeights {
  std::vector<int64_t> start, size;
  std::vector<int16_t> w;  // out × taps
  int64_t taps = 0;
  int precision = 0;
};

// Keys' cubic with a = -0.5 (Pillow's and ATen's antialias bicubic), in ATen's operation order.
double cubic(double x) {
  constexpr double a = -0.5;
  x = std::abs(x);
  if (x < 1.0) return ((a + 2) * x - (a + 3)) * x * x + 1;
  if (x < 2.0) return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a;
  return 0.0;
}

AxisWeights axis_weights(int64_t in, int64_t out) {
  const double scale = static_cast<double>(in) / static_cast<double>(out);
  const double support = scale >= 1.0 ? 2.0 * scale : 2.0;  // interp_size 4 · 0.5 · scale
  AxisWeights a;
  a.taps = static_cast<int64_t>(std::ceil(support)) * 2 + 1;
  a.start.resize(static_cast<size_t>(out));
  a.size.resize(static_cast<size_t>(out));
  std::vector<double> wf(static_cast<size_t>(out * a.taps), 0.0);
  const double invscale = scale >= 1.0 ? 1.0 / scale : 1.0;
  double wt_max = 0.0;
  for (int64_t i = 0; i < out; ++i) {
    const double center = scale * (static_cast<double>(i) + 0.5);
    const int64_t xmin = std::max<int64_t>(static_cast<int64_t>(center - support + 0.5), 0);
    const int64_t xsize = std::clamp<int64_t>(
        std::min<int64_t>(static_cast<int64_t>(center + support + 0.5), in) - xmin, 0, a.taps);
    double* w = &wf[static_cast<size_t>(i * a.taps)];
    double total = 0.0;
    for (int64_t j = 0; j < xsize; ++j) {
      w[j] = cubic((static_cast<double>(j + xmin) - center + 0.5) * invscale);
      total += w[j];
    }
    if (total != 0.0)
      for (int64_t j = 0; j < xsize; ++j) {
        w[j] /= total;
        wt_max = std::max(wt_max, w[j]);
      }
    a.start[static_cast<size_t>(i)] = xmin;
    a.size[static_cast<size_t>(i)] = xsize;
  }
  // The most fractional bits (at most 22) that keep the largest weight inside int16.
  int p = 0;
  for (; p < 22; ++p)
    if (static_cast<int>(0.5 + wt_max * (1 << (p + 1))) >= (1 << 15)) break;
  a.precision = p;
  a.w.resize(wf.size());
  for (size_t k = 0; k < wf.size(); ++k) {
    const double v = wf[k] * (1 << p);
    a.w[k] = static_cast<int16_t>(v < 0 ? static_cast<int>(-0.5 + v) : static_cast<int>(0.5 + v));
  }
  return a;
}

// The horizontal pass over interleaved RGB rows (in_w -> out_w pixels), rounding half up and
// clamping to uint8 as ATen does.
void resample_rows(const uint8_t* src, uint8_t* dst, int64_t rows, int64_t in_w, int64_t out_w,
                   const AxisWeights& a) {
  const int64_t round = int64_t{1} << (a.precision - 1);
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* s = src + r * in_w * 3;
    uint8_t* d = dst + r * out_w * 3;
    for (int64_t i = 0; i < out_w; ++i) {
      const int16_t* w = &a.w[static_cast<size_t>(i * a.taps)];
      const uint8_t* base = s + a.start[static_cast<size_t>(i)] * 3;
      const int64_t n = a.size[static_cast<size_t>(i)];
      for (int64_t c = 0; c < 3; ++c) {
        int64_t acc = round;
        for (int64_t j = 0; j < n; ++j) acc += int64_t{base[j * 3 + c]} * w[j];
        d[i * 3 + c] = static_cast<uint8_t>(std::clamp<int64_t>(acc >> a.precision, 0, 255));
      }
    }
  }
}

// The vertical pass (in_h -> out_h rows of `width` RGB pixels), whole rows at a time.
void resample_cols(const uint8_t* src, uint8_t* dst, int64_t width, int64_t out_h,
                   const AxisWeights& a) {
  const int64_t round = int64_t{1} << (a.precision - 1), line = width * 3;
  std::vector<int64_t> acc(static_cast<size_t>(line));
  for (int64_t i = 0; i < out_h; ++i) {
    std::fill(acc.begin(), acc.end(), round);
    const int16_t* w = &a.w[static_cast<size_t>(i * a.taps)];
    for (int64_t j = 0; j < a.size[static_cast<size_t>(i)]; ++j) {
      const uint8_t* s = src + (a.start[static_cast<size_t>(i)] + j) * line;
      for (int64_t k = 0; k < line; ++k) acc[static_cast<size_t>(k)] += int64_t{s[k]} * w[j];
    }
    uint8_t* d = dst + i * line;
    for (int64_t k = 0; k < line; ++k)
      d[k] = static_cast<uint8_t>(
          std::clamp<int64_t>(acc[static_cast<size_t>(k)] >> a.precision, 0, 255));
  }
}

float normalize(uint8_t v) {
  // (x - mean) / std with mean = 0.5 / (1/255) and std likewise, in float32 as torchvision's
  // normalize computes it after the processor fuses rescale into mean and std.
  return (static_cast<float>(v) - 127.5f) / 127.5f;
}

}  // namespace

Image resize_bicubic(const Image& img, int64_t height, int64_t width) {
  MYRIAD_CHECK(img.channels == 3 && img.width >= 1 && img.height >= 1 &&
                   img.rgb.size() == static_cast<size_t>(img.width * img.height * 3),
               "resize: bad image ", img.width, "x", img.height, "x", img.channels);
  MYRIAD_CHECK(height >= 1 && width >= 1 && height <= kMaxSide && width <= kMaxSide,
               "resize: bad target size ", width, "x", height);
  Image cur = img;
  // Horizontal pass first, then vertical, each rounded to uint8 (ATen's order).
  if (width != cur.width) {
    const AxisWeights a = axis_weights(cur.width, width);
    Image next{width, cur.height, 3,
               std::vector<uint8_t>(static_cast<size_t>(width * cur.height * 3))};
    resample_rows(cur.rgb.data(), next.rgb.data(), cur.height, cur.width, width, a);
    cur = std::move(next);
  }
  if (height != cur.height) {
    const AxisWeights a = axis_weights(cur.height, height);
    Image next{cur.width, height, 3,
               std::vector<uint8_t>(static_cast<size_t>(cur.width * height * 3))};
    resample_cols(cur.rgb.data(), next.rgb.data(), cur.width, height, a);
    cur = std::move(next);
  }
  return cur;
}

Processed preprocess(const Image& img, const PreprocessOptions& opt) {
  const ResizePlan plan = navit_resize(img.height, img.width, opt);
  const Image r = resize_bicubic(img, plan.height, plan.width);
  const int64_t p = opt.patch_size;
  const int64_t gh = plan.pad_height / p, gw = plan.pad_width / p;
  Processed out;
  out.grid = Grid{1, gh, gw};
  out.tokens = gh * gw / (opt.merge_h * opt.merge_w);
  out.pixel_values = Tensor::empty({gh * gw, 3 * p * p}, DType::F32);
  float* dst = out.pixel_values.data<float>();
  const float pad = normalize(0);  // the padding is zero pixels
  // Row (gy, gx) of pixel_values holds channel-major c × p × p values of that patch.
  for (int64_t gy = 0; gy < gh; ++gy)
    for (int64_t gx = 0; gx < gw; ++gx)
      for (int64_t c = 0; c < 3; ++c)
        for (int64_t py = 0; py < p; ++py)
          for (int64_t px = 0; px < p; ++px) {
            const int64_t y = gy * p + py, x = gx * p + px;
            *dst++ = y < r.height && x < r.width
                         ? normalize(r.rgb[static_cast<size_t>((y * r.width + x) * 3 + c)])
                         : pad;
          }
  return out;
}

ProcessedBatch preprocess(std::span<const Image> images, const PreprocessOptions& opt) {
  opt.validate();
  ProcessedBatch b;
  std::vector<Processed> each;
  int64_t rows = 0;
  for (const Image& img : images) {
    each.push_back(preprocess(img, opt));
    rows += each.back().grid.h * each.back().grid.w;
    b.grids.push_back(each.back().grid);
    b.tokens.push_back(each.back().tokens);
  }
  const int64_t cols = opt.patch_size * opt.patch_size * 3;
  b.pixel_values = Tensor::empty({rows, cols}, DType::F32);
  if (rows == 0) return b;
  float* dst = b.pixel_values.data<float>();
  for (const Processed& e : each) {
    const size_t n = static_cast<size_t>(e.pixel_values.numel());
    std::memcpy(dst, e.pixel_values.data<float>(), n * sizeof(float));
    dst += n;
  }
  return b;
}

}  // namespace myriad::vision
