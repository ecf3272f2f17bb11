#include "vision/fashion_mnist.h"

#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "core/autograd.h"
#include "core/error.h"
#include "model/decoder.h"
#include "ops/ops.h"

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
#pragma GCC diagnostic ignored "-Wsign-compare"
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wconversion"
#define STB_IMAGE_WRITE_IMPLEMENTATION
#define STB_IMAGE_WRITE_STATIC
#define STBI_WRITE_NO_STDIO
#include <stb/stb_image_write.h>
#pragma GCC diagnostic pop

namespace myriad::vision {

namespace {

std::string read_gzip(const std::string& path) {
  gzFile gz = gzopen(path.c_str(), "rb");
  MYRIAD_CHECK(gz != nullptr, "fashion-mnist: cannot open ", path,
               " (install Debian's dataset-fashion-mnist: scripts/install-deps.sh)");
  std::string out;
  char buf[1 << 16];
  int n = 0;
  while ((n = gzread(gz, buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  int err = 0;
  const char* msg = gzerror(gz, &err);
  const std::string what = msg ? msg : "";
  gzclose(gz);
  MYRIAD_CHECK(n == 0 && (err == Z_OK || err == Z_STREAM_END), "fashion-mnist: ", path,
               " is corrupt or truncated (", what, ")");
  return out;
}

uint32_t be32(const std::string& s, size_t at) {
  return (static_cast<uint32_t>(static_cast<uint8_t>(s[at])) << 24) |
         (static_cast<uint32_t>(static_cast<uint8_t>(s[at + 1])) << 16) |
         (static_cast<uint32_t>(static_cast<uint8_t>(s[at + 2])) << 8) |
         static_cast<uint32_t>(static_cast<uint8_t>(s[at + 3]));
}

uint64_t mix(uint64_t a, uint64_t b) {  // splitmix64 of a combined key
  uint64_t z = a * 0x9e3779b97f4a7c15ULL + b + 0x632be59bd9b4e019ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

constexpr const char* kPositions[4] = {"top-left", "top-right", "bottom-left", "bottom-right"};
bool is_shoe(int label) {
  return label == 5 || label == 7 || label == 9;
}

std::string trim(std::string s) {
  s.erase(0, s.find_first_not_of(" \n\t"));
  s.erase(s.find_last_not_of(" \n\t") + 1);
  return s;
}

}  // namespace

ImageSet load_fashion_mnist(const std::string& split, const std::string& dir) {
  MYRIAD_CHECK(split == "train" || split == "test",
               "fashion-mnist: split must be train or test, got ", split);
  const std::string stem = split == "train" ? "train" : "t10k";
  const std::string ip = dir + "/" + stem + "-images-idx3-ubyte.gz";
  const std::string lp = dir + "/" + stem + "-labels-idx1-ubyte.gz";
  const std::string im = read_gzip(ip), lb = read_gzip(lp);
  MYRIAD_CHECK(im.size() >= 16 && be32(im, 0) == 0x803, "fashion-mnist: ", ip,
               " is not an IDX image file (magic 0x00000803)");
  MYRIAD_CHECK(lb.size() >= 8 && be32(lb, 0) == 0x801, "fashion-mnist: ", lp,
               " is not an IDX label file (magic 0x00000801)");
  ImageSet s;
  const uint64_t n = be32(im, 4);
  s.rows = be32(im, 8);
  s.cols = be32(im, 12);
  MYRIAD_CHECK(s.rows == 28 && s.cols == 28, "fashion-mnist: ", ip, " holds ", s.rows, "x", s.cols,
               " images, expected 28x28");
  MYRIAD_CHECK(be32(lb, 4) == n, "fashion-mnist: ", lp, " has ", be32(lb, 4), " labels for ", n,
               " images");
  MYRIAD_CHECK(im.size() == 16 + n * 784, "fashion-mnist: ", ip, " has ", im.size() - 16,
               " pixel bytes, expected ", n * 784);
  MYRIAD_CHECK(lb.size() == 8 + n, "fashion-mnist: ", lp, " has ", lb.size() - 8,
               " label bytes, expected ", n);
  s.pixels.assign(im.begin() + 16, im.end());
  s.labels.assign(lb.begin() + 8, lb.end());
  for (uint8_t l : s.labels) MYRIAD_CHECK(l < 10, "fashion-mnist: ", lp, " has label ", int(l));
  return s;
}

bool fashion_mnist_available(const std::string& dir) {
  namespace fs = std::filesystem;
  for (const char* f : {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                        "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"})
    if (!fs::exists(fs::path(dir) / f)) return false;
  return true;
}

ImageSet synthetic_images(int64_t n, uint64_t seed) {
  ImageSet s;
  s.synthetic = true;
  s.pixels.assign(static_cast<size_t>(n * 784), 0);
  std::mt19937_64 rng(seed);
  for (int64_t i = 0; i < n; ++i) {
    const int c = static_cast<int>(rng() % 10);
    s.labels.push_back(static_cast<uint8_t>(c));
    uint8_t* p = s.pixels.data() + i * 784;
    // Class c: a bright block whose place and shape are the class, jittered by a pixel or two.
    const int64_t y0 = 2 + (c / 5) * 12 + static_cast<int64_t>(rng() % 3);
    const int64_t x0 = 2 + (c % 5) * 4 + static_cast<int64_t>(rng() % 2);
    for (int64_t y = y0; y < y0 + 10; ++y)
      for (int64_t x = x0; x < x0 + 4 + (c % 3); ++x)
        p[y * 28 + x] = static_cast<uint8_t>(180 + rng() % 70);
    for (int k = 0; k < 20; ++k) p[rng() % 784] = static_cast<uint8_t>(rng() % 120);
  }
  return s;
}

ImageSet fashion_or_synthetic(const std::string& split, int64_t n_fallback, uint64_t seed) {
  if (fashion_mnist_available()) return load_fashion_mnist(split);
  return synthetic_images(n_fallback, split == "train" ? seed : mix(seed, 1));
}

Patches patchify_grey(const uint8_t* img, int64_t rows, int64_t cols, const VisionConfig& c) {
  const int64_t p = c.patch_size;
  const int64_t fh = p * c.merge_kernel_h, fw = p * c.merge_kernel_w;
  const int64_t H = (rows + fh - 1) / fh * fh, W = (cols + fw - 1) / fw * fw;
  Patches out;
  out.grid = {1, H / p, W / p};
  const int64_t pv = 3 * p * p;
  out.values.assign(static_cast<size_t>(out.grid.h * out.grid.w * pv), -1.0f);  // black padding
  for (int64_t gy = 0; gy < out.grid.h; ++gy)
    for (int64_t gx = 0; gx < out.grid.w; ++gx) {
      float* dst = out.values.data() + (gy * out.grid.w + gx) * pv;
      for (int64_t y = 0; y < p; ++y)
        for (int64_t x = 0; x < p; ++x) {
          const int64_t sy = gy * p + y, sx = gx * p + x;
          if (sy >= rows || sx >= cols) continue;
          const float v = (static_cast<float>(img[sy * cols + sx]) - 127.5f) / 127.5f;
          for (int64_t ch = 0; ch < 3; ++ch) dst[ch * p * p + y * p + x] = v;
        }
    }
  return out;
}

const char* question_name(Question q) {
  switch (q) {
    case Question::Caption:
      return "caption";
    case Question::GridWhat:
      return "grid_what";
    case Question::GridWhere:
      return "grid_where";
    case Question::GridCount:
      return "grid_count";
    case Question::GridExists:
      return "grid_exists";
  }
  return "?";
}

Example make_example(const ImageSet& set, Question kind, uint64_t seed, int64_t i) {
  MYRIAD_CHECK(set.size() > 0, "fashion-mnist: no images");
  std::mt19937_64 rng(mix(mix(seed, static_cast<uint64_t>(i)), static_cast<uint64_t>(kind)));
  const auto draw = [&] { return static_cast<int64_t>(rng() % static_cast<uint64_t>(set.size())); };
  Example e;
  e.kind = kind;
  if (kind == Question::Caption) {
    const int64_t k = draw();
    e.label = set.labels[static_cast<size_t>(k)];
    e.image.assign(set.image(k), set.image(k) + 784);
    e.rows = e.cols = 28;
    e.question = "What is this?";
    e.answer = kFashionClasses[static_cast<size_t>(e.label)];
    return e;
  }
  // A 2×2 canvas; `avoid` redraws a cell until its class differs.
  std::array<int64_t, 4> cell{};
  const auto draw_not = [&](int avoid) {
    for (;;) {
      const int64_t k = draw();
      if (set.labels[static_cast<size_t>(k)] != avoid) return k;
    }
  };
  for (auto& k : cell) k = draw();
  const auto label = [&](int pos) {
    return static_cast<int>(set.labels[static_cast<size_t>(cell[pos])]);
  };
  if (kind == Question::GridWhat) {
    const int pos = static_cast<int>(rng() % 4);
    e.question = std::string("What is ") + kPositions[pos] + "?";
    e.answer = kFashionClasses[static_cast<size_t>(label(pos))];
  } else if (kind == Question::GridWhere) {
    const int t = static_cast<int>(rng() % 10);
    const bool present = rng() % 2 == 0;
    const int pos = static_cast<int>(rng() % 4);
    for (int q = 0; q < 4; ++q)
      if (!present || q != pos) cell[q] = draw_not(t);
    if (present)
      while (label(pos) != t) cell[pos] = draw();
    e.question = std::string("Where is the ") + kFashionClasses[t] + "?";
    e.answer = present ? kPositions[pos] : "none";
  } else if (kind == Question::GridCount) {
    int n = 0;
    for (int q = 0; q < 4; ++q) n += is_shoe(label(q)) ? 1 : 0;
    e.question = "How many shoes?";
    e.answer = std::to_string(n);
  } else {
    const int t = static_cast<int>(rng() % 10);
    const bool present = rng() % 2 == 0;
    for (int q = 0; q < 4; ++q) cell[q] = draw_not(t);
    if (present) {
      const int pos = static_cast<int>(rng() % 4);
      while (label(pos) != t) cell[pos] = draw();
    }
    e.question = std::string("Is there a ") + kFashionClasses[t] + "?";
    e.answer = present ? "yes" : "no";
  }
  e.rows = e.cols = 56;
  e.image.assign(56 * 56, 0);
  for (int q = 0; q < 4; ++q) {
    const uint8_t* src = set.image(cell[q]);
    const int64_t oy = (q / 2) * 28, ox = (q % 2) * 28;
    for (int64_t y = 0; y < 28; ++y)
      std::copy(src + y * 28, src + y * 28 + 28, e.image.data() + (oy + y) * 56 + ox);
  }
  return e;
}

Rendered render(const Example& e, const data::Tokenizer& tok, const VisionConfig& c) {
  Rendered r;
  r.patches = patchify_grey(e.image.data(), e.rows, e.cols, c);
  // The default chat template (serve::ChatTemplate::default_template) with the image first in
  // the user's message, as the server renders an OpenAI message whose parts are [image, text].
  const std::string prompt = "<|user|>\n" + image_block(merged_tokens(c, r.patches.grid)) +
                             e.question + "<|end|>\n<|assistant|>\n";
  r.prompt = tok.encode_parts({{prompt, true}});
  r.answer = tok.encode_parts({{e.answer, false}, {"<|end|>", true}});
  return r;
}

// ---- The stream ----

struct ImageTextStream::Impl {
  ImageSet images;
  const data::Tokenizer& tok;
  VisionConfig cfg;
  TaskMix mix;
  std::unique_ptr<data::TokenStream> text;
  uint64_t seed;
  int64_t row = 0;      // rows handed out so far (each row's text-or-images draw)
  int64_t example = 0;  // conversations handed out so far (the position in the seeded sequence)
};

ImageTextStream::ImageTextStream(ImageSet images, const data::Tokenizer& tok, VisionConfig cfg,
                                 TaskMix m, std::unique_ptr<data::TokenStream> text, uint64_t seed)
    : impl_(std::make_unique<Impl>(
          Impl{std::move(images), tok, std::move(cfg), m, std::move(text), seed, 0, 0})) {
  MYRIAD_CHECK(impl_->images.size() > 0, "vision stream: no images");
  double w = 0;
  for (double x : m.weights) {
    MYRIAD_CHECK(x >= 0, "vision stream: question weights must be >= 0");
    w += x;
  }
  MYRIAD_CHECK(w > 0, "vision stream: all question weights are 0");
  MYRIAD_CHECK(m.text_fraction >= 0 && m.text_fraction < 1,
               "vision stream: text_fraction must be in [0, 1), got ", m.text_fraction);
  MYRIAD_CHECK(m.text_fraction == 0 || impl_->text, "vision stream: text rows need a token stream");
}

ImageTextStream::~ImageTextStream() = default;

data::Batch ImageTextStream::next(int64_t B, int64_t T) {
  Impl& s = *impl_;
  const int32_t eos = s.tok.eos();
  std::vector<int64_t> ids(static_cast<size_t>(B * T)), labels(static_cast<size_t>(B * T));
  std::vector<float> wts(static_cast<size_t>(B * T), 0.0f), pixels;
  data::Batch b;
  double wsum = 0;
  for (double x : s.mix.weights) wsum += x;
  for (int64_t r = 0; r < B; ++r, ++s.row) {
    std::mt19937_64 rng(mix(s.seed, static_cast<uint64_t>(s.row)));
    const double u = std::uniform_real_distribution<double>(0, 1)(rng);
    int64_t* id = ids.data() + r * T;
    int64_t* lb = labels.data() + r * T;
    float* wt = wts.data() + r * T;
    if (u < s.mix.text_fraction) {
      const data::Batch t = s.text->next(1, T);
      const std::vector<int64_t> ti = t.input_ids.to_ints(), tl = t.labels.to_ints();
      std::copy(ti.begin(), ti.end(), id);
      std::copy(tl.begin(), tl.end(), lb);
      std::fill(wt, wt + T, 1.0f);
      b.doc_starts.push_back({0});
      continue;
    }
    // Conversations packed one after another while they fit (the rest of the row is eos with
    // no loss); each one's answer is weighted.
    std::vector<int32_t> seq;
    std::vector<float> weight;
    std::vector<int64_t> starts;
    for (;;) {
      std::mt19937_64 pick(mix(s.seed ^ 0x5bd1e995ULL, static_cast<uint64_t>(s.example)));
      double v = std::uniform_real_distribution<double>(0, wsum)(pick);
      int k = 0;
      while (k + 1 < kQuestionKinds && v >= s.mix.weights[static_cast<size_t>(k)])
        v -= s.mix.weights[static_cast<size_t>(k++)];
      const Example e = make_example(s.images, static_cast<Question>(k), s.seed, s.example);
      const Rendered rd = render(e, s.tok, s.cfg);
      const size_t n = rd.prompt.size() + rd.answer.size();
      MYRIAD_CHECK(!seq.empty() || static_cast<int64_t>(n) <= T + 1, "vision stream: a ",
                   question_name(e.kind), " conversation takes ", n,
                   " tokens; the stage's seq_len ", T, " is too short");
      if (static_cast<int64_t>(seq.size() + n) > T + 1) break;  // it starts the next row
      ++s.example;
      starts.push_back(static_cast<int64_t>(seq.size()));
      seq.insert(seq.end(), rd.prompt.begin(), rd.prompt.end());
      seq.insert(seq.end(), rd.answer.begin(), rd.answer.end());
      weight.resize(seq.size(), 0.0f);
      std::fill(weight.end() - static_cast<std::ptrdiff_t>(rd.answer.size()), weight.end(), 1.0f);
      pixels.insert(pixels.end(), rd.patches.values.begin(), rd.patches.values.end());
      b.grids.push_back(rd.patches.grid);
    }
    const auto n = static_cast<int64_t>(seq.size());
    for (int64_t t = 0; t < T; ++t) {
      id[t] = t < n ? seq[static_cast<size_t>(t)] : eos;
      lb[t] = t + 1 < n ? seq[static_cast<size_t>(t + 1)] : ops::kIgnoreIndex;
      wt[t] = t + 1 < n ? weight[static_cast<size_t>(t + 1)] : 0.0f;  // the answers only
    }
    b.doc_starts.push_back(std::move(starts));
  }
  b.input_ids = Tensor::from_ints(ids, {B, T});
  b.labels = Tensor::from_ints(labels, {B, T});
  b.loss_weights = Tensor::from_floats(wts, {B, T});
  if (!pixels.empty()) {
    const int64_t pv = s.cfg.patch_values();
    b.pixel_values = Tensor::from_floats(pixels, {static_cast<int64_t>(pixels.size()) / pv, pv});
  }
  return b;
}

std::string ImageTextStream::state() const {
  nlohmann::json j;
  j["row"] = impl_->row;
  j["example"] = impl_->example;
  j["seed"] = impl_->seed;
  if (impl_->text) j["text"] = impl_->text->state().to_json();
  return j.dump();
}

void ImageTextStream::restore(const std::string& text) {
  const nlohmann::json j = nlohmann::json::parse(text);
  MYRIAD_CHECK(j.at("seed").get<uint64_t>() == impl_->seed,
               "vision stream: the saved state belongs to another seed");
  impl_->row = j.at("row").get<int64_t>();
  impl_->example = j.at("example").get<int64_t>();
  if (impl_->text && j.contains("text"))
    impl_->text->restore(data::TokenStream::State::from_json(j["text"].get<std::string>()));
}

// ---- Evaluation ----

std::string grey_png(const uint8_t* pixels, int64_t rows, int64_t cols) {
  std::string out;
  const auto put = [](void* ctx, void* data, int n) {
    static_cast<std::string*>(ctx)->append(static_cast<const char*>(data), static_cast<size_t>(n));
  };
  MYRIAD_CHECK(stbi_write_png_to_func(put, &out, static_cast<int>(cols), static_cast<int>(rows), 1,
                                      pixels, static_cast<int>(cols)) != 0,
               "cannot encode a PNG");
  return out;
}

std::string base64(std::string_view in) {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  for (size_t i = 0; i < in.size(); i += 3) {
    uint32_t v = static_cast<uint32_t>(static_cast<uint8_t>(in[i])) << 16;
    if (i + 1 < in.size()) v |= static_cast<uint32_t>(static_cast<uint8_t>(in[i + 1])) << 8;
    if (i + 2 < in.size()) v |= static_cast<uint32_t>(static_cast<uint8_t>(in[i + 2]));
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += i + 1 < in.size() ? kAlphabet[(v >> 6) & 63] : '=';
    out += i + 2 < in.size() ? kAlphabet[v & 63] : '=';
  }
  return out;
}

nlohmann::json eval_record(int64_t step, const FashionEval& ev, const ImageSet& test) {
  nlohmann::json j;
  j["step"] = step;
  for (int k = 0; k < kQuestionKinds; ++k) {
    const auto q = static_cast<Question>(k);
    j["accuracy"][question_name(q)] = ev.accuracy(q);
    j["asked"][question_name(q)] = ev.asked[static_cast<size_t>(k)];
  }
  j["confusion"] = ev.confusion;
  j["classes"] = kFashionClasses;
  for (const auto& [i, reply] : ev.samples)
    j["samples"].push_back({{"label", kFashionClasses[test.labels[static_cast<size_t>(i)]]},
                            {"reply", reply},
                            {"png", base64(grey_png(test.image(i), test.rows, test.cols))}});
  return j;
}

FashionEval evaluate_fashion(const model::Decoder& dec, const data::Tokenizer& tok,
                             const ImageSet& test, int64_t n_caption, int64_t n_grid, uint64_t seed,
                             int64_t batch, int64_t max_tokens) {
  NoGradGuard ng;
  const model::ModelConfig& mc = dec.config();
  MYRIAD_CHECK(mc.vision.has_value(), "vision eval: the model has no vision tower");
  const VisionConfig& vc = *mc.vision;
  int32_t end_id = -1;
  for (const auto& [text, id] : tok.special_tokens())
    if (text == "<|end|>") end_id = id;
  FashionEval ev;
  // Examples grouped by prompt length, so a batch decodes in lock step without padding.
  struct Item {
    Example e;
    Rendered r;
    int64_t index;
  };
  std::map<std::pair<int, size_t>, std::vector<Item>> groups;
  for (int64_t i = 0; i < std::min<int64_t>(n_caption, test.size()); ++i) {
    Example e;
    e.kind = Question::Caption;
    e.label = test.labels[static_cast<size_t>(i)];
    e.image.assign(test.image(i), test.image(i) + 784);
    e.rows = e.cols = 28;
    e.question = "What is this?";
    e.answer = kFashionClasses[static_cast<size_t>(e.label)];
    Rendered r = render(e, tok, vc);
    groups[{0, r.prompt.size()}].push_back({std::move(e), std::move(r), i});
  }
  for (int k = 1; k < kQuestionKinds; ++k)
    for (int64_t i = 0; i < n_grid; ++i) {
      Example e = make_example(test, static_cast<Question>(k), seed, i);
      Rendered r = render(e, tok, vc);
      groups[{k, r.prompt.size()}].push_back({std::move(e), std::move(r), i});
    }
  const Tensor& probe = dec.weights().get("model.embed_tokens.weight");
  for (auto& [key, items] : groups)
    for (size_t b0 = 0; b0 < items.size(); b0 += static_cast<size_t>(batch)) {
      const size_t b1 = std::min(items.size(), b0 + static_cast<size_t>(batch));
      const int64_t B = static_cast<int64_t>(b1 - b0);
      std::vector<float> pixels;
      std::vector<Grid> grids;
      std::vector<std::vector<int64_t>> seqs;
      for (size_t i = b0; i < b1; ++i) {
        const Rendered& r = items[i].r;
        pixels.insert(pixels.end(), r.patches.values.begin(), r.patches.values.end());
        grids.push_back(r.patches.grid);
        seqs.emplace_back(r.prompt.begin(), r.prompt.end());
      }
      const int64_t pv = vc.patch_values();
      const Tensor px = Tensor::from_floats(pixels, {static_cast<int64_t>(pixels.size()) / pv, pv})
                            .to(probe.dtype());
      const Tensor embeds = dec.encode_images(px, grids);
      std::vector<std::vector<int32_t>> replies(static_cast<size_t>(B));
      std::vector<bool> done(static_cast<size_t>(B), false);
      for (int64_t step = 0; step < max_tokens; ++step) {
        const int64_t T = static_cast<int64_t>(seqs[0].size());
        std::vector<int64_t> flat;
        for (const auto& s : seqs) flat.insert(flat.end(), s.begin(), s.end());
        model::ForwardOptions fo;
        fo.image_embeds = embeds;
        const model::ForwardOutput f = dec.forward(Tensor::from_ints(flat, {B, T}), nullptr, fo);
        const Tensor last = ops::contiguous(ops::slice(f.logits_BTV, 1, T - 1, T));
        const std::vector<double> lg = last.to(DType::F32).to_doubles();
        const int64_t V = f.logits_BTV.size(2);
        bool all = true;
        for (int64_t r = 0; r < B; ++r) {
          const double* row = lg.data() + r * V;
          const int64_t best = std::max_element(row, row + V) - row;
          seqs[static_cast<size_t>(r)].push_back(best);
          if (done[static_cast<size_t>(r)]) continue;
          if (best == end_id || best == tok.eos())
            done[static_cast<size_t>(r)] = true;
          else
            replies[static_cast<size_t>(r)].push_back(static_cast<int32_t>(best));
          all = all && done[static_cast<size_t>(r)];
        }
        if (all) break;
      }
      for (int64_t r = 0; r < B; ++r) {
        const Item& it = items[b0 + static_cast<size_t>(r)];
        const std::string reply = trim(tok.decode(replies[static_cast<size_t>(r)]));
        const auto q = static_cast<size_t>(it.e.kind);
        ++ev.asked[q];
        if (reply == it.e.answer) ++ev.correct[q];
        if (it.e.kind == Question::Caption) {
          size_t pred = 10;
          for (size_t c = 0; c < 10; ++c)
            if (reply == kFashionClasses[c]) pred = c;
          ++ev.confusion[static_cast<size_t>(it.e.label)][pred];
          if (ev.samples.size() < 16) ev.samples.emplace_back(it.index, reply);
        }
      }
    }
  return ev;
}

}  // namespace myriad::vision
