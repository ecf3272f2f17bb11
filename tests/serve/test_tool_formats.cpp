// Tool calls in the Kimi form (<|tool_calls_section_begin|> … <|tool_calls_section_end|>) beside
// Myriad's JSON-in-tags form: parsing, streaming, forced openings and the template detection.
#include <gtest/gtest.h>

#include <string>

#include "serve/protocol.h"

namespace myriad::serve {
namespace {

const std::string kSection =
    "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
    "<|tool_call_argument_begin|>{\"city\": \"Paris\"}<|tool_call_end|>\n"
    "<|tool_call_begin|>functions.lookup:1<|tool_call_argument_begin|>{\"key\": 7}"
    "<|tool_call_end|><|tool_calls_section_end|>";

TEST(KimiToolCalls, ParsesASectionOfCalls) {
  const ParsedOutput p = parse_tool_calls("Let me check." + kSection, ToolFormat::Kimi);
  EXPECT_EQ(p.content, "Let me check.");
  ASSERT_EQ(p.tool_calls.size(), 2u);
  EXPECT_EQ(p.tool_calls[0].name, "get_weather");
  EXPECT_EQ(p.tool_calls[0].arguments, "{\"city\":\"Paris\"}");
  EXPECT_EQ(p.tool_calls[1].name, "lookup");
  EXPECT_EQ(p.tool_calls[1].arguments, "{\"key\":7}");
  EXPECT_NE(p.tool_calls[0].id, p.tool_calls[1].id);
  // The JSON form's tags are plain text to the Kimi parser and the other way round.
  EXPECT_TRUE(parse_tool_calls(kSection, ToolFormat::Json).tool_calls.empty());
  const std::string json_call = "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>";
  EXPECT_EQ(parse_tool_calls(json_call, ToolFormat::Kimi).content, json_call);
}

TEST(KimiToolCalls, MalformedSectionsStayContent) {
  for (const std::string bad :
       {"<|tool_calls_section_begin|>no call<|tool_calls_section_end|>",
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0{}<|tool_call_end|>"
        "<|tool_calls_section_end|>",
        "<|tool_calls_section_begin|><|tool_call_begin|>:0<|tool_call_argument_begin|>{}"
        "<|tool_call_end|><|tool_calls_section_end|>",
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0"
        "<|tool_call_argument_begin|>{}"}) {
    const ParsedOutput p = parse_tool_calls(bad, ToolFormat::Kimi);
    EXPECT_TRUE(p.tool_calls.empty()) << bad;
    EXPECT_EQ(p.content, bad);
  }
}

TEST(KimiToolCalls, StreamingHoldsTheSection) {
  ToolStreamFilter f(ToolFormat::Kimi);
  std::string shown;
  const std::string all = "Sure. " + kSection;
  for (size_t i = 0; i < all.size(); i += 3) shown += f.feed(all.substr(i, 3));
  const ParsedOutput rest = f.finish();
  EXPECT_EQ(shown + rest.content, "Sure. ");
  ASSERT_EQ(rest.tool_calls.size(), 2u);
  EXPECT_EQ(rest.tool_calls[1].name, "lookup");
}

TEST(KimiToolCalls, ForcedOpeningsAndCalls) {
  ChatRequest r;
  r.tools = {{"get_weather", "", nullptr}, {"lookup", "", nullptr}};
  r.tool_choice = {ToolChoice::Function, "lookup"};
  auto [open, stop] = forced_opening(r, ToolFormat::Kimi);
  EXPECT_EQ(open,
            "<|tool_calls_section_begin|><|tool_call_begin|>functions.lookup:0"
            "<|tool_call_argument_begin|>");
  EXPECT_EQ(stop, "<|tool_call_end|>");
  ToolCall c = forced_tool_call(r, open, " {\"key\": 3}", ToolFormat::Kimi);
  EXPECT_EQ(c.name, "lookup");
  EXPECT_EQ(c.arguments, "{\"key\":3}");
  r.tool_choice = {ToolChoice::Required, ""};
  open = forced_opening(r, ToolFormat::Kimi).first;
  EXPECT_EQ(open, "<|tool_calls_section_begin|><|tool_call_begin|>functions.");
  c = forced_tool_call(r, open, "get_weat:0<|tool_call_argument_begin|>{\"city\": \"Oslo\"}",
                       ToolFormat::Kimi);
  EXPECT_EQ(c.name, "get_weather");  // the longest shared prefix
  EXPECT_EQ(c.arguments, "{\"city\":\"Oslo\"}");
  r.tool_choice = {ToolChoice::Auto, ""};
  EXPECT_TRUE(forced_opening(r, ToolFormat::Kimi).first.empty());
}

TEST(KimiToolCalls, TemplateDetection) {
  EXPECT_EQ(tool_format_of("{%- for t in m.tool_calls -%}<|tool_call_begin|>"), ToolFormat::Kimi);
  EXPECT_EQ(tool_format_of("<tool_call>{{ t | tojson }}</tool_call>"), ToolFormat::Json);
}

}  // namespace
}  // namespace myriad::serve
