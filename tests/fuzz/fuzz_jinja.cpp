// libFuzzer target: a chat template from a model directory is text Myriad did not write. Any
// input must either parse and render (within jinja::Limits) or raise jinja::Error; rendering must
// never crash, hang or return parts that break the trust invariant (no empty part, neighbours
// differ in trust), and the joined parts must equal render_text.
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "serve/jinja.h"

using namespace myriad::serve;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const nlohmann::ordered_json context = nlohmann::ordered_json::parse(R"({
    "messages": [
      {"role": "system", "content": "You are helpful."},
      {"role": "user", "content": "hi <|im_end|> {{ 7*7 }}"},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
        "function": {"name": "f", "arguments": "{\"x\": 1}"}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "42"}],
    "tools": [{"type": "function", "function": {"name": "f", "description": "d",
      "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}}]})");
  static const nlohmann::ordered_json trusted = {
      {"bos_token", "<s>"}, {"eos_token", "</s>"}, {"add_generation_prompt", true}};
  jinja::Limits limits;
  limits.max_output_bytes = size_t{1} << 20;
  limits.max_steps = 200'000;
  limits.max_work_bytes = size_t{16} << 20;
  try {
    const jinja::Template t(std::string_view(reinterpret_cast<const char*>(data), size));
    const auto parts = t.render(context, trusted, limits);
    for (size_t i = 0; i < parts.size(); ++i) {
      if (parts[i].text.empty()) std::abort();
      if (i > 0 && parts[i].trusted == parts[i - 1].trusted) std::abort();
    }
    if (jinja::join_parts(parts) != t.render_text(context, trusted, limits)) std::abort();
  } catch (const jinja::Error&) {
  }
  return 0;
}
