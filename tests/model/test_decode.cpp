// Decoding through the cache (MODEL.md §3.3, §4.5, §9): prefill + token-by-token decode gives the
// full forward's logits at every position; a prompt processed in two segments equals one pass;
// the `logits` command writes what the forward computes; inspect reports published cache sizes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>

#include "core/autograd.h"
#include "io/safetensors.h"
#include "model/commands.h"
#include "model/decoder.h"
#include "ops/ops.h"
#include "tests/model/model_test_util.h"

namespace myriad::model {
namespace {

Tensor cols(const Tensor& ids, int64_t from, int64_t to) {
  return ops::contiguous(ops::slice(ids, 1, from, to));
}

class Decode : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    m_.emplace(Decoder::load(fixture_dir(GetParam())));
    ids_ = safetensors::open(fixture_dir(GetParam()) + "/inputs.safetensors").load("input_ids");
  }
  std::optional<Decoder> m_;
  Tensor ids_;
};

TEST_P(Decode, PrefillThenStepsEqualsFullForward) {
  NoGradGuard ng;
  const int64_t T = ids_.size(1), T0 = 5;
  Tensor full = m_->forward(ids_).logits_BTV;
  DecodeCache cache = m_->new_cache();
  std::vector<Tensor> parts = {m_->forward(cols(ids_, 0, T0), &cache).logits_BTV};
  for (int64_t t = T0; t < T; ++t)
    parts.push_back(m_->forward(cols(ids_, t, t + 1), &cache).logits_BTV);
  EXPECT_EQ(cache.position, T);
  const double err = max_abs_diff(ops::concat(parts, 1), full);
  EXPECT_LE(err, 1e-4);
  std::printf("%s: prefill(%lld) + %lld steps vs full forward: max err %.3g\n", GetParam().c_str(),
              static_cast<long long>(T0), static_cast<long long>(T - T0), err);
}

TEST_P(Decode, TwoSegmentsEqualOnePass) {
  NoGradGuard ng;
  const int64_t T = ids_.size(1), T0 = 7;
  DecodeCache one = m_->new_cache(), two = m_->new_cache();
  Tensor a = m_->forward(ids_, &one).logits_BTV;
  Tensor b1 = m_->forward(cols(ids_, 0, T0), &two).logits_BTV;
  Tensor b2 = m_->forward(cols(ids_, T0, T), &two).logits_BTV;
  EXPECT_LE(max_abs_diff(ops::concat({b1, b2}, 1), a), 1e-4);
  // The caches agree too, and continuing both with one token gives the same logits.
  EXPECT_EQ(one.bytes(), two.bytes());
  Tensor next = cols(ids_, 0, 1);
  EXPECT_LE(max_abs_diff(m_->forward(next, &one).logits_BTV, m_->forward(next, &two).logits_BTV),
            1e-4);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Decode,
                         ::testing::Values("kimi_linear_tiny", "kimi_linear_tiny_rope0",
                                           "deepseek_v3_tiny"));

TEST(ModelCommands, LogitsCommandWritesTheForward) {
  const std::string dir = fixture_dir("kimi_linear_tiny");
  const auto tmp = std::filesystem::temp_directory_path() / "myriad_test_logits.safetensors";
  logits_command(dir, dir + "/inputs.safetensors", tmp.string());
  Tensor got = safetensors::open(tmp.string()).load("logits");
  Tensor want = safetensors::open(dir + "/outputs.safetensors").load("logits");
  EXPECT_EQ(got.dtype(), DType::F32);
  EXPECT_LE(max_abs_diff(got, want), 1e-4);
  std::filesystem::remove(tmp);
}

TEST(ModelCommands, LogitsCommandRejectsBadTokens) {
  const std::string dir = fixture_dir("kimi_linear_tiny");
  const auto tmp = std::filesystem::temp_directory_path() / "myriad_test_bad_tokens.safetensors";
  safetensors::save(tmp.string(), {{"input_ids", Tensor::zeros({2, 3})}});
  try {
    logits_command(dir, tmp.string(), tmp.string() + ".out");
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("input_ids"), std::string::npos) << e.what();
  }
  std::filesystem::remove(tmp);
}

TEST(ModelCommands, InspectMatchesPublishedSizes) {
  // MODEL.md §1, §3.3, §4.8: published totals and cache sizes.
  const ParamCounts k3 = count_params(kimi_k3());
  EXPECT_NEAR(k3.total / 1e12, 2.78, 0.02);
  EXPECT_NEAR(k3.active / 1e9, 104.2, 1.5);
  const ParamCounts ds = count_params(deepseek_v3());
  EXPECT_NEAR(ds.total / 1e9, 671, 1);
  EXPECT_NEAR(ds.active / 1e9, 37, 1);
  EXPECT_EQ(cache_sizes(kimi_k3()).mla_bytes_per_token, 27648);
  EXPECT_EQ(cache_sizes(kimi_linear_48b()).mla_bytes_per_token, 8064);
  EXPECT_EQ(cache_sizes(deepseek_v3()).mla_bytes_per_token, 70272);
  EXPECT_EQ(cache_sizes(kimi_k3()).kda_state_bytes_per_layer, 6 << 20);  // f32
  const std::string r = inspect_report(kimi_k3());
  for (const char* s : {"69 KDA", "24 MLA", "27648 B per token", "27 GiB", "Block AttnRes"})
    EXPECT_NE(r.find(s), std::string::npos) << s << "\n" << r;
}

}  // namespace
}  // namespace myriad::model
