#include "serve/protocol.h"

#include "serve/jinja.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>

#include "core/error.h"
#include "vision/image.h"

namespace myriad::serve {

using json = nlohmann::json;

namespace {
constexpr std::string_view kOpen = "<tool_call>", kClose = "</tool_call>";
constexpr std::string_view kKimiOpen = "<|tool_calls_section_begin|>",
                           kKimiClose = "<|tool_calls_section_end|>",
                           kKimiCall = "<|tool_call_begin|>",
                           kKimiArgs = "<|tool_call_argument_begin|>",
                           kKimiCallEnd = "<|tool_call_end|>";
std::string_view open_tag(ToolFormat f) {
  return f == ToolFormat::Kimi ? kKimiOpen : kOpen;
}
std::string_view close_tag(ToolFormat f) {
  return f == ToolFormat::Kimi ? kKimiClose : kClose;
}
}  // namespace

ApiError::ApiError(int status_, std::string message, std::string param_, std::string code_,
                   std::string type_)
    : std::runtime_error(std::move(message)),
      status(status_),
      type(type_.empty() ? (status_ >= 500 ? "server_error" : "invalid_request_error") : type_),
      param(std::move(param_)),
      code(std::move(code_)) {}

json error_json(const ApiError& e) {
  const auto opt = [](const std::string& s) { return s.empty() ? json(nullptr) : json(s); };
  return {
      {"error",
       {{"message", e.what()}, {"type", e.type}, {"param", opt(e.param)}, {"code", opt(e.code)}}}};
}

namespace {

[[noreturn]] void bad(const std::string& message, const std::string& param,
                      const std::string& code = "") {
  throw ApiError(400, message, param, code);
}

const char* kind(const json& v) {
  if (v.is_string()) return "a string";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number()) return "a number";
  if (v.is_array()) return "an array";
  if (v.is_object()) return "an object";
  return "null";
}

// Present and not null.
const json* field(const json& o, const char* key) {
  auto it = o.find(key);
  return it == o.end() || it->is_null() ? nullptr : &*it;
}

std::string want_string(const json& v, const std::string& param) {
  if (!v.is_string()) bad("'" + param + "' must be a string, got " + kind(v), param);
  return v.get<std::string>();
}

bool get_bool(const json& o, const char* key, bool def) {
  const json* v = field(o, key);
  if (!v) return def;
  if (!v->is_boolean()) bad(std::string("'") + key + "' must be a boolean, got " + kind(*v), key);
  return v->get<bool>();
}

double get_number(const json& o, const char* key, double def, double lo, double hi,
                  bool lo_open = false) {
  const json* v = field(o, key);
  if (!v) return def;
  if (!v->is_number()) bad(std::string("'") + key + "' must be a number, got " + kind(*v), key);
  const double x = v->get<double>();
  if (!(lo_open ? x > lo : x >= lo) || !(x <= hi)) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "'%s' must be in %s%g, %g], got %g", key, lo_open ? "(" : "[",
                  lo, hi, x);
    bad(buf, key, "invalid_value");
  }
  return x;
}

std::optional<int64_t> get_int(const json& o, const char* key, int64_t lo, int64_t hi) {
  const json* v = field(o, key);
  if (!v) return std::nullopt;
  if (!v->is_number_integer())
    bad(std::string("'") + key + "' must be an integer, got " + kind(*v), key);
  // nlohmann stores non-negative literals as unsigned: compare those without a sign change.
  const bool out = v->is_number_unsigned()
                       ? v->get<uint64_t>() > static_cast<uint64_t>(hi) ||
                             (lo > 0 && v->get<uint64_t>() < static_cast<uint64_t>(lo))
                       : v->get<int64_t>() < lo || v->get<int64_t>() > hi;
  if (out)
    bad(std::string("'") + key + "' must be in [" + std::to_string(lo) + ", " + std::to_string(hi) +
            "], got " + v->dump(),
        key, "invalid_value");
  return v->get<int64_t>();
}

json parse_body(std::string_view body, const Limits& limits) {
  if (body.size() > limits.max_body_bytes)
    throw ApiError(413,
                   "request body of " + std::to_string(body.size()) +
                       " bytes exceeds the limit of " + std::to_string(limits.max_body_bytes) +
                       " bytes",
                   "", "request_too_large");
  json j = json::parse(body, nullptr, false);
  if (j.is_discarded())
    bad("We could not parse the JSON body of your request. (HINT: This likely means you aren't "
        "using your HTTP library correctly. The OpenAI API expects a JSON payload.)",
        "");
  if (!j.is_object())
    bad(std::string("the request body must be a JSON object, got ") + kind(j), "");
  return j;
}

std::string get_model(const json& j, const Limits& limits) {
  const json* m = field(j, "model");
  if (!m) bad("you must provide a model parameter", "model");
  std::string name = want_string(*m, "model");
  if (!limits.model.empty() && name != limits.model)
    throw ApiError(404, "The model `" + name + "` does not exist or you do not have access to it.",
                   "model", "model_not_found");
  return name;
}

// The parameters chat and completions share.
GenParams get_params(const json& j, const Limits& limits) {
  GenParams p;
  const SamplingDefaults& d = limits.defaults;
  p.temperature = get_number(j, "temperature", d.temperature, 0.0, 2.0);
  p.top_p = get_number(j, "top_p", d.top_p, 0.0, 1.0, true);
  p.min_p = get_number(j, "min_p", d.min_p, 0.0, 1.0);
  p.repetition_penalty = get_number(j, "repetition_penalty", d.repetition_penalty, 0.0, 10.0, true);
  p.presence_penalty = get_number(j, "presence_penalty", 0.0, -2.0, 2.0);
  p.frequency_penalty = get_number(j, "frequency_penalty", 0.0, -2.0, 2.0);
  p.top_k = static_cast<int>(get_int(j, "top_k", 0, 1 << 30).value_or(d.top_k));
  p.ignore_eos = get_bool(j, "ignore_eos", false);
  if (const json* s = field(j, "seed")) {
    if (!s->is_number_integer())
      bad(std::string("'seed' must be an integer, got ") + kind(*s), "seed");
    p.seed =
        s->is_number_unsigned() ? s->get<uint64_t>() : static_cast<uint64_t>(s->get<int64_t>());
  }
  const char* mt = field(j, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  p.max_tokens = get_int(j, mt, 1, INT64_MAX);
  if (p.max_tokens && *p.max_tokens > limits.max_tokens)
    bad("'" + std::string(mt) + "' is too large: " + std::to_string(*p.max_tokens) +
            ". This server supports at most " + std::to_string(limits.max_tokens) +
            " completion tokens.",
        mt, "invalid_value");
  if (const json* s = field(j, "stop")) {
    if (s->is_string()) {
      p.stop.push_back(s->get<std::string>());
    } else if (s->is_array()) {
      for (const auto& e : *s) p.stop.push_back(want_string(e, "stop"));
    } else {
      bad(std::string("'stop' must be a string or an array of strings, got ") + kind(*s), "stop");
    }
    if (p.stop.size() > limits.max_stop)
      bad("'stop' may hold at most " + std::to_string(limits.max_stop) + " sequences", "stop");
    for (const auto& x : p.stop)
      if (x.empty()) bad("stop sequences must not be empty", "stop");
  }
  if (auto n = get_int(j, "n", 1, INT64_MAX); n && *n != 1)
    bad("this server supports only n = 1", "n", "invalid_value");
  if (const json* b = field(j, "logit_bias"); b && !(b->is_object() && b->empty()))
    bad("'logit_bias' is not supported", "logit_bias");
  return p;
}

void get_stream(const json& j, bool& stream, bool& include_usage) {
  stream = get_bool(j, "stream", false);
  include_usage = false;
  if (const json* o = field(j, "stream_options")) {
    if (!o->is_object())
      bad(std::string("'stream_options' must be an object, got ") + kind(*o), "stream_options");
    if (!stream) bad("'stream_options' is only allowed when 'stream' is true", "stream_options");
    include_usage = get_bool(*o, "include_usage", false);
  }
}

// An image_url content part: the data: URL decoded and the image's header checked (remote URLs,
// malformed URLs, other formats and oversized images are 400s).
MessageImage get_image(const json& part, const std::string& param, size_t offset,
                       const Limits& limits) {
  const json* iu = field(part, "image_url");
  // {"url": ..., "detail": ...}, or the URL itself as some clients send it.
  const json* url = iu && iu->is_object()   ? field(*iu, "url")
                    : iu && iu->is_string() ? iu
                                            : nullptr;
  if (!url) bad("an image_url content part needs 'image_url' with a 'url'", param);
  if (iu->is_object())
    if (const json* d = field(*iu, "detail");
        d && (!d->is_string() || (*d != "auto" && *d != "low" && *d != "high")))
      bad("'image_url.detail' must be 'auto', 'low' or 'high'", param);
  const std::string u = want_string(*url, param);
  vision::DecodeOptions opt;
  opt.max_bytes = limits.max_body_bytes;  // the body already bounds it
  opt.max_pixels = INT64_MAX;             // checked below, with its own error code
  MessageImage img;
  img.offset = offset;
  try {
    img.bytes = vision::decode_data_url(u, opt.max_bytes);
  } catch (const Error& e) {
    bad(std::string("invalid image URL: ") + e.what(), param, "invalid_image_url");
  }
  try {
    const vision::ImageInfo info = vision::probe_image(img.bytes, opt);
    img.width = info.width;
    img.height = info.height;
  } catch (const Error& e) {
    bad(std::string("invalid image: ") + e.what(), param, "invalid_image_format");
  }
  if (img.width * img.height > limits.max_image_pixels)
    bad("image of " + std::to_string(img.width) + "x" + std::to_string(img.height) + " = " +
            std::to_string(img.width * img.height) + " pixels exceeds the limit of " +
            std::to_string(limits.max_image_pixels) + " pixels",
        param, "image_too_large");
  return img;
}

// Message content: a string, or an array of parts: text (joined without a separator) and, where
// `images` is given (user messages), image_url parts.
std::string get_content(const json& m, const std::string& param, bool allow_null,
                        std::vector<MessageImage>* images = nullptr,
                        const Limits* limits = nullptr) {
  const json* c = field(m, "content");
  if (!c) {
    if (allow_null) return "";
    bad("'" + param + ".content' is required", param + ".content");
  }
  if (c->is_string()) return c->get<std::string>();
  if (!c->is_array())
    bad("'" + param + ".content' must be a string or an array of content parts, got " + kind(*c),
        param + ".content");
  std::string out;
  for (const auto& part : *c) {
    if (!part.is_object() || !field(part, "type") || !part["type"].is_string())
      bad("content parts must be objects with a 'type'", param + ".content");
    const std::string type = part["type"].get<std::string>();
    if (type == "image_url") {
      if (!images) bad("image content parts are only allowed in user messages", param + ".content");
      images->push_back(get_image(part, param + ".content", out.size(), *limits));
      continue;
    }
    if (type != "text")
      bad("content part type '" + type + "' is not supported (text and image_url only)",
          param + ".content");
    const json* t = field(part, "text");
    if (!t) bad("a text content part needs 'text'", param + ".content");
    out += want_string(*t, param + ".content");
  }
  return out;
}

bool valid_function_name(const std::string& n) {
  return !n.empty() && n.size() <= 64 && std::all_of(n.begin(), n.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
  });
}

Message get_message(const json& m, size_t i, const Limits& limits) {
  const std::string p = "messages[" + std::to_string(i) + "]";
  if (!m.is_object()) bad("'" + p + "' must be an object, got " + kind(m), p);
  const json* r = field(m, "role");
  if (!r) bad("'" + p + ".role' is required", p + ".role");
  Message msg;
  msg.role = want_string(*r, p + ".role");
  if (const json* n = field(m, "name")) msg.name = want_string(*n, p + ".name");
  if (msg.role == "user") {
    msg.content = get_content(m, p, false, &msg.images, &limits);
  } else if (msg.role == "system" || msg.role == "developer") {
    msg.content = get_content(m, p, false);
  } else if (msg.role == "assistant") {
    msg.content = get_content(m, p, true);
    if (const json* tc = field(m, "tool_calls")) {
      if (!tc->is_array()) bad("'" + p + ".tool_calls' must be an array", p + ".tool_calls");
      for (size_t k = 0; k < tc->size(); ++k) {
        const json& c = (*tc)[k];
        const std::string q = p + ".tool_calls[" + std::to_string(k) + "]";
        if (!c.is_object() || !field(c, "function") || !c["function"].is_object())
          bad("'" + q + "' must be an object with a 'function' object", q);
        ToolCall call;
        if (const json* id = field(c, "id")) call.id = want_string(*id, q + ".id");
        const json& f = c["function"];
        const json* n = field(f, "name");
        if (!n) bad("'" + q + ".function.name' is required", q + ".function.name");
        call.name = want_string(*n, q + ".function.name");
        if (const json* a = field(f, "arguments"))
          call.arguments = a->is_string() ? a->get<std::string>() : a->dump();
        msg.tool_calls.push_back(std::move(call));
      }
    } else if (!field(m, "content")) {
      bad("'" + p + ".content' is required unless 'tool_calls' is given", p + ".content");
    }
  } else if (msg.role == "tool") {
    msg.content = get_content(m, p, false);
    const json* id = field(m, "tool_call_id");
    if (!id) bad("'" + p + ".tool_call_id' is required for tool messages", p + ".tool_call_id");
    msg.tool_call_id = want_string(*id, p + ".tool_call_id");
  } else {
    bad("'" + p + ".role' must be one of system, developer, user, assistant, tool; got '" +
            msg.role + "'",
        p + ".role");
  }
  return msg;
}

// `body`: the request text again, for the parameter schemas with their keys in the client's
// order (json sorts them).
void get_tools(const json& j, std::string_view body, ChatRequest& r, const Limits& limits) {
  nlohmann::ordered_json ordered;
  if (j.contains("tools")) ordered = nlohmann::ordered_json::parse(body, nullptr, false);
  if (const json* t = field(j, "tools")) {
    if (!t->is_array()) bad(std::string("'tools' must be an array, got ") + kind(*t), "tools");
    if (t->size() > limits.max_tools)
      bad("at most " + std::to_string(limits.max_tools) + " tools are allowed", "tools");
    for (size_t i = 0; i < t->size(); ++i) {
      const json& x = (*t)[i];
      const std::string p = "tools[" + std::to_string(i) + "]";
      if (!x.is_object()) bad("'" + p + "' must be an object", p);
      if (const json* ty = field(x, "type"); !ty || *ty != "function")
        bad("'" + p + ".type' must be 'function'", p + ".type");
      const json* f = field(x, "function");
      if (!f || !f->is_object()) bad("'" + p + ".function' must be an object", p + ".function");
      Tool tool;
      const json* n = field(*f, "name");
      if (!n) bad("'" + p + ".function.name' is required", p + ".function.name");
      tool.name = want_string(*n, p + ".function.name");
      if (!valid_function_name(tool.name))
        bad("'" + p + ".function.name' must match ^[a-zA-Z0-9_-]{1,64}$", p + ".function.name");
      for (const auto& other : r.tools)
        if (other.name == tool.name) bad("duplicate tool name '" + tool.name + "'", p);
      if (const json* d = field(*f, "description"))
        tool.description = want_string(*d, p + ".function.description");
      if (const json* s = field(*f, "parameters")) {
        if (!s->is_object())
          bad("'" + p + ".function.parameters' must be an object", p + ".function.parameters");
        tool.parameters = *s;
        const auto& o = ordered;
        if (o.is_object() && o.contains("tools") && o["tools"].is_array() &&
            o["tools"].size() > i && o["tools"][i].is_object() &&
            o["tools"][i].contains("function") && o["tools"][i]["function"].is_object() &&
            o["tools"][i]["function"].contains("parameters"))
          tool.parameters_text = o["tools"][i]["function"]["parameters"].dump();
      }
      r.tools.push_back(std::move(tool));
    }
  }
  const json* c = field(j, "tool_choice");
  r.tool_choice.mode = r.tools.empty() ? ToolChoice::None : ToolChoice::Auto;
  if (!c) return;
  if (c->is_string()) {
    const std::string s = c->get<std::string>();
    if (s == "none") {
      r.tool_choice.mode = ToolChoice::None;
    } else if (s == "auto") {
      // keeps the default
    } else if (s == "required") {
      r.tool_choice.mode = ToolChoice::Required;
    } else {
      bad("'tool_choice' must be 'none', 'auto', 'required' or a function object; got '" + s + "'",
          "tool_choice");
    }
  } else if (c->is_object()) {
    const json* f = field(*c, "function");
    if (const json* ty = field(*c, "type");
        !ty || *ty != "function" || !f || !f->is_object() || !field(*f, "name"))
      bad("'tool_choice' object must be {\"type\": \"function\", \"function\": {\"name\": ...}}",
          "tool_choice");
    r.tool_choice.mode = ToolChoice::Function;
    r.tool_choice.name = want_string((*f)["name"], "tool_choice.function.name");
    if (std::none_of(r.tools.begin(), r.tools.end(),
                     [&](const Tool& t) { return t.name == r.tool_choice.name; }))
      bad("'tool_choice' names function '" + r.tool_choice.name + "', which is not in 'tools'",
          "tool_choice");
  } else {
    bad(std::string("'tool_choice' must be a string or an object, got ") + kind(*c), "tool_choice");
  }
  if (r.tools.empty() && r.tool_choice.mode != ToolChoice::None)
    bad("'tool_choice' other than 'none' needs 'tools'", "tool_choice");
}

}  // namespace

ChatRequest parse_chat_request(std::string_view body, const Limits& limits) {
  const json j = parse_body(body, limits);
  ChatRequest r;
  r.model = get_model(j, limits);

  const json* ms = field(j, "messages");
  if (!ms) bad("'messages' is required", "messages");
  if (!ms->is_array())
    bad(std::string("'messages' must be an array, got ") + kind(*ms), "messages");
  if (ms->empty()) bad("'messages' must not be empty", "messages");
  if (ms->size() > limits.max_messages)
    bad("at most " + std::to_string(limits.max_messages) + " messages are allowed", "messages");
  size_t images = 0;
  for (size_t i = 0; i < ms->size(); ++i) {
    r.messages.push_back(get_message((*ms)[i], i, limits));
    images += r.messages.back().images.size();
    if (images > limits.max_images)
      bad("at most " + std::to_string(limits.max_images) + " images are allowed per request",
          "messages[" + std::to_string(i) + "].content");
  }
  r.params = get_params(j, limits);
  get_stream(j, r.stream, r.include_usage);
  if (get_bool(j, "logprobs", false)) {
    r.params.top_logprobs = static_cast<int>(get_int(j, "top_logprobs", 0, 20).value_or(0));
  } else if (field(j, "top_logprobs")) {
    bad("'top_logprobs' needs 'logprobs' set to true", "top_logprobs");
  }
  if (const json* f = field(j, "response_format")) {
    if (!f->is_object() || !field(*f, "type") || (*f)["type"] != "text")
      bad("only response_format {\"type\": \"text\"} is supported", "response_format");
  }
  get_tools(j, body, r, limits);
  return r;
}

CompletionRequest parse_completion_request(std::string_view body, const Limits& limits) {
  const json j = parse_body(body, limits);
  CompletionRequest r;
  r.model = get_model(j, limits);
  const json* p = field(j, "prompt");
  if (!p) bad("'prompt' is required", "prompt");
  const auto ids = [&](const json& a) {
    for (const auto& e : a) {
      if (!e.is_number_integer() || e.get<int64_t>() < 0 || e.get<int64_t>() > INT32_MAX)
        bad("token ids in 'prompt' must be non-negative integers", "prompt");
      r.prompt_ids.push_back(static_cast<int32_t>(e.get<int64_t>()));
    }
    if (r.prompt_ids.empty()) bad("'prompt' must not be an empty token list", "prompt");
  };
  if (p->is_string()) {
    r.prompt = p->get<std::string>();
  } else if (p->is_array() && !p->empty() && (*p)[0].is_string()) {
    if (p->size() != 1) bad("this server takes one prompt per request", "prompt");
    r.prompt = want_string((*p)[0], "prompt");
  } else if (p->is_array() && !p->empty() && (*p)[0].is_array()) {
    if (p->size() != 1) bad("this server takes one prompt per request", "prompt");
    ids((*p)[0]);
  } else if (p->is_array()) {
    ids(*p);
  } else {
    bad(std::string("'prompt' must be a string, an array of one string or token ids; got ") +
            kind(*p),
        "prompt");
  }
  r.params = get_params(j, limits);
  if (!r.params.max_tokens) r.params.max_tokens = std::min<int64_t>(16, limits.max_tokens);
  get_stream(j, r.stream, r.include_usage);
  r.echo = get_bool(j, "echo", false);
  if (auto lp = get_int(j, "logprobs", 0, 5)) r.params.top_logprobs = static_cast<int>(*lp);
  if (auto b = get_int(j, "best_of", 1, INT64_MAX); b && *b != 1)
    bad("this server supports only best_of = 1", "best_of");
  if (const json* s = field(j, "suffix"); s && !(s->is_string() && s->get<std::string>().empty()))
    bad("'suffix' is not supported", "suffix");
  return r;
}

// ---- Chat template ----

ChatTemplate ChatTemplate::default_template() {
  ChatTemplate t;
  t.system = "<|system|>\n{content}<|end|>\n";
  t.user = "<|user|>\n{content}<|end|>\n";
  t.assistant = "<|assistant|>\n{content}<|end|>\n";
  t.tool = "<|tool|>\n{content}<|end|>\n";
  t.generation = "<|assistant|>\n";
  t.tools =
      "<|system|>\nYou can call these functions. To call one, reply with "
      "<tool_call>{\"name\": NAME, \"arguments\": ARGUMENTS}</tool_call>.\n{tools}<|end|>\n";
  t.stop = {"<|end|>", "<|user|>"};
  return t;
}

ChatTemplate ChatTemplate::parse(std::string_view text) {
  ChatTemplate t = default_template();
  bool own_stop = false;
  std::istringstream in{std::string(text)};
  std::string line;
  for (int no = 1; std::getline(in, line); ++no) {
    const auto where = [&] { return "chat template line " + std::to_string(no) + ": "; };
    const auto first = line.find_first_not_of(" \t\r");
    if (first == std::string::npos || line[first] == '#') continue;
    const auto eq = line.find('=');
    if (eq == std::string::npos) throw std::invalid_argument(where() + "expected key = value");
    std::string key = line.substr(first, eq - first);
    key.erase(key.find_last_not_of(" \t") + 1);
    std::string raw = line.substr(eq + 1);
    raw.erase(0, raw.find_first_not_of(" \t"));
    raw.erase(raw.find_last_not_of(" \t\r") + 1);
    std::string v;
    for (size_t i = 0; i < raw.size(); ++i) {
      if (raw[i] != '\\') {
        v += raw[i];
        continue;
      }
      const char e = i + 1 < raw.size() ? raw[++i] : '\0';
      if (e == 'n')
        v += '\n';
      else if (e == 't')
        v += '\t';
      else if (e == 's')
        v += ' ';
      else if (e == '\\')
        v += '\\';
      else
        throw std::invalid_argument(where() + "unknown escape (use \\n \\t \\s \\\\)");
    }
    if (key == "bos") {
      if (v != "true" && v != "false") throw std::invalid_argument(where() + "bos is true|false");
      t.bos = v == "true";
    } else if (key == "stop") {
      if (v.empty()) throw std::invalid_argument(where() + "empty stop sequence");
      if (!own_stop) t.stop.clear(), own_stop = true;
      t.stop.push_back(v);
    } else if (key == "system")
      t.system = v;
    else if (key == "user")
      t.user = v;
    else if (key == "assistant")
      t.assistant = v;
    else if (key == "tool")
      t.tool = v;
    else if (key == "generation")
      t.generation = v;
    else if (key == "tools")
      t.tools = v;
    else
      throw std::invalid_argument(where() + "unknown key '" + key + "'");
  }
  return t;
}

namespace {

std::optional<std::string> read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return std::nullopt;
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// tokenizer_config.json's bos_token / eos_token: a string or an AddedToken object.
std::string token_text(const json& cfg, const char* key) {
  const auto it = cfg.find(key);
  if (it == cfg.end()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
    return (*it)["content"].get<std::string>();
  return "";
}

}  // namespace

ChatTemplate ChatTemplate::from_jinja(std::string_view source, std::string origin,
                                      std::string bos_token, std::string eos_token) {
  ChatTemplate t;
  try {
    t.jinja = std::make_shared<const jinja::Template>(source);
  } catch (const jinja::Error& e) {
    throw std::invalid_argument(origin + ": " + e.what());
  }
  t.tool_format = tool_format_of(source);
  t.bos_token = std::move(bos_token);
  t.eos_token = std::move(eos_token);
  t.origin = std::move(origin);
  return t;
}

ChatTemplate ChatTemplate::from_model_dir(const std::string& dir) {
  json cfg = json::object();
  const std::string cfg_path = dir + "/tokenizer_config.json";
  if (auto text = read_text(cfg_path)) {
    cfg = json::parse(*text, nullptr, false);
    if (!cfg.is_object()) throw std::invalid_argument(cfg_path + ": not a JSON object");
  }
  const std::string bos = token_text(cfg, "bos_token"), eos = token_text(cfg, "eos_token");
  if (auto text = read_text(dir + "/chat_template.jinja"))
    return from_jinja(*text, dir + "/chat_template.jinja", bos, eos);
  if (const auto it = cfg.find("chat_template"); it != cfg.end() && !it->is_null()) {
    const std::string origin = cfg_path + " chat_template";
    if (it->is_string()) return from_jinja(it->get<std::string>(), origin, bos, eos);
    if (it->is_array())
      for (const json& e : *it)
        if (e.is_object() && e.value("name", "") == "default" && e.contains("template") &&
            e["template"].is_string())
          return from_jinja(e["template"].get<std::string>(), origin + " (default)", bos, eos);
    throw std::invalid_argument(origin +
                                ": expected a string or a list holding a \"default\" template");
  }
  auto text = read_text(dir + "/chat_template.txt");
  if (!text) return default_template();
  try {
    ChatTemplate t = parse(*text);
    t.origin = dir + "/chat_template.txt";
    return t;
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(dir + "/chat_template.txt: " + e.what());
  }
}

std::string ChatTemplate::describe() const {
  std::string s = jinja ? "Jinja" : "Myriad key = value";
  s += " (" + (origin.empty() ? std::string("built-in default") : origin) + ")";
  s += tool_format == ToolFormat::Kimi ? ", Kimi tool calls" : ", <tool_call> JSON tool calls";
  return s;
}

namespace {

// Placeholders are substituted in one pass; inserted text is never scanned again. The
// template's own text goes in as trusted (it may hold special tokens), what it inserts from the
// request as untrusted.
// A message's text with its images' placeholder blocks (trusted: the template's markers) at
// their offsets; blocks[k] belongs to the message's k-th image.
void add_content(Prompt& p, const Message& m, const std::vector<std::string>& blocks) {
  size_t at = 0;
  for (size_t k = 0; k < m.images.size(); ++k) {
    const size_t off = std::min(m.images[k].offset, m.content.size());
    p.add(std::string_view(m.content).substr(at, off - at), false);
    p.add(blocks.at(k), true);
    at = off;
  }
  p.add(std::string_view(m.content).substr(at), false);
}

void fill(Prompt& p, const std::string& pattern, const Message* m, const std::string& tools = "",
          const std::vector<std::string>& blocks = {}) {
  std::string literal;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '{') {
      const auto rest = std::string_view(pattern).substr(i);
      const std::pair<std::string_view, const std::string*> keys[] = {
          {"{content}", m ? &m->content : nullptr},
          {"{name}", m ? &m->name : nullptr},
          {"{tool_call_id}", m ? &m->tool_call_id : nullptr},
          {"{tools}", &tools}};
      bool hit = false;
      for (const auto& [k, v] : keys) {
        if (v && rest.substr(0, k.size()) == k) {
          p.add(std::exchange(literal, {}), true);
          if (m && v == &m->content && !m->images.empty())
            add_content(p, *m, blocks);
          else
            p.add(*v, false);
          i += k.size() - 1;
          hit = true;
          break;
        }
      }
      if (hit) continue;
    }
    literal += pattern[i];
  }
  p.add(literal, true);
}

}  // namespace

std::string format_tool_call(const ToolCall& c) {
  // Arguments that are JSON go in as they are; anything else as a JSON string. A closing tag
  // can then only sit inside a JSON string, where "<\/" keeps it from ending the block.
  const auto text = [](const json& j) {
    return j.dump(-1, ' ', false, json::error_handler_t::replace);
  };
  const json a = json::parse(c.arguments, nullptr, false);
  std::string args = c.arguments.empty() ? "{}"
                     : a.is_discarded()  ? text(json(c.arguments))
                                         : c.arguments;
  std::string out = "{\"name\": " + text(json(c.name)) + ", \"arguments\": " + args + "}";
  for (size_t i = out.find(kClose); i != std::string::npos; i = out.find(kClose, i + 1))
    out.replace(i, 2, "<\\/");
  return std::string(kOpen) + out + std::string(kClose);
}

void Prompt::add(std::string_view s, bool trusted) {
  if (s.empty()) return;
  text += s;
  if (!parts.empty() && parts.back().trusted == trusted)
    parts.back().text += s;
  else
    parts.push_back({std::string(s), trusted});
}

namespace {

// The request as a Jinja template sees it (transformers' apply_chat_template / vLLM): OpenAI
// messages (an assistant's tool calls with their arguments as JSON text; content null when a
// tool-calling turn has no text; a user's images as image_url parts beside the text), tools as
// {"type": "function", "function": {...}}.
nlohmann::ordered_json jinja_context(const ChatRequest& r) {
  using ojson = nlohmann::ordered_json;
  ojson messages = ojson::array();
  for (const Message& m : r.messages) {
    ojson j = {{"role", m.role}};
    if (!m.images.empty()) {
      ojson parts = ojson::array();
      size_t at = 0;
      for (const MessageImage& im : m.images) {
        if (im.offset > at)
          parts.push_back({{"type", "text"}, {"text", m.content.substr(at, im.offset - at)}});
        parts.push_back({{"type", "image_url"}, {"image_url", {{"url", ""}}}});
        at = std::max(at, im.offset);
      }
      if (at < m.content.size())
        parts.push_back({{"type", "text"}, {"text", m.content.substr(at)}});
      j["content"] = std::move(parts);
    } else if (m.content.empty() && !m.tool_calls.empty()) {
      j["content"] = nullptr;
    } else {
      j["content"] = m.content;
    }
    if (!m.name.empty()) j["name"] = m.name;
    if (!m.tool_call_id.empty()) j["tool_call_id"] = m.tool_call_id;
    if (!m.tool_calls.empty()) {
      ojson calls = ojson::array();
      for (const ToolCall& c : m.tool_calls)
        calls.push_back({{"id", c.id},
                         {"type", "function"},
                         {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
      j["tool_calls"] = std::move(calls);
    }
    messages.push_back(std::move(j));
  }
  ojson ctx = {{"messages", std::move(messages)}};
  if (!r.tools.empty() && r.tool_choice.mode != ToolChoice::None) {
    ojson tools = ojson::array();
    for (const Tool& t : r.tools) {
      ojson f = {{"name", t.name}};
      if (!t.description.empty()) f["description"] = t.description;
      if (!t.parameters_text.empty())
        f["parameters"] = ojson::parse(t.parameters_text);
      else if (!t.parameters.is_null())
        f["parameters"] = ojson::parse(t.parameters.dump());
      tools.push_back({{"type", "function"}, {"function", std::move(f)}});
    }
    ctx["tools"] = std::move(tools);
  }
  return ctx;
}

// Where a template puts an image: Kimi K2.5's templates write one <|media_pad|> inside their own
// begin/content/end markers; the K3 format writes <|kimi_image_placeholder|> for the whole block.
constexpr std::string_view kMediaPad = "<|media_pad|>", kK3Image = "<|kimi_image_placeholder|>";

Prompt render_jinja(const ChatTemplate& t, const ChatRequest& r,
                    const std::vector<std::string>& image_blocks) {
  const nlohmann::ordered_json data = jinja_context(r);
  const nlohmann::ordered_json trusted = {
      {"bos_token", t.bos_token}, {"eos_token", t.eos_token}, {"add_generation_prompt", true}};
  std::vector<jinja::Part> parts;
  try {
    parts = t.jinja->render(data, trusted);
  } catch (const jinja::Error& e) {
    if (e.kind == jinja::Error::Kind::Raised)
      throw ApiError(400, "the chat template refused the request: " + e.detail, "messages");
    throw ApiError(500, "the chat template failed: " + std::string(e.what()), "", "",
                   "server_error");
  }
  Prompt p;
  // Each image's placeholder becomes the image's run of pads (or its whole block).
  size_t next_image = 0;
  for (const jinja::Part& part : parts) {
    if (!part.trusted || image_blocks.empty()) {
      p.add(part.text, part.trusted);
      continue;
    }
    std::string_view rest = part.text;
    while (true) {
      const size_t pad = rest.find(kMediaPad), k3 = rest.find(kK3Image);
      const size_t at = std::min(pad, k3);
      if (at == std::string_view::npos) break;
      if (next_image >= image_blocks.size())
        throw ApiError(400, "the chat template placed more images than the request holds",
                       "messages");
      const std::string_view block = image_blocks[next_image++];
      p.add(rest.substr(0, at), true);
      if (at == pad) {  // the pad run of the block
        const size_t first = block.find(kMediaPad), last = block.rfind(kMediaPad);
        p.add(block.substr(first, last + kMediaPad.size() - first), true);
        rest.remove_prefix(at + kMediaPad.size());
      } else {  // the whole block
        p.add(block, true);
        rest.remove_prefix(at + kK3Image.size());
      }
    }
    p.add(rest, true);
  }
  if (next_image != image_blocks.size())
    throw ApiError(400,
                   "the chat template placed " + std::to_string(next_image) + " of the " +
                       std::to_string(image_blocks.size()) +
                       " images (it writes no <|media_pad|> or <|kimi_image_placeholder|> for "
                       "them)",
                   "messages");
  auto [opening, stop] = forced_opening(r, t.tool_format);
  if (!opening.empty()) {
    // The format's markers are the template's (trusted); the tool name is the client's.
    p.forced_prefix = opening;
    if (t.tool_format == ToolFormat::Kimi) {
      const std::string head = std::string(kKimiOpen) + std::string(kKimiCall) + "functions.";
      p.add(head, true);
      std::string_view tail = std::string_view(opening).substr(head.size());
      const bool args = tail.ends_with(kKimiArgs);
      if (args) tail.remove_suffix(kKimiArgs.size());
      p.add(tail, false);
      if (args) p.add(kKimiArgs, true);
    } else {
      p.add(opening, false);
    }
    p.stop.push_back(std::move(stop));
  }
  return p;
}

}  // namespace

Prompt render_chat(const ChatTemplate& t, const ChatRequest& r,
                   const std::vector<std::string>& image_blocks) {
  if (t.jinja) return render_jinja(t, r, image_blocks);
  Prompt p;
  p.bos = t.bos;
  p.stop = t.stop;
  const bool tools = !r.tools.empty() && r.tool_choice.mode != ToolChoice::None;
  if (tools) {
    std::string list;
    for (const auto& tool : r.tools) {
      json d = {{"name", tool.name}};
      if (!tool.description.empty()) d["description"] = tool.description;
      if (!tool.parameters.is_null()) d["parameters"] = tool.parameters;
      list += d.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
    }
    fill(p, t.tools, nullptr, list);
  }
  size_t next_image = 0;
  for (const auto& m : r.messages) {
    if (m.role == "assistant") {
      Message a = m;
      for (const auto& c : m.tool_calls) a.content += format_tool_call(c);
      fill(p, t.assistant, &a);
    } else if (m.role == "tool") {
      fill(p, t.tool, &m);
    } else {
      MYRIAD_CHECK(image_blocks.size() >= next_image + m.images.size(),
                   "render_chat: ", m.images.size(), " image(s) in a message but only ",
                   image_blocks.size() - next_image, " placeholder block(s) left");
      const std::vector<std::string> blocks(
          image_blocks.begin() + static_cast<std::ptrdiff_t>(next_image),
          image_blocks.begin() + static_cast<std::ptrdiff_t>(next_image + m.images.size()));
      next_image += m.images.size();
      fill(p, m.role == "user" ? t.user : t.system, &m, "", blocks);
    }
  }
  p.add(t.generation, true);
  if (tools) {
    auto [opening, stop] = forced_opening(r, ToolFormat::Json);
    p.forced_prefix = std::move(opening);
    if (!p.forced_prefix.empty()) {
      p.add(p.forced_prefix, false);  // holds the tool name from the request
      p.stop.push_back(std::move(stop));
    }
  }
  return p;
}

// ---- Tool calls in model output ----

std::string new_id(std::string_view prefix) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  char buf[32];
  std::snprintf(buf, sizeof buf, "%016llx%08llx", static_cast<unsigned long long>(rng()),
                static_cast<unsigned long long>(rng() & 0xffffffffu));
  return std::string(prefix) + buf;
}

namespace {

std::string arguments_text(const json& a) {
  if (a.is_string()) return a.get<std::string>();
  return a.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::optional<ToolCall> parse_call(std::string_view inner) {
  const json j = json::parse(inner, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return std::nullopt;
  const json* n = field(j, "name");
  if (!n || !n->is_string() || n->get<std::string>().empty()) return std::nullopt;
  const json* a = field(j, "arguments");
  return ToolCall{new_id("call_"), n->get<std::string>(), a ? arguments_text(*a) : "{}"};
}

std::string_view trim(std::string_view s) {
  const auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

// Arguments from the model's text: compact JSON when it parses (possibly after dropping the
// closing brace of the call object), else the text as written.
std::string salvage_arguments(std::string_view s) {
  s = trim(s);
  json a = json::parse(s, nullptr, false);
  if (a.is_discarded() && !s.empty() && s.back() == '}')
    a = json::parse(s.substr(0, s.size() - 1), nullptr, false);
  return a.is_discarded() ? std::string(s) : arguments_text(a);
}

}  // namespace

namespace {

// The calls of a Kimi section body: <|tool_call_begin|>functions.N:I<|tool_call_argument_begin|>
// A<|tool_call_end|>, repeated (whitespace between calls allowed). Anything else: not a section.
std::optional<std::vector<ToolCall>> parse_kimi_section(std::string_view body) {
  std::vector<ToolCall> calls;
  size_t pos = 0;
  while (true) {
    while (pos < body.size() && std::isspace(static_cast<unsigned char>(body[pos]))) ++pos;
    if (pos == body.size()) break;
    if (body.substr(pos, kKimiCall.size()) != kKimiCall) return std::nullopt;
    pos += kKimiCall.size();
    const size_t a = body.find(kKimiArgs, pos);
    if (a == std::string_view::npos) return std::nullopt;
    const size_t e = body.find(kKimiCallEnd, a + kKimiArgs.size());
    if (e == std::string_view::npos) return std::nullopt;
    std::string_view id = trim(body.substr(pos, a - pos));  // functions.NAME:INDEX
    if (id.starts_with("functions.")) id.remove_prefix(10);
    const size_t colon = id.rfind(':');
    std::string_view name = colon == std::string_view::npos ? id : id.substr(0, colon);
    if (name.empty()) return std::nullopt;
    calls.push_back(
        ToolCall{new_id("call_"), std::string(name),
                 salvage_arguments(body.substr(a + kKimiArgs.size(), e - a - kKimiArgs.size()))});
    pos = e + kKimiCallEnd.size();
  }
  if (calls.empty()) return std::nullopt;
  return calls;
}

}  // namespace

ToolFormat tool_format_of(std::string_view template_text) {
  return template_text.find(kKimiCall) != std::string_view::npos ? ToolFormat::Kimi
                                                                 : ToolFormat::Json;
}

std::pair<std::string, std::string> forced_opening(const ChatRequest& r, ToolFormat f) {
  if (r.tools.empty() || r.tool_choice.mode == ToolChoice::None) return {};
  const bool fn = r.tool_choice.mode == ToolChoice::Function;
  if (!fn && r.tool_choice.mode != ToolChoice::Required) return {};
  if (f == ToolFormat::Kimi)
    return {std::string(kKimiOpen) + std::string(kKimiCall) + "functions." +
                (fn ? r.tool_choice.name + ":0" + std::string(kKimiArgs) : ""),
            std::string(kKimiCallEnd)};
  return {fn ? "<tool_call>{\"name\": " + json(r.tool_choice.name).dump() + ", \"arguments\": "
             : "<tool_call>{\"name\": \"",
          std::string(kClose)};
}

ParsedOutput parse_tool_calls(std::string_view text, ToolFormat f) {
  ParsedOutput out;
  const std::string_view open = open_tag(f), close = close_tag(f);
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t b = text.find(open, pos);
    const size_t e = b == std::string_view::npos ? b : text.find(close, b + open.size());
    if (e == std::string_view::npos) break;
    const std::string_view body = text.substr(b + open.size(), e - b - open.size());
    std::optional<std::vector<ToolCall>> calls;
    if (f == ToolFormat::Kimi) {
      calls = parse_kimi_section(body);
    } else if (auto c = parse_call(body)) {
      calls = std::vector<ToolCall>{std::move(*c)};
    }
    if (calls) {
      out.content += text.substr(pos, b - pos);
      for (auto& c : *calls) out.tool_calls.push_back(std::move(c));
    } else {
      out.content += text.substr(pos, e + close.size() - pos);
    }
    pos = e + close.size();
  }
  if (pos < text.size()) out.content += text.substr(pos);
  return out;
}

ToolCall forced_tool_call(const ChatRequest& r, std::string_view prefix, std::string_view gen,
                          ToolFormat f) {
  if (f == ToolFormat::Kimi) {
    // The prefix ends in "functions." (required) or in the call's argument marker (function).
    ToolCall c{new_id("call_"), r.tool_choice.name, ""};
    std::string_view args = gen;
    if (r.tool_choice.mode != ToolChoice::Function) {
      const size_t a = gen.find(kKimiArgs);
      std::string_view said = gen.substr(0, std::min(a, gen.find(':')));
      size_t best = 0;
      c.name = r.tools.empty() ? std::string(said) : r.tools[0].name;
      for (const auto& t : r.tools) {
        size_t k = 0;
        while (k < t.name.size() && k < said.size() && t.name[k] == said[k]) ++k;
        if (k > best) best = k, c.name = t.name;
      }
      args = a == std::string_view::npos ? std::string_view{} : gen.substr(a + kKimiArgs.size());
    }
    if (const size_t e = args.find(kKimiCallEnd); e != std::string_view::npos)
      args = args.substr(0, e);
    c.arguments = trim(args).empty() ? "{}" : salvage_arguments(args);
    return c;
  }
  const std::string body =
      std::string(prefix.substr(std::min(prefix.size(), kOpen.size()))) + std::string(gen);
  if (auto c = parse_call(body)) {
    const bool known = std::any_of(r.tools.begin(), r.tools.end(),
                                   [&](const Tool& t) { return t.name == c->name; });
    if (r.tool_choice.mode == ToolChoice::Function) c->name = r.tool_choice.name;
    if (known || r.tool_choice.mode == ToolChoice::Function) return *c;
  }
  ToolCall c{new_id("call_"), r.tool_choice.name, ""};
  if (r.tool_choice.mode == ToolChoice::Function) {
    c.arguments = salvage_arguments(gen);
    return c;
  }
  // Required: the name is the text up to the closing quote; take the tool whose name shares the
  // longest prefix with it (the first tool on ties).
  const std::string_view said = gen.substr(0, gen.find('"'));
  size_t best = 0;
  c.name = r.tools.empty() ? std::string(said) : r.tools[0].name;
  for (const auto& t : r.tools) {
    size_t k = 0;
    while (k < t.name.size() && k < said.size() && t.name[k] == said[k]) ++k;
    if (k > best) best = k, c.name = t.name;
  }
  const size_t a = gen.find("\"arguments\"");
  const size_t colon = a == std::string_view::npos ? a : gen.find(':', a);
  c.arguments = colon == std::string_view::npos ? "{}" : salvage_arguments(gen.substr(colon + 1));
  return c;
}

std::string ToolStreamFilter::feed(std::string_view text) {
  pending_ += text;
  if (holding_) return {};
  std::string out;
  const std::string_view open = open_tag(format_);
  if (const size_t b = pending_.find(open); b != std::string::npos) {
    out = pending_.substr(0, b);
    pending_.erase(0, b);
    holding_ = true;
    return out;
  }
  // Hold back a tail that could be the start of the tag.
  size_t keep = std::min(pending_.size(), open.size() - 1);
  while (keep > 0 &&
         std::string_view(pending_).substr(pending_.size() - keep) != open.substr(0, keep))
    --keep;
  out = pending_.substr(0, pending_.size() - keep);
  pending_.erase(0, pending_.size() - keep);
  return out;
}

ParsedOutput ToolStreamFilter::finish() {
  ParsedOutput out = holding_ ? parse_tool_calls(pending_, format_) : ParsedOutput{pending_, {}};
  pending_.clear();
  holding_ = false;
  return out;
}

// ---- Responses ----

json usage_json(const Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens}};
}

namespace {
json bytes_of(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(c);
  return b;
}
json nullable(const std::string& s) {
  return s.empty() ? json(nullptr) : json(s);
}
}  // namespace

json chat_logprobs_json(const std::vector<TokenLogprob>& lp) {
  json content = json::array();
  for (const auto& t : lp) {
    json top = json::array();
    for (const auto& [tok, l] : t.top)
      top.push_back({{"token", tok}, {"logprob", l}, {"bytes", bytes_of(tok)}});
    content.push_back({{"token", t.token},
                       {"logprob", t.logprob},
                       {"bytes", bytes_of(t.token)},
                       {"top_logprobs", top}});
  }
  return {{"content", content}};
}

json completion_logprobs_json(const std::vector<TokenLogprob>& lp, size_t offset) {
  json tokens = json::array(), lps = json::array(), tops = json::array(), offs = json::array();
  for (const auto& t : lp) {
    tokens.push_back(t.token);
    lps.push_back(t.logprob);
    json top = json::object();
    for (const auto& [tok, l] : t.top) top[tok] = l;
    tops.push_back(top);
    offs.push_back(offset);
    offset += t.token.size();
  }
  return {
      {"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offs}};
}

json tool_calls_json(const std::vector<ToolCall>& calls, bool with_index) {
  json a = json::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    json c = {{"id", calls[i].id},
              {"type", "function"},
              {"function", {{"name", calls[i].name}, {"arguments", calls[i].arguments}}}};
    if (with_index) c["index"] = i;
    a.push_back(c);
  }
  return a;
}

json chat_response(const std::string& id, int64_t created, const std::string& model,
                   const ParsedOutput& out, const std::string& finish_reason, const Usage& usage,
                   const json& logprobs) {
  json msg = {{"role", "assistant"}, {"content", out.content}};
  if (!out.tool_calls.empty()) {
    if (trim(out.content).empty()) msg["content"] = nullptr;
    msg["tool_calls"] = tool_calls_json(out.tool_calls, false);
  }
  return {{"id", id},
          {"object", "chat.completion"},
          {"created", created},
          {"model", model},
          {"system_fingerprint", nullptr},
          {"choices", json::array({{{"index", 0},
                                    {"message", msg},
                                    {"logprobs", logprobs},
                                    {"finish_reason", finish_reason}}})},
          {"usage", usage_json(usage)}};
}

json completion_response(const std::string& id, int64_t created, const std::string& model,
                         const std::string& text, const std::string& finish_reason,
                         const Usage& usage, const json& logprobs) {
  return {{"id", id},
          {"object", "text_completion"},
          {"created", created},
          {"model", model},
          {"system_fingerprint", nullptr},
          {"choices", json::array({{{"index", 0},
                                    {"text", text},
                                    {"logprobs", logprobs},
                                    {"finish_reason", finish_reason}}})},
          {"usage", usage_json(usage)}};
}

json chat_chunk(const std::string& id, int64_t created, const std::string& model, json delta,
                const std::string& finish_reason, const json& logprobs) {
  return {{"id", id},
          {"object", "chat.completion.chunk"},
          {"created", created},
          {"model", model},
          {"system_fingerprint", nullptr},
          {"choices", json::array({{{"index", 0},
                                    {"delta", std::move(delta)},
                                    {"logprobs", logprobs},
                                    {"finish_reason", nullable(finish_reason)}}})}};
}

json completion_chunk(const std::string& id, int64_t created, const std::string& model,
                      const std::string& text, const std::string& finish_reason,
                      const json& logprobs) {
  return {{"id", id},
          {"object", "text_completion"},
          {"created", created},
          {"model", model},
          {"choices", json::array({{{"index", 0},
                                    {"text", text},
                                    {"logprobs", logprobs},
                                    {"finish_reason", nullable(finish_reason)}}})}};
}

json usage_chunk(const std::string& object, const std::string& id, int64_t created,
                 const std::string& model, const Usage& u) {
  return {{"id", id},       {"object", object},         {"created", created},
          {"model", model}, {"choices", json::array()}, {"usage", usage_json(u)}};
}

std::string sse(const json& j) {
  return "data: " + j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

}  // namespace myriad::serve
