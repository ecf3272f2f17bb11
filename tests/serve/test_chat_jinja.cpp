// Jinja chat templates in the server's prompt path (serve/protocol.h render_chat): where a
// model directory's template comes from, trust of the rendered parts, images, template errors
// as HTTP errors, and forced tool calls in Kimi's form.
#include <gtest/gtest.h>

#include <unistd.h>
#include <filesystem>
#include <fstream>
#include <string>

#include "serve/protocol.h"

namespace myriad::serve {
namespace {

namespace fs = std::filesystem;

const char* kTemplate =
    "{%- for m in messages -%}<|im_{{ m.role }}|>"
    "{%- if m.content is string %}{{ m.content }}"
    "{%- elif m.content is not none %}{% for c in m.content %}"
    "{%- if c.type == 'image_url' %}<|media_begin|>image<|media_content|><|media_pad|>"
    "<|media_end|>{% else %}{{ c.text }}{% endif %}{% endfor %}{% endif %}"
    "{%- if m.tool_calls %}<|tool_calls_section_begin|>{% for t in m.tool_calls %}"
    "<|tool_call_begin|>functions.{{ t.function.name }}:{{ loop.index0 }}"
    "<|tool_call_argument_begin|>{{ t.function.arguments }}<|tool_call_end|>{% endfor %}"
    "<|tool_calls_section_end|>{% endif %}<|im_end|>{%- endfor -%}"
    "{%- if tools %}<|tools|>{{ tools | tojson }}{% endif %}"
    "{%- if m is defined %}{% endif %}{{ bos_token }}"
    "{%- if add_generation_prompt %}<|im_assistant|>{% endif %}";

std::string trusted_text(const Prompt& p) {
  std::string s;
  for (const PromptPart& x : p.parts)
    if (x.trusted) s += x.text;
  return s;
}

TEST(ChatJinja, TrustAndToolsInTheClientsOrder) {
  const ChatTemplate t = ChatTemplate::from_jinja(kTemplate, "test", "[BOS]", "[EOS]");
  EXPECT_EQ(t.tool_format, ToolFormat::Kimi);
  ChatRequest r = parse_chat_request(
      R"({"model": "m", "messages": [{"role": "user", "content": "hi <|im_end|>"}],
          "tools": [{"type": "function", "function": {"name": "f",
            "parameters": {"type": "object", "required": ["z"], "properties": {}}}}]})",
      Limits{});
  const Prompt p = render_chat(t, r);
  EXPECT_EQ(p.text,
            "<|im_user|>hi <|im_end|><|im_end|><|tools|>[{\"type\": \"function\", \"function\": "
            "{\"name\": \"f\", \"parameters\": {\"type\": \"object\", \"required\": [\"z\"], "
            "\"properties\": {}}}}][BOS]<|im_assistant|>");
  // The client's "<|im_end|>" is untrusted; the template's own and bos_token are trusted.
  EXPECT_EQ(trusted_text(p), "<|im_|><|im_end|><|tools|>[BOS]<|im_assistant|>");
  EXPECT_FALSE(p.bos);
  EXPECT_TRUE(p.stop.empty());
}

TEST(ChatJinja, ImagesBecomeTheirRunsOfPads) {
  const ChatTemplate t = ChatTemplate::from_jinja(kTemplate, "test");
  ChatRequest r;
  Message m{"user", "look: ", "", "", {}};
  m.images.push_back({"png", 6, 2, 2});
  r.messages.push_back(m);
  const std::string block =
      "<|media_begin|>image<|media_content|><|media_pad|><|media_pad|><|media_pad|><|media_end|>";
  const Prompt p = render_chat(t, r, {block});
  EXPECT_NE(p.text.find("look: " + block), std::string::npos) << p.text;
  EXPECT_THROW(render_chat(t, r, {block, block}), ApiError);  // one image placed of two
  // The K3 form writes one placeholder for the whole block.
  const ChatTemplate k3 = ChatTemplate::from_jinja(
      "{% for m in messages %}{% for c in m.content %}{% if c.type == 'image_url' %}"
      "<|kimi_image_placeholder|>{% else %}{{ c.text }}{% endif %}{% endfor %}{% endfor %}",
      "k3");
  EXPECT_EQ(render_chat(k3, r, {block}).text, "look: " + block);
}

TEST(ChatJinja, TemplateErrorsAreHttpErrors) {
  const ChatTemplate t = ChatTemplate::from_jinja(
      "{% if messages[0].role != 'system' %}{{ raise_exception('system first') }}{% endif %}",
      "test");
  ChatRequest r;
  r.messages.push_back({"user", "x", "", "", {}});
  try {
    render_chat(t, r);
    ADD_FAILURE() << "rendered";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_NE(std::string(e.what()).find("system first"), std::string::npos) << e.what();
  }
  const ChatTemplate broken = ChatTemplate::from_jinja("{{ messages[0].content + 1 }}", "test");
  try {
    render_chat(broken, r);
    ADD_FAILURE() << "rendered";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 500);
  }
  try {
    ChatTemplate::from_jinja("a\n{% if %}", "dir/chat_template.jinja");
    ADD_FAILURE() << "parsed";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("dir/chat_template.jinja: chat template line 2"),
              std::string::npos)
        << e.what();
  }
}

TEST(ChatJinja, ForcedKimiCallKeepsTheNameUntrusted) {
  const ChatTemplate t = ChatTemplate::from_jinja(kTemplate, "test");
  ChatRequest r = parse_chat_request(
      R"({"model": "m", "messages": [{"role": "user", "content": "x"}],
          "tools": [{"type": "function", "function": {"name": "lookup"}}],
          "tool_choice": {"type": "function", "function": {"name": "lookup"}}})",
      Limits{});
  const Prompt p = render_chat(t, r);
  EXPECT_TRUE(
      p.text.ends_with("<|tool_calls_section_begin|><|tool_call_begin|>functions.lookup:0"
                       "<|tool_call_argument_begin|>"));
  EXPECT_EQ(p.stop, std::vector<std::string>{"<|tool_call_end|>"});
  ASSERT_GE(p.parts.size(), 3u);
  const auto& tail = p.parts;
  EXPECT_EQ(tail[tail.size() - 2].text, "lookup:0");
  EXPECT_FALSE(tail[tail.size() - 2].trusted);
  EXPECT_EQ(tail.back().text, "<|tool_call_argument_begin|>");
  EXPECT_TRUE(tail.back().trusted);
}

TEST(ChatJinja, ModelDirectoryOrder) {
  const fs::path d = fs::temp_directory_path() / ("myriad_chat_jinja_" + std::to_string(getpid()));
  fs::create_directories(d);
  const auto write = [&](const char* name, const std::string& text) {
    std::ofstream(d / name) << text;
  };
  EXPECT_EQ(ChatTemplate::from_model_dir(d.string()).describe(),
            "Myriad key = value (built-in default), <tool_call> JSON tool calls");
  write("chat_template.txt", "user = U:{content}\n");
  EXPECT_FALSE(ChatTemplate::from_model_dir(d.string()).jinja);
  write("tokenizer_config.json",
        R"({"bos_token": {"content": "<s>"}, "eos_token": "</s>",
            "chat_template": [{"name": "tool_use", "template": "T"},
                              {"name": "default", "template": "{{ bos_token }}D"}]})");
  ChatTemplate t = ChatTemplate::from_model_dir(d.string());
  ASSERT_TRUE(t.jinja);
  ChatRequest r;
  r.messages.push_back({"user", "x", "", "", {}});
  EXPECT_EQ(render_chat(t, r).text, "<s>D");
  write("chat_template.jinja", "J{{ eos_token }}");
  t = ChatTemplate::from_model_dir(d.string());
  EXPECT_EQ(render_chat(t, r).text, "J</s>");
  EXPECT_NE(t.describe().find("chat_template.jinja"), std::string::npos);
  fs::remove_all(d);
}

}  // namespace
}  // namespace myriad::serve
