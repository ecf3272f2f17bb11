// `myriad tokenizer train` and `myriad data build`: the tokenizer and token shards of the
// pretraining pipeline, from the WordNet and GCIDE packages read at run time (TRAINING.md §10).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace CLI {
class App;
}

namespace myriad::cli {

// Trains the SentencePiece tokenizer on builtin_corpus(max_bytes) and writes out_model.
int tokenizer_train_command(const std::string& out_model, int vocab, size_t max_bytes);

struct DataBuildArgs {
  std::string tokenizer_model, out_dir;
  size_t max_bytes = 0;  // corpus size (0: all of WordNet and GCIDE)
  int64_t shard_tokens = 1 << 24;
  double heldout_fraction = 0.01;
  uint64_t seed = 0;
  // A long-context stage mix (§5.2) instead of plain documents when stage_length > 0.
  int64_t stage_length = 0, prev_stage_length = 0, stage_tokens = 0;
  double synthetic_fraction = 0.2;
  int answer_weight = 1;
};
// Tokenises the corpus (or a stage mix of it) into train/heldout shards under out_dir.
int data_build_command(const DataBuildArgs& args);

struct DataArgs {
  std::string tok_out = "tokenizer.model";
  int vocab = 8192;
  size_t tok_max_bytes = 20u << 20;
  DataBuildArgs build;
  CLI::App* tokenizer_train = nullptr;
  CLI::App* data_build = nullptr;
  bool selected() const;  // one of the two subcommands was parsed
};
// Registers `tokenizer train` and `data build` on app.
void add_data_commands(CLI::App& app, DataArgs& args);
int data_command(const DataArgs& args);

}  // namespace myriad::cli
