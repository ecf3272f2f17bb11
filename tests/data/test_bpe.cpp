// Byte-level BPE tokenizers (data/bpe.h) against the Python references: the fixtures under
// tests/fixtures/tokenizers/ hold the ids tiktoken and tokenizers produce for 10,000+ strings
// (tools/reference/tokenizer_fixtures.py); every id must agree and every text round-trip.
#include <gtest/gtest.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "data/bpe.h"
#include "data/tokenizer.h"
#include "infer/sampling.h"
#include "tests/data/data_test_util.h"

using namespace myriad::data;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

const fs::path kFixtures = fs::path(MYRIAD_SOURCE_DIR) / "tests/fixtures/tokenizers";

std::vector<json> read_gz_lines(const fs::path& p) {
  gzFile f = gzopen(p.c_str(), "rb");
  if (!f) throw std::runtime_error("cannot open " + p.string());
  std::string all;
  char buf[1 << 16];
  int n;
  while ((n = gzread(f, buf, sizeof buf)) > 0) all.append(buf, static_cast<size_t>(n));
  gzclose(f);
  std::vector<json> out;
  std::istringstream s(all);
  for (std::string line; std::getline(s, line);) out.push_back(json::parse(line));
  return out;
}

std::string unhex(const std::string& h) {
  std::string out;
  for (size_t i = 0; i + 1 < h.size(); i += 2)
    out += static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16));
  return out;
}

struct Case {
  std::string category;
  std::string text;
  bool bytes = false;       // not valid UTF-8: round trip only
  bool unassigned = false;  // holds a code point unassigned in Unicode 14 (Python 3.11, PCRE2)
};

const std::vector<Case>& cases() {
  static const std::vector<Case> all = [] {
    std::vector<Case> v;
    const auto lines = read_gz_lines(kFixtures / "cases.jsonl.gz");
    for (size_t i = 1; i < lines.size(); ++i) {
      const json& l = lines[i];
      Case c;
      c.category = l[0].get<std::string>();
      if (l[1].is_null()) {
        c.bytes = true;
        c.text = unhex(l[2].get<std::string>());
      } else {
        c.text = l[1].get<std::string>();
        c.unassigned = l.size() > 2;
      }
      v.push_back(std::move(c));
    }
    EXPECT_EQ(static_cast<int64_t>(v.size()), lines[0]["cases"].get<int64_t>());
    return v;
  }();
  return all;
}

const Tokenizer& fixture(const std::string& name) {
  static std::map<std::string, Tokenizer> loaded;
  static std::mutex mu;
  std::lock_guard lk(mu);
  auto it = loaded.find(name);
  if (it == loaded.end())
    it = loaded.emplace(name, Tokenizer::from_dir((kFixtures / name).string())).first;
  return it->second;
}

bool valid_utf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t len = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 0;
    if (len == 0 || i + len > s.size()) return false;
    for (size_t k = 1; k < len; ++k)
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    i += len;
  }
  return true;
}

std::string show(const std::vector<int32_t>& ids) {
  std::ostringstream s;
  for (size_t i = 0; i < ids.size() && i < 40; ++i) s << (i ? " " : "") << ids[i];
  if (ids.size() > 40) s << " ...";
  return s.str();
}

// Checks every case the fixture covers.
// bytes: whether the byte strings must round-trip (not where the pre-tokenizer adds a space).
void check_parity(const std::string& name, bool bytes_round_trip = true) {
  const Tokenizer& tok = fixture(name);
  const auto rows = read_gz_lines(kFixtures / name / "expected.jsonl.gz");
  const auto& cs = cases();
  ASSERT_EQ(rows.size(), cs.size() + 1) << name;
  std::map<std::string, std::pair<int, int>> by_cat;  // category -> (checked, mismatches)
  int checked = 0, bad = 0, bad_unassigned = 0, unassigned = 0, bytes = 0, trusted = 0;
  for (size_t i = 0; i < cs.size(); ++i) {
    const json& row = rows[i + 1];
    const Case& c = cs[i];
    if (row.is_null()) continue;
    if (c.bytes) {
      if (!bytes_round_trip) continue;
      ++bytes;
      EXPECT_EQ(tok.decode(tok.encode(c.text)), c.text) << name << " bytes case " << i;
      continue;
    }
    ++checked;
    auto& [n, m] = by_cat[c.category];
    ++n;
    unassigned += c.unassigned;
    const auto want = row["ids"].get<std::vector<int32_t>>();
    const auto got = tok.encode(c.text);
    bool ok = got == want;
    for (int32_t id : got) ok = ok && !tok.is_special(id);
    const std::string decoded =
        row.contains("decoded") ? row["decoded"].get<std::string>() : c.text;
    // The text comes back whatever the split (a hard failure even for unassigned code points).
    EXPECT_EQ(tok.decode(got), decoded) << name << " case " << i;
    // Trusted text: special tokens become their ids, as the reference with specials allowed.
    const auto want_trusted =
        row.contains("trusted") ? row["trusted"].get<std::vector<int32_t>>() : want;
    trusted += row.contains("trusted");
    ok = ok && tok.encode_parts({{c.text, true}}) == want_trusted;
    if (!ok) {
      ++m;
      if (c.unassigned) {
        if (++bad_unassigned <= 10)
          std::printf("[parity] %s case %zu (%s, holds code points unassigned in Unicode 14): %s\n",
                      name.c_str(), i, c.category.c_str(), json(c.text).dump().c_str());
      } else if (++bad <= 10) {
        ADD_FAILURE() << name << " case " << i << " (" << c.category << "): " << json(c.text).dump()
                      << "\n  want " << show(want) << "\n  got  " << show(got)
                      << "\n  trusted want " << show(want_trusted) << "\n  trusted got  "
                      << show(tok.encode_parts({{c.text, true}}));
      }
    }
  }
  std::ostringstream cats;
  for (const auto& [k, v] : by_cat) cats << " " << k << " " << v.second << "/" << v.first;
  std::printf(
      "[parity] %s (%s): %d strings (%d with trusted specials), %d mismatches; "
      "%d of %d strings with code points unassigned in Unicode 14 differ; %d byte "
      "strings round-trip checked\n  mismatches by category:%s\n",
      name.c_str(), tok.kind().c_str(), checked, trusted, bad + bad_unassigned, bad_unassigned,
      unassigned, bytes, cats.str().c_str());
  EXPECT_EQ(bad, 0) << name;
  // PCRE2 10.42 has Unicode 14's tables, the references newer ones: a code point assigned since
  // (a new emoji is \p{S} to them, unassigned to PCRE2) may split differently. Rare, though.
  EXPECT_LE(bad_unassigned * 20, unassigned) << name;
  EXPECT_GT(checked, 1000) << name;
}

}  // namespace

TEST(BpeParity, KimiTiktoken) {
  check_parity("kimi_tiktoken");
}
TEST(BpeParity, Cl100kPatternOverride) {
  check_parity("cl100k_tiktoken");
}
TEST(BpeParity, DeepSeekTokenizerJson) {
  check_parity("deepseek_hf");
}
TEST(BpeParity, Gpt2StyleTokenizerJson) {
  check_parity("gpt2_hf", /*bytes_round_trip=*/false);
}

// ------------------------------------------------------------------------------ behaviour

TEST(Bpe, KindsAndSpecialIdsFromTheConfig) {
  const Tokenizer& kimi = fixture("kimi_tiktoken");
  EXPECT_EQ(kimi.kind(), "tiktoken");
  EXPECT_EQ(kimi.vocab_size(), 3500 + 256);  // the ranks, then Kimi's 256 reserved ids
  EXPECT_EQ(kimi.bos(), 3500);               // [BOS], a plain string in tokenizer_config.json
  EXPECT_EQ(kimi.eos(), 3501);               // [EOS], an {"content": ...} object there
  EXPECT_EQ(kimi.unk(), 3500 + 254);
  EXPECT_EQ(kimi.pad(), 3500 + 255);
  EXPECT_EQ(kimi.special_tokens().size(), 256u);
  EXPECT_TRUE(kimi.is_special(3502));
  EXPECT_FALSE(kimi.is_special(3499));
  EXPECT_EQ(kimi.decode({3502}), "<|im_end|>");
  EXPECT_EQ(kimi.decode({3505}), "<|reserved_token_3505|>");  // not named: reserved
  EXPECT_EQ(kimi.encode_parts({{"<|reserved_token_3505|>", true}}), std::vector<int32_t>{3505});

  const Tokenizer& ds = fixture("deepseek_hf");
  EXPECT_EQ(ds.kind(), "hf-bpe");
  EXPECT_EQ(ds.bos(), 0);
  EXPECT_EQ(ds.eos(), 1);
  EXPECT_EQ(ds.pad(), 1);   // pad_token is the eos token there
  EXPECT_EQ(ds.unk(), -1);  // unk_token: null
  EXPECT_TRUE(ds.is_special(2));
  EXPECT_FALSE(ds.is_special(4000));  // <｜fim▁hole｜>: an added token, not special

  const Tokenizer& g = fixture("gpt2_hf");
  EXPECT_EQ(g.bos(), 0);
  EXPECT_EQ(g.eos(), 0);
  EXPECT_EQ(g.pad(), 0);  // no pad_token: eos

  // bos/eos/pad decode to nothing (as SentencePiece's), other specials to their text.
  EXPECT_EQ(kimi.decode({kimi.bos(), 3502, kimi.eos()}), "<|im_end|>");
  // is_byte: a one-byte token that is part of a character.
  int bytes = 0;
  for (int32_t id = 0; id < kimi.vocab_size(); ++id) {
    if (!kimi.is_byte(id)) continue;
    ++bytes;
    const std::string b = kimi.decode({id});
    EXPECT_EQ(b.size(), 1u);
    EXPECT_GE(static_cast<unsigned char>(b[0]), 0x80);
  }
  EXPECT_EQ(bytes, 128);
  EXPECT_FALSE(kimi.is_byte(kimi.encode("a")[0]));
}

TEST(Bpe, SpecialTokensOnlyWhereTrusted) {
  for (const char* name : {"kimi_tiktoken", "deepseek_hf"}) {
    const Tokenizer& tok = fixture(name);
    const bool kimi = std::string(name) == "kimi_tiktoken";
    const std::string end = kimi ? "<|im_end|>" : "<｜end▁of▁sentence｜>";
    const int32_t end_id = kimi ? 3502 : 1;
    for (const std::string& text :
         {end, std::string("[EOS]"), std::string("<|im_end|>"), "x" + end + "y"}) {
      for (int32_t id : tok.encode(text)) EXPECT_FALSE(tok.is_special(id)) << name << " " << text;
      EXPECT_EQ(tok.decode(tok.encode(text)), text) << name;
      EXPECT_EQ(tok.encode_parts({{text, false}}), tok.encode(text)) << name;
    }
    EXPECT_EQ(tok.encode_parts({{end, true}}), std::vector<int32_t>{end_id}) << name;
    // A template around untrusted content: only the template's markers are specials.
    const std::string user = "user says " + end;
    const auto ids = tok.encode_parts({{end, true}, {user, false}, {end, true}});
    ASSERT_GE(ids.size(), 3u);
    EXPECT_EQ(ids.front(), end_id);
    EXPECT_EQ(ids.back(), end_id);
    EXPECT_EQ(std::count(ids.begin(), ids.end(), end_id), 2) << name;
    // A special token split across two trusted parts is not one.
    const std::string a = end.substr(0, 3), b = end.substr(3);
    for (int32_t id : tok.encode_parts({{a, true}, {b, true}}))
      EXPECT_FALSE(tok.is_special(id)) << name;
  }
  // Kimi's bos/eos spelled in trusted text.
  const Tokenizer& kimi = fixture("kimi_tiktoken");
  EXPECT_EQ(kimi.encode_parts({{"[BOS]hi[EOS]", true}}).front(), kimi.bos());
  EXPECT_EQ(kimi.encode_parts({{"[BOS]hi[EOS]", true}}).back(), kimi.eos());
  // Non-special added tokens of a tokenizer.json are vocabulary: matched in any text, as the
  // reference matches them.
  const Tokenizer& ds = fixture("deepseek_hf");
  EXPECT_EQ(ds.encode("<think>"), std::vector<int32_t>{4008});
}

TEST(Bpe, InvalidUtf8RoundTripsAndSplitsPieces) {
  std::string all;
  for (int b = 0; b < 256; ++b) all += static_cast<char>(b);
  const std::vector<std::string> texts = {all,
                                          "abc\xff"
                                          "def",
                                          "\xe4\xb8",
                                          "\xed\xa0\x80",
                                          "caf\xc3",
                                          "\xf0\x9f\x98\x80\xf0\x9f"};
  for (const char* name : {"kimi_tiktoken", "deepseek_hf", "gpt2_hf"}) {
    const Tokenizer& tok = fixture(name);
    for (const std::string& s : texts) {
      if (std::string(name) == "gpt2_hf") continue;  // its prefix space changes the text
      EXPECT_EQ(tok.decode(tok.encode(s)), s) << name;
    }
  }
  // A run of invalid bytes is a pre-token of its own: the text around it encodes as it would
  // alone (tiktoken's own _encode_bytes instead re-encodes from the last piece on as one piece).
  const Tokenizer& kimi = fixture("kimi_tiktoken");
  auto want = kimi.encode("hello world");
  const auto ff = kimi.encode("\xff\xfe");
  want.insert(want.end(), ff.begin(), ff.end());
  const auto tail = kimi.encode(" again");
  want.insert(want.end(), tail.begin(), tail.end());
  EXPECT_EQ(kimi.encode("hello world\xff\xfe again"), want);
}

TEST(Bpe, EncodeIsThreadSafe) {
  const auto& cs = cases();
  for (const char* name : {"kimi_tiktoken", "deepseek_hf"}) {
    const Tokenizer& tok = fixture(name);
    std::vector<std::vector<int32_t>> want;
    for (size_t i = 0; i < 400; ++i) want.push_back(tok.encode(cs[i * 7].text));
    std::vector<std::thread> threads;
    std::vector<int> bad(4, 0);
    for (int t = 0; t < 4; ++t)
      threads.emplace_back([&, t] {
        for (size_t i = 0; i < 400; ++i) bad[t] += tok.encode(cs[i * 7].text) != want[i];
      });
    for (auto& th : threads) th.join();
    for (int b : bad) EXPECT_EQ(b, 0) << name;
  }
}

// The server streams text through infer::TextStream, which must hold back the bytes of a
// character until its last token arrives: with byte-level tokens a character often spans several.
TEST(Bpe, StreamingNeverReleasesHalfACharacter) {
  for (const char* name : {"kimi_tiktoken", "deepseek_hf"}) {
    const Tokenizer& tok = fixture(name);
    int split_chars = 0, streams = 0;
    for (const Case& c : cases()) {
      if (c.bytes || (c.category != "multilingual" && c.category != "emoji") || ++streams > 300)
        continue;
      const auto ids = tok.encode(c.text);
      myriad::infer::TextStream stream(
          {}, [&](const std::vector<int32_t>& v) { return tok.decode(v); });
      std::string out;
      for (int32_t id : ids) {
        split_chars += !valid_utf8(tok.decode({id}));
        const std::string piece = stream.push(id).text;
        EXPECT_TRUE(valid_utf8(piece)) << name << ": " << c.text;
        out += piece;
      }
      out += stream.flush();
      EXPECT_EQ(out, c.text) << name;
    }
    EXPECT_GT(split_chars, 100) << name << ": the test needs tokens that split characters";
  }
}

TEST(Bpe, FromDirPicksByFiles) {
  const auto dir = dtest::scratch_dir("bpe_from_dir");
  // tiktoken.model wins over tokenizer.json, which wins over tokenizer.model.
  fs::copy(kFixtures / "deepseek_hf", dir + "/both");
  fs::copy(kFixtures / "kimi_tiktoken", dir + "/both",
           fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  EXPECT_EQ(Tokenizer::from_dir(dir + "/both").kind(), "tiktoken");
  fs::remove(dir + "/both/tiktoken.model");
  fs::remove(dir + "/both/tokenizer_config.json");  // Kimi's; tokenizer.json does without
  const Tokenizer hf = Tokenizer::from_dir(dir + "/both");
  EXPECT_EQ(hf.kind(), "hf-bpe");
  EXPECT_EQ(hf.bos(), -1);  // no tokenizer_config.json to name it
  EXPECT_EQ(hf.eos(), -1);
  EXPECT_EQ(hf.pad(), -1);
  Tokenizer::train(dtest::small_corpus(), 400, dir + "/both/tokenizer.model");
  EXPECT_EQ(Tokenizer::from_dir(dir + "/both").kind(), "hf-bpe");
  fs::remove(dir + "/both/tokenizer.json");
  const Tokenizer sp = Tokenizer::from_dir(dir + "/both");
  EXPECT_EQ(sp.kind(), "sentencepiece");
  EXPECT_EQ(sp.bos(), 1);
  EXPECT_EQ(sp.eos(), 2);
  EXPECT_EQ(sp.pad(), 3);
  EXPECT_EQ(sp.unk(), 0);
  // Nothing there: the error lists what it looked for.
  fs::create_directories(dir + "/empty");
  try {
    Tokenizer::from_dir(dir + "/empty");
    ADD_FAILURE() << "from_dir of an empty directory did not throw";
  } catch (const myriad::Error& e) {
    const std::string m = e.what();
    for (const char* f :
         {"tiktoken.model", "tokenizer_config.json", "tokenizer.json", "tokenizer.model"})
      EXPECT_NE(m.find(f), std::string::npos) << m;
  }
  EXPECT_THROW(Tokenizer::from_dir(dir + "/missing"), myriad::Error);
}

namespace {

// The message of the error loading dir throws ("" when it loads).
std::string load_error(const std::string& dir) {
  try {
    Tokenizer::from_dir(dir);
  } catch (const myriad::Error& e) {
    return e.what();
  }
  return "";
}

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

void spit(const fs::path& p, const std::string& s) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f << s;
}

bool has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

}  // namespace

TEST(Bpe, TiktokenFileErrors) {
  const auto dir = dtest::scratch_dir("bpe_tiktoken_errors");
  const fs::path src = kFixtures / "kimi_tiktoken";
  const std::string model = slurp(src / "tiktoken.model");
  const auto variant = [&](const std::string& name, const std::string& m) {
    const fs::path d = fs::path(dir) / name;
    fs::create_directories(d);
    spit(d / "tiktoken.model", m);
    fs::copy_file(src / "tokenizer_config.json", d / "tokenizer_config.json");
    return load_error(d.string());
  };
  EXPECT_EQ(variant("ok", model), "");
  std::string e = variant("base64", model + "!!notbase64 3500\n");
  EXPECT_TRUE(has(e, "line 3501") && has(e, "base64")) << e;
  e = variant("fields", model + "YWJj\n");
  EXPECT_TRUE(has(e, "line 3501") && has(e, "'YWJj'")) << e;
  e = variant("rank", model + "YWJjZA== x1\n");
  EXPECT_TRUE(has(e, "line 3501") && has(e, "rank")) << e;
  e = variant("twice", model + model.substr(0, model.find('\n') + 1));
  EXPECT_TRUE(has(e, "line 3501") && has(e, "twice")) << e;
  e = variant("gap", model + "YWJjZGVmZ2g= 4000\n");
  EXPECT_TRUE(has(e, "ranks are not 0..3500")) << e;
  // Without byte 0x00 (rank 0, the first line) the ranks start at 1.
  e = variant("nobyte", model.substr(model.find('\n') + 1));
  EXPECT_TRUE(has(e, "ranks are not 0..")) << e;

  // Missing files and bad configs.
  fs::create_directories(fs::path(dir) / "noconfig");
  spit(fs::path(dir) / "noconfig/tiktoken.model", model);
  e = load_error(dir + "/noconfig");
  EXPECT_TRUE(has(e, "tokenizer_config.json") && has(e, "does not exist")) << e;
  const auto config_variant = [&](const std::string& name, const json& config) {
    const fs::path d = fs::path(dir) / name;
    fs::create_directories(d);
    spit(d / "tiktoken.model", model);
    spit(d / "tokenizer_config.json", config.dump());
    return load_error(d.string());
  };
  const json config = json::parse(slurp(src / "tokenizer_config.json"));
  json c = config;
  c["eos_token"] = "<|not_there|>";
  e = config_variant("eos", c);
  EXPECT_TRUE(has(e, "eos_token") && has(e, "<|not_there|>")) << e;
  c = config;
  c["added_tokens_decoder"]["9999"] = {{"content", "<|far|>"}};
  e = config_variant("far", c);
  EXPECT_TRUE(has(e, "'9999'") && has(e, "reserved ids")) << e;
  c = config;
  c["pat_str"] = "[a-";
  e = config_variant("pat", c);
  EXPECT_TRUE(has(e, "does not compile") || has(e, "unterminated")) << e;
  // No bos_token / pad_token: -1, and pad() falls back to eos().
  c = config;
  c.erase("bos_token");
  c.erase("pad_token");
  EXPECT_EQ(config_variant("nobos", c), "");
  const Tokenizer t = Tokenizer::from_dir(dir + "/nobos");
  EXPECT_EQ(t.bos(), -1);
  EXPECT_EQ(t.eos(), 3501);
  EXPECT_EQ(t.pad(), 3501);
}

TEST(Bpe, TokenizerJsonErrors) {
  const auto dir = dtest::scratch_dir("bpe_hf_errors");
  const json base = json::parse(slurp(kFixtures / "deepseek_hf/tokenizer.json"));
  const auto variant = [&](const std::string& name, const json& j) {
    const fs::path d = fs::path(dir) / name;
    fs::create_directories(d);
    spit(d / "tokenizer.json", j.dump());
    return load_error(d.string());
  };
  EXPECT_EQ(variant("ok", base), "");
  json j = base;
  j["normalizer"] = {{"type", "NFC"}};
  std::string e = variant("nfc", j);
  EXPECT_TRUE(has(e, "normalizer NFC")) << e;
  j = base;
  j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "_"}};
  e = variant("metaspace", j);
  EXPECT_TRUE(has(e, "pre_tokenizer Metaspace")) << e;
  j = base;
  j["model"]["type"] = "Unigram";
  e = variant("unigram", j);
  EXPECT_TRUE(has(e, "model type Unigram")) << e;
  j = base;
  j["model"]["byte_fallback"] = true;
  e = variant("fallback", j);
  EXPECT_TRUE(has(e, "byte_fallback")) << e;
  j = base;
  j["decoder"] = nullptr;
  e = variant("decoder", j);
  EXPECT_TRUE(has(e, "decoder null")) << e;
  j = base;
  j["added_tokens"][3]["single_word"] = true;
  e = variant("single_word", j);
  EXPECT_TRUE(has(e, "single_word")) << e;
  j = base;
  j["model"]["merges"].push_back("Ġzzzq Ġyyyq");
  e = variant("merge", j);
  EXPECT_TRUE(has(e, "missing from the vocab")) << e;
  const fs::path bad = fs::path(dir) / "badjson";
  fs::create_directories(bad);
  spit(bad / "tokenizer.json", "{not json");
  e = load_error(bad.string());
  EXPECT_TRUE(has(e, "not valid JSON")) << e;
}

TEST(Bpe, PatternTranslation) {
  // Rust-regex class intersection becomes a lookahead; \s the White_Space set; scripts sc:.
  EXPECT_EQ(bpe_pattern_to_pcre2(R"([\p{L}&&[^\p{Han}]]+)"), R"((?:(?=[^\p{sc:Han}])[\p{L}])+)");
  EXPECT_EQ(bpe_pattern_to_pcre2(R"(\p{N}{1,3})"), R"(\p{N}{1,3})");
  EXPECT_NE(bpe_pattern_to_pcre2(R"(\s+(?!\S))").find(R"(\x{3000})"), std::string::npos);
  EXPECT_THROW(bpe_pattern_to_pcre2("[abc"), myriad::Error);
}
