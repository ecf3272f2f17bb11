// What the `myriad logits` and `myriad inspect` subcommands do, as library functions (so tests
// can call them without the binary).
#pragma once
#include <cstdint>
#include <string>

#include "model/config.h"

namespace myriad::model {

// Reads int64 `input_ids` [B, T] from tokens_path (or its only tensor), runs the model in
// model_dir (f32, uncached) and writes f32 `logits` [B, T, V] to out_path.
void logits_command(const std::string& model_dir, const std::string& tokens_path,
                    const std::string& out_path);

struct ParamCounts {
  int64_t total = 0;
  int64_t active = 0;  // per token: everything but the unchosen routed experts
};
ParamCounts count_params(const ModelConfig& c);

// A human-readable summary: layers and their types, parameter counts (total and active per
// token), cache bytes per token per layer type, MLA cache at 128K and 1M tokens, KDA state bytes.
std::string inspect_report(const ModelConfig& c);

}  // namespace myriad::model
