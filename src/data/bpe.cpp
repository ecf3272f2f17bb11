#include "data/bpe.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <queue>
#include <sstream>
#include <unordered_map>
#include <variant>

#include "core/error.h"

namespace myriad::data {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

// ------------------------------------------------------------------------------ UTF-8 and text

// Length of the valid UTF-8 character at s[i] (Unicode's well-formed sequences: no overlongs,
// surrogates or code points past U+10FFFF), or 0 when the bytes there are not one.
size_t utf8_len(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const size_t n = s.size() - i;
  const unsigned c = b(0);
  if (c < 0x80) return 1;
  const auto cont = [&](size_t k) { return k < n && (b(k) & 0xC0) == 0x80; };
  if (c >= 0xC2 && c <= 0xDF) return cont(1) ? 2 : 0;
  if (c >= 0xE0 && c <= 0xEF) {
    if (n < 2) return 0;
    const unsigned lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
    return b(1) >= lo && b(1) <= hi && cont(2) ? 3 : 0;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    if (n < 2) return 0;
    const unsigned lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
    return b(1) >= lo && b(1) <= hi && cont(2) && cont(3) ? 4 : 0;
  }
  return 0;
}

// The code point of the valid character of length len at s[i].
char32_t utf8_decode(std::string_view s, size_t i, size_t len) {
  const auto b = [&](size_t k) {
    return static_cast<char32_t>(static_cast<unsigned char>(s[i + k]));
  };
  switch (len) {
    case 1:
      return b(0);
    case 2:
      return (b(0) & 0x1F) << 6 | (b(1) & 0x3F);
    case 3:
      return (b(0) & 0x0F) << 12 | (b(1) & 0x3F) << 6 | (b(2) & 0x3F);
    default:
      return (b(0) & 0x07) << 18 | (b(1) & 0x3F) << 12 | (b(2) & 0x3F) << 6 | (b(3) & 0x3F);
  }
}

void utf8_append(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

// Unicode White_Space: Rust's char::is_whitespace, `\s` of Rust regex and of Oniguruma.
bool is_white_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}
// Python's str.isspace (White_Space plus the information separators U+001C..U+001F).
bool is_python_space(char32_t c) {
  return is_white_space(c) || (c >= 0x1C && c <= 0x1F);
}
// The White_Space set as PCRE2 class items.
constexpr const char* kWhiteSpaceItems =
    "\\t\\n\\x0B\\f\\r\\x20\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"
    "\\x{202F}\\x{205F}\\x{3000}";

// Calls f(begin, end, valid) for the maximal runs of valid UTF-8 and of invalid bytes of s.
template <class F>
void for_each_utf8_run(std::string_view s, F&& f) {
  size_t i = 0;
  while (i < s.size()) {
    const size_t start = i;
    const bool valid = utf8_len(s, i) != 0;
    while (i < s.size()) {
      const size_t len = utf8_len(s, i);
      if ((len != 0) != valid) break;
      i += len != 0 ? len : 1;
    }
    f(start, i, valid);
  }
}

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  MYRIAD_CHECK(f, "cannot read ", p.string());
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

json read_json(const fs::path& p) {
  const std::string text = read_file(p);
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    throw Error(cat(p.string(), ": not valid JSON: ", e.what()));
  }
}

// ------------------------------------------------------------------------------ regexes

bool is_general_category(std::string_view n) {
  static const char* kNames[] = {"L",  "LC", "L&", "Lu", "Ll", "Lt", "Lm", "Lo", "M",  "Mn",
                                 "Mc", "Me", "N",  "Nd", "Nl", "No", "P",  "Pc", "Pd", "Ps",
                                 "Pe", "Pi", "Pf", "Po", "S",  "Sm", "Sc", "Sk", "So", "Z",
                                 "Zs", "Zl", "Zp", "C",  "Cc", "Cf", "Cs", "Co", "Cn", "Any"};
  return std::any_of(std::begin(kNames), std::end(kNames), [&](const char* k) { return n == k; });
}

// \p{..} / \P{..} / \pX at p[i] (p[i] == '\\') as PCRE2 writes it; advances i past it.
std::string translate_property(std::string_view p, size_t& i) {
  const bool upper = p[i + 1] == 'P';
  std::string name;
  if (i + 2 < p.size() && p[i + 2] == '{') {
    const size_t close = p.find('}', i + 3);
    MYRIAD_CHECK(close != std::string_view::npos, "regex: unterminated \\p{ in ", p);
    name = std::string(p.substr(i + 3, close - i - 3));
    i = close + 1;
  } else {
    MYRIAD_CHECK(i + 2 < p.size(), "regex: \\p without a name at the end of ", p);
    name = std::string(1, p[i + 2]);
    i += 3;
  }
  bool neg = upper;
  if (!name.empty() && name[0] == '^') neg = !neg, name.erase(0, 1);
  std::string value = name;
  if (const size_t eq = name.find_first_of("=:"); eq != std::string::npos) {
    const std::string key = name.substr(0, eq);
    value = name.substr(eq + 1);
    if (key == "sc" || key == "Script")
      value = "sc:" + value;
    else if (key == "scx" || key == "Script_Extensions")
      value = "scx:" + value;
    else if (key != "gc" && key != "General_Category")
      throw Error(cat("regex: the property \\p{", name, "} is not supported"));
  } else if (!is_general_category(name)) {
    // A bare name that is not a general category is a script, which Rust regex and Oniguruma
    // match by the Script property (PCRE2's bare script names mean Script_Extensions).
    value = "sc:" + name;
  }
  return std::string(neg ? "\\P{" : "\\p{") + value + "}";
}

// Copies the (possibly multi-byte) character at p[i] to out.
void copy_char(std::string_view p, size_t& i, std::string& out) {
  const size_t len = std::max<size_t>(1, utf8_len(p, i));
  out.append(p.substr(i, len));
  i += len;
}

// The class at p[i] == '[' (Rust regex / Oniguruma syntax: nested classes, `&&` intersection)
// as a PCRE2 expression matching one character; advances i past its ']'.
std::string translate_class(std::string_view p, size_t& i) {
  struct Operand {
    std::string items;                // PCRE2 class items
    std::vector<std::string> nested;  // nested classes, as PCRE2 expressions
  };
  ++i;
  bool neg = false;
  if (i < p.size() && p[i] == '^') neg = true, ++i;
  std::vector<Operand> ops(1);
  bool first = true;
  for (;;) {
    MYRIAD_CHECK(i < p.size(), "regex: unterminated character class in ", p);
    const char c = p[i];
    if (c == ']' && !first) {
      ++i;
      break;
    }
    first = false;
    if (c == '[' && i + 1 < p.size() && p[i + 1] == ':') {  // POSIX [:name:]
      const size_t e = p.find(":]", i + 2);
      MYRIAD_CHECK(e != std::string_view::npos, "regex: unterminated [: in ", p);
      ops.back().items.append(p.substr(i, e + 2 - i));
      i = e + 2;
    } else if (c == '[') {
      ops.back().nested.push_back(translate_class(p, i));
    } else if (c == '&' && i + 1 < p.size() && p[i + 1] == '&') {
      ops.emplace_back();
      i += 2;
    } else if (c == '\\') {
      MYRIAD_CHECK(i + 1 < p.size(), "regex: trailing backslash in ", p);
      const char e = p[i + 1];
      if (e == 's') {
        ops.back().items += kWhiteSpaceItems;
        i += 2;
      } else if (e == 'S') {
        ops.back().nested.push_back(std::string("[^") + kWhiteSpaceItems + "]");
        i += 2;
      } else if (e == 'p' || e == 'P') {
        ops.back().items += translate_property(p, i);
      } else {
        ops.back().items += '\\';
        ++i;
        copy_char(p, i, ops.back().items);
      }
    } else {
      copy_char(p, i, ops.back().items);
    }
  }
  if (ops.size() == 1 && ops[0].nested.empty())
    return std::string(neg ? "[^" : "[") + ops[0].items + "]";
  const auto operand = [&](const Operand& o) {
    std::vector<std::string> alts;
    if (!o.items.empty()) alts.push_back("[" + o.items + "]");
    alts.insert(alts.end(), o.nested.begin(), o.nested.end());
    MYRIAD_CHECK(!alts.empty(), "regex: empty class operand in ", p);
    if (alts.size() == 1) return alts[0];
    std::string s = "(?:";
    for (size_t k = 0; k < alts.size(); ++k) s += (k ? "|" : "") + alts[k];
    return s + ")";
  };
  // A ∩ B ∩ C: a character that B and C accept (lookaheads) and A consumes.
  std::string pos = "(?:";
  for (size_t k = 1; k < ops.size(); ++k) pos += "(?=" + operand(ops[k]) + ")";
  pos += operand(ops[0]) + ")";
  return neg ? "(?:(?!" + pos + ")[\\s\\S])" : pos;
}

}  // namespace

std::string bpe_pattern_to_pcre2(std::string_view p) {
  std::string out;
  size_t i = 0;
  while (i < p.size()) {
    const char c = p[i];
    if (c == '\\') {
      MYRIAD_CHECK(i + 1 < p.size(), "regex: trailing backslash in ", p);
      const char e = p[i + 1];
      if (e == 's') {
        out += std::string("[") + kWhiteSpaceItems + "]";
        i += 2;
      } else if (e == 'S') {
        out += std::string("[^") + kWhiteSpaceItems + "]";
        i += 2;
      } else if (e == 'p' || e == 'P') {
        out += translate_property(p, i);
      } else {
        out += '\\';
        ++i;
        copy_char(p, i, out);
      }
    } else if (c == '[') {
      out += translate_class(p, i);
    } else {
      copy_char(p, i, out);
    }
  }
  return out;
}

namespace {

// A compiled split regex; matching is thread-safe (match data per call).
class Regex {
 public:
  Regex(std::string_view pattern, const std::string& where) {
    const std::string pcre = bpe_pattern_to_pcre2(pattern);
    int err = 0;
    PCRE2_SIZE at = 0;
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pcre.data()), pcre.size(),
                                     PCRE2_UTF | PCRE2_UCP, &err, &at, nullptr);
    if (!code) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      throw Error(cat(where, ": the regex ", pattern, " does not compile (as PCRE2 ", pcre,
                      ", at offset ", at, "): ", reinterpret_cast<const char*>(msg)));
    }
    code_.reset(code, pcre2_code_free);
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // the interpreter runs it when JIT fails
  }

  // Calls f(begin, end) for each non-empty match in s, left to right, non-overlapping (as Rust
  // regex's find_iter and Oniguruma's search loop do). s must be valid UTF-8.
  template <class F>
  void for_each_match(std::string_view s, F&& f) const {
    std::unique_ptr<pcre2_match_data, void (*)(pcre2_match_data*)> md(
        pcre2_match_data_create_from_pattern(code_.get(), nullptr), pcre2_match_data_free);
    MYRIAD_CHECK(md, "regex: out of memory");
    const auto subject = reinterpret_cast<PCRE2_SPTR>(s.data());
    size_t off = 0;
    while (off <= s.size()) {
      int rc =
          pcre2_match(code_.get(), subject, s.size(), off, PCRE2_NO_UTF_CHECK, md.get(), nullptr);
      if (rc == PCRE2_ERROR_JIT_STACKLIMIT)  // a long run in a repeated group: interpret it
        rc = pcre2_match(code_.get(), subject, s.size(), off, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT,
                         md.get(), nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) return;
      if (rc < 0) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof msg);
        throw Error(cat("regex match failed: ", reinterpret_cast<const char*>(msg)));
      }
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
      const size_t b = ov[0], e = ov[1];
      if (e > b) {
        f(b, e);
        off = e;
      } else {
        if (b >= s.size()) return;
        off = b + std::max<size_t>(1, utf8_len(s, b));
      }
    }
  }

 private:
  std::shared_ptr<pcre2_code> code_;
};

// ------------------------------------------------------------------------------ BPE merging

struct Sym {
  int32_t id = -1;
  uint32_t start = 0, len = 0;  // bytes of the piece
  int32_t prev = -1, next = -1;
};

// Merges adjacent symbols, the lowest rank first and the leftmost on a tie, until no pair has a
// rank (tiktoken's _byte_pair_merge; tokenizers' Word::merge_all without dropout).
// pair(a, b) -> (rank, merged id), rank < 0 when the pair does not merge.
template <class Pair>
void merge_symbols(std::vector<Sym>& syms, const Pair& pair, std::vector<int32_t>& out) {
  struct Cand {
    int64_t rank;
    int32_t pos, right, id;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<>> q;
  const auto push = [&](int32_t a) {
    if (a < 0 || syms[a].next < 0) return;
    const auto [rank, id] = pair(syms[a], syms[syms[a].next]);
    if (rank >= 0) q.push({rank, a, syms[a].next, id});
  };
  for (int32_t k = 0; k + 1 < static_cast<int32_t>(syms.size()); ++k) push(k);
  while (!q.empty()) {
    const Cand c = q.top();
    q.pop();
    Sym& a = syms[c.pos];
    if (a.len == 0 || a.next != c.right) continue;
    if (pair(a, syms[c.right]) != std::pair<int64_t, int32_t>{c.rank, c.id}) continue;
    Sym& b = syms[c.right];
    a.id = c.id;
    a.len += b.len;
    a.next = b.next;
    if (b.next >= 0) syms[b.next].prev = c.pos;
    b.len = 0;
    push(a.prev);
    push(c.pos);
  }
  for (const Sym& s : syms)
    if (s.len > 0) out.push_back(s.id);
}

// ------------------------------------------------------------------------------ added tokens

struct Added {
  std::string text;
  int32_t id = -1;
  bool special = false, lstrip = false, rstrip = false, normalized = false;
};

// Leftmost-longest matching of a set of added tokens (tokenizers' Aho-Corasick with
// MatchKind::LeftmostLongest).
class Matcher {
 public:
  void add(Added a) { toks_.push_back(std::move(a)); }
  void build() {
    all_special_ =
        std::all_of(toks_.begin(), toks_.end(), [](const Added& a) { return a.special; });
    for (auto& v : by_first_) v.clear();
    for (int k = 0; k < static_cast<int>(toks_.size()); ++k)
      if (!toks_[k].text.empty())
        by_first_[static_cast<unsigned char>(toks_[k].text[0])].push_back(k);
    for (auto& v : by_first_)
      std::stable_sort(v.begin(), v.end(),
                       [&](int a, int b) { return toks_[a].text.size() > toks_[b].text.size(); });
  }
  bool empty() const { return toks_.empty(); }
  bool all_special() const { return all_special_; }
  // The first match at or after from: (position, token index), or position npos.
  std::pair<size_t, int> find(std::string_view s, size_t from) const {
    for (size_t p = from; p < s.size(); ++p)
      for (int k : by_first_[static_cast<unsigned char>(s[p])])
        if (s.compare(p, toks_[k].text.size(), toks_[k].text) == 0) return {p, k};
    return {std::string_view::npos, -1};
  }
  const Added& token(int k) const { return toks_[k]; }

 private:
  std::vector<Added> toks_;
  std::array<std::vector<int>, 256> by_first_;
  bool all_special_ = true;
};

// A piece of text: [begin, end) of the input, with the added token's id when it is one.
struct Seg {
  size_t begin = 0, end = 0;
  int32_t id = -1;
};

bool white_space_at(std::string_view s, size_t i, size_t* len) {
  const size_t l = utf8_len(s, i);
  if (l == 0 || !is_white_space(utf8_decode(s, i, l))) return false;
  *len = l;
  return true;
}

// The start of the White_Space run that ends at i.
size_t white_space_back(std::string_view s, size_t i) {
  while (i > 0) {
    size_t k = i - 1;
    while (k > 0 && i - k < 4 && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
    size_t len = 0;
    if (!white_space_at(s, k, &len) || k + len != i) break;
    i = k;
  }
  return i;
}

// tokenizers' AddedVocabulary::split_with_indices on s = text[base, base + s.size()): added
// tokens and the text between them. A special token counts only inside a trusted span.
void split_added(std::string_view s, size_t base, const Matcher& m,
                 std::span<const ByteSpan> trusted, std::vector<Seg>& out) {
  const auto allowed = [&](size_t b, size_t e) {
    return std::any_of(trusted.begin(), trusted.end(),
                       [&](const ByteSpan& t) { return t.begin <= b && e <= t.end; });
  };
  size_t start_offset = 0, pos = 0;
  // Without trusted text a set of special tokens matches nothing.
  const bool none = m.empty() || (trusted.empty() && m.all_special());
  while (!none) {
    const auto [at, k] = m.find(s, pos);
    if (at == std::string_view::npos) break;
    const Added& t = m.token(k);
    size_t start = at, stop = at + t.text.size();
    pos = stop;
    if (t.special && !allowed(base + start, base + stop)) continue;  // plain text
    if (t.lstrip) start = std::max(white_space_back(s, start), start_offset);
    if (t.rstrip) {
      size_t len = 0;
      while (stop < s.size() && white_space_at(s, stop, &len)) stop += len;
      pos = stop;
    }
    if (start > start_offset) out.push_back({base + start_offset, base + start, -1});
    out.push_back({base + start, base + stop, t.id});
    start_offset = stop;
  }
  if (start_offset < s.size()) out.push_back({base + start_offset, base + s.size(), -1});
}

// ------------------------------------------------------------------------------ misc

struct SvHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};
using BytesMap = std::unordered_map<std::string, int32_t, SvHash, std::equal_to<>>;

// GPT-2's bytes_to_unicode: byte -> the code point that stands for it in byte-level vocabularies.
const std::array<char32_t, 256>& byte_to_unicode() {
  static const std::array<char32_t, 256> table = [] {
    std::array<char32_t, 256> t{};
    char32_t n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      t[b] = printable ? static_cast<char32_t>(b) : 256 + n++;
    }
    return t;
  }();
  return table;
}

// The bytes a byte-level vocabulary entry stands for; false when a character of it is not in the
// byte alphabet (the ByteLevel decoder then writes the entry's UTF-8 as it is).
bool byte_level_bytes(std::string_view token, std::string* out) {
  static const std::unordered_map<char32_t, unsigned char> inverse = [] {
    std::unordered_map<char32_t, unsigned char> m;
    for (int b = 0; b < 256; ++b) m[byte_to_unicode()[b]] = static_cast<unsigned char>(b);
    return m;
  }();
  out->clear();
  size_t i = 0;
  while (i < token.size()) {
    const size_t len = utf8_len(token, i);
    if (len == 0) return false;
    const auto it = inverse.find(utf8_decode(token, i, len));
    if (it == inverse.end()) return false;
    *out += static_cast<char>(it->second);
    i += len;
  }
  return true;
}

bool base64_decode(std::string_view in, std::string* out) {
  const auto val = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  if (in.empty() || in.size() % 4 != 0) return false;
  out->clear();
  for (size_t i = 0; i < in.size(); i += 4) {
    int v[4];
    int pad = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = in[i + k];
      if (c == '=' && i + 4 == in.size() && k >= 2) {
        v[k] = 0, ++pad;
      } else {
        if (pad) return false;  // data after padding
        v[k] = val(c);
        if (v[k] < 0) return false;
      }
    }
    const uint32_t w = static_cast<uint32_t>(v[0] << 18 | v[1] << 12 | v[2] << 6 | v[3]);
    *out += static_cast<char>(w >> 16);
    if (pad < 2) *out += static_cast<char>((w >> 8) & 0xFF);
    if (pad < 1) *out += static_cast<char>(w & 0xFF);
  }
  return true;
}

std::string shorten(std::string_view s, size_t n = 60) {
  return s.size() <= n ? std::string(s) : std::string(s.substr(0, n)) + "...";
}

}  // namespace

// ------------------------------------------------------------------------------ the tokenizer

// Kimi's pat_str (tokenization_kimi.py).
constexpr const char* kKimiPattern =
    R"([\p{Han}]+|)"
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|)"
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|)"
    R"(\p{N}{1,3}|)"
    R"( ?[^\s\p{L}\p{N}]+[\r\n]*|)"
    R"(\s*[\r\n]+|)"
    R"(\s+(?!\S)|)"
    R"(\s+)";
// GPT-2's pattern, ByteLevel's use_regex.
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr int kKimiReserved = 256;

enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct SplitStep {
  std::optional<Regex> regex;  // else the literal
  std::string literal;
  Behavior behavior = Behavior::kIsolated;
  bool invert = false;
};
struct ByteLevelStep {
  bool add_prefix_space = false;
  bool use_regex = true;
};
using Step = std::variant<SplitStep, ByteLevelStep>;

struct BpeTokenizer::Impl {
  std::string kind;
  std::vector<std::string> tokens;  // id -> bytes ("" for a gap)
  std::vector<uint8_t> special;     // id -> is a special token
  std::vector<std::pair<std::string, int32_t>> specials;
  int32_t bos = -1, eos = -1, pad = -1, unk = -1;
  Matcher pass1, pass2;  // added tokens (tiktoken: all in pass1)

  // tiktoken
  BytesMap ranks;
  std::optional<Regex> pattern;

  // tokenizer.json
  std::array<int32_t, 256> byte_id{};
  std::unordered_map<uint64_t, std::pair<int64_t, int32_t>> merges;  // (a, b) -> (rank, id)
  BytesMap vocab_bytes;  // whole-word lookup of ignore_merges
  bool ignore_merges = false, fuse_unk = false;
  int32_t model_unk = -1;
  std::vector<Step> steps;

  void encode(std::string_view text, std::span<const ByteSpan> trusted,
              std::vector<int32_t>& out) const;
  void tiktoken_plain(std::string_view s, std::vector<int32_t>& out) const;
  void tiktoken_piece(std::string_view piece, std::vector<int32_t>& out) const;
  void hf_plain(std::string_view s, std::vector<int32_t>& out) const;
  void hf_piece(std::string_view piece, std::vector<int32_t>& out) const;
  void apply(const Step& step, std::string&& piece, std::vector<std::string>& out) const;
  int32_t resolve(const json& config, const char* key, const std::string& where) const;
  void finish();
};

void BpeTokenizer::Impl::encode(std::string_view text, std::span<const ByteSpan> trusted,
                                std::vector<int32_t>& out) const {
  std::vector<Seg> segs;
  split_added(text, 0, pass1, trusted, segs);
  for (const Seg& s : segs) {
    if (s.id >= 0) {
      out.push_back(s.id);
      continue;
    }
    const std::string_view piece = text.substr(s.begin, s.end - s.begin);
    if (kind == "tiktoken") {
      tiktoken_plain(piece, out);
      continue;
    }
    std::vector<Seg> inner;
    split_added(piece, s.begin, pass2, trusted, inner);
    for (const Seg& t : inner) {
      if (t.id >= 0)
        out.push_back(t.id);
      else
        hf_plain(text.substr(t.begin, t.end - t.begin), out);
    }
  }
}

// tokenization_kimi.py: 400,000-character chunks, each cut where a run of whitespace or of
// non-whitespace characters (Python's str.isspace) grows past 25,000; then tiktoken's
// encode_ordinary on each slice.
void BpeTokenizer::Impl::tiktoken_plain(std::string_view s, std::vector<int32_t>& out) const {
  constexpr size_t kChunk = 400000, kRun = 25000;
  const auto encode_slice = [&](std::string_view slice) {
    pattern->for_each_match(
        slice, [&](size_t b, size_t e) { tiktoken_piece(slice.substr(b, e - b), out); });
  };
  for_each_utf8_run(s, [&](size_t rb, size_t re, bool valid) {
    const std::string_view run = s.substr(rb, re - rb);
    if (!valid) return tiktoken_piece(run, out);
    size_t i = 0;
    while (i < run.size()) {  // one chunk
      size_t chars = 0, slice_start = i, cur_len = 0;
      bool cur_space = false;
      for (; i < run.size() && chars < kChunk; ++chars) {
        const size_t len = utf8_len(run, i);
        const bool now = is_python_space(utf8_decode(run, i, len));
        if (chars == 0) cur_space = now;
        if (cur_space != now) {
          cur_len = 1, cur_space = now;
        } else if (++cur_len > kRun) {
          encode_slice(run.substr(slice_start, i - slice_start));
          slice_start = i, cur_len = 1;
        }
        i += len;
      }
      encode_slice(run.substr(slice_start, i - slice_start));
    }
  });
}

void BpeTokenizer::Impl::tiktoken_piece(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.empty()) return;
  if (const auto it = ranks.find(piece); it != ranks.end()) return out.push_back(it->second);
  std::vector<Sym> syms(piece.size());
  for (size_t k = 0; k < piece.size(); ++k) {
    syms[k].id = ranks.find(piece.substr(k, 1))->second;  // every byte has a rank (load checks)
    syms[k].start = static_cast<uint32_t>(k), syms[k].len = 1;
    syms[k].prev = static_cast<int32_t>(k) - 1;
    syms[k].next = k + 1 < piece.size() ? static_cast<int32_t>(k + 1) : -1;
  }
  merge_symbols(
      syms,
      [&](const Sym& a, const Sym& b) -> std::pair<int64_t, int32_t> {
        const auto it = ranks.find(piece.substr(a.start, a.len + b.len));
        if (it == ranks.end()) return {-1, -1};
        return {it->second, it->second};
      },
      out);
}

void BpeTokenizer::Impl::apply(const Step& step, std::string&& piece,
                               std::vector<std::string>& out) const {
  if (const auto* bl = std::get_if<ByteLevelStep>(&step)) {
    if (bl->add_prefix_space && (piece.empty() || piece[0] != ' ')) piece.insert(0, 1, ' ');
    if (!bl->use_regex) return out.push_back(std::move(piece));
    static const Regex gpt2(kGpt2Pattern, "ByteLevel");
    size_t prev = 0;
    gpt2.for_each_match(piece, [&](size_t b, size_t e) {
      if (b > prev) out.push_back(piece.substr(prev, b - prev));
      out.push_back(piece.substr(b, e - b));
      prev = e;
    });
    if (prev < piece.size()) out.push_back(piece.substr(prev));
    return;
  }
  const SplitStep& sp = std::get<SplitStep>(step);
  // tokenizers' Pattern::find_matches: the whole piece as (range, is_match) runs.
  struct Run {
    size_t b, e;
    bool match;
  };
  std::vector<Run> runs;
  size_t prev = 0;
  const auto on_match = [&](size_t b, size_t e) {
    if (b > prev) runs.push_back({prev, b, false});
    runs.push_back({b, e, true});
    prev = e;
  };
  if (sp.regex) {
    sp.regex->for_each_match(piece, on_match);
  } else if (!sp.literal.empty()) {
    for (size_t at = piece.find(sp.literal); at != std::string::npos;
         at = piece.find(sp.literal, at + sp.literal.size()))
      on_match(at, at + sp.literal.size());
  }
  if (prev < piece.size()) runs.push_back({prev, piece.size(), false});
  if (sp.invert)
    for (Run& r : runs) r.match = !r.match;
  // tokenizers' NormalizedString::split by behaviour: (range, removed).
  std::vector<std::pair<Run, bool>> parts;
  switch (sp.behavior) {
    case Behavior::kRemoved:
      for (const Run& r : runs) parts.push_back({r, r.match});
      break;
    case Behavior::kIsolated:
      for (const Run& r : runs) parts.push_back({r, false});
      break;
    case Behavior::kContiguous: {
      bool previous = false;
      for (const Run& r : runs) {
        if (r.match == previous && !parts.empty())
          parts.back().first.e = r.e;
        else
          parts.push_back({r, false});
        previous = r.match;
      }
      break;
    }
    case Behavior::kMergedWithPrevious: {
      bool previous = false;
      for (const Run& r : runs) {
        if (r.match && !previous && !parts.empty())
          parts.back().first.e = r.e;
        else
          parts.push_back({r, false});
        previous = r.match;
      }
      break;
    }
    case Behavior::kMergedWithNext: {
      bool previous = false;
      for (auto r = runs.rbegin(); r != runs.rend(); ++r) {
        if (r->match && !previous && !parts.empty())
          parts.back().first.b = r->b;
        else
          parts.push_back({*r, false});
        previous = r->match;
      }
      std::reverse(parts.begin(), parts.end());
      break;
    }
  }
  for (const auto& [r, removed] : parts)
    if (!removed && r.e > r.b) out.push_back(piece.substr(r.b, r.e - r.b));
}

void BpeTokenizer::Impl::hf_plain(std::string_view s, std::vector<int32_t>& out) const {
  for_each_utf8_run(s, [&](size_t rb, size_t re, bool valid) {
    const std::string_view run = s.substr(rb, re - rb);
    if (!valid) return hf_piece(run, out);
    std::vector<std::string> pieces{std::string(run)}, next;
    for (const Step& step : steps) {
      next.clear();
      for (std::string& p : pieces) apply(step, std::move(p), next);
      pieces.swap(next);
    }
    for (const std::string& p : pieces) hf_piece(p, out);
  });
}

void BpeTokenizer::Impl::hf_piece(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.empty()) return;
  if (ignore_merges)
    if (const auto it = vocab_bytes.find(piece); it != vocab_bytes.end())
      return out.push_back(it->second);
  std::vector<Sym> syms;
  syms.reserve(piece.size());
  for (size_t k = 0; k < piece.size(); ++k) {
    int32_t id = byte_id[static_cast<unsigned char>(piece[k])];
    if (id < 0) {
      if (model_unk < 0) continue;  // tokenizers drops what it cannot represent
      if (fuse_unk && !syms.empty() && syms.back().id == model_unk) {
        ++syms.back().len;
        continue;
      }
      id = model_unk;
    }
    Sym s;
    s.id = id, s.start = static_cast<uint32_t>(k), s.len = 1;
    s.prev = static_cast<int32_t>(syms.size()) - 1;
    if (!syms.empty()) syms.back().next = static_cast<int32_t>(syms.size());
    syms.push_back(s);
  }
  merge_symbols(
      syms,
      [&](const Sym& a, const Sym& b) -> std::pair<int64_t, int32_t> {
        const auto it = merges.find(static_cast<uint64_t>(static_cast<uint32_t>(a.id)) << 32 |
                                    static_cast<uint32_t>(b.id));
        if (it == merges.end()) return {-1, -1};
        return it->second;
      },
      out);
}

// bos_token / eos_token / ...: a string, an {"content": ...} object, null or absent.
int32_t BpeTokenizer::Impl::resolve(const json& config, const char* key,
                                    const std::string& where) const {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) return -1;
  std::string text;
  if (it->is_string()) {
    text = it->get<std::string>();
  } else if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    text = (*it)["content"].get<std::string>();
  } else {
    throw Error(cat(where, ": ", key, " must be a string or an object with a \"content\" string"));
  }
  for (const auto& [t, id] : specials)
    if (t == text) return id;
  for (int32_t id = 0; id < static_cast<int32_t>(tokens.size()); ++id)
    if (tokens[id] == text) return id;
  throw Error(cat(where, ": ", key, " \"", text, "\" is not a token of the vocabulary"));
}

void BpeTokenizer::Impl::finish() {
  special.assign(tokens.size(), 0);
  for (const auto& [t, id] : specials) special[id] = 1;
  std::stable_sort(specials.begin(), specials.end(),
                   [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  pass1.build();
  pass2.build();
}

std::unique_ptr<BpeTokenizer> BpeTokenizer::load_tiktoken(const std::string& dir) {
  auto impl = std::make_unique<Impl>();
  impl->kind = "tiktoken";
  const fs::path model = fs::path(dir) / "tiktoken.model";
  const fs::path config_path = fs::path(dir) / "tokenizer_config.json";
  MYRIAD_CHECK(fs::exists(model), "tiktoken tokenizer: ", model.string(), " does not exist");
  MYRIAD_CHECK(fs::exists(config_path), "tiktoken tokenizer: ", config_path.string(),
               " does not exist (it names the special tokens: added_tokens_decoder)");
  const std::string text = read_file(model);
  std::unordered_map<int64_t, size_t> line_of_rank;
  size_t line_no = 0, pos = 0;
  int64_t max_rank = -1;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    std::vector<std::string_view> fields;
    for (size_t i = 0; i < line.size();) {
      while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) ++i;
      const size_t b = i;
      while (i < line.size() && line[i] != ' ' && line[i] != '\t') ++i;
      if (i > b) fields.push_back(line.substr(b, i - b));
    }
    if (fields.empty()) continue;
    const auto bad = [&](const std::string& why) {
      return Error(cat(model.string(), " line ", line_no, ": ", why, " (expected '<base64 token> ",
                       "<rank>', got '", shorten(line), "')"));
    };
    if (fields.size() != 2) throw bad("wrong number of fields");
    std::string bytes;
    if (!base64_decode(fields[0], &bytes)) throw bad("the token is not valid base64");
    int64_t rank = 0;
    for (char c : fields[1]) {
      if (c < '0' || c > '9' || rank > (int64_t{1} << 31)) throw bad("the rank is not a number");
      rank = rank * 10 + (c - '0');
    }
    if (rank >= std::numeric_limits<int32_t>::max() - kKimiReserved) throw bad("rank too large");
    if (!impl->ranks.emplace(bytes, static_cast<int32_t>(rank)).second)
      throw bad("the token appears twice");
    if (const auto [it, fresh] = line_of_rank.emplace(rank, line_no); !fresh)
      throw bad(cat("rank ", rank, " is also on line ", it->second));
    max_rank = std::max(max_rank, rank);
  }
  const auto n = static_cast<int32_t>(impl->ranks.size());
  MYRIAD_CHECK(n > 0, model.string(), ": no tokens");
  MYRIAD_CHECK(max_rank + 1 == n, model.string(), ": the ranks are not 0..", n - 1,
               " (the largest is ", max_rank, "), so the special ids after them would collide");
  for (int b = 0; b < 256; ++b)
    MYRIAD_CHECK(impl->ranks.count(std::string(1, static_cast<char>(b))), model.string(),
                 ": the byte 0x", std::hex, b, " has no rank (a byte-level vocabulary needs all",
                 " 256 bytes)");
  impl->tokens.resize(static_cast<size_t>(n) + kKimiReserved);
  for (const auto& [bytes, rank] : impl->ranks) impl->tokens[rank] = bytes;

  const json config = read_json(config_path);
  const std::string where = config_path.string();
  MYRIAD_CHECK(config.is_object(), where, ": not a JSON object");
  std::vector<std::string> names(kKimiReserved);
  if (const auto it = config.find("added_tokens_decoder"); it != config.end()) {
    MYRIAD_CHECK(it->is_object(), where, ": added_tokens_decoder must be an object");
    for (const auto& [key, v] : it->items()) {
      int64_t id = -1;
      try {
        size_t used = 0;
        id = std::stoll(key, &used);
        if (used != key.size()) id = -1;
      } catch (const std::exception&) {
      }
      MYRIAD_CHECK(id >= n && id < n + kKimiReserved, where, ": added_tokens_decoder id '", key,
                   "' is not one of the reserved ids ", n, "..", n + kKimiReserved - 1,
                   " after the ", n, " ranks of tiktoken.model");
      MYRIAD_CHECK(v.is_object() && v.contains("content") && v["content"].is_string(), where,
                   ": added_tokens_decoder[\"", key, "\"] needs a \"content\" string");
      names[id - n] = v["content"].get<std::string>();
      MYRIAD_CHECK(!names[id - n].empty(), where, ": added_tokens_decoder[\"", key,
                   "\"] has empty content");
    }
  }
  for (int k = 0; k < kKimiReserved; ++k) {
    const int32_t id = n + k;
    if (names[k].empty()) names[k] = cat("<|reserved_token_", id, "|>");
    impl->tokens[id] = names[k];
    impl->specials.emplace_back(names[k], id);
    Added a;
    a.text = names[k], a.id = id, a.special = true;
    impl->pass1.add(std::move(a));
  }
  std::string pat = kKimiPattern;
  if (const auto it = config.find("pat_str"); it != config.end()) {
    MYRIAD_CHECK(it->is_string(), where, ": pat_str must be a string");
    pat = it->get<std::string>();
  }
  impl->pattern.emplace(pat, where);
  impl->bos = impl->resolve(config, "bos_token", where);
  impl->eos = impl->resolve(config, "eos_token", where);
  impl->pad = impl->resolve(config, "pad_token", where);
  impl->unk = impl->resolve(config, "unk_token", where);
  impl->finish();
  return std::unique_ptr<BpeTokenizer>(new BpeTokenizer(std::move(impl)));
}

namespace {

std::string type_of(const json& j) {
  return j.is_object() && j.contains("type") && j["type"].is_string() ? j["type"].get<std::string>()
                                                                      : std::string("?");
}

bool flag(const json& j, const char* key, bool dflt) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return dflt;
  MYRIAD_CHECK(it->is_boolean(), "tokenizer.json: \"", key, "\" must be true or false");
  return it->get<bool>();
}

void check_normalizer(const json& n, const std::string& where) {
  if (n.is_null()) return;
  const std::string t = type_of(n);
  if (t == "Sequence") {
    MYRIAD_CHECK(n.contains("normalizers") && n["normalizers"].is_array(), where,
                 ": a Sequence normalizer needs \"normalizers\"");
    for (const json& m : n["normalizers"]) check_normalizer(m, where);
    return;
  }
  throw Error(cat(where, ": the normalizer ", t,
                  " is not supported (Myriad's tokenizer.json support has no normalizers: null or",
                  " an empty Sequence only)"));
}

void check_decoder(const json& d, const std::string& where) {
  const std::string t = type_of(d);
  if (t == "ByteLevel") return;
  if (t == "Sequence" && d.contains("decoders") && d["decoders"].is_array() &&
      d["decoders"].size() == 1) {
    check_decoder(d["decoders"][0], where);
    return;
  }
  throw Error(cat(where, ": the decoder ", d.is_null() ? std::string("null") : t,
                  " is not supported (byte-level BPE needs the ByteLevel decoder)"));
}

}  // namespace

std::unique_ptr<BpeTokenizer> BpeTokenizer::load_hf(const std::string& dir) {
  auto impl = std::make_unique<Impl>();
  impl->kind = "hf-bpe";
  const fs::path path = fs::path(dir) / "tokenizer.json";
  MYRIAD_CHECK(fs::exists(path), "tokenizer.json tokenizer: ", path.string(), " does not exist");
  const std::string where = path.string();
  const json j = read_json(path);
  MYRIAD_CHECK(j.is_object() && j.contains("model"), where, ": no \"model\"");
  const json& m = j["model"];
  const std::string mt = m.contains("type") ? type_of(m) : std::string("BPE");
  MYRIAD_CHECK(mt == "BPE", where, ": the model type ", mt,
               " is not supported (byte-level BPE only)");
  MYRIAD_CHECK(!m.contains("dropout") || m["dropout"].is_null(), where,
               ": BPE dropout is not supported");
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
    MYRIAD_CHECK(!m.contains(k) || m[k].is_null() || m[k] == "", where, ": the BPE model's ", k,
                 " is not supported");
  MYRIAD_CHECK(!flag(m, "byte_fallback", false), where,
               ": byte_fallback is not supported (byte-level BPE has every byte in its vocab)");
  impl->fuse_unk = flag(m, "fuse_unk", false);
  impl->ignore_merges = flag(m, "ignore_merges", false);
  MYRIAD_CHECK(m.contains("vocab") && m["vocab"].is_object(), where, ": the model has no vocab");
  check_normalizer(j.value("normalizer", json()), where);
  check_decoder(j.value("decoder", json()), where);

  // Vocabulary: token string -> id; the bytes of each id.
  std::unordered_map<std::string, int32_t> vocab;
  int64_t max_id = -1;
  for (const auto& [tok, v] : m["vocab"].items()) {
    MYRIAD_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() < (1 << 24),
                 where, ": the vocab id of \"", shorten(tok), "\" is not a valid id");
    vocab[tok] = v.get<int32_t>();
    max_id = std::max<int64_t>(max_id, v.get<int64_t>());
  }
  std::vector<Added> added;
  if (j.contains("added_tokens") && !j["added_tokens"].is_null()) {
    MYRIAD_CHECK(j["added_tokens"].is_array(), where, ": added_tokens must be an array");
    for (const json& a : j["added_tokens"]) {
      MYRIAD_CHECK(a.is_object() && a.contains("id") && a["id"].is_number_integer() &&
                       a.contains("content") && a["content"].is_string(),
                   where, ": an added token needs \"id\" and \"content\"");
      Added t;
      t.id = a["id"].get<int32_t>();
      t.text = a["content"].get<std::string>();
      MYRIAD_CHECK(t.id >= 0 && t.id < (1 << 24) && !t.text.empty(), where, ": added token \"",
                   t.text, "\" has a bad id or empty content");
      t.special = flag(a, "special", false);
      t.lstrip = flag(a, "lstrip", false);
      t.rstrip = flag(a, "rstrip", false);
      t.normalized = flag(a, "normalized", !t.special);
      MYRIAD_CHECK(!flag(a, "single_word", false), where, ": added token \"", t.text,
                   "\" has single_word, which is not supported");
      max_id = std::max<int64_t>(max_id, t.id);
      added.push_back(std::move(t));
    }
  }
  impl->tokens.resize(static_cast<size_t>(max_id + 1));
  for (const auto& [tok, id] : vocab) {
    std::string bytes;
    if (byte_level_bytes(tok, &bytes)) {
      impl->tokens[id] = bytes;
      impl->vocab_bytes.emplace(bytes, id);
    } else {
      impl->tokens[id] = tok;
    }
  }
  impl->byte_id.fill(-1);
  for (int b = 0; b < 256; ++b) {
    std::string s;
    utf8_append(s, byte_to_unicode()[b]);
    if (const auto it = vocab.find(s); it != vocab.end()) impl->byte_id[b] = it->second;
  }
  if (m.contains("unk_token") && m["unk_token"].is_string()) {
    const auto it = vocab.find(m["unk_token"].get<std::string>());
    MYRIAD_CHECK(it != vocab.end(), where, ": the model's unk_token is not in its vocab");
    impl->model_unk = it->second;
  }
  // Merges: "a b" strings or [a, b] pairs; the rank is the position (a later duplicate wins).
  if (m.contains("merges") && !m["merges"].is_null()) {
    MYRIAD_CHECK(m["merges"].is_array(), where, ": merges must be an array");
    int64_t rank = 0;
    for (const json& e : m["merges"]) {
      std::string a, b;
      if (e.is_string()) {
        const std::string s = e.get<std::string>();
        const size_t sp = s.find(' ');
        MYRIAD_CHECK(sp != std::string::npos && s.find(' ', sp + 1) == std::string::npos, where,
                     ": merge ", rank, " \"", shorten(s), "\" is not two tokens");
        a = s.substr(0, sp), b = s.substr(sp + 1);
      } else {
        MYRIAD_CHECK(e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string(), where,
                     ": merge ", rank, " is not a pair of strings");
        a = e[0].get<std::string>(), b = e[1].get<std::string>();
      }
      const auto ia = vocab.find(a), ib = vocab.find(b), in = vocab.find(a + b);
      MYRIAD_CHECK(ia != vocab.end() && ib != vocab.end() && in != vocab.end(), where, ": merge ",
                   rank, " (\"", a, "\" \"", b, "\") names a token missing from the vocab");
      impl->merges[static_cast<uint64_t>(static_cast<uint32_t>(ia->second)) << 32 |
                   static_cast<uint32_t>(ib->second)] = {rank, in->second};
      ++rank;
    }
  }
  // Pre-tokenizer: Split and ByteLevel steps, possibly in a Sequence.
  bool byte_level = false;
  std::function<void(const json&)> add_step = [&](const json& p) {
    const std::string t = type_of(p);
    if (t == "Sequence") {
      MYRIAD_CHECK(p.contains("pretokenizers") && p["pretokenizers"].is_array(), where,
                   ": a Sequence pre_tokenizer needs \"pretokenizers\"");
      for (const json& q : p["pretokenizers"]) add_step(q);
    } else if (t == "ByteLevel") {
      ByteLevelStep s;
      s.add_prefix_space = flag(p, "add_prefix_space", true);
      s.use_regex = flag(p, "use_regex", true);
      impl->steps.emplace_back(s);
      byte_level = true;
    } else if (t == "Split") {
      SplitStep s;
      const json& pat = p.value("pattern", json());
      if (pat.is_object() && pat.contains("Regex") && pat["Regex"].is_string())
        s.regex.emplace(pat["Regex"].get<std::string>(), where);
      else if (pat.is_object() && pat.contains("String") && pat["String"].is_string())
        s.literal = pat["String"].get<std::string>();
      else
        throw Error(
            cat(where, ": a Split pre_tokenizer needs a {\"Regex\"} or {\"String\"} ", "pattern"));
      const std::string b = p.value("behavior", std::string("?"));
      if (b == "Removed")
        s.behavior = Behavior::kRemoved;
      else if (b == "Isolated")
        s.behavior = Behavior::kIsolated;
      else if (b == "MergedWithPrevious")
        s.behavior = Behavior::kMergedWithPrevious;
      else if (b == "MergedWithNext")
        s.behavior = Behavior::kMergedWithNext;
      else if (b == "Contiguous")
        s.behavior = Behavior::kContiguous;
      else
        throw Error(cat(where, ": unknown Split behavior \"", b, "\""));
      s.invert = flag(p, "invert", false);
      impl->steps.emplace_back(std::move(s));
    } else {
      throw Error(cat(where, ": the pre_tokenizer ", p.is_null() ? std::string("null") : t,
                      " is not supported (Split and ByteLevel only)"));
    }
  };
  add_step(j.value("pre_tokenizer", json()));
  MYRIAD_CHECK(byte_level, where,
               ": the pre_tokenizer has no ByteLevel step, so this is not a byte-level BPE");

  for (Added& t : added) {
    impl->tokens[t.id] = t.text;
    if (t.special) impl->specials.emplace_back(t.text, t.id);
    (t.normalized ? impl->pass2 : impl->pass1).add(std::move(t));
  }
  const fs::path config_path = fs::path(dir) / "tokenizer_config.json";
  if (fs::exists(config_path)) {
    const json config = read_json(config_path);
    MYRIAD_CHECK(config.is_object(), config_path.string(), ": not a JSON object");
    impl->bos = impl->resolve(config, "bos_token", config_path.string());
    impl->eos = impl->resolve(config, "eos_token", config_path.string());
    impl->pad = impl->resolve(config, "pad_token", config_path.string());
    impl->unk = impl->resolve(config, "unk_token", config_path.string());
  }
  impl->finish();
  return std::unique_ptr<BpeTokenizer>(new BpeTokenizer(std::move(impl)));
}

BpeTokenizer::BpeTokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
BpeTokenizer::~BpeTokenizer() = default;

std::vector<int32_t> BpeTokenizer::encode(std::string_view text,
                                          std::span<const ByteSpan> trusted) const {
  std::vector<int32_t> out;
  impl_->encode(text, trusted, out);
  return out;
}

std::string_view BpeTokenizer::token_bytes(int32_t id) const {
  MYRIAD_CHECK(id >= 0 && id < vocab_size(), "BpeTokenizer: id ", id,
               " outside the vocabulary [0, ", vocab_size(), ")");
  return impl_->tokens[id];
}

int BpeTokenizer::vocab_size() const {
  return static_cast<int>(impl_->tokens.size());
}
const std::string& BpeTokenizer::kind() const {
  return impl_->kind;
}
bool BpeTokenizer::is_special(int32_t id) const {
  return id >= 0 && id < vocab_size() && impl_->special[id];
}
const std::vector<std::pair<std::string, int32_t>>& BpeTokenizer::special_tokens() const {
  return impl_->specials;
}
int32_t BpeTokenizer::bos() const {
  return impl_->bos;
}
int32_t BpeTokenizer::eos() const {
  return impl_->eos;
}
int32_t BpeTokenizer::pad() const {
  return impl_->pad;
}
int32_t BpeTokenizer::unk() const {
  return impl_->unk;
}

}  // namespace myriad::data
