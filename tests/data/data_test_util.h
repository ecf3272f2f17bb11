// Shared helpers for the data tests: a scratch directory and one small trained tokenizer.
#pragma once
#include <unistd.h>

#include <filesystem>
#include <string>

#include "data/corpus.h"
#include "data/synthetic.h"
#include "data/tokenizer.h"

namespace myriad::data::dtest {

// A fresh directory under the system temp dir, removed when the test program exits.
inline std::string scratch_dir(const std::string& name) {
  struct Cleanup {
    std::filesystem::path root =
        std::filesystem::temp_directory_path() / ("myriad_data_" + std::to_string(::getpid()));
    ~Cleanup() {
      std::error_code ec;
      std::filesystem::remove_all(root, ec);
    }
  };
  static Cleanup cleanup;
  auto p = cleanup.root / name;
  std::filesystem::remove_all(p);
  std::filesystem::create_directories(p);
  return p.string();
}

inline std::vector<std::string> small_corpus() {
  auto docs = synthetic_fallback_corpus(7, 120000);
  for (const auto& s : Filler::fixed().sentences) docs.push_back(s);
  return docs;
}

// Trained once per test program (BPE, 512 pieces, well under a second).
inline const Tokenizer& test_tokenizer() {
  static Tokenizer t = Tokenizer::train(small_corpus(), 512, scratch_dir("tok") + "/t.model");
  return t;
}

}  // namespace myriad::data::dtest
