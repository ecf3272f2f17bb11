// Raw tensors of any safetensors dtype (the quantized checkpoints' F8_E4M3, U8, I32, ...):
// load_raw, st_dtype_size and the raw writers, checked against files written by the official
// `safetensors` package (tests/fixtures/quant, tools/reference/quant_fixtures.py).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>

#include "core/error.h"
#include "io/safetensors.h"

namespace myriad::safetensors {
namespace {

namespace fs = std::filesystem;

std::string quant_fixture(const std::string& f) {
  return std::string(MYRIAD_SOURCE_DIR) + "/tests/fixtures/quant/" + f;
}

std::vector<uint8_t> bytes_of(std::span<const uint8_t> s) {
  return {s.begin(), s.end()};
}

TEST(SafetensorsQuant, DTypeSizes) {
  EXPECT_EQ(st_dtype_size("F8_E4M3"), 1u);
  EXPECT_EQ(st_dtype_size("F8_E5M2"), 1u);
  EXPECT_EQ(st_dtype_size("F8_E8M0"), 1u);
  EXPECT_EQ(st_dtype_size("I8"), 1u);
  EXPECT_EQ(st_dtype_size("U16"), 2u);
  EXPECT_EQ(st_dtype_size("BF16"), 2u);
  EXPECT_EQ(st_dtype_size("I32"), 4u);
  EXPECT_EQ(st_dtype_size("I64"), 8u);
  EXPECT_EQ(st_dtype_size("F4"), 0u);
  EXPECT_EQ(st_dtype_size(""), 0u);
}

// The package's file: every dtype reads raw, bit for bit, and load() keeps refusing the ones
// Myriad has no DType for.
TEST(SafetensorsQuant, ReadsPackageWrittenRawTensors) {
  SafetensorsFile f = SafetensorsFile::open(quant_fixture("tensors.safetensors"));
  RawTensor e4m3 = f.load_raw("codes.f8_e4m3");
  EXPECT_EQ(e4m3.st_dtype, "F8_E4M3");
  EXPECT_EQ(e4m3.shape, Shape{256});
  ASSERT_EQ(e4m3.bytes.size(), 256u);
  for (int i = 0; i < 256; ++i) ASSERT_EQ(e4m3.bytes[i], i);
  EXPECT_EQ(f.load_raw("codes.f8_e5m2").st_dtype, "F8_E5M2");
  EXPECT_FALSE(f.info("codes.f8_e4m3").supported);
  EXPECT_THROW(f.load("codes.f8_e4m3"), Error);

  RawTensor packed = f.load_raw("int4g.weight_packed");
  EXPECT_EQ(packed.st_dtype, "I32");
  EXPECT_EQ(packed.shape, Shape({6, 8}));
  Tensor t = f.load("int4g.weight_packed");  // I32 loads as a Tensor too: same bytes
  ASSERT_EQ(t.nbytes(), packed.bytes.size());
  EXPECT_EQ(std::memcmp(t.data_ptr(), packed.bytes.data(), t.nbytes()), 0);
  EXPECT_EQ(f.load_raw("mxfp4.weight_scale").st_dtype, "U8");
  EXPECT_EQ(f.load_raw("int4g.weight_scale").st_dtype, "BF16");
  EXPECT_EQ(f.load_raw("int4g.weight_shape").st_dtype, "I64");

  Checkpoint ck = Checkpoint::open(quant_fixture("deepseek_v3_fp8_tiny"));
  const std::string w = "model.layers.0.self_attn.kv_a_proj_with_mqa.weight";
  RawTensor r = ck.load_raw(w);
  EXPECT_EQ(r.st_dtype, "F8_E4M3");
  EXPECT_EQ(r.shape, Shape({40, 64}));
  EXPECT_EQ(r.bytes.size(), 40u * 64u);
  EXPECT_EQ(ck.load_raw(w + "_scale_inv").shape, Shape({3, 2}));
  EXPECT_THROW(ck.load_raw("no.such.tensor"), Error);
}

TEST(SafetensorsQuant, RawWriterRoundTrip) {
  std::map<std::string, RawEntry> m;
  m["a.f8"] = {.st_dtype = "F8_E4M3", .shape = {2, 3}, .bytes = {0, 1, 0x7e, 0x7f, 0x80, 0xfe}};
  m["b.i8"] = {.st_dtype = "I8", .shape = {3}, .bytes = {0x80, 0x7f, 0xff}};
  m["c.u16"] = {.st_dtype = "U16", .shape = {1, 2}, .bytes = {1, 2, 3, 4}};
  m["d.bf16"] = {.st_dtype = "BF16", .shape = {2}, .bytes = {0x80, 0x3f, 0x00, 0xc0}};
  m["e.empty"] = {.st_dtype = "F8_E8M0", .shape = {0, 4}, .bytes = {}};
  const std::vector<uint8_t> image = serialize_raw(m, {{"format", "pt"}});
  SafetensorsFile f = SafetensorsFile::from_bytes(image, "raw");
  EXPECT_EQ(f.metadata().at("format"), "pt");
  for (const auto& [name, e] : m) {
    SCOPED_TRACE(name);
    RawTensor r = f.load_raw(name);
    EXPECT_EQ(r.st_dtype, e.st_dtype);
    EXPECT_EQ(r.shape, e.shape);
    EXPECT_EQ(bytes_of(r.bytes), e.bytes);
  }
  // A raw BF16 tensor is an ordinary one: 1.0, -2.0.
  EXPECT_EQ(f.load("d.bf16").to_doubles(), (std::vector<double>{1.0, -2.0}));

  const fs::path dir =
      fs::temp_directory_path() / ("myriad_test_raw_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  save_raw((dir / "model.safetensors").string(), m);
  Checkpoint ck = Checkpoint::open(dir.string());
  EXPECT_EQ(ck.names().size(), m.size());
  EXPECT_EQ(bytes_of(ck.load_raw("a.f8").bytes), m["a.f8"].bytes);
  fs::remove_all(dir);
}

TEST(SafetensorsQuant, RawWriterRejectsBadEntries) {
  std::map<std::string, RawEntry> m;
  m["x"] = {.st_dtype = "I32", .shape = {2}, .bytes = {1, 2, 3}};
  try {
    serialize_raw(m);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs 8 bytes, given 3"), std::string::npos) << e.what();
  }
  m["x"] = {.st_dtype = "F4", .shape = {1}, .bytes = {0}};
  EXPECT_THROW(serialize_raw(m), Error);
  m["x"] = {.st_dtype = "U8", .shape = {-1}, .bytes = {}};
  EXPECT_THROW(serialize_raw(m), Error);
}

}  // namespace
}  // namespace myriad::safetensors
