// safetensors: round trips, the file layout, the official package's output
// (tests/fixtures/io/reference.safetensors, written by tools/reference/safetensors_fixture.py),
// malformed input, and sharded checkpoints.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/dtype.h"
#include "io/file.h"
#include "io/safetensors.h"
#include "model/config.h"

namespace myriad {
namespace {

namespace fs = std::filesystem;
namespace st = safetensors;

template <class F>
void expect_error(F&& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "expected an error mentioning " << parts.at(0);
  } catch (const Error& e) {
    for (const auto& p : parts)
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what() << "\n  lacks: " << p;
  }
}

// A fresh directory per test under the gtest temp dir.
fs::path temp_dir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  fs::path d = fs::path(::testing::TempDir()) / "myriad_test_io" /
               (std::string(info->test_suite_name()) + "." + info->name());
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::vector<uint8_t> bytes_of(const Tensor& t) {
  Tensor c = t.contiguous();
  const auto* p = static_cast<const uint8_t*>(c.data_ptr());
  return {p, p + c.nbytes()};
}

void write_bytes(const fs::path& p, const std::vector<uint8_t>& b) {
  std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(b.data()), b.size());
}

// A file image from a header text and a data section, with an optional forged length field.
std::vector<uint8_t> image(const std::string& header, size_t data_bytes,
                           std::optional<uint64_t> forged_len = std::nullopt) {
  uint64_t n = forged_len.value_or(header.size());
  std::vector<uint8_t> out(8 + header.size() + data_bytes, 0x5a);
  std::memcpy(out.data(), &n, 8);
  std::memcpy(out.data() + 8, header.data(), header.size());
  return out;
}

st::SafetensorsFile parse(const std::vector<uint8_t>& b,
                          const std::string& name = "t.safetensors") {
  return st::SafetensorsFile::from_bytes(b, name);
}

std::map<std::string, Tensor> sample_tensors() {
  std::map<std::string, Tensor> m;
  m["a.f32"] = Tensor::from_doubles(std::vector<double>{1.5, -2, 3.25, 0, 7, -8}, {2, 3});
  m["b.f64"] = Tensor::from_doubles(std::vector<double>{0.1, -1e300}, {2}, DType::F64);
  m["c.bf16"] = Tensor::from_doubles(std::vector<double>{1, -0.5, 3.140625}, {3}, DType::BF16);
  m["d.f16"] = Tensor::from_doubles(std::vector<double>{65504, -1e-3}, {1, 2}, DType::F16);
  m["e.i32"] = Tensor::from_ints(std::vector<int64_t>{-5, 1 << 30}, {2}, DType::I32);
  m["f.i64"] = Tensor::from_ints(std::vector<int64_t>{int64_t(1) << 50, -1}, {2, 1});
  m["g.u8"] = Tensor::from_ints(std::vector<int64_t>{0, 255, 7}, {3}, DType::U8);
  m["h.empty"] = Tensor::empty({0, 5});
  m["i.scalar"] = Tensor::from_doubles(std::vector<double>{42}, {});
  return m;
}

void expect_same_tensor(const Tensor& a, const Tensor& b, const std::string& name) {
  EXPECT_EQ(a.dtype(), b.dtype()) << name;
  EXPECT_EQ(a.shape(), b.shape()) << name;
  EXPECT_EQ(bytes_of(a), bytes_of(b)) << name;
}

// ---- Round trips and layout ----

TEST(Safetensors, RoundTripEveryDType) {
  fs::path p = temp_dir() / "m.safetensors";
  auto tensors = sample_tensors();
  st::Metadata md{{"format", "pt"}, {"note", "hello \"world\""}};
  st::save(p.string(), tensors, md);
  auto f = st::open(p.string());
  EXPECT_EQ(f.metadata(), md);
  std::vector<std::string> want;
  for (const auto& kv : tensors) want.push_back(kv.first);
  EXPECT_EQ(f.names(), want);
  for (const auto& [name, t] : tensors) {
    EXPECT_EQ(f.info(name).dtype, t.dtype()) << name;
    EXPECT_EQ(f.info(name).shape, t.shape()) << name;
    expect_same_tensor(f.load(name), t, name);
  }
  EXPECT_EQ(f.info("c.bf16").st_dtype, "BF16");
  EXPECT_EQ(f.load("i.scalar").item(), 42.0);
}

TEST(Safetensors, HeaderIsPaddedAndTensorsFollowInNameOrder) {
  auto tensors = sample_tensors();
  std::vector<uint8_t> img = st::serialize(tensors, {{"k", "v"}});
  uint64_t n = 0;
  std::memcpy(&n, img.data(), 8);
  EXPECT_EQ(n % 8, 0u);
  std::string header(reinterpret_cast<const char*>(img.data()) + 8, n);
  EXPECT_EQ(header.front(), '{');
  EXPECT_EQ(header.find("\"__metadata__\""), 1u);  // metadata first, then the tensors
  size_t last = header.find_last_not_of(' ');
  EXPECT_EQ(header[last], '}');
  EXPECT_LT(n - 1 - last, 8u);  // at most 7 spaces of padding
  uint64_t total = 0, expect_begin = 0;
  auto f = parse(img);
  for (const auto& [name, t] : tensors) {  // sorted by name, packed back to back
    EXPECT_EQ(f.info(name).begin, expect_begin) << name;
    expect_begin += t.nbytes();
    total += t.nbytes();
  }
  EXPECT_EQ(img.size(), 8 + n + total);
  // The bytes of each tensor are exactly its little-endian contents.
  auto raw = f.raw("e.i32");
  int32_t v[2];
  std::memcpy(v, raw.data(), 8);
  EXPECT_EQ(v[0], -5);
  EXPECT_EQ(v[1], 1 << 30);
}

TEST(Safetensors, NonContiguousTensorIsSavedContiguous) {
  Tensor t = Tensor::from_doubles(std::vector<double>{1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor tt = t.view_as_strided({3, 2}, {1, 3}, 0);  // the transpose
  auto f = parse(st::serialize({{"t", tt}}));
  EXPECT_EQ(f.load("t").to_doubles(), (std::vector<double>{1, 4, 2, 5, 3, 6}));
}

TEST(Safetensors, SaveIsAtomicAndOverwrites) {
  fs::path d = temp_dir();
  fs::path p = d / "m.safetensors";
  st::save(p.string(), {{"x", Tensor::ones({3})}});
  st::save(p.string(), {{"y", Tensor::zeros({2})}});
  EXPECT_EQ(st::open(p.string()).names(), std::vector<std::string>{"y"});
  size_t files = 0;
  for (const auto& e : fs::directory_iterator(d)) files += e.is_regular_file();
  EXPECT_EQ(files, 1u);  // no temporary left behind
  expect_error([&] { st::save((d / "missing" / "m.safetensors").string(), {}); },
               {"missing/m.safetensors", "cannot create temporary file"});
  expect_error([&] { st::save(p.string(), {{"z", Tensor()}}); }, {"'z'", "undefined"});
  std::map<std::string, Tensor> reserved{{"__metadata__", Tensor::ones({1})}};
  expect_error([&] { st::save(p.string(), reserved); }, {"'__metadata__' is not a tensor name"});
  std::map<std::string, Tensor> bad_utf8{{"bad\xff", Tensor::ones({1})}};
  expect_error([&] { st::save(p.string(), bad_utf8); }, {"cannot write the header", "UTF-8"});
  EXPECT_EQ(st::open(p.string()).names(), std::vector<std::string>{"y"});  // left intact
}

TEST(Safetensors, EmptyFileAndMetadataOnly) {
  auto f = parse(st::serialize({}, {{"a", "b"}}));
  EXPECT_TRUE(f.names().empty());
  EXPECT_EQ(f.metadata().at("a"), "b");
  auto g = parse(st::serialize({}));
  EXPECT_TRUE(g.names().empty());
}

TEST(Safetensors, BoolReadsAsU8AndF8IsListedButNotLoadable) {
  std::string h = R"({"flags":{"dtype":"BOOL","shape":[3],"data_offsets":[0,3]},)"
                  R"("w8":{"dtype":"F8_E4M3","shape":[2,2],"data_offsets":[3,7]}})";
  auto img = image(h, 7);
  img[8 + h.size()] = 1;
  auto f = parse(img, "fp8.safetensors");
  EXPECT_EQ(f.info("flags").dtype, DType::U8);
  EXPECT_EQ(f.load("flags").to_ints(), (std::vector<int64_t>{1, 0x5a, 0x5a}));
  EXPECT_FALSE(f.info("w8").supported);
  EXPECT_EQ(f.info("w8").st_dtype, "F8_E4M3");
  EXPECT_EQ(f.raw("w8").size(), 4u);
  expect_error([&] { f.load("w8"); }, {"fp8.safetensors", "'w8'", "F8_E4M3", "cannot load"});
  expect_error([&] { f.load("nope"); }, {"fp8.safetensors", "no tensor 'nope'"});
}

// ---- The official package's output ----

const std::string kFixture =
    std::string(MYRIAD_SOURCE_DIR) + "/tests/fixtures/io/reference.safetensors";

TEST(IoFixture, ReadsFileWrittenByOfficialSafetensors) {
  auto f = st::open(kFixture);
  EXPECT_EQ(f.names(),
            (std::vector<std::string>{"empty.f32", "ids.i64", "weight.bf16", "weight.f32"}));
  EXPECT_EQ(f.metadata(), (st::Metadata{{"format", "pt"}, {"source", "myriad fixture"}}));
  Tensor w = f.load("weight.f32");
  EXPECT_EQ(w.dtype(), DType::F32);
  EXPECT_EQ(w.shape(), (Shape{2, 3}));
  EXPECT_EQ(w.to_floats(), (std::vector<float>{0.5f, -1.25f, 3.0f, 1e-3f, -0.0f, 65504.0f}));
  EXPECT_TRUE(std::signbit(w.to_floats()[4]));
  Tensor b = f.load("weight.bf16");
  EXPECT_EQ(b.dtype(), DType::BF16);
  EXPECT_EQ(b.to_doubles(), (std::vector<double>{1.0, -2.5, 0.0078125, 3.140625}));
  Tensor i = f.load("ids.i64");
  EXPECT_EQ(i.to_ints(), (std::vector<int64_t>{0, -7, (int64_t(1) << 40) + 3}));
  EXPECT_EQ(f.load("empty.f32").shape(), (Shape{0, 4}));
  // Our writer reproduces the same tensors, and reading that back matches again.
  std::map<std::string, Tensor> all;
  for (const auto& n : f.names()) all[n] = f.load(n);
  auto g = parse(st::serialize(all, f.metadata()));
  for (const auto& n : f.names()) expect_same_tensor(g.load(n), all[n], n);
}

// Whatever tools/reference/make_fixtures.py saved with transformers' save_pretrained
// (tests/fixtures/models/<name>/) reads back: config.json validates and every tensor loads.
TEST(IoFixture, ReadsTransformersCheckpoints) {
  fs::path root = fs::path(MYRIAD_SOURCE_DIR) / "tests/fixtures/models";
  if (!fs::exists(root)) GTEST_SKIP() << "no model fixtures";
  for (const auto& e : fs::directory_iterator(root)) {
    if (!fs::exists(e.path() / "model.safetensors")) continue;
    SCOPED_TRACE(e.path().string());
    auto cfg = model::ModelConfig::load(e.path().string());
    auto c = st::Checkpoint::open(e.path().string());
    ASSERT_FALSE(c.names().empty());
    // A multimodal (kimi_k25) checkpoint holds the text model under language_model.
    const std::string emb = c.contains("model.embed_tokens.weight")
                                ? "model.embed_tokens.weight"
                                : "language_model.model.embed_tokens.weight";
    EXPECT_TRUE(c.contains(emb));
    EXPECT_EQ(c.info(emb).shape, (Shape{cfg.vocab_size, cfg.hidden_size}));
    for (const auto& n : c.names()) {
      Tensor t = c.load(n);
      EXPECT_EQ(t.shape(), c.info(n).shape) << n;
    }
  }
}

// The file tools/reference/safetensors_fixture.py --verify checks; set MYRIAD_IO_EXPORT=path to
// keep a copy for it.
TEST(IoCrossCheck, WritesFileForPython) {
  std::map<std::string, Tensor> m;
  m["a"] = Tensor::from_doubles(std::vector<double>{0, 0.25, 0.5, 0.75, 1, 1.25}, {2, 3});
  m["b"] = Tensor::from_doubles(std::vector<double>{-1.5, 0.25, 3.0}, {3}, DType::BF16);
  m["c"] = Tensor::from_ints(std::vector<int64_t>{1, -2, int64_t(1) << 40}, {3});
  st::Metadata md{{"format", "pt"}, {"writer", "myriad"}};
  fs::path p = temp_dir() / "cpp_written.safetensors";
  st::save(p.string(), m, md);
  if (const char* out = std::getenv("MYRIAD_IO_EXPORT")) st::save(out, m, md);
  auto f = st::open(p.string());
  for (const auto& [n, t] : m) expect_same_tensor(f.load(n), t, n);
}

// ---- Malformed input ----

TEST(SafetensorsMalformed, TruncatedFile) {
  auto img = st::serialize({{"lm_head.weight", Tensor::ones({4, 5})}});
  img.pop_back();
  expect_error([&] { parse(img, "model.safetensors"); },
               {"model.safetensors", "tensor 'lm_head.weight'", "data_offsets [0, 80]",
                "outside the 79-byte data section"});
  expect_error(
      [&] {
        parse({1, 2, 3, 4, 5}, "short.safetensors");
      },
      {"short.safetensors", "5 bytes", "too short"});
  expect_error([&] { parse({}, "empty.safetensors"); }, {"empty.safetensors", "0 bytes"});
}

TEST(SafetensorsMalformed, OffsetsOutsideDataSection) {
  std::string h = R"({"lm_head.weight":{"dtype":"F32","shape":[20],"data_offsets":[0,99]}})";
  expect_error([&] { parse(image(h, 80), "model.safetensors"); },
               {"model.safetensors: tensor 'lm_head.weight' data_offsets [0, 99] lie outside the "
                "80-byte data section"});
}

TEST(SafetensorsMalformed, HeaderLengthBeyondFileOrLimit) {
  std::string h = R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})";
  expect_error([&] { parse(image(h, 1, 1000)); },
               {"t.safetensors", "header length 1000", "runs past the end"});
  expect_error([&] { parse(image(h, 1, uint64_t(1) << 40)); },
               {"header length 1099511627776", "exceeds the limit"});
  expect_error([&] { parse(image(h, 1, ~uint64_t(0))); }, {"exceeds the limit"});
}

TEST(SafetensorsMalformed, BadJson) {
  expect_error([&] { parse(image(R"({"a": {"dtype": "F32",)", 0)); },
               {"t.safetensors", "header is not valid JSON"});
  expect_error([&] { parse(image("[1, 2]", 0)); }, {"does not start with '{'"});
  expect_error([&] { parse(image("", 0)); }, {"does not start with '{'"});
  expect_error([&] { parse(image("{} x", 0)); }, {"not valid JSON"});
  std::string deep = "{\"a\":" + std::string(200, '[') + std::string(200, ']') + "}";
  expect_error([&] { parse(image(deep, 0)); }, {"nests deeper than 64"});
}

TEST(SafetensorsMalformed, EntryStructure) {
  auto one = [](const std::string& entry) { return image("{\"w\":" + entry + "}", 16); };
  expect_error([&] { parse(one("3")); }, {"tensor 'w'", "not an object"});
  expect_error([&] { parse(one(R"({"shape":[1],"data_offsets":[0,4]})")); },
               {"tensor 'w' has a missing or non-string dtype"});
  expect_error([&] { parse(one(R"({"dtype":"F32","data_offsets":[0,4]})")); },
               {"tensor 'w' has a missing or non-array shape"});
  expect_error([&] { parse(one(R"({"dtype":"F32","shape":[1.5],"data_offsets":[0,4]})")); },
               {"tensor 'w'", "shape entry 1.5 is not an integer"});
  expect_error([&] { parse(one(R"({"dtype":"F32","shape":[1],"data_offsets":[0]})")); },
               {"tensor 'w'", "data_offsets must be an array of two integers"});
  expect_error([&] { parse(one(R"({"dtype":"F32","shape":[1],"data_offsets":[-4,0]})")); },
               {"tensor 'w'", "not two non-negative integers"});
  expect_error([&] { parse(one(R"({"dtype":"F32","shape":[1],"data_offsets":[8,4]})")); },
               {"tensor 'w'", "data_offsets [8, 4] end before they begin"});
  expect_error([&] { parse(image(R"({"__metadata__":{"a":1}})", 0)); },
               {"__metadata__ value for 'a' is 1, not a string"});
  expect_error([&] { parse(image(R"({"__metadata__":[]})", 0)); }, {"__metadata__ is an array"});
}

TEST(SafetensorsMalformed, UnknownDType) {
  std::string h = R"({"w":{"dtype":"F31","shape":[1],"data_offsets":[0,4]}})";
  expect_error([&] { parse(image(h, 4)); }, {"t.safetensors", "tensor 'w'", "unknown dtype 'F31'"});
}

TEST(SafetensorsMalformed, ShapeDoesNotMatchByteLength) {
  std::string h = R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}})";
  expect_error([&] { parse(image(h, 24)); },
               {"tensor 'w'", "shape [2, 3] of F32 needs 24 bytes", "span 20"});
}

TEST(SafetensorsMalformed, NegativeDimsAndOverflow) {
  std::string h = R"({"w":{"dtype":"F32","shape":[2,-3],"data_offsets":[0,0]}})";
  expect_error([&] { parse(image(h, 0)); }, {"tensor 'w'", "negative dimension -3"});
  std::string big = R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})";
  expect_error([&] { parse(image(big, 0)); }, {"tensor 'w'", "overflows 64 bits"});
  // A zero dimension makes 0 bytes, but the other dims would still overflow the strides.
  std::string zero =
      R"({"w":{"dtype":"F32","shape":[0,4294967296,4294967296],"data_offsets":[0,0]}})";
  expect_error([&] { parse(image(zero, 0)); }, {"overflows 64 bits"});
  std::string huge = R"({"w":{"dtype":"F32","shape":[18446744073709551615],"data_offsets":[0,0]}})";
  expect_error([&] { parse(image(huge, 0)); }, {"is not an integer"});
}

TEST(SafetensorsMalformed, OverlappingTensors) {
  std::string h = R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                  R"("b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]},)"
                  R"("z":{"dtype":"F32","shape":[0],"data_offsets":[4,4]}})";
  expect_error([&] { parse(image(h, 16)); },
               {"t.safetensors", "'a' [0, 16]", "'b' [8, 16]", "overlap"});
  // Empty tensors may sit anywhere; gaps are allowed.
  std::string ok = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                   R"("z":{"dtype":"F32","shape":[0],"data_offsets":[4,4]},)"
                   R"("b":{"dtype":"F32","shape":[1],"data_offsets":[12,16]}})";
  EXPECT_EQ(parse(image(ok, 16)).names().size(), 3u);
}

TEST(SafetensorsMalformed, FileSystemErrors) {
  fs::path d = temp_dir();
  expect_error([&] { st::open((d / "nope.safetensors").string()); },
               {"nope.safetensors", "cannot open"});
  expect_error([&] { st::open(d.string()); }, {"not a regular file"});
  write_bytes(d / "empty.safetensors", {});
  expect_error([&] { st::open((d / "empty.safetensors").string()); }, {"0 bytes", "too short"});
}

// ---- Checkpoints (single file and shards) ----

TEST(Checkpoint, SingleFileDirectory) {
  fs::path d = temp_dir();
  auto tensors = sample_tensors();
  auto files = st::save_sharded(d.string(), tensors, uint64_t(1) << 30, {{"format", "pt"}});
  EXPECT_EQ(files, std::vector<std::string>{"model.safetensors"});
  auto c = st::Checkpoint::open(d.string());
  EXPECT_EQ(c.names().size(), tensors.size());
  EXPECT_EQ(c.metadata().at("format"), "pt");
  for (const auto& [n, t] : tensors) expect_same_tensor(c.load(n), t, n);
  EXPECT_EQ(c.file_of("a.f32"), "model.safetensors");
  expect_error([&] { c.load("missing"); }, {"no tensor 'missing'"});
  // Opening the file itself works too.
  EXPECT_EQ(st::Checkpoint::open((d / "model.safetensors").string()).names(), c.names());
}

TEST(Checkpoint, ShardedRoundTripOpensShardsLazily) {
  fs::path d = temp_dir();
  std::map<std::string, Tensor> tensors;
  for (int i = 0; i < 6; ++i)
    tensors["layer." + std::to_string(i)] = Tensor::full({10}, i);  // 40 bytes each
  tensors["big"] = Tensor::zeros({100});                            // 400 bytes > limit
  auto files = st::save_sharded(d.string(), tensors, 100, {{"format", "pt"}});
  // "big" gets a shard of its own; layers pack two per 100-byte shard.
  ASSERT_EQ(files.size(), 5u);
  EXPECT_EQ(files[0], "model-00001-of-00004.safetensors");
  EXPECT_EQ(files.back(), "model.safetensors.index.json");
  EXPECT_FALSE(fs::exists(d / "model.safetensors"));
  auto c = st::Checkpoint::open(d.string());
  EXPECT_EQ(c.metadata().at("total_size"), "640");
  EXPECT_EQ(c.metadata().at("format"), "pt");
  EXPECT_EQ(c.names().size(), tensors.size());
  EXPECT_EQ(c.num_shards_opened(), 0u);
  EXPECT_EQ(c.load("layer.3").to_doubles(), std::vector<double>(10, 3.0));
  EXPECT_EQ(c.num_shards_opened(), 1u);
  EXPECT_EQ(c.info("layer.2").shape, Shape{10});  // same shard as layer.3
  EXPECT_EQ(c.num_shards_opened(), 1u);
  for (const auto& [n, t] : tensors) expect_same_tensor(c.load(n), t, n);
  EXPECT_EQ(c.num_shards_opened(), 4u);
  EXPECT_EQ(c.file_of("big"), "model-00001-of-00004.safetensors");
  // Saving again as one file removes the shards and the index.
  st::save_sharded(d.string(), tensors, uint64_t(1) << 20);
  size_t n = 0;
  for (const auto& e : fs::directory_iterator(d)) n += e.is_regular_file();
  EXPECT_EQ(n, 1u);
  EXPECT_EQ(st::Checkpoint::open(d.string()).names().size(), tensors.size());
}

TEST(Checkpoint, IndexErrors) {
  fs::path d = temp_dir();
  st::save((d / "shard-a.safetensors").string(), {{"x", Tensor::ones({2})}});
  auto write_index = [&](const std::string& text) {
    io::write_file_atomic((d / "model.safetensors.index.json").string(), text);
  };
  write_index(R"({"weight_map": {"x": "shard-a.safetensors", "y": "shard-a.safetensors",
                                 "z": "shard-b.safetensors"}})");
  auto c = st::Checkpoint::open(d.string());
  EXPECT_EQ(c.load("x").to_doubles(), (std::vector<double>{1, 1}));
  expect_error([&] { c.load("y"); }, {"model.safetensors.index.json",
                                      "maps 'y' to shard "
                                      "'shard-a.safetensors', which has no tensor 'y'"});
  expect_error([&] { c.info("z"); }, {"maps 'z' to shard 'shard-b.safetensors'", "does not exist"});
  // The index path itself can be opened.
  EXPECT_TRUE(st::Checkpoint::open((d / "model.safetensors.index.json").string()).contains("z"));
  write_index(R"({"metadata": {}})");
  expect_error([&] { st::Checkpoint::open(d.string()); }, {"missing or non-object weight_map"});
  write_index(R"({"weight_map": {"x": "../outside.safetensors"}})");
  expect_error([&] { st::Checkpoint::open(d.string()); },
               {"'../outside.safetensors'", "not a file inside the checkpoint directory"});
  write_index(R"({"weight_map": {"x": 3}})");
  expect_error([&] { st::Checkpoint::open(d.string()); }, {"entry for 'x' is 3"});
  write_index(R"({"weight_map": )");
  expect_error([&] { st::Checkpoint::open(d.string()); }, {"not valid JSON"});
  fs::remove(d / "model.safetensors.index.json");
  expect_error([&] { st::Checkpoint::open(d.string()); },
               {"neither model.safetensors nor model.safetensors.index.json"});
}

}  // namespace
}  // namespace myriad
