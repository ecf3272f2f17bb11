// Quantized checkpoints (model/quant.h): the element decoders and dequantizers against hand-made
// codes and against what transformers 5.24 / compressed-tensors 0.20.1 compute from the same
// stored tensors (tests/fixtures/quant/tensors.safetensors), error cases, and the quantized tiny
// models (tests/fixtures/quant/<name>, tools/reference/quant_fixtures.py) against the logits of
// their dequantized weights in transformers.
#include <gtest/gtest.h>
#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "core/autograd.h"
#include "core/dtype.h"
#include "io/file.h"
#include "io/safetensors.h"
#include "model/decoder.h"
#include "model/quant.h"
#include "tests/model/model_test_util.h"

namespace myriad::model::quant {
namespace {

namespace fs = std::filesystem;
using safetensors::RawEntry;
using safetensors::RawTensor;

std::string quant_dir(const std::string& f) {
  return std::string(MYRIAD_SOURCE_DIR) + "/tests/fixtures/quant/" + f;
}

const safetensors::SafetensorsFile& cases() {
  static const auto f = safetensors::open(quant_dir("tensors.safetensors"));
  return f;
}

// Same value, NaN equal to NaN, and the sign of zero kept.
bool same(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return a == b && std::signbit(a) == std::signbit(b);
}

void expect_bits_equal(const Tensor& got, const Tensor& want, const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_EQ(got.shape(), want.shape());
  ASSERT_EQ(got.dtype(), want.dtype());
  ASSERT_EQ(got.nbytes(), want.nbytes());
  Tensor g = got.contiguous(), w = want.contiguous();
  EXPECT_EQ(std::memcmp(g.data_ptr(), w.data_ptr(), g.nbytes()), 0);
  const auto a = g.to_floats(), b = w.to_floats();
  int shown = 0;
  for (size_t i = 0; i < a.size() && shown < 5; ++i)
    if (!same(a[i], b[i])) {
      ADD_FAILURE() << "element " << i << ": " << a[i] << " vs " << b[i];
      ++shown;
    }
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

#define EXPECT_ERROR_HAS(stmt, ...)                                          \
  do {                                                                       \
    const std::string msg_ = error_of([&] { stmt; });                        \
    for (const char* part_ : {__VA_ARGS__})                                  \
      EXPECT_NE(msg_.find(part_), std::string::npos) << "'" << part_ << "'"  \
                                                     << " not in: " << msg_; \
  } while (0)

// ---- Element codes ----

TEST(QuantCodes, Fp8E4M3KnownPatterns) {
  EXPECT_EQ(fp8_e4m3_to_float(0x00), 0.0f);
  EXPECT_TRUE(std::signbit(fp8_e4m3_to_float(0x80)));            // -0
  EXPECT_EQ(fp8_e4m3_to_float(0x01), std::ldexp(1.0f, -9));      // smallest subnormal
  EXPECT_EQ(fp8_e4m3_to_float(0x07), 7 * std::ldexp(1.0f, -9));  // largest subnormal
  EXPECT_EQ(fp8_e4m3_to_float(0x08), std::ldexp(1.0f, -6));      // smallest normal
  EXPECT_EQ(fp8_e4m3_to_float(0x38), 1.0f);
  EXPECT_EQ(fp8_e4m3_to_float(0x3c), 1.5f);
  EXPECT_EQ(fp8_e4m3_to_float(0x7e), 448.0f);  // the largest: S.1111.110
  EXPECT_EQ(fp8_e4m3_to_float(0xfe), -448.0f);
  EXPECT_EQ(fp8_e4m3_to_float(0x78), 256.0f);  // exponent 15 is a normal exponent (no inf)
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_float(0x7f)));
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_float(0xff)));
}

TEST(QuantCodes, Fp8E5M2KnownPatterns) {
  EXPECT_EQ(fp8_e5m2_to_float(0x01), std::ldexp(1.0f, -16));
  EXPECT_EQ(fp8_e5m2_to_float(0x04), std::ldexp(1.0f, -14));
  EXPECT_EQ(fp8_e5m2_to_float(0x3c), 1.0f);
  EXPECT_EQ(fp8_e5m2_to_float(0x7b), 57344.0f);
  EXPECT_EQ(fp8_e5m2_to_float(0x7c), INFINITY);
  EXPECT_EQ(fp8_e5m2_to_float(0xfc), -INFINITY);
  EXPECT_TRUE(std::isnan(fp8_e5m2_to_float(0x7d)));
}

TEST(QuantCodes, Fp4AllSixteenCodes) {
  const float want[16] = {0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0f, -0.5, -1, -1.5, -2, -3, -4, -6};
  for (int c = 0; c < 16; ++c) EXPECT_TRUE(same(fp4_e2m1_to_float(c), want[c])) << c;
  EXPECT_EQ(fp4_e2m1_to_float(0xf7), 6.0f);  // only the low nibble counts
}

TEST(QuantCodes, E8M0Extremes) {
  EXPECT_EQ(e8m0_to_float(127), 1.0f);
  EXPECT_EQ(e8m0_to_float(0), std::ldexp(1.0f, -127));  // a float32 subnormal
  EXPECT_GT(e8m0_to_float(0), 0.0f);
  EXPECT_EQ(e8m0_to_float(1), std::ldexp(1.0f, -126));
  EXPECT_EQ(e8m0_to_float(254), std::ldexp(1.0f, 127));
  EXPECT_TRUE(std::isnan(e8m0_to_float(255)));
}

// Every code against torch's float8_e4m3fn / float8_e5m2 / float8_e8m0fnu conversions and
// compressed-tensors' unpack_fp4_from_uint8 (low nibble first).
TEST(QuantCodes, AllCodesMatchThePackages) {
  const auto e4 = cases().load("codes.e4m3_as_f32").to_floats();
  const auto e5 = cases().load("codes.e5m2_as_f32").to_floats();
  const auto e8 = cases().load("codes.e8m0_as_f32").to_floats();
  const auto f4 = cases().load("codes.fp4_as_f32").to_floats();
  ASSERT_EQ(f4.size(), 512u);
  for (int c = 0; c < 256; ++c) {
    SCOPED_TRACE(c);
    EXPECT_TRUE(same(fp8_e4m3_to_float(c), e4[c])) << fp8_e4m3_to_float(c) << " " << e4[c];
    EXPECT_TRUE(same(fp8_e5m2_to_float(c), e5[c])) << fp8_e5m2_to_float(c) << " " << e5[c];
    EXPECT_TRUE(same(e8m0_to_float(c), e8[c])) << e8m0_to_float(c) << " " << e8[c];
    EXPECT_TRUE(same(fp4_e2m1_to_float(c & 15), f4[2 * c]));
    EXPECT_TRUE(same(fp4_e2m1_to_float(c >> 4), f4[2 * c + 1]));
  }
}

TEST(QuantCodes, UnpackIntEdgesAndOrder) {
  // int4, offset 8: stored nibble 0 is -8, 15 is 7; element j at bits [4j, 4j + 4).
  const uint32_t w[2] = {0x76543210u, 0xfedcba98u};
  uint8_t b[8];
  std::memcpy(b, w, 8);
  for (int j = 0; j < 16; ++j) EXPECT_EQ(unpack_int(b, 1, j, 4), j - 8) << j;
  // int8, offset 128; int2, offset 2; int1, offset 1.
  EXPECT_EQ(unpack_int(b, 1, 0, 8), 0x10 - 128);
  EXPECT_EQ(unpack_int(b, 1, 7, 8), 0xfe - 128);
  EXPECT_EQ(unpack_int(b, 1, 0, 2), 0 - 2);
  EXPECT_EQ(unpack_int(b, 1, 2, 2), 1 - 2);
  EXPECT_EQ(unpack_int(b, 1, 4, 1), 1 - 1);
  EXPECT_EQ(unpack_int(b, 1, 5, 1), 0 - 1);
  // A column of a [words, 2] matrix: stride 2 words.
  const uint32_t m[4] = {0xfu, 0x0u, 0x0u, 0x8u};  // column 1: word 0 = 0, word 1 = 8
  uint8_t mb[16];
  std::memcpy(mb, m, 16);
  EXPECT_EQ(unpack_int(mb + 4, 2, 0, 4), -8);
  EXPECT_EQ(unpack_int(mb + 4, 2, 8, 4), 0);
  EXPECT_EQ(unpack_int(mb, 2, 0, 4), 7);
}

// ---- Dequantizers on hand-made tensors ----

template <class T>
std::vector<uint8_t> raw_bytes(const std::vector<T>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(T));
  if (!b.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

RawTensor view(const std::string& dtype, Shape shape, const std::vector<uint8_t>& bytes) {
  return {.st_dtype = dtype, .shape = std::move(shape), .bytes = bytes};
}

TEST(QuantDequant, Fp8BlocksWithCeilGrid) {
  // [3, 5] weight, block [2, 3]: grid [2, 2]; the last row and last two columns are partial.
  std::vector<uint8_t> q(15, 0x38);  // 1.0
  q[0] = 0x01;                       // 2^-9 (subnormal)
  q[14] = 0xfe;                      // -448
  const std::vector<float> s = {1.0f, 2.0f, 4.0f, 0.5f};
  const auto sb = raw_bytes(s);
  Tensor t = dequantize_fp8(view("F8_E4M3", {3, 5}, q), view("F32", {2, 2}, sb), 2, 3, DType::F32);
  const auto v = t.to_floats();
  const float want[15] = {std::ldexp(1.0f, -9), 1, 1, 2, 2, 1, 1, 1, 2, 2, 4, 4, 4, 0.5, -224};
  for (int k = 0; k < 15; ++k) EXPECT_EQ(v[k], want[k]) << k;
  // A one-element grid scales the whole tensor; bf16 output rounds the f32 product once.
  const std::vector<uint16_t> one = {f32_to_bf16(3.0f)};
  const auto ob = raw_bytes(one);
  Tensor b = dequantize_fp8(view("F8_E4M3", {3, 5}, q), view("BF16", {1}, ob), 3, 5, DType::BF16);
  EXPECT_EQ(b.dtype(), DType::BF16);
  EXPECT_EQ(b.to_floats()[14], -1344.0f);
  EXPECT_EQ(b.to_floats()[1], 3.0f);
}

TEST(QuantDequant, PackedInt4SymmetricGroups) {
  // One row of 16 values -8..7 (two words), groups of 8 with scales 0.5 and 2.
  const std::vector<uint32_t> w = {0x76543210u, 0xfedcba98u};
  const std::vector<float> s = {0.5f, 2.0f};
  const auto wb = raw_bytes(w), sb = raw_bytes(s);
  Tensor t = dequantize_packed_int(view("I32", {1, 2}, wb), view("F32", {1, 2}, sb), nullptr, 1, 16,
                                   4, 8, false, DType::F32);
  const auto v = t.to_floats();
  for (int j = 0; j < 16; ++j) EXPECT_EQ(v[j], (j - 8) * (j < 8 ? 0.5f : 2.0f)) << j;
  // Asymmetric: an I8 zero point per group.
  const std::vector<int8_t> z = {-8, 7};
  const auto zb = raw_bytes(z);
  const RawTensor zp = view("I8", {1, 2}, zb);
  Tensor a = dequantize_packed_int(view("I32", {1, 2}, wb), view("F32", {1, 2}, sb), &zp, 1, 16, 4,
                                   8, false, DType::F32);
  EXPECT_EQ(a.to_floats()[0], 0.0f);    // (-8 - -8) * 0.5
  EXPECT_EQ(a.to_floats()[15], 0.0f);   // (7 - 7) * 2
  EXPECT_EQ(a.to_floats()[7], 3.5f);    // (-1 - -8) * 0.5
  EXPECT_EQ(a.to_floats()[8], -14.0f);  // (0 - 7) * 2
}

TEST(QuantDequant, Mxfp4NibbleOrderAndScales) {
  // Row 0: bytes 0x21 -> 0.5 (low), 1 (high); group of 32 with e8m0 scale 2^1; row 1: 2^-1.
  std::vector<uint8_t> p(32, 0x00);
  p[0] = 0x21;
  p[16] = 0xf7;  // row 1: 6, -6
  const std::vector<uint8_t> s = {128, 126};
  Tensor t = dequantize_mxfp4(view("U8", {2, 16}, p), view("U8", {2, 1}, s), 32, DType::F32);
  ASSERT_EQ(t.shape(), Shape({2, 32}));
  const auto v = t.to_floats();
  EXPECT_EQ(v[0], 1.0f);
  EXPECT_EQ(v[1], 2.0f);
  EXPECT_EQ(v[2], 0.0f);
  EXPECT_EQ(v[32], 3.0f);
  EXPECT_EQ(v[33], -3.0f);
}

TEST(QuantDequant, Errors) {
  const std::vector<uint8_t> q(15, 0x38);
  const std::vector<float> s = {1, 1, 1, 1};
  const auto sb = raw_bytes(s);
  EXPECT_ERROR_HAS(
      dequantize_fp8(view("F8_E4M3", {3, 5}, q), view("F32", {4}, sb), 2, 3, DType::F32, "w"),
      "w_scale_inv", "has shape [4], expected [2, 2]");
  EXPECT_ERROR_HAS(
      dequantize_fp8(view("U8", {3, 5}, q), view("F32", {2, 2}, sb), 2, 3, DType::F32, "w"),
      "dtype U8");
  const std::vector<uint32_t> w = {0, 0};
  const auto wb = raw_bytes(w);
  EXPECT_ERROR_HAS(dequantize_packed_int(view("I32", {1, 2}, wb), view("F32", {1, 2}, sb), nullptr,
                                         1, 16, 3, 8, false, DType::F32, "w"),
                   "3-bit");
  EXPECT_ERROR_HAS(dequantize_packed_int(view("I32", {1, 2}, wb), view("F32", {1, 2}, sb), nullptr,
                                         1, 17, 4, 8, false, DType::F32, "w"),
                   "w_packed has shape [1, 2], expected [1, 3]");
  EXPECT_ERROR_HAS(dequantize_packed_int(view("I32", {1, 2}, wb), view("F32", {1, 2}, sb), nullptr,
                                         1, 16, 4, 5, false, DType::F32, "w"),
                   "group size 5");
  const std::vector<uint8_t> p(32, 0);
  EXPECT_ERROR_HAS(
      dequantize_mxfp4(view("U8", {2, 16}, p), view("F32", {2, 1}, sb), 32, DType::F32, "w"),
      "e8m0");
}

// ---- Dequantizers against the packages' results ----

RawTensor fx(const std::string& n) {
  return cases().load_raw(n);
}

TEST(QuantDequant, Fp8MatchesTransformers) {
  // [20, 40] with block [8, 16]: grid [3, 3], partial blocks in both dimensions;
  // _dequantize_fp8_weight of transformers.
  Tensor t = dequantize_fp8(fx("fp8.weight"), fx("fp8.weight_scale_inv"), 8, 16, DType::F32);
  expect_bits_equal(t, cases().load("fp8.dense"), "fp8 f32");
  Tensor b = dequantize_fp8(fx("fp8.weight"), fx("fp8.weight_scale_inv"), 8, 16, DType::BF16);
  expect_bits_equal(b, cases().load("fp8.dense").to(DType::BF16), "fp8 bf16");
}

struct PackedCase {
  const char* name;
  int bits;
  int64_t group;  // 0: channel
};

TEST(QuantDequant, PackedIntMatchesCompressedTensors) {
  for (const PackedCase& c : {PackedCase{"int4g", 4, 32}, PackedCase{"int4g_asym", 4, 32},
                              PackedCase{"int4c", 4, 0}, PackedCase{"int8c", 8, 0}}) {
    const std::string n = c.name;
    SCOPED_TRACE(n);
    const auto shape = cases().load(n + ".weight_shape").to_ints();
    const int64_t rows = shape[0], cols = shape[1];
    std::optional<RawTensor> zp;
    if (cases().contains(n + ".weight_zero_point")) zp = fx(n + ".weight_zero_point");
    EXPECT_EQ(zp.has_value(), n == "int4g_asym");
    const int64_t group = c.group ? c.group : cols;
    Tensor f =
        dequantize_packed_int(fx(n + ".weight_packed"), fx(n + ".weight_scale"),
                              zp ? &*zp : nullptr, rows, cols, c.bits, group, false, DType::F32, n);
    expect_bits_equal(f, cases().load(n + ".exact"), n + " exact f32");
    // compressed-tensors computes in the scale's dtype: the same value rounded once.
    Tensor pkg = cases().load(n + ".dense");
    Tensor d = dequantize_packed_int(fx(n + ".weight_packed"), fx(n + ".weight_scale"),
                                     zp ? &*zp : nullptr, rows, cols, c.bits, group, false,
                                     pkg.dtype(), n);
    expect_bits_equal(d, pkg, n + " in the package's dtype");
  }
  EXPECT_EQ(fx("int4c.weight_packed").shape, Shape({5, 6}));  // 44 int4 values: 5.5 words
}

TEST(QuantDequant, Mxfp4MatchesCompressedTensors) {
  Tensor f = dequantize_mxfp4(fx("mxfp4.weight_packed"), fx("mxfp4.weight_scale"), 32, DType::F32);
  expect_bits_equal(f, cases().load("mxfp4.exact"), "mxfp4 exact");
  Tensor b = dequantize_mxfp4(fx("mxfp4.weight_packed"), fx("mxfp4.weight_scale"), 32, DType::BF16);
  expect_bits_equal(b, cases().load("mxfp4.dense"), "mxfp4 bf16 (compressed-tensors)");
}

// ---- quantization_config ----

TEST(QuantConfig, ParsesThePublishedConfigs) {
  // DeepSeek-V3's (config.json on the hub).
  QuantConfig d =
      QuantConfig::parse(R"({"activation_scheme":"dynamic","fmt":"e4m3","quant_method":"fp8",)"
                         R"("weight_block_size":[128,128]})",
                         "ds");
  EXPECT_EQ(d.quant_method, "fp8");
  EXPECT_EQ(d.weight_block_size, (std::vector<int64_t>{128, 128}));
  EXPECT_EQ(d.fmt, "e4m3");
  // Kimi K2 Thinking's: one group, int4 symmetric group 32.
  QuantConfig k = QuantConfig::from_config_json(
      io::read_file(quant_dir("deepseek_v3_int4_tiny/config.json")), "k2t");
  EXPECT_EQ(k.quant_method, "compressed-tensors");
  EXPECT_EQ(k.format, "pack-quantized");
  ASSERT_EQ(k.groups.size(), 1u);
  ASSERT_TRUE(k.groups[0].weights.has_value());
  EXPECT_EQ(k.groups[0].weights->describe(), "int4 symmetric group 32");
  EXPECT_EQ(k.ignore.size(), 4u);
  // No strategy: compressed-tensors infers it from group_size.
  QuantConfig c = QuantConfig::parse(
      R"({"quant_method":"compressed-tensors","format":"pack-quantized","config_groups":{"g":)"
      R"({"targets":["Linear"],"weights":{"num_bits":8,"group_size":-1}}}})",
      "c");
  EXPECT_EQ(c.groups[0].weights->strategy, "channel");
  EXPECT_TRUE(QuantConfig::from_config_json(R"({"model_type":"x"})", "x").empty());
  EXPECT_ERROR_HAS(QuantConfig::parse(R"({"quant_method":"fp8","weight_block_size":[128]})", "q"),
                   "weight_block_size");
  // A directory without a config.json has no quantization_config.
  EXPECT_TRUE(QuantConfig::for_checkpoint(quant_dir("")).empty());
}

// ---- Quantized models ----

class QuantModel : public ::testing::TestWithParam<std::string> {};

// The quantized tiny models against transformers with their dequantized weights: logits and
// 8 greedy tokens. Quantization itself moves these logits by up to 2.3-2.9 (median 0.07-0.17)
// from the unquantized models' (the fixtures' metadata); dequantization here matches to float32
// rounding.
TEST_P(QuantModel, LogitsMatchTheDequantizedReference) {
  const std::string dir = quant_dir(GetParam());
  Decoder m = Decoder::load(dir);
  const auto in = safetensors::open(dir + "/inputs.safetensors");
  const auto out = safetensors::open(dir + "/outputs.safetensors");
  NoGradGuard ng;
  Tensor ids = in.load("input_ids");
  ForwardOutput f = m.forward(ids, nullptr, {.logits = true});
  const double dl = max_abs_diff(f.logits_BTV, out.load("logits"));
  EXPECT_LE(dl, 1e-4);
  const int64_t T = ids.size(1);
  std::vector<int64_t> row0 = ids.to_ints();
  row0.resize(T);
  auto gen = m.generate_greedy(Tensor::from_ints(row0, {1, T}), 8);
  EXPECT_EQ(gen.ids, out.load("greedy_ids").to_ints());
  const Tensor want = out.load("greedy_logits");
  const int64_t V = want.size(1);
  const std::vector<double> all = want.to_doubles();
  for (int64_t k = 0; k < 8; ++k) {
    SCOPED_TRACE("step " + std::to_string(k));
    std::vector<double> r(all.begin() + k * V, all.begin() + (k + 1) * V);
    EXPECT_LE(max_abs_diff(gen.step_logits[k], Tensor::from_doubles(r, {V})), 1e-4);
  }
  std::printf("%s: logits max err %.3g vs its dequantized reference\n", GetParam().c_str(), dl);
}

// bf16 loading rounds each dequantized f32 value once.
TEST_P(QuantModel, Bf16LoadRoundsTheF32Dequantization) {
  const std::string dir = quant_dir(GetParam());
  const ModelConfig c = ModelConfig::load(dir);
  const auto specs = Decoder::param_specs(c);
  Weights f = Weights::load(dir, specs, DType::F32), b = Weights::load(dir, specs, DType::BF16);
  const auto ck = safetensors::Checkpoint::open(dir);
  int quantized = 0;
  for (const auto& s : specs) {
    if (!ck.contains(s.name + "_scale_inv") && !ck.contains(s.name + "_packed")) continue;
    ++quantized;
    expect_bits_equal(b.get(s.name), f.get(s.name).to(DType::BF16), s.name);
  }
  EXPECT_GE(quantized, 8);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, QuantModel,
                         ::testing::Values("deepseek_v3_fp8_tiny", "deepseek_v3_int4_tiny",
                                           "kimi_linear_mxfp4_tiny"));

// A fixture copied to a temporary directory, to be broken in one place.
class QuantBroken : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("myriad_test_quant_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  // Reads a fixture's tensors and config.json.
  void read(const std::string& name) {
    src_ = quant_dir(name);
    const auto f = safetensors::open(src_ + "/model.safetensors");
    tensors_.clear();
    for (const auto& n : f.names()) {
      const RawTensor r = f.load_raw(n);
      tensors_[n] = {
          .st_dtype = r.st_dtype, .shape = r.shape, .bytes = {r.bytes.begin(), r.bytes.end()}};
    }
    config_ = nlohmann::json::parse(io::read_file(src_ + "/config.json"));
  }
  // Writes them (config.json unless `with_config` is false) and loads the model.
  void load(bool with_config = true) {
    safetensors::save_raw((dir_ / "model.safetensors").string(), tensors_);
    fs::remove(dir_ / "config.json");
    if (with_config) io::write_file_atomic((dir_ / "config.json").string(), config_.dump(2));
    const ModelConfig c = ModelConfig::load(src_);
    Weights::load(dir_.string(), Decoder::param_specs(c));
  }
  fs::path dir_;
  std::string src_;
  std::map<std::string, RawEntry> tensors_;
  nlohmann::json config_;
};

const std::string kFp8W = "model.layers.1.self_attn.q_b_proj.weight";
const std::string kInt4W = "model.layers.1.mlp.experts.3.down_proj.weight";

TEST_F(QuantBroken, IntactCopyLoads) {
  read("deepseek_v3_fp8_tiny");
  EXPECT_NO_THROW(load());
  read("deepseek_v3_int4_tiny");
  EXPECT_NO_THROW(load());
}

TEST_F(QuantBroken, Fp8MissingScale) {
  read("deepseek_v3_fp8_tiny");
  tensors_.erase(kFp8W + "_scale_inv");
  EXPECT_ERROR_HAS(load(), kFp8W.c_str(), "F8_E4M3 without", "_scale_inv");
}

TEST_F(QuantBroken, Fp8WrongScaleShape) {
  read("deepseek_v3_fp8_tiny");
  RawEntry& s = tensors_[kFp8W + "_scale_inv"];  // [3, 1] for [48, 32] in [16, 32] blocks
  ASSERT_EQ(s.shape, Shape({3, 1}));
  s.shape = {1, 3};
  const std::string scale = kFp8W + "_scale_inv";
  EXPECT_ERROR_HAS(load(), scale.c_str(), "has shape [1, 3], expected [3, 1]");
  s.shape = {3, 1};
  config_["quantization_config"]["weight_block_size"] = {16, 16};  // the grid would be [3, 2]
  EXPECT_ERROR_HAS(load(), "_scale_inv (fp8 block [16, 16]", "has shape [");
}

TEST_F(QuantBroken, Fp8WithoutConfigReadsTheBlockOffTheGrid) {
  read("deepseek_v3_fp8_tiny");
  // The 40-row kv_a_proj_with_mqa has a ceil grid [3, 2]: its block cannot be inferred.
  EXPECT_ERROR_HAS(load(false), "kv_a_proj_with_mqa.weight", "cannot be read off a [3, 2]");
}

TEST_F(QuantBroken, UnsupportedMethodsAndSchemes) {
  read("deepseek_v3_fp8_tiny");
  config_["quantization_config"] = {{"quant_method", "awq"}};
  EXPECT_ERROR_HAS(load(), "_scale_inv", "quant_method 'awq'");

  read("deepseek_v3_int4_tiny");
  config_["quantization_config"]["config_groups"]["group_0"]["weights"]["num_bits"] = 3;
  EXPECT_ERROR_HAS(load(), "model.layers.", ".weight", "int3 symmetric group 32",
                   "num_bits 3 is not supported");
  read("deepseek_v3_int4_tiny");
  config_["quantization_config"]["format"] = "nvfp4-pack-quantized";
  EXPECT_ERROR_HAS(load(), "format 'nvfp4-pack-quantized' is not supported");
  read("deepseek_v3_int4_tiny");
  config_["quantization_config"]["config_groups"]["group_0"]["weights"]["symmetric"] = false;
  EXPECT_ERROR_HAS(load(), "asymmetric", "lacks", "_zero_point");
  read("deepseek_v3_int4_tiny");
  EXPECT_ERROR_HAS(load(false), "_packed", "has no quantization_config");
}

TEST_F(QuantBroken, CompressedMissingOrMisshapedParts) {
  read("deepseek_v3_int4_tiny");
  tensors_.erase(kInt4W + "_scale");
  EXPECT_ERROR_HAS(load(), kInt4W.c_str(), "lacks", "_scale");
  read("deepseek_v3_int4_tiny");
  RawEntry& s = tensors_[kInt4W + "_scale"];  // [64, 1] bf16 for [64, 32] in groups of 32
  ASSERT_EQ(s.shape, Shape({64, 1}));
  s.shape = {32, 2};
  const std::string scale = kInt4W + "_scale";
  EXPECT_ERROR_HAS(load(), scale.c_str(), "has shape [32, 2], expected [64, 1]");
  read("deepseek_v3_int4_tiny");
  tensors_.erase(kInt4W + "_shape");
  EXPECT_ERROR_HAS(load(), "lacks", "_shape");
  read("deepseek_v3_int4_tiny");
  // A weight_shape that disagrees with the spec'd shape.
  std::vector<int64_t> bad = {64, 24};
  tensors_[kInt4W + "_shape"].bytes = raw_bytes(bad);
  EXPECT_ERROR_HAS(load(), kInt4W.c_str(), "expected [64, 3]");
}

}  // namespace
}  // namespace myriad::model::quant
