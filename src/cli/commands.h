// Subcommand entry points of the myriad binary.
#pragma once

namespace myriad::cli {

struct SelfcheckOptions {
  int scale = 1;
  int reps = 3;
};
int selfcheck(const SelfcheckOptions& opt);

}  // namespace myriad::cli
