// A Jinja interpreter for the chat templates that published models ship (chat_template.jinja or
// tokenizer_config.json's chat_template): the subset of Jinja2 3.1 those templates use, rendered
// byte for byte as Hugging Face transformers renders them, i.e. with
// jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
// extensions=[loopcontrols]) plus transformers' tojson filter (ensure_ascii=False, indent,
// separators, sort_keys), raise_exception, strftime_now, namespace and dict, and its
// {% generation %} tag (rendered as its body). Values print as Python prints them (True, None,
// 1.0, 1e-05, {'a': 1}).
//
// The output is split by who wrote it: text from the template source is trusted (its special
// tokens may become special token ids); text that comes from the render context's untrusted data
// (message contents, names, tool results, tool schemas) stays untrusted even after it is copied,
// concatenated or printed inside a container, so a user who types "<|im_end|>" cannot forge a
// control token. A string made by an operation that transforms text (a filter such as trim or
// replace, tojson, slicing, a string method) is trusted only when every input to it was; joining
// and concatenating keep each piece's flag. Numbers, booleans and None print as trusted text (they
// cannot spell a special token). Comparisons and tests ignore trust.
//
// Not supported (an error, never a silent difference): include/import/extends/block, recursive
// for loops, integers beyond 64 bits (Python's are unbounded), complex numbers, and the filters
// groupby, slice, truncate, wordwrap, urlize, urlencode, striptags, xmlattr, pprint, random,
// filesizeformat, forceescape. Differences that remain: printing a function, method, range or
// generator object (Python prints its address), Markup's repr inside a printed container, the
// results of jinja2's constant folding on nonsense such as slicing a literal number, and
// str.upper/lower/title beyond Unicode 14 (Python 3.11's tables are built in). Rendering at the
// default depth needs about 1 MiB of stack.
//
// Tested against jinja2 3.1.6 on fixtures written by tools/reference/jinja_fixtures.py.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace myriad::serve::jinja {

// One run of rendered text; consecutive parts of a render have different `trusted` flags.
struct Part {
  std::string text;
  bool trusted = false;
  bool operator==(const Part&) const = default;
};

// Every error of parsing or rendering. what() reads "chat template line 7: unknown filter 'foo'".
class Error : public std::runtime_error {
 public:
  enum class Kind {
    Syntax,   // the template does not parse (or names an unknown filter or test)
    Runtime,  // rendering failed (type error, undefined value used, calling a non-callable, ...)
    Raised,   // the template called raise_exception(message): a client error (HTTP 400)
    Limit,    // a Limits bound was reached
  };
  Error(Kind kind, int line, int column, std::string detail);
  Kind kind;
  int line = 0, column = 0;  // 1-based position in the template; 0 when unknown
  std::string detail;        // the message without the "chat template line N: " prefix;
                             // for Raised, exactly the template's message
};

// Bounds on one render, so that a hostile template cannot hang or exhaust the server.
struct Limits {
  size_t max_output_bytes = size_t{64} << 20;  // rendered text, also the longest string built
  int max_depth = 256;                         // nested macro calls (parsing nests at most 256)
  uint64_t max_steps = 5'000'000;              // statements + loop iterations + calls
  size_t max_work_bytes = size_t{256} << 20;   // bytes of strings and lists built or scanned
};

class Template {
 public:
  // Throws Error (Kind::Syntax) when `source` is not a valid template.
  explicit Template(std::string_view source);

  // `data`: a JSON object whose members become template variables; every string in them
  // (values and object keys) is untrusted: messages, tools, documents. `trusted`: members the
  // server sets itself and vouches for, whose strings are trusted: bos_token, eos_token,
  // add_generation_prompt, enable_thinking, ... A name in both takes the trusted value. Object
  // members keep their order (nlohmann::ordered_json), as Python dicts do. Throws Error.
  std::vector<Part> render(const nlohmann::ordered_json& data,
                           const nlohmann::ordered_json& trusted = nlohmann::ordered_json::object(),
                           const Limits& limits = {}) const;
  // The same, joined.
  std::string render_text(const nlohmann::ordered_json& data,
                          const nlohmann::ordered_json& trusted = nlohmann::ordered_json::object(),
                          const Limits& limits = {}) const;

  struct Program;  // the parsed template (internal)

 private:
  std::shared_ptr<const Program> program_;
};

// The parts' texts concatenated.
std::string join_parts(const std::vector<Part>& parts);

// Python's repr() of a float (what {{ x }} prints for one): 1.0, 0.5, 1e-05, 1e+16, inf, nan.
std::string python_float_repr(double d);

}  // namespace myriad::serve::jinja
