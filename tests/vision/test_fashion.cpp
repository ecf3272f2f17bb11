// The tiny multimodal task (src/vision/fashion_mnist.h): the IDX reader, the processor-equivalent
// patches, the questions and their answers, the trainer's stream, and the decoder's splicing of
// image rows into the embeddings.
#include <gtest/gtest.h>
#include <zlib.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>

#include "core/error.h"
#include "data/tokenizer.h"
#include "model/decoder.h"
#include "ops/ops.h"
#include "train/recipe.h"
#include "train/trainer.h"
#include "vision/fashion_mnist.h"
#include "vision/image.h"

namespace myriad {
namespace {

namespace fs = std::filesystem;

void write_gz(const fs::path& p, const std::string& bytes) {
  gzFile gz = gzopen(p.c_str(), "wb");
  ASSERT_NE(gz, nullptr);
  ASSERT_EQ(gzwrite(gz, bytes.data(), static_cast<unsigned>(bytes.size())),
            static_cast<int>(bytes.size()));
  gzclose(gz);
}

std::string be32(uint32_t v) {
  return {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8),
          static_cast<char>(v)};
}

// A valid two-image test split in `dir`, optionally damaged.
void write_split(const fs::path& dir, uint32_t image_magic, size_t drop_bytes, uint8_t label) {
  fs::create_directories(dir);
  std::string im = be32(image_magic) + be32(2) + be32(28) + be32(28) + std::string(2 * 784, '\7');
  im.resize(im.size() - drop_bytes);
  write_gz(dir / "t10k-images-idx3-ubyte.gz", im);
  write_gz(dir / "t10k-labels-idx1-ubyte.gz",
           be32(0x801) + be32(2) + std::string(1, 3) + std::string(1, static_cast<char>(label)));
}

TEST(FashionMnist, ReadsTheIdxFilesAndRefusesDamagedOnes) {
  const fs::path dir = fs::temp_directory_path() / "myriad_fashion_test";
  fs::remove_all(dir);
  write_split(dir, 0x803, 0, 9);
  const vision::ImageSet s = vision::load_fashion_mnist("test", dir.string());
  ASSERT_EQ(s.size(), 2);
  EXPECT_EQ(s.labels[1], 9);
  EXPECT_EQ(s.image(1)[783], 7);
  const auto fails = [&](const std::string& what) {
    try {
      vision::load_fashion_mnist("test", dir.string());
      ADD_FAILURE() << "no error for " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("fashion-mnist"), std::string::npos) << e.what();
    }
  };
  write_split(dir, 0x801, 0, 9);
  fails("a wrong magic number");
  write_split(dir, 0x803, 100, 9);
  fails("missing pixel bytes");
  write_split(dir, 0x803, 0, 12);
  fails("a label out of range");
  fs::remove(dir / "t10k-labels-idx1-ubyte.gz");
  fails("a missing file");
  EXPECT_THROW(vision::load_fashion_mnist("validation", dir.string()), Error);
  fs::remove_all(dir);
}

TEST(FashionMnist, ThePackageWhenInstalled) {
  if (!vision::fashion_mnist_available()) GTEST_SKIP() << "dataset-fashion-mnist not installed";
  const vision::ImageSet train = vision::load_fashion_mnist("train");
  const vision::ImageSet test = vision::load_fashion_mnist("test");
  EXPECT_EQ(train.size(), 60000);
  EXPECT_EQ(test.size(), 10000);
  EXPECT_EQ(train.labels[0], 9);  // TRAINING.md §10: the first training label is an ankle boot
}

TEST(FashionMnist, PatchesAreTheProcessorsLayout) {
  const vision::VisionConfig c = vision::tiny_vision();
  std::vector<uint8_t> img(28 * 28);
  for (size_t i = 0; i < img.size(); ++i) img[i] = static_cast<uint8_t>(i % 251);
  const vision::Patches p = vision::patchify_grey(img.data(), 28, 28, c);
  const int64_t ps = c.patch_size;
  ASSERT_EQ(p.grid, (vision::Grid{1, 32 / ps, 32 / ps}));  // padded to a multiple of patch·merge
  ASSERT_EQ(static_cast<int64_t>(p.values.size()), p.grid.h * p.grid.w * 3 * ps * ps);
  for (int64_t gy = 0; gy < p.grid.h; ++gy)
    for (int64_t gx = 0; gx < p.grid.w; ++gx)
      for (int64_t ch = 0; ch < 3; ++ch)
        for (int64_t y = 0; y < ps; ++y)
          for (int64_t x = 0; x < ps; ++x) {
            const int64_t sy = gy * ps + y, sx = gx * ps + x;
            const double want = sy < 28 && sx < 28
                                    ? (img[static_cast<size_t>(sy * 28 + sx)] - 127.5) / 127.5
                                    : -1.0;  // black padding at the bottom and right
            ASSERT_NEAR(
                p.values[static_cast<size_t>((((gy * p.grid.w + gx) * 3 + ch) * ps + y) * ps + x)],
                want, 1e-6);
          }
}

TEST(FashionMnist, TrainingPatchesEqualTheServersPreprocessing) {
  // A test image as a client sends it (a PNG) meets the model as the training rows did.
  const vision::VisionConfig c = vision::tiny_vision();
  const vision::ImageSet set = vision::synthetic_images(3, 9);
  for (const auto& [rows, cols, img] :
       {std::tuple<int64_t, int64_t, const uint8_t*>{28, 28, set.image(0)},
        {28, 28, set.image(2)}}) {
    const vision::Patches p = vision::patchify_grey(img, rows, cols, c);
    const vision::Processed q =
        vision::preprocess(vision::decode_image(vision::grey_png(img, rows, cols)),
                           vision::PreprocessOptions::from(c));
    EXPECT_EQ(q.grid, p.grid);
    EXPECT_EQ(q.tokens, vision::merged_tokens(c, p.grid));
    const std::vector<double> want = q.pixel_values.to_doubles();
    ASSERT_EQ(want.size(), p.values.size());
    for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(static_cast<float>(want[i]), p.values[i]);
  }
  // And the 2×2 canvas.
  const vision::Example e = vision::make_example(set, vision::Question::GridCount, 1, 0);
  const vision::Patches p = vision::patchify_grey(e.image.data(), e.rows, e.cols, c);
  const vision::Processed q =
      vision::preprocess(vision::decode_image(vision::grey_png(e.image.data(), e.rows, e.cols)),
                         vision::PreprocessOptions::from(c));
  EXPECT_EQ(q.grid, p.grid);
  EXPECT_EQ(q.pixel_values.to_doubles(), std::vector<double>(p.values.begin(), p.values.end()));
}

TEST(FashionMnist, GridQuestionsAreAnsweredByTheirCanvas) {
  const vision::ImageSet set = vision::synthetic_images(500, 3);
  // Which class is in each quadrant: synthetic images are told apart by their exact pixels.
  const auto classes_of = [&](const vision::Example& e) {
    std::vector<int> out;
    for (int q = 0; q < 4; ++q) {
      int found = -1;
      for (int64_t k = 0; k < set.size() && found < 0; ++k) {
        bool same = true;
        for (int64_t y = 0; y < 28 && same; ++y)
          for (int64_t x = 0; x < 28 && same; ++x)
            same = e.image[static_cast<size_t>(((q / 2) * 28 + y) * 56 + (q % 2) * 28 + x)] ==
                   set.image(k)[y * 28 + x];
        if (same) found = set.labels[static_cast<size_t>(k)];
      }
      out.push_back(found);
    }
    return out;
  };
  const char* pos[4] = {"top-left", "top-right", "bottom-left", "bottom-right"};
  std::set<std::string> answers;
  for (int64_t i = 0; i < 40; ++i) {
    for (auto kind : {vision::Question::GridWhat, vision::Question::GridWhere,
                      vision::Question::GridCount, vision::Question::GridExists}) {
      const vision::Example e = vision::make_example(set, kind, 7, i);
      ASSERT_EQ(e.rows, 56);
      const std::vector<int> c = classes_of(e);
      answers.insert(std::string(vision::question_name(kind)) + ":" + e.answer);
      if (kind == vision::Question::GridWhat) {
        bool ok = false;
        for (int q = 0; q < 4; ++q)
          ok |= e.question == std::string("What is ") + pos[q] + "?" &&
                e.answer == vision::kFashionClasses[static_cast<size_t>(c[q])];
        EXPECT_TRUE(ok) << e.question << " -> " << e.answer;
      } else if (kind == vision::Question::GridCount) {
        int n = 0;
        for (int x : c) n += x == 5 || x == 7 || x == 9;
        EXPECT_EQ(e.answer, std::to_string(n));
      } else {
        int t = -1;
        for (int k = 0; k < 10; ++k)
          if (e.question.find(std::string(" ") + vision::kFashionClasses[static_cast<size_t>(k)] +
                              "?") != std::string::npos)
            t = k;
        ASSERT_GE(t, 0) << e.question;
        const auto hits = std::count(c.begin(), c.end(), t);
        if (kind == vision::Question::GridExists) {
          EXPECT_EQ(e.answer, hits ? "yes" : "no");
        } else {
          ASSERT_LE(hits, 1) << "a where-question must be unambiguous";
          std::string want = "none";
          for (int q = 0; q < 4; ++q)
            if (c[static_cast<size_t>(q)] == t) want = pos[q];
          EXPECT_EQ(e.answer, want);
        }
      }
    }
  }
  // Both answers of the yes/no and present/absent questions occur.
  EXPECT_TRUE(answers.count("grid_exists:yes") && answers.count("grid_exists:no"));
  EXPECT_TRUE(answers.count("grid_where:none"));
}

data::Tokenizer test_tokenizer() {
  const fs::path p = fs::temp_directory_path() / "myriad_fashion_tok.model";
  std::vector<std::string> docs;
  const vision::ImageSet set = vision::synthetic_images(200, 1);
  for (int64_t i = 0; i < 400; ++i) {
    const vision::Example e = vision::make_example(set, static_cast<vision::Question>(i % 5), 1, i);
    docs.push_back(e.question + " " + e.answer + " the quick brown fox jumps over the lazy dog");
  }
  return data::Tokenizer::train(docs, 320, p.string());
}

TEST(FashionMnist, StreamRowsPackConversationsWithTheirImages) {
  const data::Tokenizer tok = test_tokenizer();
  EXPECT_EQ(tok.encode_parts({{"<|media_pad|>", true}}), std::vector<int32_t>{data::kMediaPadId});
  const vision::VisionConfig c = vision::tiny_vision();
  vision::TaskMix mix;
  mix.text_fraction = 0;
  vision::ImageTextStream s(vision::synthetic_images(300, 2), tok, c, mix, nullptr, 5);
  const std::string start = s.state();
  const data::Batch b = s.next(12, 128);
  ASSERT_EQ(b.input_ids.shape(), (Shape{12, 128}));
  ASSERT_GE(b.grids.size(), 12u);  // at least one conversation per row
  int64_t merged = 0, patches = 0;
  for (const vision::Grid& g : b.grids) {
    merged += vision::merged_tokens(c, g);
    patches += g.t * g.h * g.w;
  }
  EXPECT_EQ(b.pixel_values.shape(), (Shape{patches, c.patch_values()}));
  const std::vector<int64_t> ids = b.input_ids.to_ints(), y = b.labels.to_ints();
  const std::vector<double> w = b.loss_weights.to_doubles();
  EXPECT_EQ(std::count(ids.begin(), ids.end(), data::kMediaPadId), merged);
  for (int64_t r = 0; r < 12; ++r) {
    // The weighted labels are the replies, each ending in <|end|>.
    std::vector<int32_t> reply;
    for (int64_t t = 0; t < 128; ++t) {
      const size_t i = static_cast<size_t>(r * 128 + t);
      if (w[i] > 0) reply.push_back(static_cast<int32_t>(y[i]));
      if (ids[i] == data::kMediaPadId) {
        EXPECT_EQ(w[i], 0.0);
      }
    }
    ASSERT_GE(reply.size(), 2u);
    EXPECT_EQ(tok.decode({reply.back()}), "<|end|>");
    reply.pop_back();
    EXPECT_FALSE(tok.decode(reply).empty());
  }
  // Deterministic and resumable.
  const data::Batch b2 = s.next(4, 128);
  s.restore(start);
  s.next(12, 128);
  EXPECT_EQ(s.next(4, 128).input_ids.to_ints(), b2.input_ids.to_ints());
  // A seq_len too short for a grid conversation is refused with the reason.
  mix.weights = {0, 1, 0, 0, 0};
  vision::ImageTextStream g(vision::synthetic_images(50, 2), tok, c, mix, nullptr, 5);
  EXPECT_THROW(g.next(1, 40), Error);
}

TEST(Multimodal, TrainerRunsImageRowsAndResumesExactly) {
  // The multimodal recipe through the one trainer: steps 4-6 after a resume from step 3 repeat the
  // uninterrupted run bit for bit (image stream cursor, text cursor, weights, optimiser).
  const fs::path base = fs::temp_directory_path() / "myriad_fashion_trainer";
  fs::remove_all(base);
  const std::string recipe = R"(
seed = 3
[model]
preset = "tiny"
vision = "tiny"
[model.overrides]
num_hidden_layers = 2
hidden_size = 64
intermediate_size = 128
moe_intermediate_size = 32
layer_types = ["linear_attention", "full_attention"]
linear_attn_config = { kda_layers = [1], full_attn_layers = [2] }
[data]
corpus = "fashion_mnist"
vocab_size = 400
max_corpus_bytes = 150000
text_fraction = 0.3
vision_eval_images = 20
vision_eval_every = 2
[optimizer]
lr = 3e-3
[schedule]
kind = "constant"
[checkpoint]
every = 3
[log]
tensorboard = false
[[stage]]
name = "mm"
seq_len = 128
steps = 6
tokens_per_step = 512
batch_size = 4
)";
  const train::Recipe r = train::Recipe::parse(recipe);
  ASSERT_TRUE(r.model(400).vision.has_value());
  const auto losses = [&](const fs::path& out, int64_t stop, bool resume) {
    train::Trainer t(r, out.string());
    t.set_quiet(true);
    if (stop >= 0) t.stop_after(stop);
    t.run(resume);
    std::vector<double> l;
    for (const auto& h : t.history()) l.push_back(h.loss);
    return l;
  };
  const std::vector<double> full = losses(base / "full", -1, false);
  ASSERT_EQ(full.size(), 6u);
  for (double x : full) EXPECT_TRUE(std::isfinite(x));
  fs::create_directories(base / "split");
  fs::copy_file(base / "full" / "tokenizer.model", base / "split" / "tokenizer.model");
  const std::vector<double> head = losses(base / "split", 3, false);
  const std::vector<double> tail = losses(base / "split", -1, true);
  ASSERT_EQ(head.size(), 3u);
  ASSERT_EQ(tail.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(head[static_cast<size_t>(i)], full[static_cast<size_t>(i)]) << "step " << i + 1;
    EXPECT_EQ(tail[static_cast<size_t>(i)], full[static_cast<size_t>(i + 3)]) << "step " << i + 4;
  }
  // The report has the vision section: accuracy curve, confusion and sample images.
  const std::string html = [&] {
    std::ifstream f(base / "full" / "report.html");
    return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  }();
  EXPECT_NE(html.find(">Vision</h2>"), std::string::npos);
  EXPECT_NE(html.find("data:image/png;base64,"), std::string::npos);
  fs::remove_all(base);
}

TEST(Multimodal, ImageRowsReplaceThePlaceholderEmbeddings) {
  // The rows given as image_embeds land exactly where the placeholders are: giving the embedding
  // rows of other tokens equals running those tokens (in values and in gradients).
  model::ModelConfig c = model::tiny();
  c.vocab_size = 64;
  c.media_placeholder_token_id = 11;
  const model::Decoder dec = model::Decoder::random(c, 3);
  const std::vector<int64_t> with_pads = {5, 11, 11, 7, 11, 9, 11, 2, 3, 11};
  std::vector<int64_t> plain = with_pads, rows;
  const std::vector<int64_t> stand_in = {20, 21, 22, 23, 24};
  size_t k = 0;
  for (auto& t : plain)
    if (t == 11) t = stand_in[k++];
  const Tensor emb = dec.weights().get("model.embed_tokens.weight");
  const Tensor image_rows = ops::index_select(emb, 0, Tensor::from_ints(stand_in, {5}));
  model::ForwardOptions o;
  o.image_embeds = image_rows;
  const Tensor a = dec.forward(Tensor::from_ints(with_pads, {2, 5}), nullptr, o).logits_BTV;
  const Tensor b = dec.forward(Tensor::from_ints(plain, {2, 5})).logits_BTV;
  EXPECT_EQ(a.to_doubles(), b.to_doubles());
  // Wrong counts are refused.
  o.image_embeds = ops::slice(image_rows, 0, 0, 4);
  EXPECT_THROW(dec.forward(Tensor::from_ints(with_pads, {2, 5}), nullptr, o), Error);
  // Gradients reach the image rows.
  Tensor leaf = image_rows.clone();
  leaf.requires_grad_(true);
  o.image_embeds = leaf;
  ops::sum(dec.forward(Tensor::from_ints(with_pads, {2, 5}), nullptr, o).logits_BTV).backward();
  ASSERT_TRUE(leaf.grad().defined());
  double g = 0;
  for (double x : leaf.grad().to_doubles()) g += std::abs(x);
  EXPECT_GT(g, 0.0);
}

}  // namespace
}  // namespace myriad
