// Image input through the server (issue 14): render_chat puts each image's placeholder block at
// its place among the text as template text (and refuses a request whose blocks are missing); a
// server in front of a random tiny model with a vision tower answers chat requests with PNG data
// URLs (usage counts the image's tokens, the pixels reach the model, streaming equals blocking),
// answers OpenAI-style 400s for remote URLs, corrupt, oversize and GIF images and keeps serving;
// a text-only model answers 400 image_input_not_supported.
#include <gtest/gtest.h>
#include <httplib.h>

#include <array>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "infer/engine.h"
#include "serve/server.h"
#include "serve_test_util.h"
#include "vision/fashion_mnist.h"
#include "vision/image.h"
#include "vision/tower.h"

using namespace myriad;
using namespace myriad::serve;
using json = nlohmann::json;

namespace {

// ---- render_chat ----

Message user(const std::string& content, const std::vector<size_t>& image_offsets) {
  Message m;
  m.role = "user";
  m.content = content;
  for (size_t off : image_offsets) {
    MessageImage im;
    im.offset = off;
    m.images.push_back(im);
  }
  return m;
}

Message system_message(const std::string& content) {
  Message m;
  m.role = "system";
  m.content = content;
  return m;
}

ChatRequest request_of(std::vector<Message> messages) {
  ChatRequest r;
  r.model = "tiny";
  r.messages = std::move(messages);
  return r;
}

// The prompt's parts as "T:" (template, trusted) or "U:" (request, untrusted) + text, with
// adjacent parts of one kind merged (Prompt::add may or may not merge them).
std::vector<std::string> parts_of(const Prompt& p) {
  std::vector<std::string> out;
  for (const PromptPart& part : p.parts) {
    if (part.text.empty()) continue;
    const std::string tag = part.trusted ? "T:" : "U:";
    if (!out.empty() && out.back().starts_with(tag))
      out.back() += part.text;
    else
      out.push_back(tag + part.text);
  }
  return out;
}

const std::string B1 = "<|media_begin|>image<|media_content|><|media_pad|><|media_end|>",
                  B2 = vision::image_block(3);

TEST(RenderChatImages, BlocksGoWhereTheImagesWere) {
  const ChatTemplate t = ChatTemplate::default_template();
  EXPECT_EQ(vision::image_block(1), B1);
  // Text before and after the image.
  {
    const Prompt p = render_chat(t, request_of({user("look: what is it?", {6})}), {B1});
    EXPECT_EQ(p.text, "<|user|>\nlook: " + B1 + "what is it?<|end|>\n<|assistant|>\n");
    EXPECT_EQ(parts_of(p),
              (std::vector<std::string>{"T:<|user|>\n", "U:look: ", "T:" + B1, "U:what is it?",
                                        "T:<|end|>\n<|assistant|>\n"}));
  }
  // Two images in one message: at the start and the end, and two at one offset keep their order.
  {
    const Prompt p = render_chat(t, request_of({user("ab", {0, 2})}), {B1, B2});
    EXPECT_EQ(p.text, "<|user|>\n" + B1 + "ab" + B2 + "<|end|>\n<|assistant|>\n");
    const Prompt q = render_chat(t, request_of({user("a|b", {1, 1})}), {B1, B2});
    EXPECT_EQ(q.text, "<|user|>\na" + B1 + B2 + "|b<|end|>\n<|assistant|>\n");
    EXPECT_EQ(parts_of(q), (std::vector<std::string>{"T:<|user|>\n", "U:a", "T:" + B1 + B2, "U:|b",
                                                     "T:<|end|>\n<|assistant|>\n"}));
    // An image-only message.
    const Prompt r = render_chat(t, request_of({user("", {0})}), {B2});
    EXPECT_EQ(r.text, "<|user|>\n" + B2 + "<|end|>\n<|assistant|>\n");
  }
  // Images in two messages, a message without images between: blocks are used in order.
  {
    Message a;
    a.role = "assistant";
    a.content = "a shoe";
    const Prompt p = render_chat(
        t, request_of({system_message("be brief"), user("x", {1}), a, user("and y", {0, 5})}),
        {B1, B2, B1});
    EXPECT_EQ(p.text, "<|system|>\nbe brief<|end|>\n<|user|>\nx" + B1 +
                          "<|end|>\n<|assistant|>\na shoe<|end|>\n<|user|>\n" + B2 + "and y" + B1 +
                          "<|end|>\n<|assistant|>\n");
  }
  // The request's text stays untrusted even when it spells a marker.
  {
    const Prompt p = render_chat(t, request_of({user("<|media_pad|>", {0})}), {B1});
    EXPECT_EQ(parts_of(p), (std::vector<std::string>{"T:<|user|>\n" + B1, "U:<|media_pad|>",
                                                     "T:<|end|>\n<|assistant|>\n"}));
  }
}

TEST(RenderChatImages, MissingBlocksThrow) {
  const ChatTemplate t = ChatTemplate::default_template();
  EXPECT_THROW(render_chat(t, request_of({user("look", {4})})), Error);
  EXPECT_THROW(render_chat(t, request_of({user("look", {0, 4})}), {B1}), Error);
  EXPECT_THROW(render_chat(t, request_of({user("a", {0}), user("b", {1})}), {B1}), Error);
  EXPECT_NO_THROW(render_chat(t, request_of({user("a", {0}), user("b", {1})}), {B1, B2}));
  EXPECT_NO_THROW(render_chat(t, request_of({user("no images", {})})));
}

// ---- the server ----

// A 28 x 28 grey image (a bright square on black; `salt` moves it) as a PNG.
std::string png(int salt, int64_t rows = 28, int64_t cols = 28) {
  std::vector<uint8_t> px(static_cast<size_t>(rows * cols), 0);
  for (int64_t y = 0; y < rows; ++y)
    for (int64_t x = 0; x < cols; ++x)
      if (y >= 4 + salt && y < 16 + salt && x >= 6 && x < 20 - salt)
        px[static_cast<size_t>(y * cols + x)] = static_cast<uint8_t>(200 + 5 * salt);
  return vision::grey_png(px.data(), rows, cols);
}

std::string data_url(const std::string& bytes, const std::string& type = "image/png") {
  return "data:" + type + ";base64," + vision::base64(bytes);
}

uint32_t crc32(std::string_view s) {
  uint32_t c = 0xFFFFFFFFu;
  for (unsigned char ch : s) {
    c ^= ch;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
  }
  return ~c;
}

// A PNG whose structure and CRCs are valid but whose IDAT holds no zlib stream: the header
// check passes, decoding fails.
std::string png_with_bad_zlib(std::string p) {
  const size_t at = p.find("IDAT");
  EXPECT_NE(at, std::string::npos);
  const auto len = (uint32_t(uint8_t(p[at - 4])) << 24) | (uint32_t(uint8_t(p[at - 3])) << 16) |
                   (uint32_t(uint8_t(p[at - 2])) << 8) | uint32_t(uint8_t(p[at - 1]));
  EXPECT_GE(len, 2u);
  p[at + 4] = p[at + 5] = static_cast<char>(0xFF);  // no deflate header
  const uint32_t crc = crc32(std::string_view(p).substr(at, 4 + len));
  for (int k = 0; k < 4; ++k) p[at + 4 + len + k] = static_cast<char>(crc >> (24 - 8 * k));
  return p;
}

std::string fixture(const std::string& name) {
  std::ifstream f(std::string(MYRIAD_SOURCE_DIR) + "/tests/fixtures/images/" + name,
                  std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

infer::EngineConfig engine_config() {
  infer::EngineConfig c;
  c.max_batch = 8;
  c.cache_budget_bytes = 128ll << 20;
  c.block_tokens = 16;
  c.prefill_chunk = 24;  // an image's placeholders span chunks
  c.max_context = 2048;
  return c;
}

ServeConfig serve_config() {
  ServeConfig c;
  c.port = 0;
  c.threads = 8;
  c.limits.model = "tiny";
  c.limits.max_tokens = 512;
  c.limits.context = 2048;
  c.limits.max_image_pixels = 32 * 32;  // 28 x 28 fits, 40 x 40 does not
  return c;
}

// The serving tests' tokenizer (its control tokens 9..12 are the media markers), a random tiny
// model with the tiny tower behind an engine and a server; and a text-only one.
struct Env {
  data::Tokenizer tok = data::Tokenizer::load(test::model_dir() + "/tokenizer.model");
  model::Decoder model = [this] {
    model::ModelConfig c = model::tiny();
    c.num_hidden_layers = 4;
    model::default_layout(4, c.linear_attn_config.kda_layers,
                          c.linear_attn_config.full_attn_layers);
    c.vocab_size = tok.vocab_size();
    c.model_max_length = 4096;
    c.vision = vision::tiny_vision();
    c.media_placeholder_token_id = data::kMediaPadId;
    c.validate();
    return model::Decoder::random(c, 23);
  }();
  infer::Engine engine{model, tok, engine_config()};
  Server server{engine, tok, ChatTemplate::default_template(), serve_config()};
  int port = server.start();

  model::Decoder text_model = model::Decoder::load(test::model_dir());
  infer::Engine text_engine{text_model, tok, engine_config()};
  Server text_server{text_engine, tok, ChatTemplate::default_template(), serve_config()};
  int text_port = text_server.start();
};

Env& env() {
  static Env e;
  return e;
}

json image_part(const std::string& url) {
  return {{"type", "image_url"}, {"image_url", {{"url", url}}}};
}

json text_part(const std::string& text) {
  return {{"type", "text"}, {"text", text}};
}

json chat(const json& content, int max_tokens = 6) {
  return {{"model", "tiny"},
          {"messages", {{{"role", "user"}, {"content", content}}}},
          {"max_tokens", max_tokens},
          {"temperature", 0}};
}

// POST /v1/chat/completions; the status and the JSON body.
std::pair<int, json> post(const json& body, int port = 0) {
  httplib::Client c("127.0.0.1", port ? port : env().port);
  c.set_read_timeout(120, 0);
  auto r = c.Post("/v1/chat/completions", body.dump(), "application/json");
  EXPECT_TRUE(r) << "no response";
  if (!r) return {0, json()};
  return {r->status, json::parse(r->body, nullptr, false)};
}

int prompt_tokens(const json& content) {
  const auto [status, r] = post(chat(content, 1));
  EXPECT_EQ(status, 200) << r.dump();
  return status == 200 ? r["usage"]["prompt_tokens"].get<int>() : -1;
}

// The ids of an image's block (16 merged tokens for a 28 x 28 image: padded to 32 x 32, patches
// of 4, 2 x 2 merge).
std::vector<int32_t> block_ids(const data::Tokenizer& tok, int64_t merged) {
  return tok.encode_parts({{vision::image_block(merged), true}});
}

void expect_400(const json& body, const std::string& code, const std::string& needle,
                int port = 0) {
  SCOPED_TRACE(code + ": " + needle);
  const auto [status, r] = post(body, port);
  EXPECT_EQ(status, 400) << r.dump();
  ASSERT_TRUE(r.is_object() && r.contains("error")) << r.dump();
  const json& e = r["error"];
  EXPECT_EQ(e["code"], code);
  EXPECT_EQ(e["type"], "invalid_request_error");
  EXPECT_EQ(e["param"], "messages[0].content");
  ASSERT_TRUE(e["message"].is_string());
  EXPECT_NE(e["message"].get<std::string>().find(needle), std::string::npos) << e["message"];
}

TEST(ServerImages, ChatWithAnImageCountsItsTokens) {
  const vision::Processed p = vision::preprocess(
      vision::decode_image(png(0)), vision::PreprocessOptions::from(*env().model.config().vision));
  ASSERT_EQ(p.grid, (vision::Grid{1, 8, 8}));
  ASSERT_EQ(p.tokens, 16);
  const auto block = block_ids(env().tok, p.tokens);
  ASSERT_EQ(std::count(block.begin(), block.end(), data::kMediaPadId), 16);

  const json content = {text_part("What is this?"), image_part(data_url(png(0)))};
  const auto [status, r] = post(chat(content, 6));
  ASSERT_EQ(status, 200) << r.dump();
  EXPECT_EQ(r["object"], "chat.completion");
  EXPECT_TRUE(r["choices"][0]["message"]["content"].is_string());
  const json& u = r["usage"];
  EXPECT_GE(u["completion_tokens"].get<int>(), 1);
  EXPECT_EQ(u["total_tokens"], u["prompt_tokens"].get<int>() + u["completion_tokens"].get<int>());
  // The image's block (its 16 placeholders and the marker tokens) counts as prompt tokens.
  const int text_only = prompt_tokens(json::array({text_part("What is this?")}));
  EXPECT_EQ(u["prompt_tokens"].get<int>(), text_only + static_cast<int>(block.size()));
  // Two images, in two messages: both blocks count.
  json two = chat(content, 1);
  two["messages"].push_back({{"role", "assistant"}, {"content", "a thing"}});
  two["messages"].push_back(
      {{"role", "user"}, {"content", {text_part("And this?"), image_part(data_url(png(2)))}}});
  json two_text = two;
  two_text["messages"][0]["content"] = json::array({text_part("What is this?")});
  two_text["messages"][2]["content"] = json::array({text_part("And this?")});
  const auto [s2, r2] = post(two);
  const auto [s2t, r2t] = post(two_text);
  ASSERT_EQ(s2, 200) << r2.dump();
  ASSERT_EQ(s2t, 200) << r2t.dump();
  EXPECT_EQ(r2["usage"]["prompt_tokens"].get<int>(),
            r2t["usage"]["prompt_tokens"].get<int>() + 2 * static_cast<int>(block.size()));
  // An image before the text (the text then tokenizes on its own): the rendered prompt's ids,
  // both images' placeholders among them.
  two["messages"][2]["content"] =
      json::array({image_part(data_url(png(2))), text_part("And this?")});
  const auto [s3, r3] = post(two);
  ASSERT_EQ(s3, 200) << r3.dump();
  const std::string b = vision::image_block(16);
  const auto ids = prompt_ids(
      env().tok, render_chat(ChatTemplate::default_template(),
                             parse_chat_request(two.dump(), serve_config().limits), {b, b}));
  EXPECT_EQ(std::count(ids.begin(), ids.end(), data::kMediaPadId), 32);
  EXPECT_EQ(r3["usage"]["prompt_tokens"].get<int>(), static_cast<int>(ids.size()));
  // User text that spells a marker stays text: the placeholders still match the image.
  EXPECT_EQ(post(chat(json::array(
                     {text_part("<|media_pad|><|media_pad|>"), image_part(data_url(png(0)))})))
                .first,
            200);
}

TEST(ServerImages, ThePixelsReachTheModel) {
  // Same text, same image: the same logprobs; another image: other logprobs.
  auto first_logprobs = [](int salt) {
    json body = chat(json::array({image_part(data_url(png(salt))), text_part("What is this?")}), 3);
    body["logprobs"] = true;
    const auto [status, r] = post(body);
    EXPECT_EQ(status, 200) << r.dump();
    std::vector<double> out;
    if (status == 200)
      for (const auto& t : r["choices"][0]["logprobs"]["content"])
        out.push_back(t["logprob"].get<double>());
    return out;
  };
  const auto a = first_logprobs(0), again = first_logprobs(0), b = first_logprobs(3);
  ASSERT_FALSE(a.empty());
  ASSERT_FALSE(b.empty());
  EXPECT_EQ(a, again);
  EXPECT_NE(a[0], b[0]);

  // Streaming equals blocking.
  json body = chat(json::array({image_part(data_url(png(1))), text_part("What is this?")}), 8);
  const auto [status, r] = post(body);
  ASSERT_EQ(status, 200) << r.dump();
  body["stream"] = true;
  httplib::Client c("127.0.0.1", env().port);
  c.set_read_timeout(120, 0);
  auto s = c.Post("/v1/chat/completions", body.dump(), "application/json");
  ASSERT_TRUE(s);
  ASSERT_EQ(s->status, 200);
  std::string text;
  for (size_t pos = 0; (pos = s->body.find("data: {", pos)) != std::string::npos;) {
    const size_t end = s->body.find("\n\n", pos);
    const json ev = json::parse(s->body.substr(pos + 6, end - pos - 6));
    if (!ev["choices"].empty() && ev["choices"][0]["delta"].contains("content"))
      text += ev["choices"][0]["delta"]["content"].get<std::string>();
    pos = end;
  }
  EXPECT_NE(s->body.find("data: [DONE]"), std::string::npos);
  EXPECT_EQ(text, r["choices"][0]["message"]["content"].get<std::string>());
}

TEST(ServerImages, BadImagesAre400sAndTheServerKeepsServing) {
  const json q = text_part("What is this?");
  const std::string good = png(0);
  expect_400(chat(json::array({image_part("https://example.com/cat.png"), q})), "invalid_image_url",
             "does not fetch");
  expect_400(chat(json::array({image_part("data:image/png;base64,@@@@"), q})), "invalid_image_url",
             "base64");
  // Corrupt: bytes that are no image, a truncated PNG, a PNG whose CRC fails, and a PNG whose
  // header and CRCs are right but whose pixel data does not inflate (found when decoding).
  expect_400(chat(json::array({image_part(data_url("not an image at all")), q})),
             "invalid_image_format", "invalid image");
  expect_400(chat(json::array({image_part(data_url(good.substr(0, good.size() / 2))), q})),
             "invalid_image_format", "truncated");
  std::string flipped = good;
  flipped[flipped.find("IDAT") + 6] ^= 0x5a;
  expect_400(chat(json::array({image_part(data_url(flipped)), q})), "invalid_image_format",
             "invalid image");
  const std::string bad_zlib = png_with_bad_zlib(good);
  ASSERT_NO_THROW(vision::probe_image(bad_zlib));
  ASSERT_THROW(vision::decode_image(bad_zlib), Error);
  expect_400(chat(json::array({image_part(data_url(bad_zlib)), q})), "invalid_image_format",
             "invalid image");
  // Oversize: 40 x 40 = 1600 pixels over the limit of 32 x 32.
  expect_400(chat(json::array({image_part(data_url(png(0, 40, 40))), q})), "image_too_large",
             "1600 pixels");
  // GIF: as what it is, and disguised as a PNG.
  const std::string gif = fixture("tiny.gif");
  ASSERT_TRUE(gif.starts_with("GIF8"));
  expect_400(chat(json::array({image_part(data_url(gif, "image/gif")), q})), "invalid_image_url",
             "image/gif");
  expect_400(chat(json::array({image_part(data_url(gif)), q})), "invalid_image_format", "GIF");
  // Still serving: health, a good image, a text request.
  httplib::Client c("127.0.0.1", env().port);
  auto h = c.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  EXPECT_EQ(post(chat(json::array({image_part(data_url(good)), q}))).first, 200);
  EXPECT_EQ(post(chat("hello")).first, 200);
  const auto st = env().engine.stats();
  EXPECT_EQ(st.cache_bytes_reserved, 0);
}

TEST(ServerImages, TextOnlyModelRefusesImages) {
  const json body = chat(json::array({text_part("What is this?"), image_part(data_url(png(0)))}));
  expect_400(body, "image_input_not_supported", "does not accept images", env().text_port);
  // A bad image to a text-only model is still a bad image.
  expect_400(chat(json::array({image_part("https://example.com/x.png")})), "invalid_image_url",
             "does not fetch", env().text_port);
  EXPECT_EQ(post(chat("hello"), env().text_port).first, 200);
}

}  // namespace
