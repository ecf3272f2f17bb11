// `myriad vision-eval MODEL_DIR`: exact-match accuracy of a multimodal model on the Fashion-MNIST
// test images through greedy generation (captions over the whole test split by default, and each
// 2×2 grid question kind), the caption confusion, as text and optionally JSON (TRAINING.md §9).
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

namespace myriad::cli {

struct VisionArgs {
  CLI::App* eval = nullptr;
  std::string model_dir, json_out, save_images;
  int64_t save_count = 8;
  int64_t images = 10000, grid = 1000, batch = 256;
  uint64_t seed = 0;
  bool selected() const { return eval && eval->parsed(); }
};
void add_vision_commands(CLI::App& app, VisionArgs& a);
int vision_command(const VisionArgs& a);

}  // namespace myriad::cli
