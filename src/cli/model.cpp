// The model subcommands: thin wrappers over model/commands.h.
#include <cstdio>
#include <exception>
#include <filesystem>
#include <string>

#include "cli/commands.h"
#include "data/tokenizer.h"
#include "infer/generation_config.h"
#include "model/commands.h"
#include "model/config.h"
#include "model/quant.h"
#include "serve/protocol.h"

namespace myriad::cli {

namespace {

// What a model directory carries besides the model: tokenizer, chat template, quantization and
// generation defaults (docs/CHECKPOINTS.md). Each line reports its own error.
std::string files_report(const std::string& dir) {
  std::string out = "files\n";
  const auto line = [&](const char* k, const std::string& v) {
    char head[32];
    std::snprintf(head, sizeof head, "  %-18s", k);
    out.append(head).append(v).append("\n");
  };
  try {
    const data::Tokenizer t = data::Tokenizer::from_dir(dir);
    line("tokenizer", t.kind() + ", " + std::to_string(t.vocab_size()) + " tokens, " +
                          std::to_string(t.special_tokens().size()) + " special, bos " +
                          std::to_string(t.bos()) + ", eos " + std::to_string(t.eos()));
  } catch (const std::exception& e) {
    line("tokenizer", std::string("cannot load: ") + e.what());
  }
  try {
    line("chat template", serve::ChatTemplate::from_model_dir(dir).describe());
  } catch (const std::exception& e) {
    line("chat template", std::string("cannot load: ") + e.what());
  }
  try {
    const model::quant::QuantConfig q = model::quant::QuantConfig::for_checkpoint(dir);
    std::string v = q.empty() ? "none (f32/bf16/f16 tensors)" : q.quant_method;
    if (!q.format.empty()) v += ", format " + q.format;
    if (!q.fmt.empty()) v += ", " + q.fmt;
    if (q.weight_block_size.size() == 2)
      v += ", blocks " + std::to_string(q.weight_block_size[0]) + "x" +
           std::to_string(q.weight_block_size[1]);
    for (const auto& g : q.groups)
      if (g.weights) v += "; " + g.name + ": " + g.weights->describe();
    if (!q.empty()) v += " (dequantized at load)";
    line("quantization", v);
  } catch (const std::exception& e) {
    line("quantization", std::string("cannot read: ") + e.what());
  }
  try {
    const infer::GenerationConfig g = infer::GenerationConfig::from_model_dir(dir);
    std::string v = g.present ? "eos" : "none";
    if (g.present) {
      for (int32_t id : g.eos_token_ids) v.append(" ").append(std::to_string(id));
      if (g.eos_token_ids.empty()) v += " (tokenizer's)";
      char buf[160];
      std::snprintf(buf, sizeof buf, ", temperature %g", g.default_temperature());
      v += buf;
      if (g.top_p) std::snprintf(buf, sizeof buf, ", top_p %g", *g.top_p), v += buf;
      if (g.top_k) std::snprintf(buf, sizeof buf, ", top_k %d", *g.top_k), v += buf;
      if (g.max_new_tokens)
        std::snprintf(buf, sizeof buf, ", max_new_tokens %lld",
                      static_cast<long long>(*g.max_new_tokens)),
            v += buf;
    }
    line("generation config", v);
  } catch (const std::exception& e) {
    line("generation config", std::string("cannot read: ") + e.what());
  }
  return out;
}

}  // namespace

int logits(const std::string& model_dir, const std::string& tokens, const std::string& out) {
  model::logits_command(model_dir, tokens, out);
  std::printf("wrote %s\n", out.c_str());
  return 0;
}

int inspect(const std::string& model_dir) {
  // A path (directory or config.json), else a preset name.
  const model::ModelConfig c = std::filesystem::exists(model_dir)
                                   ? model::ModelConfig::load(model_dir)
                                   : model::preset(model_dir);
  std::fputs(model::inspect_report(c).c_str(), stdout);
  if (std::filesystem::is_directory(model_dir)) std::fputs(files_report(model_dir).c_str(), stdout);
  return 0;
}

}  // namespace myriad::cli
