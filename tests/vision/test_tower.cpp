// The kimi_k25 vision tower and projector (src/vision/tower.h): parity with transformers 5.24 on
// tests/fixtures/models/kimi_k25_tiny (tools/reference/kimi_k25_fixtures.py): two images of
// different sizes packed in one call and each alone, a two-frame video chunk, the hub's tensor
// spellings; an f64 finite-difference check of encode; the kimi_k25 / kimi_k3 config fields and
// their errors; and the whole model's logits and greedy tokens with the images spliced in.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "core/autograd.h"
#include "core/error.h"
#include "core/random.h"
#include "io/file.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "model/decoder.h"
#include "ops/ops.h"
#include "tests/model/model_test_util.h"
#include "vision/tower.h"

namespace myriad::vision {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using model::ModelConfig;
using model::Weights;

using model::max_abs_diff;
const std::string kDir = model::fixture_dir("kimi_k25_tiny");

std::vector<Grid> grids_of(const Tensor& thw) {
  const auto v = thw.to_ints();
  std::vector<Grid> g;
  for (size_t i = 0; i + 2 < v.size(); i += 3) g.push_back({v[i], v[i + 1], v[i + 2]});
  return g;
}

fs::path temp_dir(const std::string& name) {
  // Per process: ctest runs the tests of this program in parallel processes.
  fs::path d =
      fs::temp_directory_path() / ("myriad_test_tower_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// The tower and projector tensors of the fixture checkpoint under `rename`'s names, loaded
// through Weights::load (the text model's tensors are left out).
Weights fixture_vision_weights(const ModelConfig& c,
                               const std::map<std::string, std::string>& rename = {}) {
  auto ck = safetensors::Checkpoint::open(kDir + "/model.safetensors");
  std::map<std::string, Tensor> m;
  for (const auto& n : ck.names())
    if (!n.starts_with("language_model.")) m[rename.count(n) ? rename.at(n) : n] = ck.load(n);
  const fs::path dir = temp_dir("weights"), file = dir / "vision.safetensors";
  safetensors::save(file.string(), m);
  Weights w = Weights::load(file.string(), param_specs(*c.vision, c.hidden_size));
  fs::remove_all(dir);
  return w;
}

class Fixture : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    config_ = new ModelConfig(ModelConfig::load(kDir));
    weights_ = new Weights(fixture_vision_weights(*config_));
  }
  static void TearDownTestSuite() {
    delete weights_;
    delete config_;
  }
  void SetUp() override {
    in_ = safetensors::open(kDir + "/inputs.safetensors");
    out_ = safetensors::open(kDir + "/outputs.safetensors");
  }
  const VisionConfig& vc() const { return *config_->vision; }
  static ModelConfig* config_;
  static Weights* weights_;
  safetensors::SafetensorsFile in_, out_;
};
ModelConfig* Fixture::config_ = nullptr;
Weights* Fixture::weights_ = nullptr;

TEST_F(Fixture, PackedImagesMatchTransformers) {
  NoGradGuard ng;
  const std::vector<Grid> grids = grids_of(in_.load("grid_thws"));
  ASSERT_EQ(grids, (std::vector<Grid>{{1, 4, 6}, {1, 4, 4}}));
  VisionTrace trace;
  const Tensor y = encode(vc(), *weights_, in_.load("pixel_values"), grids, &trace);
  const double dt = max_abs_diff(trace.tower_out, out_.load("tower_out"));
  const double dp = max_abs_diff(y, out_.load("projector_out"));
  EXPECT_LE(dt, 1e-4);
  EXPECT_LE(dp, 1e-4);
  std::printf("kimi_k25_tiny packed: tower max err %.3g, projector max err %.3g\n", dt, dp);
}

TEST_F(Fixture, EachImageAloneGivesItsRowsOfThePackedBatch) {
  NoGradGuard ng;
  const std::vector<Grid> grids = grids_of(in_.load("grid_thws"));
  const Tensor pv = in_.load("pixel_values");
  const Tensor packed = encode(vc(), *weights_, pv, grids);
  const Tensor want = out_.load("projector_out");
  int64_t row = 0, tok = 0;
  for (const Grid& g : grids) {
    const int64_t n = g.t * g.h * g.w, m = merged_tokens(vc(), g);
    VisionTrace trace;
    const Tensor alone = encode(vc(), *weights_, ops::slice(pv, 0, row, row + n), {g}, &trace);
    // Not bitwise: an image of up to 16 patches alone takes the few-row GEMM kernel, the packed
    // batch oneDNN (1.1e-6 apart in the sanitizer build, whose kernel has no FMA); rows mixed
    // across images would be off by orders of magnitude more.
    EXPECT_LE(max_abs_diff(alone, ops::slice(packed, 0, tok, tok + m)), 1e-5);
    EXPECT_LE(max_abs_diff(alone, ops::slice(want, 0, tok, tok + m)), 1e-4);
    EXPECT_LE(max_abs_diff(trace.tower_out, ops::slice(out_.load("tower_out"), 0, tok, tok + m)),
              1e-4);
    row += n;
    tok += m;
  }
}

TEST_F(Fixture, VideoChunkMatchesTransformers) {
  NoGradGuard ng;
  const std::vector<Grid> grids = grids_of(in_.load("video_grid_thws"));
  ASSERT_EQ(grids, (std::vector<Grid>{{2, 4, 4}}));
  VisionTrace trace;
  const Tensor y = encode(vc(), *weights_, in_.load("video_pixel_values"), grids, &trace);
  const double dt = max_abs_diff(trace.tower_out, out_.load("video_tower_out"));
  const double dp = max_abs_diff(y, out_.load("video_projector_out"));
  EXPECT_LE(dt, 1e-4);
  EXPECT_LE(dp, 1e-4);
  std::printf("kimi_k25_tiny video chunk: tower max err %.3g, projector max err %.3g\n", dt, dp);
}

TEST_F(Fixture, HubSpellingsLoadAsAliases) {
  const std::map<std::string, std::string> hub = {
      {"vision_tower.encoder.patch_embed.proj.weight", "vision_tower.patch_embed.proj.weight"},
      {"vision_tower.encoder.patch_embed.proj.bias", "vision_tower.patch_embed.proj.bias"},
      {"model.mm_projector.pre_norm.weight", "mm_projector.pre_norm.weight"},
      {"model.mm_projector.pre_norm.bias", "mm_projector.pre_norm.bias"}};
  const Weights w = fixture_vision_weights(*config_, hub);
  for (const auto& [name, t] : weights_->tensors())
    EXPECT_EQ(max_abs_diff(w.get(name), t), 0.0) << name;
}

TEST_F(Fixture, BackwardReachesEveryParameter) {
  Weights w = weights_->to(DType::F32);
  w.requires_grad_(true);
  Tensor pv = in_.load("pixel_values").requires_grad_();
  ops::sum(ops::square(encode(vc(), w, pv, grids_of(in_.load("grid_thws"))))).backward();
  ASSERT_TRUE(pv.grad().defined());
  for (const auto& s : w.specs()) {
    const Tensor g = w.get(s.name).grad();
    ASSERT_TRUE(g.defined()) << s.name;
    double norm = 0;
    for (double v : g.to_doubles()) {
      ASSERT_TRUE(std::isfinite(v)) << s.name;
      norm += v * v;
    }
    EXPECT_GT(norm, 0.0) << s.name;
  }
}

TEST_F(Fixture, BadInputsAreNamed) {
  const Tensor pv = in_.load("pixel_values");
  auto fails = [&](const Tensor& x, const std::vector<Grid>& g, const std::string& part) {
    try {
      encode(vc(), *weights_, x, g);
      ADD_FAILURE() << "no error for " << part;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  fails(pv, {{1, 4, 6}}, "the grids hold 24 patches, but pixel_values has 40 rows");
  fails(pv, {{1, 5, 8}}, "grid of 5 x 8 patches, not a positive multiple of the 2 x 2");
  fails(pv, {{5, 2, 4}}, "t = 5 frames; 1..vision_config.pos_emb_time = 4");
  fails(ops::reshape(pv, {80, -1}), {{1, 4, 6}}, "pixel_values must be [patches, 3·14·14 = 588]");
  fails(pv, {}, "no image grids");
}

// ---- f64 gradient check on a tiny random tower ----

VisionConfig micro() {
  VisionConfig c;
  c.patch_size = 2;
  c.pos_emb_height = c.pos_emb_width = 3;
  c.pos_emb_time = 2;
  c.num_attention_heads = 2;
  c.num_hidden_layers = 1;
  c.hidden_size = 8;
  c.intermediate_size = 12;
  c.rope_theta = 3.0;
  c.validate();
  return c;
}

TEST(Encode, GradcheckF64) {
  const VisionConfig c = micro();
  // Three images and a chunk: a run of three 8-patch sequences (one batched attention call)
  // and a 4-patch one.
  const std::vector<Grid> grids = {{1, 2, 4}, {1, 4, 2}, {2, 2, 2}, {1, 2, 2}};
  Weights w = Weights::init(param_specs(c, 5), 7, 0.5, DType::F64);
  Generator gen(8);
  for (const auto& s : w.specs())  // LayerNorms and biases away from 1 and 0 too
    if (s.init != model::Init::Normal)
      w.set(s.name, ops::add(gen.normal(s.shape, 0.0, 0.3, DType::F64),
                             s.init == model::Init::Ones ? 1.0 : 0.0));
  w.requires_grad_(true);
  Tensor pv = gen.normal({28, c.patch_values()}, 0.0, 1.0, DType::F64).requires_grad_();
  const Tensor seed = gen.normal({2 + 2 + 1 + 1, 5}, 0.0, 1.0, DType::F64);
  auto objective = [&] { return ops::sum(ops::mul(encode(c, w, pv, grids), seed)); };
  objective().backward();
  NoGradGuard ng;
  auto check = [&](const std::string& what, const Tensor& p, int64_t stride) {
    SCOPED_TRACE(what);
    ASSERT_TRUE(p.grad().defined());
    const std::vector<double> grad = p.grad().to_doubles();
    double* data = p.data<double>();
    const double h = 1e-6;
    for (int64_t e = 0; e < p.numel(); e += stride) {
      const double x0 = data[e];
      data[e] = x0 + h;
      const double up = objective().item();
      data[e] = x0 - h;
      const double down = objective().item();
      data[e] = x0;
      const double fd = (up - down) / (2 * h);
      EXPECT_NEAR(grad[e], fd, 1e-6 * std::max(1.0, std::abs(fd))) << "element " << e;
    }
  };
  check("pixel_values", pv, 1);
  check("pos_emb", w.get("vision_tower.patch_embed.pos_emb.weight"), 1);
  for (const char* n :
       {"vision_tower.encoder.patch_embed.proj.weight", "vision_tower.encoder.blocks.0.wqkv.weight",
        "vision_tower.encoder.blocks.0.norm1.bias", "vision_tower.encoder.blocks.0.mlp.fc0.weight",
        "vision_tower.encoder.final_layernorm.weight", "model.mm_projector.pre_norm.weight",
        "mm_projector.proj.0.weight", "mm_projector.proj.2.bias"})
    check(n, w.get(n), 7);
}

TEST(Encode, TinyVisionShapes) {
  // Fashion-MNIST: a 32 × 32 padded image is the 8 × 8 table itself; a 56 × 56 2 × 2 grid of
  // four images resamples it to 14 × 14. Three images of one size share one attention call.
  const VisionConfig c = tiny_vision();
  c.validate();
  const Weights w = Weights::init(param_specs(c, 48), 3);
  const std::vector<Grid> grids = {{1, 8, 8}, {1, 14, 14}, {1, 8, 8}, {1, 8, 8}};
  NoGradGuard ng;
  const Tensor pv = Generator(4).normal({64 + 196 + 128, c.patch_values()}, 0.0, 1.0);
  const Tensor y = encode(c, w, pv, grids);
  EXPECT_EQ(y.shape(), (Shape{16 + 49 + 32, 48}));
  EXPECT_EQ(merged_tokens(c, grids[1]), 49);
  // The last image alone gives the last rows: the batched runs keep images apart.
  const Tensor last = encode(c, w, ops::slice(pv, 0, 64 + 196 + 64, 64 + 196 + 128), {{1, 8, 8}});
  EXPECT_LE(max_abs_diff(last, ops::slice(y, 0, 16 + 49 + 16, 16 + 49 + 32)), 1e-5);
}

// ---- config ----

json fixture_json() {
  return json::parse(io::read_file(kDir + "/config.json", 1 << 20));
}

ModelConfig from(const json& j) {
  return ModelConfig::from_json(j.dump());
}

void expect_error(const json& j, const std::string& part) {
  try {
    from(j).validate();
    ADD_FAILURE() << "no error, wanted: " << part;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

TEST(VisionConfigJson, KimiK25FixtureReadsAndWritesBack) {
  const json j = fixture_json();
  const ModelConfig c = from(j);
  EXPECT_NO_THROW(c.validate());
  EXPECT_EQ(c.model_type, "deepseek_v3");
  ASSERT_TRUE(c.vision.has_value());
  const VisionConfig& v = *c.vision;
  EXPECT_EQ(v.patch_size, 14);
  EXPECT_EQ(v.pos_emb_height, 5);
  EXPECT_EQ(v.pos_emb_time, 4);
  EXPECT_EQ(v.hidden_size, 32);
  EXPECT_EQ(v.rope_theta, 100.0);
  EXPECT_EQ(v.projection_layer_norm_eps, 1e-5);
  EXPECT_EQ(c.media_placeholder_token_id, 299);
  EXPECT_FALSE(c.tie_word_embeddings);
  // The written config is transformers' own, key for key, outside the text model.
  json back = json::parse(c.to_json());
  json want = j;
  back.erase("text_config");
  want.erase("text_config");
  EXPECT_EQ(back, want);
  EXPECT_EQ(ModelConfig::from_json(c.to_json()), c);
}

TEST(VisionConfigJson, HubSpellingsAreAliases) {
  json j = fixture_json();
  json& v = j["vision_config"];
  for (const char* k : {"pos_emb_height", "pos_emb_width", "pos_emb_time"}) {
    v[std::string("init_") + k] = v[k];
    v.erase(k);
  }
  v["vt_hidden_size"] = v["hidden_size"];
  v.erase("hidden_size");
  v["projector_ln_eps"] = j["projection_layer_norm_eps"];
  v["merge_type"] = "sd2_tpool";  // unknown keys are kept
  j.erase("projection_layer_norm_eps");
  j["media_placeholder_token_id"] = j["image_token_id"];
  j.erase("image_token_id");
  j["text_config"]["model_type"] = "kimi_k2";
  const ModelConfig c = from(j), want = from(fixture_json());
  EXPECT_EQ(c.vision->pos_emb_height, 5);
  EXPECT_EQ(c.vision->hidden_size, 32);
  EXPECT_EQ(c.media_placeholder_token_id, 299);
  EXPECT_EQ(c.model_type, "deepseek_v3");
  EXPECT_EQ(c.vision->extra.at("merge_type"), "sd2_tpool");
  VisionConfig same = *c.vision;
  same.extra.erase("merge_type");
  EXPECT_EQ(same, *want.vision);
  EXPECT_EQ(ModelConfig::from_json(c.to_json()), c);
}

TEST(VisionConfigJson, K3StyleWrapperAndPresetRoundTrip) {
  // Myriad's K3-style variant: a kimi_k3 wrapper around the KDA/MLA hybrid, with vision_config.
  ModelConfig c = model::tiny();
  c.vision = tiny_vision();
  c.media_placeholder_token_id = 7;
  c.validate();
  const json out = json::parse(c.to_json());
  EXPECT_EQ(out.at("model_type"), "kimi_k3");
  EXPECT_EQ(out.at("media_placeholder_token_id"), 7);
  EXPECT_EQ(out.at("vision_config").at("patch_size"), 4);
  EXPECT_EQ(out.at("text_config").at("model_type"), "kimi_linear");
  const ModelConfig back = ModelConfig::from_json(c.to_json());
  EXPECT_EQ(*back.vision, tiny_vision());
  EXPECT_EQ(back.media_placeholder_token_id, 7);
  EXPECT_EQ(ModelConfig::from_json(back.to_json()), back);
  ModelConfig text_only = back;
  text_only.vision.reset();
  text_only.media_placeholder_token_id.reset();
  text_only.wrapper_json.clear();
  ModelConfig plain = model::tiny();
  EXPECT_EQ(text_only, plain);
  // A kimi_k3 wrapper without vision_config stays text-only.
  json w = out;
  w.erase("vision_config");
  w.erase("media_placeholder_token_id");
  EXPECT_FALSE(from(w).vision.has_value());
}

TEST(VisionConfigJson, ErrorsNameTheField) {
  const json j = fixture_json();
  auto with = [&](const std::function<void(json&)>& edit) {
    json k = j;
    edit(k);
    return k;
  };
  expect_error(with([](json& k) { k["vision_config"]["num_attention_heads"] = 3; }),
               "vision_config.hidden_size = 32 must be num_attention_heads = 3 heads");
  expect_error(with([](json& k) { k["vision_config"]["pos_emb_width"] = 6; }),
               "vision_config.pos_emb_width = 6 must equal vision_config.pos_emb_height = 5");
  expect_error(with([](json& k) { k["vision_config"]["hidden_act"] = "gelu"; }),
               "vision_config.hidden_act = 'gelu'");
  expect_error(
      with([](json& k) { k["vision_config"]["rope_parameters"]["rope_type"] = "default"; }),
      "vision_config.rope_parameters.rope_type = 'default' is not 'axial'");
  expect_error(with([](json& k) { k["vision_config"]["merge_kernel_size"] = {2}; }),
               "vision_config.merge_kernel_size must be a list of two integers");
  expect_error(with([](json& k) {
                 k["vision_config"]["merge_kernel_size"] = {2, 0};
               }),
               "vision_config.merge_kernel_size[1] must be > 0");
  expect_error(with([](json& k) { k["vision_config"]["hidden_size"] = "wide"; }),
               "config.json: vision_config.hidden_size must be an integer");
  expect_error(with([](json& k) { k["vision_config"]["pos_emb_time"] = 0; }),
               "vision_config.pos_emb_time must be > 0");
  expect_error(with([](json& k) { k["vision_config"] = 3; }), "vision_config must be an object");
  expect_error(with([](json& k) { k["projection_hidden_size"] = 1152; }),
               "projection_hidden_size (1152) must equal vision_config.hidden_size (32)");
  expect_error(with([](json& k) { k["projection_layer_norm_eps"] = 0.0; }),
               "projection_layer_norm_eps must be > 0");
  expect_error(with([](json& k) { k["image_token_id"] = 300; }),
               "image_token_id = 300 outside the vocabulary 0..299");
  expect_error(with([](json& k) { k.erase("image_token_id"); }),
               "image_token_id = 163605 outside the vocabulary");  // transformers' default
  expect_error(with([](json& k) { k["media_placeholder_token_id"] = 5; }),
               "image_token_id (299) and its alias media_placeholder_token_id (5) disagree");
  expect_error(with([](json& k) { k["tie_word_embeddings"] = true; }),
               "tie_word_embeddings (true) and text_config.tie_word_embeddings (false) disagree");
  expect_error(with([](json& k) { k["vision_config"]["projector_ln_eps"] = 1e-6; }),
               "projection_layer_norm_eps (1e-05) and vision_config.projector_ln_eps (1e-06)");
  expect_error(with([](json& k) { k.erase("text_config"); }),
               "model_type kimi_k25 needs a text_config object");
  ModelConfig c = model::tiny();
  c.vision = tiny_vision();
  EXPECT_THROW(c.validate(), Error);  // no placeholder token
}

// ---- the whole model ----

TEST(KimiK25Model, LogitsAndGreedyMatchTransformers) {
  const model::Decoder m = model::Decoder::load(kDir);
  auto in = safetensors::open(kDir + "/inputs.safetensors");
  auto out = safetensors::open(kDir + "/outputs.safetensors");
  NoGradGuard ng;
  const Tensor embeds = m.encode_images(in.load("pixel_values"), grids_of(in.load("grid_thws")));
  const Tensor ids = in.load("input_ids");
  const auto f = m.forward(ids, nullptr, {.image_embeds = embeds});
  const double dl = max_abs_diff(f.logits_BTV, out.load("logits"));
  EXPECT_LE(dl, 1e-4);
  // Greedy through the decode cache: the prefill carries the images, the steps are text.
  model::DecodeCache cache = m.new_cache();
  Tensor logits = m.forward(ids, &cache, {.image_embeds = embeds}).logits_BTV;
  const std::vector<int64_t> want = out.load("greedy_ids").to_ints();
  const Tensor want_logits = out.load("greedy_logits");
  const int64_t V = m.config().vocab_size;
  double dg = 0;
  for (size_t k = 0; k < want.size(); ++k) {
    const Tensor last = ops::reshape(ops::slice(logits, 1, -1, logits.size(1)), {V});
    dg = std::max(dg, max_abs_diff(last, ops::reshape(ops::slice(want_logits, 0, k, k + 1), {V})));
    const auto v = last.to_doubles();
    const int64_t next = std::max_element(v.begin(), v.end()) - v.begin();
    ASSERT_EQ(next, want[k]) << "greedy token " << k;
    logits = m.forward(Tensor::from_ints(std::vector<int64_t>{next}, {1, 1}), &cache).logits_BTV;
  }
  EXPECT_LE(dg, 1e-4);
  std::printf("kimi_k25_tiny: logits max err %.3g, greedy step logits max err %.3g\n", dl, dg);
}

}  // namespace
}  // namespace myriad::vision

namespace myriad::vision {
namespace {

TEST(KimiK25Model, SavesWithTransformersNamesAndReloads) {
  // Myriad writes a kimi_k25 model as transformers does (text under language_model., the tower
  // and projector under their names), and reads it back to the same logits.
  const model::Decoder m = model::Decoder::load(kDir);
  const auto dir = std::filesystem::temp_directory_path() / "myriad_k25_save";
  std::filesystem::create_directories(dir);
  m.config().save((dir / "config.json").string());
  m.weights().save((dir / "model.safetensors").string());
  auto ck = safetensors::Checkpoint::open(dir.string());
  EXPECT_TRUE(ck.contains("language_model.model.embed_tokens.weight"));
  EXPECT_TRUE(ck.contains("language_model.lm_head.weight"));
  EXPECT_FALSE(ck.contains("model.embed_tokens.weight"));
  for (const auto& n : ck.names())
    EXPECT_TRUE(n.rfind("language_model.", 0) == 0 || n.rfind("vision_tower.", 0) == 0 ||
                n.find("mm_projector.") != std::string::npos)
        << n;
  const model::Decoder back = model::Decoder::load(dir.string());
  auto in = safetensors::open(kDir + "/inputs.safetensors");
  NoGradGuard ng;
  const auto grids = grids_of(in.load("grid_thws"));
  const Tensor ids = in.load("input_ids");
  const Tensor a =
      m.forward(ids, nullptr, {.image_embeds = m.encode_images(in.load("pixel_values"), grids)})
          .logits_BTV;
  const Tensor b =
      back.forward(ids, nullptr,
                   {.image_embeds = back.encode_images(in.load("pixel_values"), grids)})
          .logits_BTV;
  EXPECT_EQ(a.to_doubles(), b.to_doubles());
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace myriad::vision
