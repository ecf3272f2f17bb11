// The OpenAI wire protocol (docs/SERVING.md): request parsing and validation for
// /v1/chat/completions and /v1/completions, the chat template (a small key = value format, not
// Jinja), tool rendering and tool-call parsing of model output, and the response, stream-chunk and
// error JSON. Depends only on the standard library, nlohmann_json, src/serve/jinja.cpp (published
// models' Jinja chat templates) and src/vision/image.cpp (data: URLs and image headers), so the
// libFuzzer build (tests/fuzz/fuzz_openai_request.cpp) compiles it with those alone.
#pragma once
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace myriad::serve {

// An error for the client: HTTP status + OpenAI's {"error": {message, type, param, code}}.
struct ApiError : std::runtime_error {
  ApiError(int status, std::string message, std::string param = "", std::string code = "",
           std::string type = "");
  int status;
  std::string type, param, code;  // empty param/code are written as null
};
nlohmann::json error_json(const ApiError& e);

// Sampling for the fields a request leaves out (the model's generation_config.json; OpenAI's
// defaults otherwise).
struct SamplingDefaults {
  double temperature = 1.0, top_p = 1.0, min_p = 0.0, repetition_penalty = 1.0;
  int top_k = 0;
};

struct Limits {
  std::string model;                // the served model id; another one gives 404
  size_t max_body_bytes = 1 << 20;  // larger bodies: 413
  int64_t max_tokens = 4096;        // upper bound of max_tokens per request
  int64_t context = 4096;           // prompt + max_tokens (checked after tokenising)
  size_t max_messages = 1024, max_tools = 128, max_stop = 4;
  size_t max_images = 16;                       // image content parts per request
  int64_t max_image_pixels = int64_t{1} << 25;  // width × height of each image, from its header
  SamplingDefaults defaults{};
};

// Generation parameters as the client sent them (the server maps them to the engine's).
struct GenParams {
  double temperature = 1.0, top_p = 1.0, min_p = 0.0, repetition_penalty = 1.0;
  double presence_penalty = 0.0, frequency_penalty = 0.0;
  int top_k = 0;
  std::optional<uint64_t> seed;
  std::optional<int64_t> max_tokens;  // absent: the rest of the context, capped by Limits
  std::vector<std::string> stop;
  bool ignore_eos = false;
  int top_logprobs = -1;  // -1: no logprobs
};

struct ToolCall {
  std::string id, name, arguments;  // arguments: a JSON text as the model wrote it
  bool operator==(const ToolCall&) const = default;
};

// An image content part ({"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}})
// of a user message: the decoded bytes of its data: URL, a PNG or JPEG whose header, structure and
// size were checked (the pixels are decoded later, by vision::decode_image), and where it sat
// among the text parts.
struct MessageImage {
  std::string bytes;
  size_t offset = 0;  // byte offset in Message::content (images at one offset keep their order)
  int64_t width = 0, height = 0;
  bool operator==(const MessageImage&) const = default;
};

struct Message {
  std::string role;                         // system | developer | user | assistant | tool
  std::string content, name, tool_call_id;  // content: the text parts joined
  std::vector<ToolCall> tool_calls;
  std::vector<MessageImage> images{};  // user messages only, in content order
};

struct Tool {
  std::string name, description;
  nlohmann::json parameters;  // JSON Schema object (null when absent)
  // The same object with its keys in the client's order (a Jinja template's `tools | tojson`
  // writes them so, as transformers does); empty when absent.
  std::string parameters_text{};
};

struct ToolChoice {
  enum Mode { None, Auto, Required, Function } mode = Auto;
  std::string name;  // Function
};

struct ChatRequest {
  std::string model;
  std::vector<Message> messages;
  GenParams params;
  bool stream = false, include_usage = false;
  std::vector<Tool> tools;
  ToolChoice tool_choice;
};

struct CompletionRequest {
  std::string model;
  std::optional<std::string> prompt;  // text, or
  std::vector<int32_t> prompt_ids;    // token ids
  GenParams params;
  bool stream = false, include_usage = false, echo = false;
};

// Throw ApiError (4xx) for anything a client got wrong.
ChatRequest parse_chat_request(std::string_view body, const Limits& limits);
CompletionRequest parse_completion_request(std::string_view body, const Limits& limits);

// ---- Chat template ----
// How a model writes tool calls in its output.
// - Json: `<tool_call>{"name": N, "arguments": A}</tool_call>` per call (Myriad's templates; the
//   Qwen/Hermes form, whitespace around the JSON allowed).
// - Kimi: one section `<|tool_calls_section_begin|>` … `<|tool_calls_section_end|>` holding
//   `<|tool_call_begin|>functions.N:I<|tool_call_argument_begin|>A<|tool_call_end|>` per call
//   (Kimi K2, K2.5, Kimi Linear and K3 templates).
enum class ToolFormat : uint8_t { Json, Kimi };
// The format a chat template's text writes (Kimi when it spells <|tool_call_begin|>).
ToolFormat tool_format_of(std::string_view template_text);

// A template file (chat_template.txt in the model directory) holds `key = value` lines; '#'
// starts a comment line; values use the escapes \n \t \\ and may use the placeholders {content},
// {name}, {tool_call_id} (message fields) and {tools} (only in `tools`). Keys: bos (true|false),
// system, user, assistant, tool (one per role; developer uses system), generation (opens the
// assistant turn to generate), tools (the tool list preamble), stop (a stop sequence; repeatable).
//
// A published model's template is Jinja instead (serve/jinja.h): chat_template.jinja, or
// tokenizer_config.json's chat_template, rendered as transformers renders it with messages,
// tools, add_generation_prompt = true and the tokenizer's bos_token / eos_token.
namespace jinja {
class Template;
}
struct ChatTemplate {
  bool bos = false;
  ToolFormat tool_format = ToolFormat::Json;
  std::string system, user, assistant, tool, generation, tools;
  std::vector<std::string> stop;
  // Set: a Jinja template, rendered instead of the fields above (bos and stop stay empty; the end
  // of a reply is the model's eos tokens, generation_config.json).
  std::shared_ptr<const jinja::Template> jinja{};
  std::string bos_token{}, eos_token{};  // the Jinja template's variables of those names
  std::string origin{};                  // where the template came from (errors, inspect)

  static ChatTemplate default_template();
  static ChatTemplate parse(std::string_view text);  // throws std::invalid_argument
  // A Jinja template; throws std::invalid_argument naming origin and the template line.
  static ChatTemplate from_jinja(std::string_view source, std::string origin,
                                 std::string bos_token = "", std::string eos_token = "");
  // The first of <dir>/chat_template.jinja, tokenizer_config.json's chat_template (a string, or
  // the "default" of a list of named templates), chat_template.txt; else the default.
  static ChatTemplate from_model_dir(const std::string& dir);
  std::string describe() const;  // e.g. "Jinja (tokenizer_config.json), Kimi tool calls"
};

// One piece of a rendered prompt: text the template wrote (trusted: the literal text of a special
// token in it becomes that token) or text from the request (never parsed for special tokens).
struct PromptPart {
  std::string text;
  bool trusted = false;
};

struct Prompt {
  std::string text;               // everything the model reads (including any forced prefix)
  std::vector<PromptPart> parts;  // text, split by who wrote it (tokenize these, not text)
  std::string forced_prefix;      // the opening of a forced tool call, already in text
  std::vector<std::string> stop;
  bool bos = false;
  void add(std::string_view s, bool trusted);  // appends to text and parts
};
// image_blocks: the placeholder text of every image of the request in message order (the model's
// <|media_begin|>image<|media_content|><|media_pad|>…<|media_end|>, vision::image_block), put at
// the images' places in their messages as template text; a request with images needs them.
Prompt render_chat(const ChatTemplate& t, const ChatRequest& r,
                   const std::vector<std::string>& image_blocks = {});

// `<tool_call>{"name": N, "arguments": A}</tool_call>` in the text of an assistant message.
std::string format_tool_call(const ToolCall& c);

// Model output split into content (text outside well-formed tool-call blocks) and tool calls.
struct ParsedOutput {
  std::string content;
  std::vector<ToolCall> tool_calls;  // with fresh ids
};
ParsedOutput parse_tool_calls(std::string_view text, ToolFormat f = ToolFormat::Json);
// The tool call of a forced (tool_choice function or required) turn from the text generated
// after prefix.
ToolCall forced_tool_call(const ChatRequest& r, std::string_view prefix, std::string_view gen,
                          ToolFormat f = ToolFormat::Json);
// The opening a forced turn starts from (empty when nothing is forced) and the stop string that
// ends the call.
std::pair<std::string, std::string> forced_opening(const ChatRequest& r, ToolFormat f);

// Streaming with tools: passes text through until a tool-call block may begin, then holds the
// rest for finish(). The emitted pieces plus finish().content equal parse_tool_calls(all).content.
class ToolStreamFilter {
 public:
  explicit ToolStreamFilter(ToolFormat f = ToolFormat::Json) : format_(f) {}
  std::string feed(std::string_view text);
  ParsedOutput finish();

 private:
  ToolFormat format_;
  std::string pending_;
  bool holding_ = false;
};

// ---- Responses ----
std::string new_id(std::string_view prefix);  // e.g. "chatcmpl-" + 24 hex digits

struct TokenLogprob {
  std::string token;
  double logprob = 0;
  std::vector<std::pair<std::string, double>> top;
};
struct Usage {
  int64_t prompt_tokens = 0, completion_tokens = 0;
};
nlohmann::json usage_json(const Usage& u);
nlohmann::json chat_logprobs_json(const std::vector<TokenLogprob>& lp);
nlohmann::json completion_logprobs_json(const std::vector<TokenLogprob>& lp, size_t offset);
nlohmann::json tool_calls_json(const std::vector<ToolCall>& calls, bool with_index);

// Non-streaming bodies.
nlohmann::json chat_response(const std::string& id, int64_t created, const std::string& model,
                             const ParsedOutput& out, const std::string& finish_reason,
                             const Usage& usage, const nlohmann::json& logprobs);
nlohmann::json completion_response(const std::string& id, int64_t created, const std::string& model,
                                   const std::string& text, const std::string& finish_reason,
                                   const Usage& usage, const nlohmann::json& logprobs);
// One SSE chunk object (choices[0] with delta/text; finish_reason null when empty).
nlohmann::json chat_chunk(const std::string& id, int64_t created, const std::string& model,
                          nlohmann::json delta, const std::string& finish_reason,
                          const nlohmann::json& logprobs = nullptr);
nlohmann::json completion_chunk(const std::string& id, int64_t created, const std::string& model,
                                const std::string& text, const std::string& finish_reason,
                                const nlohmann::json& logprobs = nullptr);
// The final usage chunk of stream_options.include_usage (empty choices).
nlohmann::json usage_chunk(const std::string& object, const std::string& id, int64_t created,
                           const std::string& model, const Usage& u);
std::string sse(const nlohmann::json& j);  // "data: {...}\n\n"

}  // namespace myriad::serve
