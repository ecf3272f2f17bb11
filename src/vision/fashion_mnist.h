// The tiny multimodal task (TRAINING.md §9): Fashion-MNIST read at run time from Debian's
// dataset-fashion-mnist package, captions and 2×2 grid questions written in the default chat
// format, the stream that mixes them with text rows for the trainer, and the evaluation through
// greedy generation (exact match per question type, confusion of the captions).
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/shards.h"
#include "data/tokenizer.h"
#include "vision/tower.h"

namespace myriad::model {
class Decoder;
}

namespace myriad::vision {

inline constexpr const char* kFashionDir = "/usr/share/datasets/fashion-mnist";
// Class names as the model answers them (Fashion-MNIST's labels, lower case).
inline constexpr std::array<const char*, 10> kFashionClasses = {
    "t-shirt", "trouser", "pullover", "dress", "coat",
    "sandal",  "shirt",   "sneaker",  "bag",   "ankle boot"};

// 28×28 grey images (0 = background) and their labels.
struct ImageSet {
  int64_t rows = 28, cols = 28;
  std::vector<uint8_t> pixels;  // n · rows · cols, row-major
  std::vector<uint8_t> labels;
  bool synthetic = false;  // made by synthetic_images (the package is absent)
  int64_t size() const { return static_cast<int64_t>(labels.size()); }
  const uint8_t* image(int64_t i) const { return pixels.data() + i * rows * cols; }
};

// split "train" (60,000) or "test" (10,000) from `dir` (IDX files, gzip). Validates magic
// numbers, sizes and lengths; a missing, truncated or malformed file raises an error naming it.
ImageSet load_fashion_mnist(const std::string& split, const std::string& dir = kFashionDir);
bool fashion_mnist_available(const std::string& dir = kFashionDir);
// Ten distinct seeded shapes with noise, for tests where the package is absent.
ImageSet synthetic_images(int64_t n, uint64_t seed);
// The package's split, or synthetic images (n_fallback) when it is not installed.
ImageSet fashion_or_synthetic(const std::string& split, int64_t n_fallback, uint64_t seed);

// A grey image as the Kimi K2.5 processor prepares it (no resize below its limits; padded with
// black at the bottom and right to a multiple of patch·merge; grey to RGB; (x − 127.5)/127.5;
// patches row-major, each channel-major [3, p, p]): vision::preprocess of the same image as a PNG
// gives the same values (tested), so a served image meets the model as training did.
struct Patches {
  std::vector<float> values;  // [h·w, 3·p·p]
  Grid grid;
};
Patches patchify_grey(const uint8_t* img, int64_t rows, int64_t cols, const VisionConfig& c);

// Question kinds. The grid questions are asked about a 56×56 canvas of four images.
enum class Question { Caption, GridWhat, GridWhere, GridCount, GridExists };
inline constexpr int kQuestionKinds = 5;
const char* question_name(Question q);

struct Example {
  Question kind = Question::Caption;
  std::string question, answer;  // the user's text after the image, and the expected reply
  int label = -1;                // captions: the class
  std::vector<uint8_t> image;    // rows · cols grey pixels
  int64_t rows = 0, cols = 0;
};
// Example i of a seeded sequence drawing from `set`.
Example make_example(const ImageSet& set, Question kind, uint64_t seed, int64_t i);

// The rendered conversation: prompt tokens (user turn with the image block, then the assistant
// marker) and the answer tokens (the reply and <|end|>).
struct Rendered {
  std::vector<int32_t> prompt, answer;
  Patches patches;
};
Rendered render(const Example& e, const data::Tokenizer& tok, const VisionConfig& c);

// What the multimodal recipe mixes: question kinds by weight, plus text rows.
struct TaskMix {
  std::array<double, kQuestionKinds> weights = {0.6, 0.1, 0.1, 0.1, 0.1};
  double text_fraction = 0.25;  // share of rows that are text from the token shards
};

// Rows for the trainer: each image row is one conversation starting at position 0, padded with
// eos, loss weight 1 on the answer only (image and prompt positions 0); text rows come from the
// token stream (unweighted). Deterministic for a seed; resumable through state().
class ImageTextStream {
 public:
  ImageTextStream(ImageSet images, const data::Tokenizer& tok, VisionConfig cfg, TaskMix mix,
                  std::unique_ptr<data::TokenStream> text, uint64_t seed);
  ~ImageTextStream();
  data::Batch next(int64_t B, int64_t T);
  std::string state() const;  // JSON
  void restore(const std::string& json);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct FashionEval {
  std::array<int64_t, kQuestionKinds> asked{}, correct{};
  std::array<std::array<int64_t, 11>, 10> confusion{};   // captions: [true][predicted], 10 = other
  std::vector<std::pair<int64_t, std::string>> samples;  // (test index, caption reply), first few
  double accuracy(Question q) const {
    const auto i = static_cast<size_t>(q);
    return asked[i] ? static_cast<double>(correct[i]) / static_cast<double>(asked[i]) : 0.0;
  }
};
// The report's record of an evaluation: accuracy per kind, the caption confusion and the first
// sample images (grey PNGs, base64) with the model's replies.
nlohmann::json eval_record(int64_t step, const FashionEval& ev, const ImageSet& test);
// A grey image as a PNG file's bytes.
std::string grey_png(const uint8_t* pixels, int64_t rows, int64_t cols);
std::string base64(std::string_view bytes);

// Greedy replies (up to max_tokens, stopping at <|end|>) for the first n_caption test images
// captioned and n_grid grid questions of each kind; exact match after trimming spaces.
FashionEval evaluate_fashion(const model::Decoder& dec, const data::Tokenizer& tok,
                             const ImageSet& test, int64_t n_caption, int64_t n_grid, uint64_t seed,
                             int64_t batch = 256, int64_t max_tokens = 8);

}  // namespace myriad::vision
