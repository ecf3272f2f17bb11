// generation_config.json: the fields read, their defaults, and errors that name the field.
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "infer/generation_config.h"

namespace myriad::infer {
namespace {

TEST(GenerationConfig, ReadsIdsAndSampling) {
  const auto g = GenerationConfig::parse(
      R"({"bos_token_id": 163584, "eos_token_id": [163586, 163585], "pad_token_id": 163839,
          "do_sample": true, "temperature": 0.6, "top_p": 0.95, "top_k": 40,
          "max_new_tokens": 512, "transformers_version": "5.24.0"})",
      "gc");
  EXPECT_TRUE(g.present);
  EXPECT_EQ(g.eos_token_ids, (std::vector<int32_t>{163586, 163585}));
  EXPECT_EQ(g.bos_token_id, 163584);
  EXPECT_EQ(g.pad_token_id, 163839);
  EXPECT_DOUBLE_EQ(g.default_temperature(), 0.6);
  EXPECT_DOUBLE_EQ(*g.top_p, 0.95);
  EXPECT_EQ(*g.top_k, 40);
  EXPECT_EQ(*g.max_new_tokens, 512);
  EXPECT_FALSE(g.min_p.has_value());
  const auto one = GenerationConfig::parse(R"({"eos_token_id": 2, "do_sample": false,
                                               "temperature": 0.9})",
                                           "gc");
  EXPECT_EQ(one.eos_token_ids, (std::vector<int32_t>{2}));
  EXPECT_EQ(one.default_temperature(), 0.0);  // do_sample false: greedy
  EXPECT_EQ(GenerationConfig{}.default_temperature(), 1.0);
  EXPECT_FALSE(GenerationConfig::from_model_dir("/nonexistent-dir").present);
}

TEST(GenerationConfig, ErrorsNameTheField) {
  for (const auto& [text, field] : std::vector<std::pair<std::string, std::string>>{
           {R"({"eos_token_id": "x"})", "eos_token_id"},
           {R"({"eos_token_id": [1, -2]})", "eos_token_id"},
           {R"({"top_p": 1.5})", "top_p"},
           {R"({"top_k": 2.5})", "top_k"},
           {R"({"do_sample": 1})", "do_sample"},
           {R"({"temperature": "hot"})", "temperature"},
           {R"([1, 2])", "JSON object"},
           {R"({"eos_token_id": )", "not valid JSON"}}) {
    try {
      GenerationConfig::parse(text, "generation_config.json");
      ADD_FAILURE() << text << " parsed";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("generation_config.json"), std::string::npos);
    }
  }
}

}  // namespace
}  // namespace myriad::infer
