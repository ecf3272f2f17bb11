// Image input through the engine (issue 14): a random tiny model with a vision tower; the
// engine's greedy tokens and logprobs for prompts with images (two images of different grids in
// one prompt, placeholders split across prefill chunks, an image in the middle of a long prompt)
// equal a plain greedy loop over the uncached Decoder::forward with the encoded images spliced
// in; requests with equal tokens but other pixels never share a prefix (sequentially and
// batched together); bad image requests are refused at submit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <future>

#include "core/autograd.h"
#include "core/random.h"
#include "infer/engine.h"
#include "infer/sampling.h"
#include "ops/ops.h"
#include "tests/data/data_test_util.h"
#include "tests/model/model_test_util.h"
#include "vision/tower.h"

namespace myriad::infer {
namespace {

using model::Decoder;

const data::Tokenizer& tok() {
  return data::dtest::test_tokenizer();
}

// The tiny preset with the tiny tower (patch 4, 2 x 2 merge), O(1) random weights, f32.
const Decoder& vision_model() {
  static Decoder m = [] {
    model::ModelConfig c = model::tiny();
    c.vocab_size = tok().vocab_size();
    c.vision = vision::tiny_vision();
    c.media_placeholder_token_id = data::kMediaPadId;
    c.validate();
    return model::random_model(c, DType::F32, 17);
  }();
  return m;
}

const Decoder& text_model() {
  static Decoder m = model::random_model(model::tiny(), DType::F32, 7);
  return m;
}

constexpr int32_t kPad = data::kMediaPadId;

// n text tokens that are no control tokens (ids >= 13: past the chat and media markers).
std::vector<int32_t> text_of(int64_t n, int32_t salt) {
  std::vector<int32_t> p;
  for (int64_t i = 0; i < n; ++i)
    p.push_back(static_cast<int32_t>(13 + (i * 37 + salt * 11) % 480));
  return p;
}

// An image's block as the template writes it: <|media_begin|>image<|media_content|>, the pads,
// <|media_end|>.
std::vector<int32_t> block_of(const vision::Grid& g) {
  const int64_t n = vision::merged_tokens(vision_model().config().vision.value(), g);
  std::vector<int32_t> ids = tok().encode_parts({{vision::image_block(n), true}});
  EXPECT_EQ(std::count(ids.begin(), ids.end(), kPad), n);
  return ids;
}

void append(std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
}

// Random pixel values (the processor's range [-1, 1]) for the grids, image after image.
Tensor pixels_for(const std::vector<vision::Grid>& grids, uint64_t seed) {
  int64_t n = 0;
  for (const auto& g : grids) n += g.t * g.h * g.w;
  Generator gen(seed);
  return gen.uniform({n, vision_model().config().vision->patch_values()}, -1.0, 1.0);
}

Request image_request(std::vector<int32_t> prompt, std::vector<vision::Grid> grids, Tensor pixels,
                      int64_t max_tokens) {
  Request r;
  r.prompt = std::move(prompt);
  r.params.temperature = 0;
  r.params.max_tokens = max_tokens;
  r.params.ignore_eos = true;
  r.params.top_logprobs = 0;  // the pick's logprob
  r.pixel_values = std::move(pixels);
  r.grids = std::move(grids);
  return r;
}

Tensor ids_of(const std::vector<int32_t>& v) {
  std::vector<int64_t> w(v.begin(), v.end());
  return Tensor::from_ints(w, {1, static_cast<int64_t>(w.size())});
}

std::vector<float> last_row(const Tensor& logits) {
  const int64_t V = logits.size(-1), T = logits.size(1);
  auto d = ops::reshape(ops::slice(logits, 1, T - 1, T), {V}).to_doubles();
  return std::vector<float>(d.begin(), d.end());
}

struct Greedy {
  std::vector<int32_t> tokens;
  std::vector<double> logprobs;
  double scale = 1;  // the largest |logit| seen (tolerances are relative to it)
};

// The reference: a greedy loop over the uncached forward of the whole sequence, with the images
// encoded once and spliced at the prompt's placeholders. A generated placeholder token (the
// engine embeds it as a token, it has no image) gets its own embedding row spliced back.
// `roll`: the image rows shifted by one placeholder (to show the tolerance catches that).
Greedy reference(const Request& r, bool roll = false) {
  NoGradGuard ng;
  const Decoder& m = vision_model();
  Tensor images = m.encode_images(r.pixel_values, r.grids);
  if (roll) {  // a splicing bug: every image row one placeholder late
    const int64_t N = images.size(0);
    images = ops::concat({ops::slice(images, 0, N - 1, N), ops::slice(images, 0, 0, N - 1)}, 0);
  }
  const Tensor pad_row =
      ops::slice(m.weights().get("model.embed_tokens.weight"), 0, kPad, kPad + 1);
  std::vector<Tensor> rows = {images};
  std::vector<int32_t> ids = r.prompt;
  Greedy g;
  for (int64_t k = 0; k < r.params.max_tokens; ++k) {
    model::ForwardOptions o;
    o.image_embeds = ops::concat(rows, 0);
    const auto lg = last_row(m.forward(ids_of(ids), nullptr, o).logits_BTV);
    const auto t = static_cast<int32_t>(std::max_element(lg.begin(), lg.end()) - lg.begin());
    for (float v : lg) g.scale = std::max(g.scale, std::abs(double(v)));
    g.tokens.push_back(t);
    g.logprobs.push_back(log_softmax(lg)[static_cast<size_t>(t)]);
    ids.push_back(t);
    if (t == kPad) rows.push_back(pad_row);
  }
  return g;
}

// Cached (absorbed MLA, recurrent KDA, prefill chunks) vs uncached in f32: logprobs within this
// much of the largest |logit| (observed: up to 3e-5 with chunks of 13; the same tests with an f64
// model agree to the last bit of the float logits).
constexpr double kTol = 1e-4;

void expect_matches(const Engine::Completion& got, const Greedy& want, const std::string& what) {
  SCOPED_TRACE(what);
  EXPECT_EQ(got.finish_reason, "length") << got.error;
  EXPECT_EQ(got.tokens, want.tokens);
  ASSERT_EQ(got.logprobs.size(), want.logprobs.size());
  double worst = 0;
  for (size_t k = 0; k < want.logprobs.size(); ++k) {
    worst = std::max(worst, std::abs(got.logprobs[k] - want.logprobs[k]));
    EXPECT_NEAR(got.logprobs[k], want.logprobs[k], kTol * want.scale) << k;
  }
  std::printf("%s: max |logprob diff| %.3g (logit scale %.3g)\n", what.c_str(), worst, want.scale);
}

EngineConfig config(int64_t chunk, int64_t block) {
  EngineConfig c;
  c.block_tokens = block;
  c.prefill_chunk = chunk;
  c.cache_budget_bytes = 64 << 20;
  return c;
}

const vision::Grid kSmall{1, 8, 8}, kLarge{1, 14, 14};  // 16 and 49 merged tokens

// text, image 8 x 8, text, image 14 x 14, text.
std::vector<int32_t> two_image_prompt() {
  std::vector<int32_t> p = text_of(5, 1);
  append(p, block_of(kSmall));
  append(p, text_of(4, 2));
  append(p, block_of(kLarge));
  append(p, text_of(3, 3));
  return p;
}

TEST(EngineImages, TwoImagesGreedyEqualsUncachedForward) {
  const Request r =
      image_request(two_image_prompt(), {kSmall, kLarge}, pixels_for({kSmall, kLarge}, 1), 8);
  ASSERT_EQ(std::count(r.prompt.begin(), r.prompt.end(), kPad), 16 + 49);
  const Greedy want = reference(r);
  Engine e(vision_model(), tok(), config(2048, 16));  // the whole prompt in one chunk
  expect_matches(e.generate(r), want, "one chunk");
  // The tolerance sees a splicing error: the rows one placeholder off move the logprobs by far
  // more.
  const Greedy rolled = reference(r, true);
  double off = 0;
  for (size_t k = 0; k < want.logprobs.size() && rolled.tokens[k] == want.tokens[k]; ++k)
    off = std::max(off, std::abs(rolled.logprobs[k] - want.logprobs[k]));
  EXPECT_TRUE(rolled.tokens != want.tokens || off > 10 * kTol * want.scale) << off;
  std::printf("rows one placeholder off: tokens %s, max |logprob diff| %.3g\n",
              rolled.tokens == want.tokens ? "equal" : "differ", off);
  // The images matter: other pixels give other logprobs.
  Request other = r;
  other.pixel_values = pixels_for({kSmall, kLarge}, 2);
  const auto o = e.generate(other);
  ASSERT_EQ(o.logprobs.size(), want.logprobs.size());
  double diff = 0;
  for (size_t k = 0; k < o.logprobs.size(); ++k)
    diff = std::max(diff, std::abs(o.logprobs[k] - want.logprobs[k]));
  EXPECT_GT(diff, 1e-3);
}

TEST(EngineImages, PlaceholdersSplitAcrossPrefillChunks) {
  const Request r =
      image_request(two_image_prompt(), {kSmall, kLarge}, pixels_for({kSmall, kLarge}, 3), 6);
  const Greedy want = reference(r);
  const auto P = static_cast<int64_t>(r.prompt.size());
  for (int64_t chunk : {5, 7, 13}) {
    // Some chunk boundary falls inside an image's placeholders: the splicing carries the row
    // offset from chunk to chunk.
    bool split = false;
    for (int64_t a = chunk; a < P; a += chunk)
      split = split || (r.prompt[a - 1] == kPad && r.prompt[a] == kPad);
    EXPECT_TRUE(split) << chunk;
    Engine e(vision_model(), tok(), config(chunk, 4));
    expect_matches(e.generate(r), want, "prefill chunk " + std::to_string(chunk));
  }
}

TEST(EngineImages, ImageInTheMiddleOfALongPrompt) {
  // 150 text tokens, a 14 x 14 image (49 placeholders), 150 more, read in chunks of 32 with MLA
  // pages of 16 (the image straddles chunk and page boundaries); prefix sharing is on.
  std::vector<int32_t> p = text_of(150, 4);
  append(p, block_of(kLarge));
  append(p, text_of(150, 5));
  const Request r = image_request(p, {kLarge}, pixels_for({kLarge}, 4), 5);
  const Greedy want = reference(r);
  EngineConfig c = config(32, 16);
  Engine e(vision_model(), tok(), c);
  expect_matches(e.generate(r), want, "long prompt");
  EXPECT_EQ(e.stats().prefilled_tokens, static_cast<int64_t>(p.size()));
  EXPECT_EQ(e.stats().prefix_cache_bytes, 0);  // an image prompt leaves no shared prefix
}

// Equal token prompts with other pixels: no prefix is shared (the placeholders stand for other
// images), whether the requests come one after another or run batched together.
TEST(EngineImages, EqualTokensOtherPixelsShareNoPrefix) {
  std::vector<int32_t> p = text_of(3, 6);
  append(p, block_of(kSmall));
  append(p, text_of(12, 7));  // 36 tokens: 8 page-aligned pages of 4 would be a shareable prefix
  const auto P = static_cast<int64_t>(p.size());
  const Request a = image_request(p, {kSmall}, pixels_for({kSmall}, 5), 6);
  Request b = a;
  b.pixel_values = pixels_for({kSmall}, 6);
  const Greedy wa = reference(a), wb = reference(b);
  double diff = 0;
  for (size_t k = 0; k < wa.logprobs.size(); ++k)
    diff = std::max(diff, std::abs(wa.logprobs[k] - wb.logprobs[k]));
  ASSERT_TRUE(wa.tokens != wb.tokens || diff > 1e-3) << "the two images give the same output";

  EngineConfig c = config(8, 4);
  ASSERT_GT(c.prefix_cache_entries, 0);
  Engine e(vision_model(), tok(), c);
  expect_matches(e.generate(a), wa, "first image");
  expect_matches(e.generate(b), wb, "second image, same tokens");
  expect_matches(e.generate(a), wa, "first image again");
  EXPECT_EQ(e.stats().prefilled_tokens, 3 * P);  // every prompt read in full
  EXPECT_EQ(e.stats().prefix_cache_bytes, 0);

  // Batched together: submitted at once, each equals its reference.
  std::vector<std::future<Engine::Completion>> f;
  for (const Request* r :
       {&a, static_cast<const Request*>(&b), &a, static_cast<const Request*>(&b)})
    f.push_back(std::async(std::launch::async, [&e, r] { return e.generate(*r); }));
  for (size_t i = 0; i < f.size(); ++i)
    expect_matches(f[i].get(), i % 2 ? wb : wa, "batched " + std::to_string(i));

  // A text prompt on the same engine still leaves its prefix (sharing is off for images only).
  const std::vector<int32_t> text = text_of(30, 8);
  Request t = image_request(text, {}, Tensor{}, 2);
  EXPECT_EQ(e.generate(t).finish_reason, "length");
  EXPECT_GT(e.stats().prefix_cache_bytes, 0);
}

TEST(EngineImages, BadImageRequestsAreRefusedAtSubmit) {
  Engine e(vision_model(), tok(), config(64, 16));
  auto cb = [](const TokenEvent&) { return true; };
  auto expect_bad = [&](Engine& eng, Request r, const std::string& words) {
    try {
      eng.submit(std::move(r), cb);
      ADD_FAILURE() << "no throw for " << words;
    } catch (const std::invalid_argument& ex) {
      EXPECT_NE(std::string(ex.what()).find(words), std::string::npos) << ex.what();
    }
  };
  const std::vector<int32_t> p = two_image_prompt();
  const std::vector<vision::Grid> grids = {kSmall, kLarge};
  const Tensor px = pixels_for(grids, 7);
  // Placeholders vs merged tokens: one pad too few, one too many, images for a prompt without.
  std::vector<int32_t> fewer = p;
  fewer.erase(std::find(fewer.begin(), fewer.end(), kPad));
  expect_bad(e, image_request(fewer, grids, px, 4), "64 image placeholders for 65 image tokens");
  std::vector<int32_t> more = p;
  more.insert(more.begin() + 2, kPad);
  expect_bad(e, image_request(more, grids, px, 4), "66 image placeholders for 65 image tokens");
  expect_bad(e, image_request(text_of(8, 1), grids, px, 4), "0 image placeholders");
  // pixel_values of the wrong shape: a patch short, a value short, 3-D, missing.
  const int64_t pv = vision_model().config().vision->patch_values();
  expect_bad(e, image_request(p, grids, ops::slice(px, 0, 0, 259), 4),
             "pixel_values must be [260, 48]");
  expect_bad(e, image_request(p, grids, ops::slice(px, 1, 0, pv - 1), 4),
             "pixel_values must be [260, 48]");
  expect_bad(e, image_request(p, grids, ops::reshape(px, {1, 260, pv}), 4), "pixel_values must be");
  expect_bad(e, image_request(p, grids, Tensor{}, 4), "pixel_values must be");
  // Pixels without grids: no image tokens, 260 patches for none.
  expect_bad(e, image_request(text_of(8, 1), {}, px, 4), "pixel_values must be [0, 48]");
  // The engine still serves a valid image request afterwards.
  EXPECT_EQ(e.generate(image_request(p, grids, px, 2)).finish_reason, "length");
  EXPECT_EQ(e.stats().cache_bytes_reserved, 0);

  // A text-only model refuses images.
  Engine text(text_model(), tok(), config(64, 16));
  expect_bad(text, image_request(p, grids, px, 4), "does not take images");
  expect_bad(text, image_request(text_of(8, 1), {}, px, 4), "does not take images");
}

}  // namespace
}  // namespace myriad::infer
