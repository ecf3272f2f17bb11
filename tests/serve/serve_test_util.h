// A tiny model directory for the serving tests, built once per test program: a random four-layer
// tiny-preset decoder saved as config.json + model.safetensors, and a ~300-piece tokenizer trained
// on a few hundred generated sentences. Removed when the program exits.
#pragma once
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "data/tokenizer.h"
#include "model/config.h"
#include "model/decoder.h"

namespace myriad::serve::test {

inline std::vector<std::string> sentences() {
  const char* subj[] = {"the cat",  "a dog",     "my friend", "the weather",
                        "our team", "the river", "a robot",   "the city"};
  const char* verb[] = {"likes", "sees", "finds", "calls", "helps", "follows", "paints", "visits"};
  const char* obj[] = {"the sun",    "a red ball",   "the old house", "some music",
                       "the market", "a quiet road", "the blue sea",  "fresh bread"};
  std::vector<std::string> s;
  for (int i = 0; i < 400; ++i)
    s.push_back(std::string(subj[i % 8]) + " " + verb[(i / 8) % 8] + " " +
                obj[(i * 3 + i / 64) % 8] +
                (i % 3 ? "." : " today, says the weather report in Paris: 12 degrees."));
  return s;
}

inline const std::string& model_dir() {
  struct Dir {
    std::filesystem::path p =
        std::filesystem::temp_directory_path() / ("myriad_serve_" + std::to_string(::getpid()));
    Dir() {
      std::filesystem::remove_all(p);
      std::filesystem::create_directories(p);
      const auto tok = data::Tokenizer::train(sentences(), 300, (p / "tokenizer.model").string());
      // The tiny preset cut to four layers (three KDA, one MLA) keeps the engine tests quick.
      model::ModelConfig c = model::tiny();
      c.num_hidden_layers = 4;
      model::default_layout(4, c.linear_attn_config.kda_layers,
                            c.linear_attn_config.full_attn_layers);
      c.vocab_size = tok.vocab_size();
      c.model_max_length = 4096;
      c.validate();
      const auto m = model::Decoder::random(c, 11);
      m.weights().save((p / "model.safetensors").string());
      c.save((p / "config.json").string());
    }
    ~Dir() {
      std::error_code ec;
      std::filesystem::remove_all(p, ec);
    }
  };
  static Dir dir;
  static const std::string s = dir.p.string();
  return s;
}

}  // namespace myriad::serve::test
