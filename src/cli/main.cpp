// The myriad command line: one binary, one subcommand per job.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "cli/commands.h"
#include "core/error.h"

int main(int argc, char** argv) {
  CLI::App app{"Myriad: an engine for sparse-expert, long-context language models"};
  app.require_subcommand(1);
  myriad::cli::SelfcheckOptions sc;
  auto* selfcheck = app.add_subcommand(
      "selfcheck", "check every op against its reference and time both (prints what it measured)");
  selfcheck->add_option("--scale", sc.scale, "problem size multiplier")->check(CLI::Range(1, 64));
  selfcheck->add_option("--reps", sc.reps, "timed repetitions per op")->check(CLI::Range(1, 1000));
  CLI11_PARSE(app, argc, argv);
  try {
    if (*selfcheck) return myriad::cli::selfcheck(sc);
  } catch (const myriad::Error& e) {
    std::fprintf(stderr, "myriad: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
