#include "cli/vision.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "data/tokenizer.h"
#include "model/decoder.h"
#include "vision/fashion_mnist.h"

namespace myriad::cli {

void add_vision_commands(CLI::App& app, VisionArgs& a) {
  a.eval = app.add_subcommand(
      "vision-eval", "accuracy of a multimodal model on the Fashion-MNIST test images (greedy)");
  a.eval->add_option("model_dir", a.model_dir, "model directory")
      ->required()
      ->check(CLI::ExistingDirectory);
  a.eval->add_option("--images", a.images, "test images to caption (default all 10,000)")
      ->check(CLI::NonNegativeNumber);
  a.eval->add_option("--grid", a.grid, "questions of each 2x2 grid kind")
      ->check(CLI::NonNegativeNumber);
  a.eval->add_option("--batch", a.batch, "conversations decoded together")
      ->check(CLI::PositiveNumber);
  a.eval->add_option("--seed", a.seed, "seed of the grid canvases");
  a.eval->add_option("--json", a.json_out, "also write the result as JSON to this file");
  a.eval->add_option("--save-images", a.save_images,
                     "write the first test images as PNG files (test-<index>-<class>.png) here");
  a.eval->add_option("--save-count", a.save_count, "how many images --save-images writes")
      ->check(CLI::NonNegativeNumber);
}

int vision_command(const VisionArgs& a) {
  const data::Tokenizer tok = data::Tokenizer::from_dir(a.model_dir);
  const model::Decoder dec = model::Decoder::load(a.model_dir);
  MYRIAD_CHECK(dec.config().vision.has_value(), "vision-eval: ", a.model_dir,
               " has no vision tower (config.json lacks vision_config)");
  const vision::ImageSet test = vision::fashion_or_synthetic("test", 1000, a.seed);
  if (test.synthetic)
    std::printf("note: dataset-fashion-mnist is not installed; synthetic test images\n");
  if (!a.save_images.empty()) {
    std::filesystem::create_directories(a.save_images);
    for (int64_t i = 0; i < std::min(a.save_count, test.size()); ++i) {
      std::string name = vision::kFashionClasses[test.labels[static_cast<size_t>(i)]];
      std::replace(name.begin(), name.end(), ' ', '_');
      std::replace(name.begin(), name.end(), '/', '_');
      const std::string path = a.save_images + "/test-" + std::to_string(i) + "-" + name + ".png";
      std::ofstream f(path, std::ios::binary | std::ios::trunc);
      f << vision::grey_png(test.image(i), test.rows, test.cols);
      MYRIAD_CHECK(f.good(), "vision-eval: cannot write ", path);
    }
  }
  const vision::FashionEval ev =
      vision::evaluate_fashion(dec, tok, test, a.images, a.grid, a.seed, a.batch);
  for (int k = 0; k < vision::kQuestionKinds; ++k) {
    const auto q = static_cast<vision::Question>(k);
    std::printf("%-12s %6lld asked  accuracy %.4f\n", vision::question_name(q),
                static_cast<long long>(ev.asked[static_cast<size_t>(k)]), ev.accuracy(q));
  }
  std::printf("caption confusion (rows: true class; columns: reply, last = other):\n%12s", "");
  for (size_t c = 0; c < 10; ++c) std::printf(" %5zu", c);
  std::printf(" other\n");
  for (size_t i = 0; i < 10; ++i) {
    std::printf("%12s", vision::kFashionClasses[i]);
    for (int64_t n : ev.confusion[i]) std::printf(" %5lld", static_cast<long long>(n));
    std::printf("\n");
  }
  if (!a.json_out.empty()) {
    std::ofstream f(a.json_out, std::ios::trunc);
    nlohmann::json j = vision::eval_record(0, ev, test);
    j.erase("step");
    f << j.dump(1) << "\n";
    MYRIAD_CHECK(f.good(), "vision-eval: cannot write ", a.json_out);
  }
  return 0;
}

}  // namespace myriad::cli
