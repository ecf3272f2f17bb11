#include "data/corpus.h"

#include <zlib.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace myriad::data {
namespace {

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  MYRIAD_CHECK(f, "cannot open ", path);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void require_package(const std::string& path, const char* package) {
  MYRIAD_CHECK(std::filesystem::exists(path), path, " not found: install the Debian package ",
               package, " (apt-get install ", package, ")");
}

std::vector<std::string_view> split_ws(std::string_view s) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && s[i] == ' ') ++i;
    size_t j = i;
    while (j < s.size() && s[j] != ' ') ++j;
    if (j > i) out.push_back(s.substr(i, j - i));
    i = j;
  }
  return out;
}

std::string trim(std::string_view s) {
  size_t a = 0, b = s.size();
  while (a < b && std::isspace(static_cast<unsigned char>(s[a]))) ++a;
  while (b > a && std::isspace(static_cast<unsigned char>(s[b - 1]))) --b;
  return std::string(s.substr(a, b - a));
}

// Collapses every whitespace run into one space.
std::string collapse_ws(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  bool space = false;
  for (char c : s) {
    if (std::isspace(static_cast<unsigned char>(c))) {
      space = !out.empty();
    } else {
      if (space) out += ' ';
      space = false;
      out += c;
    }
  }
  return out;
}

bool parse_uint(std::string_view s, int base, int64_t& v) {
  if (s.empty()) return false;
  v = 0;
  for (char c : s) {
    int d = std::isdigit(static_cast<unsigned char>(c)) ? c - '0'
            : (base == 16 && std::isxdigit(static_cast<unsigned char>(c)))
                ? std::tolower(c) - 'a' + 10
                : -1;
    if (d < 0 || d >= base) return false;
    v = v * base + d;
  }
  return true;
}

}  // namespace

std::vector<Synset> read_wordnet_data(const std::string& path) {
  const std::string text = read_file(path);
  std::vector<Synset> out;
  size_t pos = 0;
  int64_t line_no = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + pos, end - pos);
    const size_t line_pos = pos;
    pos = end + 1;
    ++line_no;
    if (line.starts_with("  ") || line.empty()) continue;  // licence header
    auto bad = [&](const char* why) {
      return Error(cat("WordNet ", path, ":", line_no, ": ", why));
    };
    const size_t bar = line.find(" | ");
    if (bar == std::string_view::npos) throw bad("no ' | ' gloss separator");
    auto f = split_ws(line.substr(0, bar));
    Synset s;
    int64_t v = 0, w_cnt = 0, p_cnt = 0;
    if (f.size() < 6 || f[0].size() != 8 || !parse_uint(f[0], 10, s.offset) ||
        !parse_uint(f[1], 10, v) || f[2].size() != 1 || !parse_uint(f[3], 16, w_cnt) || w_cnt < 1)
      throw bad("malformed synset header");
    if (s.offset != static_cast<int64_t>(line_pos)) throw bad("offset is not the byte position");
    s.pos = f[2][0];
    if (std::string_view("nvasr").find(s.pos) == std::string_view::npos)
      throw bad("unknown ss_type");
    size_t k = 4;
    if (f.size() < k + 2 * w_cnt + 1) throw bad("truncated word list");
    for (int64_t i = 0; i < w_cnt; ++i, k += 2) {
      std::string w(f[k]);
      if (auto paren = w.find('('); paren != std::string::npos && w.back() == ')')
        w.resize(paren);  // adjective markers (p), (a), (ip)
      std::replace(w.begin(), w.end(), '_', ' ');
      s.words.push_back(std::move(w));
    }
    if (!parse_uint(f[k], 10, p_cnt)) throw bad("malformed p_cnt");
    k += 1 + 4 * p_cnt;
    if (s.pos == 'v' && k < f.size()) {  // verb frames: f_cnt {+ f_num w_num}
      int64_t f_cnt = 0;
      if (!parse_uint(f[k], 10, f_cnt)) throw bad("malformed frame count");
      k += 1 + 3 * f_cnt;
    }
    if (k != f.size()) throw bad("field count does not match w_cnt/p_cnt");
    // Gloss: definition parts, then quoted examples, separated by "; ".
    std::string gloss = trim(line.substr(bar + 3));
    size_t a = 0;
    while (a <= gloss.size()) {
      size_t b = gloss.find("; ", a);
      if (b == std::string::npos) b = gloss.size();
      std::string part = trim(std::string_view(gloss).substr(a, b - a));
      if (!part.empty() && part[0] == '"') {
        std::erase(part, '"');
        if (!part.empty()) s.examples.push_back(trim(part));
      } else if (!part.empty()) {
        s.gloss += (s.gloss.empty() ? "" : "; ") + part;
      }
      a = b + 2;
    }
    out.push_back(std::move(s));
  }
  return out;
}

std::string synset_document(const Synset& s) {
  std::string d;
  for (size_t i = 0; i < s.words.size(); ++i) d += (i ? ", " : "") + s.words[i];
  auto sentence = [&](const std::string& t) {
    d += t;
    if (!t.empty() && std::string_view(".!?").find(t.back()) == std::string_view::npos) d += '.';
  };
  d += ": ";
  sentence(s.gloss);
  for (const auto& e : s.examples) {
    d += " Example: ";
    sentence(e);
  }
  return d;
}

std::vector<std::string> wordnet_documents(const std::string& dir) {
  std::vector<std::string> docs;
  for (const char* pos : {"noun", "verb", "adj", "adv"}) {
    const std::string path = dir + "/data." + pos;
    require_package(path, "wordnet-base");
    for (const auto& s : read_wordnet_data(path)) docs.push_back(synset_document(s));
  }
  return docs;
}

uint64_t gcide_b64(std::string_view s) {
  MYRIAD_CHECK(!s.empty() && s.size() <= 10, "gcide_b64: bad numeral '", s, "'");
  uint64_t v = 0;
  for (char c : s) {
    int d = c >= 'A' && c <= 'Z'   ? c - 'A'
            : c >= 'a' && c <= 'z' ? c - 'a' + 26
            : c >= '0' && c <= '9' ? c - '0' + 52
            : c == '+'             ? 62
            : c == '/'             ? 63
                                   : -1;
    MYRIAD_CHECK(d >= 0, "gcide_b64: bad digit '", c, "' in '", s, "'");
    v = v * 64 + static_cast<uint64_t>(d);
  }
  return v;
}

namespace {

// Removes <tags>, {braces} and \pronunciation\ marks, then collapses whitespace.
std::string clean_gcide(std::string_view e) {
  std::string out;
  out.reserve(e.size());
  for (size_t i = 0; i < e.size(); ++i) {
    char c = e[i];
    if (c == '<') {
      size_t j = e.find('>', i);
      if (j != std::string_view::npos && j - i < 64) {
        i = j;
        out += ' ';
        continue;
      }
    } else if (c == '\\') {
      size_t j = e.find('\\', i + 1);
      if (j != std::string_view::npos && j - i < 80 &&
          e.substr(i, j - i).find('\n') == std::string_view::npos) {
        i = j;
        continue;
      }
    } else if (c == '[') {  // source tags such as [1913 Webster], [WordNet 1.5 +PJC]
      size_t j = e.find(']', i);
      if (j != std::string_view::npos && j - i < 40) {
        auto tag = e.substr(i, j - i);
        if (tag.find("Webster") != tag.npos || tag.find("WordNet") != tag.npos ||
            tag.find("PJC") != tag.npos) {
          i = j;
          continue;
        }
      }
    }
    if (c == '{' || c == '}' || c == '\\') continue;
    out += c;
  }
  return collapse_ws(out);
}

}  // namespace

std::vector<std::string> gcide_documents(const std::string& dir, size_t max_docs) {
  const std::string index_path = dir + "/gcide.index", dict_path = dir + "/gcide.dict.dz";
  require_package(index_path, "dict-gcide");
  require_package(dict_path, "dict-gcide");
  std::vector<std::pair<uint64_t, uint64_t>> entries;  // (offset, length)
  std::vector<uint64_t> metadata;  // offsets of 00-database-* entries (aliased by 00-gcide-*, ...)
  {
    std::istringstream idx(read_file(index_path));
    std::string line;
    int64_t line_no = 0;
    while (std::getline(idx, line)) {
      ++line_no;
      if (line.empty()) continue;
      size_t t1 = line.find('\t'), t2 = line.find('\t', t1 + 1);
      MYRIAD_CHECK(t1 != std::string::npos && t2 != std::string::npos, "GCIDE ", index_path, ":",
                   line_no, ": expected headword<TAB>offset<TAB>length");
      const uint64_t off = gcide_b64(std::string_view(line).substr(t1 + 1, t2 - t1 - 1));
      if (line.starts_with("00-database-")) {
        metadata.push_back(off);
      } else {
        entries.emplace_back(off, gcide_b64(std::string_view(line).substr(t2 + 1)));
      }
    }
  }
  std::erase_if(entries, [&](const auto& e) {
    return std::find(metadata.begin(), metadata.end(), e.first) != metadata.end();
  });
  std::sort(entries.begin(), entries.end());
  entries.erase(std::unique(entries.begin(), entries.end(),
                            [](auto& a, auto& b) { return a.first == b.first; }),
                entries.end());  // several headwords share one entry
  if (max_docs && entries.size() > max_docs) entries.resize(max_docs);

  gzFile gz = gzopen(dict_path.c_str(), "rb");
  MYRIAD_CHECK(gz, "cannot open ", dict_path);
  std::string text;  // the uncompressed prefix read so far
  std::vector<std::string> docs;
  char buf[1 << 16];
  for (auto [off, len] : entries) {
    while (text.size() < off + len) {
      int n = gzread(gz, buf, sizeof buf);
      if (n <= 0) break;
      text.append(buf, static_cast<size_t>(n));
    }
    if (text.size() < off + len) {
      gzclose(gz);
      throw Error(cat("GCIDE ", dict_path, ": entry [", off, ", ", off + len,
                      ") lies past the end of the decompressed text (", text.size(),
                      " bytes): truncated or corrupt file"));
    }
    std::string d = clean_gcide(std::string_view(text).substr(off, len));
    if (!d.empty()) docs.push_back(std::move(d));
  }
  gzclose(gz);
  return docs;
}

std::vector<std::string> builtin_corpus(size_t max_bytes) {
  std::vector<std::string> docs = wordnet_documents();
  std::vector<std::string> g = gcide_documents();
  docs.insert(docs.end(), std::make_move_iterator(g.begin()), std::make_move_iterator(g.end()));
  Rng rng(0x5eed'c0de);
  rng.shuffle(docs);
  if (max_bytes) {
    size_t bytes = 0, n = 0;
    while (n < docs.size() && bytes < max_bytes) bytes += docs[n++].size();
    docs.resize(n);
  }
  return docs;
}

std::vector<std::string> synthetic_fallback_corpus(uint64_t seed, size_t bytes) {
  static const char* subj[] = {"the farmer",    "a small bird",    "the river",  "my neighbour",
                               "the old clock", "a quiet student", "the engine", "our teacher",
                               "the wind",      "a red fox",       "the baker",  "every child"};
  static const char* verb[] = {"watches", "carries", "follows", "paints", "remembers", "builds",
                               "finds",   "moves",   "counts",  "opens",  "describes", "holds"};
  static const char* obj[] = {"the green field", "a wooden box",    "seven stones",
                              "the bright lamp", "a long letter",   "the open door",
                              "three apples",    "the cold water",  "a paper map",
                              "the tall tower",  "some warm bread", "the blue sky"};
  static const char* tail[] = {"in the morning",  "after the rain", "near the bridge",
                               "without a sound", "before dinner",  "every day",
                               "at the market",   "with great care"};
  Rng rng(seed);
  std::vector<std::string> docs;
  size_t total = 0;
  while (total < bytes) {
    std::string d;
    const uint64_t sentences = 2 + rng.below(8);
    for (uint64_t i = 0; i < sentences; ++i) {
      std::string s =
          std::string(subj[rng.below(12)]) + " " + verb[rng.below(12)] + " " + obj[rng.below(12)];
      if (rng.below(2)) s += std::string(" ") + tail[rng.below(8)];
      if (rng.below(4) == 0) s.append(" ").append(std::to_string(rng.below(1000))).append(" times");
      s[0] = static_cast<char>(std::toupper(s[0]));
      d.append(i ? " " : "").append(s).append(".");
    }
    total += d.size();
    docs.push_back(std::move(d));
  }
  return docs;
}

}  // namespace myriad::data
