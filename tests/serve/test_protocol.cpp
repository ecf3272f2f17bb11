// The OpenAI protocol layer without a model: request parsing (valid bodies give the right
// parameters; each kind of bad input gives the right 4xx and OpenAI error JSON), the chat
// template (default rendering, the file syntax and its errors), tool-call rendering and parsing,
// forced tool calls, the streaming tool filter, and the response/chunk shapes.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "serve/protocol.h"

using namespace myriad::serve;
using json = nlohmann::json;

namespace {

Limits limits() {
  Limits l;
  l.model = "tiny";
  l.max_body_bytes = 4096;
  l.max_tokens = 100;
  return l;
}

// The ApiError a body raises (status 0 when it parses).
ApiError chat_error(const std::string& body, bool completion = false) {
  try {
    if (completion)
      parse_completion_request(body, limits());
    else
      parse_chat_request(body, limits());
  } catch (const ApiError& e) {
    return e;
  }
  return ApiError(0, "no error");
}

}  // namespace

TEST(Protocol, ChatBodyParsesToParams) {
  const ChatRequest r = parse_chat_request(R"({
    "model": "tiny", "temperature": 0.5, "top_p": 0.9, "max_tokens": 12, "seed": 42,
    "stop": ["a", "bb"], "presence_penalty": 0.5, "frequency_penalty": -1, "top_k": 5,
    "min_p": 0.1, "repetition_penalty": 1.2, "n": 1, "stream": true,
    "stream_options": {"include_usage": true}, "logprobs": true, "top_logprobs": 3,
    "messages": [
      {"role": "system", "content": "be brief"},
      {"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}]},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
        "function": {"name": "get", "arguments": "{\"x\": 1}"}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "42"}],
    "tools": [{"type": "function", "function": {"name": "get", "description": "d",
               "parameters": {"type": "object"}}}],
    "tool_choice": {"type": "function", "function": {"name": "get"}}})",
                                           limits());
  EXPECT_EQ(r.model, "tiny");
  EXPECT_DOUBLE_EQ(r.params.temperature, 0.5);
  EXPECT_DOUBLE_EQ(r.params.top_p, 0.9);
  EXPECT_EQ(r.params.max_tokens, 12);
  EXPECT_EQ(r.params.seed, 42u);
  EXPECT_EQ(r.params.stop, (std::vector<std::string>{"a", "bb"}));
  EXPECT_DOUBLE_EQ(r.params.presence_penalty, 0.5);
  EXPECT_DOUBLE_EQ(r.params.frequency_penalty, -1);
  EXPECT_EQ(r.params.top_k, 5);
  EXPECT_DOUBLE_EQ(r.params.min_p, 0.1);
  EXPECT_DOUBLE_EQ(r.params.repetition_penalty, 1.2);
  EXPECT_EQ(r.params.top_logprobs, 3);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  ASSERT_EQ(r.messages.size(), 4u);
  EXPECT_EQ(r.messages[1].content, "hi there");
  ASSERT_EQ(r.messages[2].tool_calls.size(), 1u);
  EXPECT_EQ(r.messages[2].tool_calls[0].arguments, "{\"x\": 1}");
  EXPECT_EQ(r.messages[3].tool_call_id, "c1");
  ASSERT_EQ(r.tools.size(), 1u);
  EXPECT_EQ(r.tools[0].parameters, json({{"type", "object"}}));
  EXPECT_EQ(r.tool_choice.mode, ToolChoice::Function);
  EXPECT_EQ(r.tool_choice.name, "get");

  // Defaults, nulls as absent, max_completion_tokens, a single stop string.
  const ChatRequest d = parse_chat_request(
      R"({"model": "tiny", "messages": [{"role": "user", "content": "x"}], "temperature": null,
          "max_completion_tokens": 7, "stop": "END"})",
      limits());
  EXPECT_DOUBLE_EQ(d.params.temperature, 1.0);
  EXPECT_EQ(d.params.max_tokens, 7);
  EXPECT_EQ(d.params.stop, std::vector<std::string>{"END"});
  EXPECT_FALSE(d.stream);
  EXPECT_EQ(d.params.top_logprobs, -1);
  EXPECT_EQ(d.tool_choice.mode, ToolChoice::None);
}

TEST(Protocol, CompletionBodyParsesToParams) {
  const auto a = parse_completion_request(
      R"({"model": "tiny", "prompt": "Once", "echo": true, "logprobs": 2, "temperature": 0})",
      limits());
  EXPECT_EQ(a.prompt, "Once");
  EXPECT_TRUE(a.echo);
  EXPECT_EQ(a.params.top_logprobs, 2);
  EXPECT_EQ(a.params.max_tokens, 16);  // OpenAI's default for completions
  EXPECT_DOUBLE_EQ(a.params.temperature, 0);
  const auto b = parse_completion_request(R"({"model": "tiny", "prompt": [5, 6, 7]})", limits());
  EXPECT_FALSE(b.prompt);
  EXPECT_EQ(b.prompt_ids, (std::vector<int32_t>{5, 6, 7}));
  const auto c = parse_completion_request(R"({"model": "tiny", "prompt": [[9]]})", limits());
  EXPECT_EQ(c.prompt_ids, std::vector<int32_t>{9});
  const auto d = parse_completion_request(R"({"model": "tiny", "prompt": ["one"]})", limits());
  EXPECT_EQ(d.prompt, "one");
}

TEST(Protocol, BadRequestsGiveOpenAIErrors) {
  struct Case {
    std::string body;
    int status;
    std::string param, code;
    bool completion = false;
  };
  const std::string msgs = R"("messages": [{"role": "user", "content": "x"}])";
  const std::vector<Case> cases = {
      {"{not json", 400, "", ""},
      {"[1, 2]", 400, "", ""},
      {"", 400, "", ""},
      {R"({"messages": [{"role": "user", "content": "x"}]})", 400, "model", ""},
      {R"({"model": 5, )" + msgs + "}", 400, "model", ""},
      {R"({"model": "gpt-9", )" + msgs + "}", 404, "model", "model_not_found"},
      {R"({"model": "tiny"})", 400, "messages", ""},
      {R"({"model": "tiny", "messages": []})", 400, "messages", ""},
      {R"({"model": "tiny", "messages": "hi"})", 400, "messages", ""},
      {R"({"model": "tiny", "messages": [{"content": "x"}]})", 400, "messages[0].role", ""},
      {R"({"model": "tiny", "messages": [{"role": "wizard", "content": "x"}]})", 400,
       "messages[0].role", ""},
      {R"({"model": "tiny", "messages": [{"role": "user", "content": 3}]})", 400,
       "messages[0].content", ""},
      {R"({"model": "tiny", "messages": [{"role": "user"}]})", 400, "messages[0].content", ""},
      {R"({"model": "tiny", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]})",
       400, "messages[0].content", ""},
      {R"({"model": "tiny", "messages": [{"role": "tool", "content": "x"}]})", 400,
       "messages[0].tool_call_id", ""},
      {R"({"model": "tiny", "temperature": 2.5, )" + msgs + "}", 400, "temperature",
       "invalid_value"},
      {R"({"model": "tiny", "temperature": -0.1, )" + msgs + "}", 400, "temperature",
       "invalid_value"},
      {R"({"model": "tiny", "temperature": "hot", )" + msgs + "}", 400, "temperature", ""},
      {R"({"model": "tiny", "top_p": 0, )" + msgs + "}", 400, "top_p", "invalid_value"},
      {R"({"model": "tiny", "top_p": 1.5, )" + msgs + "}", 400, "top_p", "invalid_value"},
      {R"({"model": "tiny", "n": 2, )" + msgs + "}", 400, "n", "invalid_value"},
      {R"({"model": "tiny", "max_tokens": 0, )" + msgs + "}", 400, "max_tokens", "invalid_value"},
      {R"({"model": "tiny", "max_tokens": 101, )" + msgs + "}", 400, "max_tokens", "invalid_value"},
      {R"({"model": "tiny", "max_tokens": 1.5, )" + msgs + "}", 400, "max_tokens", ""},
      {R"({"model": "tiny", "presence_penalty": 3, )" + msgs + "}", 400, "presence_penalty",
       "invalid_value"},
      {R"({"model": "tiny", "stop": ["a","b","c","d","e"], )" + msgs + "}", 400, "stop", ""},
      {R"({"model": "tiny", "stop": 7, )" + msgs + "}", 400, "stop", ""},
      {R"({"model": "tiny", "stream": "yes", )" + msgs + "}", 400, "stream", ""},
      {R"({"model": "tiny", "stream_options": {"include_usage": true}, )" + msgs + "}", 400,
       "stream_options", ""},
      {R"({"model": "tiny", "top_logprobs": 2, )" + msgs + "}", 400, "top_logprobs", ""},
      {R"({"model": "tiny", "logprobs": true, "top_logprobs": 21, )" + msgs + "}", 400,
       "top_logprobs", "invalid_value"},
      {R"({"model": "tiny", "logit_bias": {"5": 1}, )" + msgs + "}", 400, "logit_bias", ""},
      {R"({"model": "tiny", "response_format": {"type": "json_object"}, )" + msgs + "}", 400,
       "response_format", ""},
      {R"({"model": "tiny", "tools": {}, )" + msgs + "}", 400, "tools", ""},
      {R"({"model": "tiny", "tools": [{"type": "function", "function": {"name": "a b"}}], )" +
           msgs + "}",
       400, "tools[0].function.name", ""},
      {R"({"model": "tiny", "tool_choice": "required", )" + msgs + "}", 400, "tool_choice", ""},
      {R"({"model": "tiny", "tools": [{"type": "function", "function": {"name": "f"}}],
           "tool_choice": {"type": "function", "function": {"name": "g"}}, )" +
           msgs + "}",
       400, "tool_choice", ""},
      {R"({"model": "tiny", "tools": [{"type": "function", "function": {"name": "f"}}],
           "tool_choice": "sometimes", )" +
           msgs + "}",
       400, "tool_choice", ""},
      {R"({"model": "tiny", "tools": [{"type": "function", "function": {"name": "f"}},
           {"type": "function", "function": {"name": "f"}}], )" +
           msgs + "}",
       400, "tools[1]", ""},
      {"{\"model\": \"tiny\", \"pad\": \"" + std::string(5000, 'x') + "\", " + msgs + "}", 413, "",
       "request_too_large"},
      {R"({"model": "tiny"})", 400, "prompt", "", true},
      {R"({"model": "tiny", "prompt": ["a", "b"]})", 400, "prompt", "", true},
      {R"({"model": "tiny", "prompt": [-1]})", 400, "prompt", "", true},
      {R"({"model": "tiny", "prompt": []})", 400, "prompt", "", true},
      {R"({"model": "tiny", "prompt": {}})", 400, "prompt", "", true},
      {R"({"model": "tiny", "prompt": "x", "best_of": 2})", 400, "best_of", "", true},
      {R"({"model": "tiny", "prompt": "x", "suffix": "y"})", 400, "suffix", "", true},
      {R"({"model": "tiny", "prompt": "x", "logprobs": 6})", 400, "logprobs", "invalid_value",
       true},
      {R"({"model": "other", "prompt": "x"})", 404, "model", "model_not_found", true},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.body.substr(0, 200));
    const ApiError e = chat_error(c.body, c.completion);
    EXPECT_EQ(e.status, c.status) << e.what();
    EXPECT_EQ(e.param, c.param) << e.what();
    EXPECT_EQ(e.code, c.code) << e.what();
    const json j = error_json(e);
    ASSERT_TRUE(j.contains("error"));
    const json& err = j["error"];
    EXPECT_TRUE(err["message"].is_string() && !err["message"].get<std::string>().empty());
    EXPECT_EQ(err["type"], "invalid_request_error");
    EXPECT_EQ(err["param"], c.param.empty() ? json(nullptr) : json(c.param));
    EXPECT_EQ(err["code"], c.code.empty() ? json(nullptr) : json(c.code));
  }
}

TEST(Protocol, DefaultTemplateRendersTurnsAndTools) {
  ChatRequest r = parse_chat_request(
      R"({"model": "tiny", "messages": [{"role": "system", "content": "S"},
          {"role": "user", "content": "U"},
          {"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
            "function": {"name": "f", "arguments": "{\"a\":1}"}}]},
          {"role": "tool", "tool_call_id": "c", "content": "R"}],
          "tools": [{"type": "function", "function": {"name": "f", "description": "D"}}]})",
      limits());
  const ChatTemplate t = ChatTemplate::default_template();
  Prompt p = render_chat(t, r);
  EXPECT_EQ(p.text,
            "<|system|>\nYou can call these functions. To call one, reply with "
            "<tool_call>{\"name\": NAME, \"arguments\": ARGUMENTS}</tool_call>.\n"
            "{\"description\":\"D\",\"name\":\"f\"}\n<|end|>\n"
            "<|system|>\nS<|end|>\n<|user|>\nU<|end|>\n"
            "<|assistant|>\n<tool_call>{\"name\": \"f\", \"arguments\": {\"a\":1}}</tool_call>"
            "<|end|>\n<|tool|>\nR<|end|>\n<|assistant|>\n");
  EXPECT_TRUE(p.forced_prefix.empty());
  EXPECT_EQ(p.stop, t.stop);

  r.tool_choice = {ToolChoice::Function, "f"};
  p = render_chat(t, r);
  EXPECT_EQ(p.forced_prefix, "<tool_call>{\"name\": \"f\", \"arguments\": ");
  EXPECT_TRUE(p.text.ends_with("<|assistant|>\n" + p.forced_prefix));
  EXPECT_EQ(p.stop.back(), "</tool_call>");

  r.tool_choice = {ToolChoice::None, ""};
  p = render_chat(t, r);
  EXPECT_TRUE(p.text.starts_with("<|system|>\nS<|end|>"));  // no tool preamble
}

TEST(Protocol, TemplateFileSyntax) {
  const ChatTemplate t = ChatTemplate::parse(
      "# a comment\n"
      "bos = true\n"
      "user = [U]{content}\\n\n"
      "assistant =   [A]{content}\\s\n"
      "generation = [A]\n"
      "system = [S {name}]{content}\\t\\\\\n"
      "stop = [U]\n");
  EXPECT_TRUE(t.bos);
  EXPECT_EQ(t.stop, std::vector<std::string>{"[U]"});
  EXPECT_EQ(t.tool, ChatTemplate::default_template().tool);  // unset keys keep the default
  ChatRequest r;
  r.messages = {{"system", "s", "n", "", {}},
                {"user", "{content}", "", "", {}},
                {"assistant", "a", "", "", {}}};
  const Prompt p = render_chat(t, r);
  // Inserted text is not scanned again: a user's "{content}" stays literal.
  EXPECT_EQ(p.text, "[S n]s\t\\[U]{content}\n[A]a [A]");
  EXPECT_TRUE(p.bos);
  for (const char* bad : {"user\n", "colour = x\n", "user = a\\qb\n", "bos = yes\n", "stop =\n"})
    EXPECT_THROW(ChatTemplate::parse(bad), std::invalid_argument) << bad;
}

TEST(Protocol, ToolCallsParseFromModelOutput) {
  ParsedOutput o = parse_tool_calls(
      "Let me check. <tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": "
      "\"Paris\"}}</tool_call> and <tool_call>{\"name\": \"f\", \"arguments\": \"raw\"}"
      "</tool_call><tool_call>not json</tool_call> tail <tool_call>{\"name\": \"x\"");
  ASSERT_EQ(o.tool_calls.size(), 2u);
  EXPECT_EQ(o.tool_calls[0].name, "get_weather");
  EXPECT_EQ(o.tool_calls[0].arguments, "{\"city\":\"Paris\"}");
  EXPECT_EQ(o.tool_calls[1].arguments, "raw");
  EXPECT_TRUE(o.tool_calls[0].id.starts_with("call_"));
  EXPECT_NE(o.tool_calls[0].id, o.tool_calls[1].id);
  EXPECT_EQ(o.content,
            "Let me check.  and <tool_call>not json</tool_call> tail <tool_call>{\"name\": \"x\"");
  EXPECT_TRUE(parse_tool_calls("plain").tool_calls.empty());

  // format_tool_call and parse_tool_calls round-trip.
  const ToolCall c{"id", "lookup", "{\"q\":[1,2]}"};
  const ParsedOutput back = parse_tool_calls(format_tool_call(c));
  ASSERT_EQ(back.tool_calls.size(), 1u);
  EXPECT_EQ(back.tool_calls[0].name, c.name);
  EXPECT_EQ(back.tool_calls[0].arguments, c.arguments);
  EXPECT_EQ(back.content, "");
  // A closing tag inside an argument string does not end the block.
  const ToolCall tricky{"id", "f", "{\"s\": \"</tool_call>\"}"};
  const ParsedOutput t = parse_tool_calls(format_tool_call(tricky));
  ASSERT_EQ(t.tool_calls.size(), 1u);
  EXPECT_EQ(t.tool_calls[0].arguments, "{\"s\":\"</tool_call>\"}");
  EXPECT_EQ(parse_tool_calls(format_tool_call({"id", "g", "</tool_call>"})).tool_calls[0].arguments,
            "</tool_call>");
}

TEST(Protocol, ForcedToolCalls) {
  ChatRequest r;
  r.tools = {{"get_weather", "", nullptr}, {"search", "", nullptr}};
  r.tool_choice = {ToolChoice::Function, "search"};
  const std::string fp = "<tool_call>{\"name\": \"search\", \"arguments\": ";
  EXPECT_EQ(forced_tool_call(r, fp, "{\"q\": \"x\"}}").arguments, "{\"q\":\"x\"}");
  EXPECT_EQ(forced_tool_call(r, fp, " {\"q\": 1} ").arguments, "{\"q\":1}");
  const ToolCall junk = forced_tool_call(r, fp, "gibberish {");
  EXPECT_EQ(junk.name, "search");  // always the forced function
  EXPECT_EQ(junk.arguments, "gibberish {");
  EXPECT_EQ(forced_tool_call(r, fp, "").arguments, "");

  r.tool_choice = {ToolChoice::Required, ""};
  const std::string rp = "<tool_call>{\"name\": \"";
  ToolCall c = forced_tool_call(r, rp, "search\", \"arguments\": {\"q\": 2}}");
  EXPECT_EQ(c.name, "search");
  EXPECT_EQ(c.arguments, "{\"q\":2}");
  c = forced_tool_call(r, rp, "get_wx\", \"arguments\": {\"city\": \"Oslo\"");
  EXPECT_EQ(c.name, "get_weather");  // the closest known name
  EXPECT_EQ(c.arguments, "{\"city\": \"Oslo\"");
  c = forced_tool_call(r, rp, "???");
  EXPECT_EQ(c.name, "get_weather");
  EXPECT_EQ(c.arguments, "{}");
}

TEST(Protocol, StreamFilterMatchesWholeTextParse) {
  const std::vector<std::string> texts = {
      "hello world",
      "a <tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call> b",
      "x <tool_ca",
      "<tool_call>broken</tool_call> then <tool_call>{\"name\": \"g\"}</tool_call>",
      "<<tool_call>{\"name\": \"f\"}</tool_call><",
  };
  for (const auto& t : texts) {
    const ParsedOutput whole = parse_tool_calls(t);
    for (size_t step = 1; step <= 4; ++step) {
      ToolStreamFilter f;
      std::string emitted;
      for (size_t i = 0; i < t.size(); i += step) emitted += f.feed(t.substr(i, step));
      const ParsedOutput rest = f.finish();
      SCOPED_TRACE(t + " step " + std::to_string(step));
      EXPECT_EQ(emitted + rest.content, whole.content);
      ASSERT_EQ(rest.tool_calls.size(), whole.tool_calls.size());
      for (size_t k = 0; k < whole.tool_calls.size(); ++k) {
        EXPECT_EQ(rest.tool_calls[k].name, whole.tool_calls[k].name);
        EXPECT_EQ(rest.tool_calls[k].arguments, whole.tool_calls[k].arguments);
      }
      // Text before a possible tag is never held back longer than needed.
      if (t == "hello world") {
        EXPECT_EQ(emitted, t);
      }
    }
  }
}

TEST(Protocol, ResponseShapes) {
  const ParsedOutput out{"", {{"call_1", "f", "{}"}}};
  const json r = chat_response("chatcmpl-1", 5, "tiny", out, "tool_calls", {3, 4}, nullptr);
  EXPECT_EQ(r["object"], "chat.completion");
  EXPECT_EQ(r["choices"][0]["message"]["content"], nullptr);
  EXPECT_EQ(r["choices"][0]["message"]["tool_calls"][0]["function"]["name"], "f");
  EXPECT_EQ(r["choices"][0]["message"]["tool_calls"][0]["type"], "function");
  EXPECT_EQ(r["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_EQ(r["usage"]["total_tokens"], 7);
  const json c = chat_chunk("chatcmpl-1", 5, "tiny", {{"content", "hi"}}, "");
  EXPECT_EQ(c["object"], "chat.completion.chunk");
  EXPECT_EQ(c["choices"][0]["finish_reason"], nullptr);
  EXPECT_EQ(sse(c).substr(0, 6), "data: ");
  EXPECT_TRUE(sse(c).ends_with("\n\n"));
  // Invalid UTF-8 (a byte-fallback token alone) is replaced, never thrown.
  EXPECT_NO_THROW(sse(completion_chunk("c", 1, "m", "\xff\xfe", "")));
  const json lp = completion_logprobs_json({{"ab", -0.5, {{"ab", -0.5}, {"c", -1.0}}}}, 3);
  EXPECT_EQ(lp["text_offset"][0], 3);
  EXPECT_EQ(lp["top_logprobs"][0]["c"], -1.0);
}

namespace {

std::string image_file(const std::string& name) {
  std::ifstream f(std::string(MYRIAD_SOURCE_DIR) + "/tests/fixtures/images/" + name,
                  std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string to_base64(const std::string& s) {
  static const char* k = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (size_t i = 0; i < s.size(); i += 3) {
    uint32_t v = uint32_t(uint8_t(s[i])) << 16;
    if (i + 1 < s.size()) v |= uint32_t(uint8_t(s[i + 1])) << 8;
    if (i + 2 < s.size()) v |= uint8_t(s[i + 2]);
    out += k[v >> 18];
    out += k[(v >> 12) & 63];
    out += i + 1 < s.size() ? k[(v >> 6) & 63] : '=';
    out += i + 2 < s.size() ? k[v & 63] : '=';
  }
  return out;
}

std::string image_part(const std::string& url) {
  return json({{"type", "image_url"}, {"image_url", {{"url", url}}}}).dump();
}

std::string png_url(const std::string& name) {
  return "data:image/png;base64," + to_base64(image_file(name));
}

Limits image_limits() {
  Limits l = limits();
  l.max_body_bytes = 1 << 16;
  return l;
}

// The ApiError of a chat body whose first message is {"role": role, "content": [parts]}.
ApiError image_error(const std::string& parts, const Limits& l = image_limits(),
                     const std::string& role = "user") {
  try {
    parse_chat_request(R"({"model": "tiny", "messages": [{"role": ")" + role +
                           R"(", "content": [)" + parts + "]}]}",
                       l);
  } catch (const ApiError& e) {
    return e;
  }
  return ApiError(0, "no error");
}

}  // namespace

TEST(Protocol, ChatImagePartsParse) {
  const std::string png = image_file("palette.png"), jpg = image_file("photo.jpg");
  ASSERT_FALSE(png.empty());
  ASSERT_FALSE(jpg.empty());
  const std::string body =
      R"({"model": "tiny", "messages": [{"role": "system", "content": "describe"},
          {"role": "user", "content": [{"type": "text", "text": "look: "}, )" +
      image_part(png_url("palette.png")) + R"(, {"type": "text", "text": " and "},
          {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,)" +
      to_base64(jpg) + R"(", "detail": "low"}}, {"type": "text", "text": "?"},
          {"type": "image_url", "image_url": ")" +
      png_url("gray16.png") + R"("}]}]})";
  const ChatRequest r = parse_chat_request(body, image_limits());
  ASSERT_EQ(r.messages.size(), 2u);
  EXPECT_TRUE(r.messages[0].images.empty());
  const Message& m = r.messages[1];
  EXPECT_EQ(m.content, "look:  and ?");
  ASSERT_EQ(m.images.size(), 3u);
  EXPECT_EQ(m.images[0], (MessageImage{png, 6, 20, 20}));   // after "look: "
  EXPECT_EQ(m.images[1], (MessageImage{jpg, 11, 48, 40}));  // after "look:  and "
  EXPECT_EQ(m.images[2].offset, 12u);                       // at the end
  EXPECT_EQ(m.images[2].bytes, image_file("gray16.png"));
  EXPECT_EQ(m.images[2].width, 16);
  // A plain string content has no images.
  const ChatRequest s = parse_chat_request(
      R"({"model": "tiny", "messages": [{"role": "user", "content": "hi"}]})", image_limits());
  EXPECT_TRUE(s.messages[0].images.empty());
}

TEST(Protocol, ChatImagePartErrors) {
  struct Case {
    std::string parts;
    std::string code, needle;
  };
  const std::string gif = image_file("tiny.gif"), png = image_file("rgb_pad.png");
  const std::vector<Case> cases = {
      {image_part("https://example.com/cat.png"), "invalid_image_url", "does not fetch"},
      {image_part("http://example.com/cat.png"), "invalid_image_url", "does not fetch"},
      {image_part("file:///etc/passwd"), "invalid_image_url", "expected a data URL"},
      {image_part("data:image/png,rawbytes"), "invalid_image_url", "base64"},
      {image_part("data:image/png;base64,@@@@"), "invalid_image_url", "invalid base64"},
      {image_part("data:image/png;base64,QUJ"), "invalid_image_url", "multiple of 4"},
      {image_part("data:image/gif;base64," + to_base64(gif)), "invalid_image_url", "image/gif"},
      {image_part("data:image/png;base64," + to_base64("just some text")), "invalid_image_format",
       "unrecognised image data"},
      {image_part("data:image/png;base64," + to_base64(gif)), "invalid_image_format",
       "unsupported image format GIF"},
      {image_part("data:image/png;base64," + to_base64(png.substr(0, png.size() / 2))),
       "invalid_image_format", "truncated PNG"},
      {R"({"type": "image_url"})", "", "needs 'image_url'"},
      {R"({"type": "image_url", "image_url": {"detail": "low"}})", "", "needs 'image_url'"},
      {R"({"type": "image_url", "image_url": {"url": 5}})", "", "must be a string"},
      {R"({"type": "image_url", "image_url": 5})", "", "needs 'image_url'"},
      {R"({"type": "image_url", "image_url": {"url": "data:x", "detail": "max"}})", "",
       "'image_url.detail'"},
      {R"({"type": "input_audio", "input_audio": {}})", "", "not supported"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.parts.substr(0, 120));
    const ApiError e = image_error(c.parts);
    EXPECT_EQ(e.status, 400) << e.what();
    EXPECT_EQ(e.param, "messages[0].content") << e.what();
    EXPECT_EQ(e.code, c.code) << e.what();
    EXPECT_NE(std::string(e.what()).find(c.needle), std::string::npos) << e.what();
    const json j = error_json(e);
    EXPECT_EQ(j["error"]["type"], "invalid_request_error");
    EXPECT_EQ(j["error"]["message"], e.what());
  }
  // Images only in user messages.
  for (const char* role : {"system", "developer", "assistant", "tool"}) {
    const ApiError e = image_error(image_part(png_url("palette.png")), image_limits(), role);
    EXPECT_EQ(e.status, 400) << role;
    EXPECT_NE(std::string(e.what()).find("only allowed in user messages"), std::string::npos)
        << role << ": " << e.what();
  }
  // Limits: pixels from the header, images per request.
  Limits l = image_limits();
  l.max_image_pixels = 399;  // palette.png is 20 × 20
  const ApiError big = image_error(image_part(png_url("palette.png")), l);
  EXPECT_EQ(big.status, 400);
  EXPECT_EQ(big.code, "image_too_large");
  EXPECT_NE(std::string(big.what()).find("20x20 = 400 pixels"), std::string::npos) << big.what();
  l = image_limits();
  l.max_images = 2;
  const std::string one = image_part(png_url("palette.png"));
  EXPECT_EQ(image_error(one + "," + one, l).status, 0);
  const ApiError many = image_error(one + "," + one + "," + one, l);
  EXPECT_EQ(many.status, 400);
  EXPECT_NE(std::string(many.what()).find("at most 2 images"), std::string::npos) << many.what();
}
