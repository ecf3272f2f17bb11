// The K3 release layout (docs/CHECKPOINTS.md): a kimi_k3-wrapped model is written with the text
// model under `language_model.` and A_log as [H], and read back identically; any model reads
// those spellings; a release's vision tensors are skipped, and named, when the config has no
// vision tower Myriad reads.
#include <gtest/gtest.h>

#include <unistd.h>
#include <filesystem>
#include <map>
#include <string>

#include "core/random.h"
#include "io/safetensors.h"
#include "model/decoder.h"
#include "tests/model/model_test_util.h"

namespace myriad::model {
namespace {

namespace fs = std::filesystem;

ModelConfig k3_wrapped() {
  ModelConfig c = three_layer_config(2);
  c.linear_attn_config.gate_lower_bound = -5.0;
  c.linear_attn_config.use_full_rank_gate = true;
  c.hidden_act = "situ";
  c.mla_use_output_gate = true;
  c.wrapper_json =
      R"({"model_type": "kimi_k3", "architectures": ["KimiK3ForConditionalGeneration"]})";
  c.validate();
  return c;
}

class ReleaseLayout : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("myriad_test_layout_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string st() const { return (dir_ / "model.safetensors").string(); }
  fs::path dir_;
};

TEST_F(ReleaseLayout, K3IsWrittenWithPrefixAndFlatALogAndReadBack) {
  const ModelConfig c = k3_wrapped();
  Decoder m = random_model(c, DType::F32, 3);
  c.save((dir_ / "config.json").string());
  m.weights().save(st());
  auto ck = safetensors::Checkpoint::open(st());
  int64_t a_logs = 0;
  for (const auto& n : ck.names()) {
    EXPECT_TRUE(n.starts_with("language_model.")) << n;
    if (n.ends_with(".A_log")) {
      ++a_logs;
      EXPECT_EQ(ck.info(n).shape, (Shape{c.linear_attn_config.num_heads})) << n;
    }
  }
  EXPECT_EQ(a_logs, 2);  // two KDA layers
  EXPECT_TRUE(ck.contains("language_model.model.embed_tokens.weight"));
  Decoder back = Decoder::load(dir_.string());
  Generator gen(4);
  const Tensor ids = gen.randint({1, 6}, 0, c.vocab_size);
  EXPECT_EQ(max_abs_diff(back.forward(ids).logits_BTV, m.forward(ids).logits_BTV), 0.0);
}

TEST_F(ReleaseLayout, UnwrappedModelsReadPrefixedNamesAndFlatALog) {
  ModelConfig c = three_layer_config(0);
  c.hidden_act = "silu";  // not K3 form: kimi_linear names and shapes
  c.validate();
  ASSERT_FALSE(c.is_k3_form());
  Decoder m = random_model(c, DType::F32, 5);
  c.save((dir_ / "config.json").string());
  std::map<std::string, Tensor> t;
  for (const auto& [n, x] : m.weights().tensors())
    t["language_model." + n] =
        n.ends_with(".A_log") ? Tensor::from_doubles(x.to_doubles(), {x.numel()}) : x;
  safetensors::save(st(), t);
  Decoder back = Decoder::load(dir_.string());
  Generator gen(6);
  const Tensor ids = gen.randint({1, 5}, 0, c.vocab_size);
  EXPECT_EQ(max_abs_diff(back.forward(ids).logits_BTV, m.forward(ids).logits_BTV), 0.0);
  // Unwrapped models still write the kimi_linear names and shapes.
  back.weights().save(st());
  auto ck = safetensors::Checkpoint::open(st());
  EXPECT_TRUE(ck.contains("model.layers.0.self_attn.A_log"));
  EXPECT_EQ(ck.info("model.layers.0.self_attn.A_log").shape,
            (Shape{1, 1, c.linear_attn_config.num_heads, 1}));
  // Another element count is still an error naming both accepted shapes.
  t["language_model.model.layers.0.self_attn.A_log"] = Tensor::zeros({3});
  safetensors::save(st(), t);
  try {
    Decoder::load(dir_.string());
    ADD_FAILURE() << "a [3] A_log loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("or [2]"), std::string::npos) << e.what();
  }
}

TEST_F(ReleaseLayout, VisionTensorsWithoutAVisionConfigAreSkippedAndNamed) {
  const ModelConfig c = k3_wrapped();
  Decoder m = random_model(c, DType::F32, 7);
  c.save((dir_ / "config.json").string());
  auto t = m.weights().tensors();
  std::map<std::string, Tensor> out;
  for (const auto& [n, x] : t) out["language_model." + n] = x;
  out["vision_tower.patch_embed.proj.weight"] = Tensor::zeros({4, 3, 2, 2});
  out["mm_projector.proj.0.weight"] = Tensor::zeros({4, 4});
  safetensors::save(st(), out);
  Decoder back = Decoder::load(dir_.string());
  EXPECT_EQ(back.weights().skipped(),
            (std::vector<std::string>{"mm_projector.proj.0.weight",
                                      "vision_tower.patch_embed.proj.weight"}));
  // Anything else unexpected is still an error.
  out["language_model.model.layers.7.surprise"] = Tensor::zeros({1});
  safetensors::save(st(), out);
  EXPECT_THROW(Decoder::load(dir_.string()), Error);
}

TEST_F(ReleaseLayout, MultiTokenPredictionLayersAreSkipped) {
  ModelConfig c = three_layer_config(0);
  c.hidden_act = "silu";
  c.validate();
  Decoder m = random_model(c, DType::F32, 8);
  c.save((dir_ / "config.json").string());
  auto t = m.weights().tensors();
  // DeepSeek-V3 stores its MTP module as one more layer: a decoder layer plus eh_proj and norms.
  t["model.layers.3.eh_proj.weight"] = Tensor::zeros({4, 8});
  t["model.layers.3.enorm.weight"] = Tensor::zeros({4});
  t["model.layers.3.self_attn.q_a_proj.weight"] = Tensor::zeros({4, 4});
  safetensors::save(st(), t);
  Decoder back = Decoder::load(dir_.string());
  EXPECT_EQ(back.weights().skipped().size(), 3u);
  // Without eh_proj, an extra layer is still an error.
  t.erase("model.layers.3.eh_proj.weight");
  safetensors::save(st(), t);
  EXPECT_THROW(Decoder::load(dir_.string()), Error);
}

}  // namespace
}  // namespace myriad::model
