// The model subcommands: thin wrappers over model/commands.h.
#include <cstdio>
#include <filesystem>

#include "cli/commands.h"
#include "model/commands.h"
#include "model/config.h"

namespace myriad::cli {

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
  return 0;
}

}  // namespace myriad::cli
