#include "cli/data.h"

#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>

#include "core/error.h"
#include "data/corpus.h"
#include "data/shards.h"
#include "data/synthetic.h"
#include "data/tokenizer.h"

namespace myriad::cli {

int tokenizer_train_command(const std::string& out_model, int vocab, size_t max_bytes) {
  const auto docs = data::builtin_corpus(max_bytes);
  size_t bytes = 0;
  for (const auto& d : docs) bytes += d.size();
  std::printf("corpus: %zu documents, %zu bytes (WordNet + GCIDE)\n", docs.size(), bytes);
  if (auto parent = std::filesystem::path(out_model).parent_path(); !parent.empty())
    std::filesystem::create_directories(parent);
  const auto tok = data::Tokenizer::train(docs, vocab, out_model);
  size_t tokens = 0, sample = std::min<size_t>(docs.size(), 2000);
  size_t sample_bytes = 0;
  for (size_t i = 0; i < sample; ++i) {
    tokens += tok.encode(docs[i]).size();
    sample_bytes += docs[i].size();
  }
  std::printf("wrote %s: %d pieces, %.2f bytes per token on %zu documents\n", out_model.c_str(),
              tok.vocab_size(), tokens ? static_cast<double>(sample_bytes) / tokens : 0.0, sample);
  return 0;
}

namespace {
int print_stats(const DataBuildArgs& a, const data::ShardStats& st) {
  std::printf(
      "wrote %s: train %lld docs / %lld tokens in %lld shards, heldout %lld docs / %lld "
      "tokens in %lld shards\n",
      a.out_dir.c_str(), static_cast<long long>(st.train_docs),
      static_cast<long long>(st.train_tokens), static_cast<long long>(st.train_shards),
      static_cast<long long>(st.heldout_docs), static_cast<long long>(st.heldout_tokens),
      static_cast<long long>(st.heldout_shards));
  return 0;
}
}  // namespace

int data_build_command(const DataBuildArgs& a) {
  const auto tok = data::Tokenizer::load(a.tokenizer_model);
  const auto docs = data::builtin_corpus(a.max_bytes);
  if (a.stage_length <= 0)
    return print_stats(a, data::write_token_shards(docs, tok, a.out_dir, a.shard_tokens,
                                                   a.heldout_fraction, a.seed));
  const bool have_wordnet = std::filesystem::exists("/usr/share/wordnet/data.noun");
  const auto filler = have_wordnet ? data::Filler::wordnet(false) : data::Filler::fixed();
  int64_t total = a.stage_tokens;
  if (total <= 0)
    for (const auto& d : docs) total += static_cast<int64_t>(d.size()) / 4;  // ~4 bytes a token
  const auto mix = data::mix_long_context(
      a.seed, docs, a.stage_length, a.prev_stage_length > 0 ? a.prev_stage_length : a.stage_length,
      total, tok, filler, a.synthetic_fraction, a.answer_weight);
  std::printf("stage %lld mix: %lld long, %lld short, %lld synthetic tokens\n",
              static_cast<long long>(a.stage_length), static_cast<long long>(mix.long_tokens),
              static_cast<long long>(mix.short_tokens),
              static_cast<long long>(mix.synthetic_tokens));
  return print_stats(
      a, data::write_token_shards(mix.docs, tok.vocab_size(), tok.eos(), a.out_dir, a.shard_tokens,
                                  a.heldout_fraction, a.seed, &mix.weights));
}

bool DataArgs::selected() const {
  return (tokenizer_train && tokenizer_train->parsed()) || (data_build && data_build->parsed());
}

void add_data_commands(CLI::App& app, DataArgs& a) {
  auto* tok = app.add_subcommand("tokenizer", "tokenizer tools");
  tok->require_subcommand(1);
  a.tokenizer_train = tok->add_subcommand(
      "train", "train the SentencePiece tokenizer on WordNet + GCIDE (read at run time)");
  a.tokenizer_train->add_option("--out", a.tok_out, "model file to write");
  a.tokenizer_train->add_option("--vocab", a.vocab, "vocabulary size")
      ->check(CLI::Range(300, 1 << 20));
  a.tokenizer_train->add_option("--max-bytes", a.tok_max_bytes, "training corpus bytes (0: all)");
  auto* data = app.add_subcommand("data", "training data tools");
  data->require_subcommand(1);
  auto& b = a.build;
  a.data_build = data->add_subcommand("build", "tokenise the corpus into train/heldout shards");
  a.data_build->add_option("--tokenizer", b.tokenizer_model, "tokenizer model")->required();
  a.data_build->add_option("--out", b.out_dir, "output directory")->required();
  a.data_build->add_option("--max-bytes", b.max_bytes, "corpus bytes (0: all)");
  a.data_build->add_option("--shard-tokens", b.shard_tokens, "tokens per shard")
      ->check(CLI::PositiveNumber);
  a.data_build->add_option("--heldout", b.heldout_fraction, "held-out document fraction")
      ->check(CLI::Range(0.0, 0.5));
  a.data_build->add_option("--seed", b.seed, "split and mix seed");
  a.data_build->add_option("--stage-length", b.stage_length,
                           "build a long-context stage mix of this length (0: plain documents)");
  a.data_build->add_option("--prev-stage-length", b.prev_stage_length,
                           "previous stage length (short-document share)");
  a.data_build->add_option("--stage-tokens", b.stage_tokens, "tokens in the stage mix");
  a.data_build->add_option("--synthetic", b.synthetic_fraction, "synthetic retrieval token share")
      ->check(CLI::Range(0.0, data::kMaxSyntheticFraction));
  a.data_build
      ->add_option("--answer-weight", b.answer_weight,
                   "loss weight of retrieval answers (weighted shards when > 1)")
      ->check(CLI::Range(1, 255));
}

int data_command(const DataArgs& a) {
  if (a.tokenizer_train && a.tokenizer_train->parsed())
    return tokenizer_train_command(a.tok_out, a.vocab, a.tok_max_bytes);
  return data_build_command(a.build);
}

}  // namespace myriad::cli
