// Subcommand entry points of the myriad binary.
#pragma once
#include <string>

namespace myriad::cli {

struct SelfcheckOptions {
  int scale = 1;
  int reps = 3;
};
int selfcheck(const SelfcheckOptions& opt);

// `myriad logits MODEL_DIR --tokens IN --out OUT` and `myriad inspect MODEL_DIR`.
int logits(const std::string& model_dir, const std::string& tokens, const std::string& out);
int inspect(const std::string& model_dir);

}  // namespace myriad::cli
