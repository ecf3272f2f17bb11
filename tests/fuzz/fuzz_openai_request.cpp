// libFuzzer target: the OpenAI request parsers on arbitrary bodies, and everything the server
// then does with a parsed request or with model output, none of which may throw anything but
// ApiError or crash:
// - chat and completion bodies either parse or raise ApiError with a 4xx status;
// - a parsed chat request renders through the default template and through the input read as a
//   template file (std::invalid_argument allowed), and its forced tool call can be built;
// - the input as model output: parse_tool_calls, and ToolStreamFilter fed in two pieces gives the
//   same content and tool calls; every tool call survives format_tool_call -> parse_tool_calls;
// - the response and chunk JSON serialise (invalid UTF-8 is replaced, not thrown).
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "serve/protocol.h"

using namespace myriad::serve;

namespace {

void check(bool ok) {
  if (!ok) std::abort();
}

void model_output(std::string_view text) {
  const ParsedOutput whole = parse_tool_calls(text);
  ToolStreamFilter f;
  const size_t cut = text.empty() ? 0 : (static_cast<unsigned char>(text[0]) * 131u) % text.size();
  std::string emitted = f.feed(text.substr(0, cut));
  emitted += f.feed(text.substr(cut));
  const ParsedOutput rest = f.finish();
  check(emitted + rest.content == whole.content);
  check(rest.tool_calls.size() == whole.tool_calls.size());
  for (size_t i = 0; i < whole.tool_calls.size(); ++i) {
    check(rest.tool_calls[i].name == whole.tool_calls[i].name);
    check(rest.tool_calls[i].arguments == whole.tool_calls[i].arguments);
    const ParsedOutput back = parse_tool_calls(format_tool_call(whole.tool_calls[i]));
    check(back.tool_calls.size() == 1 && back.tool_calls[0].name == whole.tool_calls[i].name);
  }
  sse(chat_response("id", 0, "m", whole, "stop", {1, 2}, nullptr));
  sse(chat_chunk("id", 0, "m", {{"content", std::string(text)}}, ""));
  sse(completion_logprobs_json({{std::string(text), -1.0, {{std::string(text), -1.0}}}}, 0));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  Limits limits;
  limits.model = "tiny";
  limits.max_body_bytes = 32 << 10;
  try {
    const ChatRequest r = parse_chat_request(in, limits);
    const Prompt p = render_chat(ChatTemplate::default_template(), r);
    check(p.text.size() >= ChatTemplate::default_template().generation.size());
    if (r.tool_choice.mode == ToolChoice::Function || r.tool_choice.mode == ToolChoice::Required) {
      check(!p.forced_prefix.empty());
      const ToolCall c = forced_tool_call(r, p.forced_prefix, in.substr(0, 64));
      check(!c.name.empty());
    }
    try {
      render_chat(ChatTemplate::parse(in), r);
    } catch (const std::invalid_argument&) {
    }
  } catch (const ApiError& e) {
    check(e.status >= 400 && e.status < 500);
    sse(error_json(e));
  }
  try {
    parse_completion_request(in, limits);
  } catch (const ApiError& e) {
    check(e.status >= 400 && e.status < 500);
  }
  try {
    ChatTemplate::parse(in);
  } catch (const std::invalid_argument&) {
  }
  model_output(in);
  return 0;
}
