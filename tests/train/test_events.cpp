// Output writers: the TensorBoard event file (CRC32C against known vectors, TFRecord framing and
// checksums re-read here, the Event fields decoded by a minimal protobuf reader; and, when
// MYRIAD_TB_CHECK_PYTHON names a python with the `tensorboard` package, the official reader via
// tools/reference/check_tfevents.py), and the run report (metrics.jsonl lines parse, report.html
// is well-formed markup with every plot and no scripts; its number formatting, axis ticks, stage
// markers, eval heatmaps and summary line).
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"

#include "train/events.h"
#include "train/report.h"

using namespace myriad::train;
namespace fs = std::filesystem;

namespace {

fs::path temp_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("myriad_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(d);
  return d;
}

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}

std::span<const uint8_t> bytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

// Minimal protobuf reading: field number -> raw values (varints as numbers, others as bytes).
struct Field {
  int num, wire;
  uint64_t v = 0;
  std::string s;
};
std::vector<Field> fields(const std::string& m) {
  std::vector<Field> out;
  size_t i = 0;
  auto varint = [&] {
    uint64_t v = 0;
    for (int sh = 0;; sh += 7) {
      const auto b = static_cast<uint8_t>(m.at(i++));
      v |= uint64_t(b & 0x7F) << sh;
      if (!(b & 0x80)) return v;
    }
  };
  while (i < m.size()) {
    const uint64_t key = varint();
    Field f{static_cast<int>(key >> 3), static_cast<int>(key & 7), 0, {}};
    if (f.wire == 0)
      f.v = varint();
    else if (f.wire == 1)
      f.s = m.substr(i, 8), i += 8;
    else if (f.wire == 5)
      f.s = m.substr(i, 4), i += 4;
    else if (f.wire == 2) {
      const uint64_t n = varint();
      f.s = m.substr(i, n);
      i += n;
    } else
      ADD_FAILURE() << "wire type " << f.wire;
    out.push_back(f);
  }
  return out;
}

// The records of a TFRecord file, checking both masked CRCs.
std::vector<std::string> records(const std::string& file) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < file.size()) {
    uint64_t len;
    uint32_t c1, c2;
    std::memcpy(&len, file.data() + i, 8);
    std::memcpy(&c1, file.data() + i + 8, 4);
    EXPECT_EQ(c1, masked_crc32c(bytes(file.substr(i, 8))));
    std::string data = file.substr(i + 12, len);
    std::memcpy(&c2, file.data() + i + 12 + len, 4);
    EXPECT_EQ(c2, masked_crc32c(bytes(data)));
    out.push_back(data);
    i += 16 + len;
  }
  EXPECT_EQ(i, file.size());
  return out;
}

}  // namespace

TEST(Events, Crc32cKnownVectors) {
  EXPECT_EQ(crc32c(bytes("123456789")), 0xE3069283u);            // the CRC-32C check value
  EXPECT_EQ(crc32c(bytes(std::string(32, '\0'))), 0x8A9136AAu);  // RFC 3720 B.4
  EXPECT_EQ(crc32c(bytes(std::string(32, '\xff'))), 0x62A8AB43u);
  EXPECT_EQ(crc32c(bytes("")), 0u);
}

TEST(Events, WritesTensorBoardEventFile) {
  const fs::path dir = temp_dir("events");
  std::string path;
  nlohmann::json expect;
  {
    EventWriter w(dir.string());
    path = w.path();
    EXPECT_EQ(fs::path(path).parent_path(), dir);
    EXPECT_EQ(fs::path(path).filename().string().rfind("events.out.tfevents.", 0), 0u);
    for (int64_t step = 0; step < 5; ++step) {
      const std::map<std::string, double> m = {
          {"loss", 3.0 - 0.25 * step}, {"layer1/load/max_over_mean", 1.0 + 0.5 / (step + 1)}};
      w.scalars(step, m);
      for (const auto& [k, v] : m) expect["scalars"][k].push_back({step, v});
    }
    w.scalar("lr", 7, 1e-3);
    expect["scalars"]["lr"].push_back({7, 1e-3});
    const std::vector<double> loads = {0.5, 1.0, 1.0, 1.5, 2.0, 0.0};
    w.histogram("layer1/load", 4, loads, 4);
    expect["histograms"]["layer1/load"].push_back({4, 6, 0.0, 2.0, 6.0});
    w.flush();
  }
  const auto recs = records(slurp(path));
  ASSERT_EQ(recs.size(), 8u);  // version + 5 + 1 + histogram
  auto ev = fields(recs[0]);
  ASSERT_EQ(ev.size(), 3u);
  EXPECT_EQ(ev[0].num, 1);  // wall_time
  double wall;
  std::memcpy(&wall, ev[0].s.data(), 8);
  EXPECT_GT(wall, 1.6e9);
  EXPECT_EQ(ev[2].num, 3);
  EXPECT_EQ(ev[2].s, "brain.Event:2");
  ev = fields(recs[3]);  // step 2: Summary with two values
  EXPECT_EQ(ev[1].num, 2);
  EXPECT_EQ(ev[1].v, 2u);
  ASSERT_EQ(ev[2].num, 5);
  const auto values = fields(ev[2].s);
  ASSERT_EQ(values.size(), 2u);
  const auto v0 = fields(values[1].s);
  EXPECT_EQ(v0[0].s, "loss");
  float f;
  std::memcpy(&f, v0[1].s.data(), 4);
  EXPECT_EQ(v0[1].num, 2);
  EXPECT_EQ(f, 2.5f);

  const char* py = std::getenv("MYRIAD_TB_CHECK_PYTHON");
  if (!py || !*py) GTEST_SKIP() << "set MYRIAD_TB_CHECK_PYTHON to a python with tensorboard";
  const fs::path ex = dir / "expect.json";
  std::ofstream(ex) << expect.dump();
  const std::string cmd = std::string(py) +
                          " " MYRIAD_SOURCE_DIR "/tools/reference/check_tfevents.py " + path + " " +
                          ex.string();
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  fs::remove_all(dir);
}

namespace {
// Tags balance (void/self-closed ones aside): a well-formedness check without an XML library.
bool balanced(const std::string& h, std::string& why) {
  std::vector<std::string> stack;
  for (size_t i = h.find('<'); i != std::string::npos; i = h.find('<', i + 1)) {
    const size_t e = h.find('>', i);
    if (e == std::string::npos) return why = "unterminated tag", false;
    const std::string tag = h.substr(i + 1, e - i - 1);
    if (tag.empty() || tag[0] == '!' || tag.back() == '/') continue;
    const std::string name = tag.substr(tag[0] == '/', tag.find_first_of(" \n") - (tag[0] == '/'));
    if (tag[0] != '/') {
      stack.push_back(name);
    } else if (stack.empty() || stack.back() != name) {
      return why = "</" + name + "> closes <" + (stack.empty() ? "" : stack.back()) + ">", false;
    } else {
      stack.pop_back();
    }
  }
  if (!stack.empty()) why = "unclosed <" + stack.back() + ">";
  return stack.empty();
}

size_t count(const std::string& h, const std::string& s) {
  size_t n = 0;
  for (size_t i = h.find(s); i != std::string::npos; i = h.find(s, i + 1)) ++n;
  return n;
}
}  // namespace

TEST(Report, WritesJsonlAndSelfContainedHtml) {
  const fs::path dir = temp_dir("report");
  {
    RunReport r(dir.string());
    for (int64_t t = 0; t < 60; ++t) {
      r.scalars(t, {{"loss", 5.0 * std::exp(-t / 20.0) + 1.0},
                    {"lr", 1e-3 * std::min(1.0, (t + 1) / 10.0)},
                    {"grad/norm", 1.0 + 0.3 * std::sin(t)},
                    {"grad/jitter", std::abs(std::cos(t))},
                    {"layer1/route/token_entropy", 0.9},
                    {"layer1/route/load_entropy", 0.8 + 0.003 * t},
                    {"loss/z", t == 3 ? NAN : 0.0}});
      for (int64_t layer : {1, 2}) {
        std::vector<double> loads(16);
        for (int j = 0; j < 16; ++j) loads[j] = 1.0 + (j - 7.5) / 8.0 * std::exp(-t / 15.0);
        r.expert_load(t, layer, loads);
      }
    }
    r.stage_eval("S1", "passkey", {512, 1024, 2048}, {0.0, 0.5, 1.0},
                 {{1.0, 1.0, 0.9}, {1.0, 0.8, 0.6}, {0.5, 0.2, 0.1}});
    r.stage_eval("S2", "passkey", {4096}, {0.25, 0.75}, {{0.75, 0.5}});
    EXPECT_THROW(r.stage_eval("bad", "passkey", {1, 2}, {0.5}, {{1.0}}), std::exception);
    EXPECT_THROW(r.stage_eval("bad", "vt_h2", {1}, {}, {{1.0, 0.5}}), std::exception);
    r.write_html();
  }
  std::ifstream jl(dir / "metrics.jsonl");
  std::string line;
  int lines = 0, evals = 0;
  while (std::getline(jl, line)) {
    const auto j = nlohmann::json::parse(line);  // throws on a malformed line
    ++lines;
    evals += j.contains("stage_eval");
    if (j.contains("loss/z") && j["step"] == 3) {
      EXPECT_TRUE(j["loss/z"].is_null());
    }
  }
  EXPECT_EQ(lines, 60 + 120 + 2);
  EXPECT_EQ(evals, 2);
  const std::string h = slurp(dir / "report.html");
  std::string why;
  EXPECT_TRUE(balanced(h, why)) << why;
  EXPECT_EQ(count(h, "<script"), 0u);
  EXPECT_EQ(count(h, "src="), 0u);  // nothing external
  // 5 line plots, accuracy against length, 2 layer heatmaps, 2 grids, 2 colour scales (accuracy,
  // expert load).
  EXPECT_EQ(count(h, "<svg"), 5u + 1u + 2u + 2u + 2u);
  EXPECT_EQ(count(h, "class=\"heatmap\""), 2u);
  EXPECT_EQ(count(h, "class=\"evalgrid\""), 2u);
  // loss, lr, grad, jitter, entropies, a passkey curve per stage
  EXPECT_EQ(count(h, "<polyline"), 1u + 1u + 1u + 1u + 2u + 2u);
  EXPECT_NE(h.find("Expert load, layer 2"), std::string::npos);
  EXPECT_NE(h.find("passkey accuracy, stage S2"), std::string::npos);
  // Frames, load cells, grid cells, colour scale swatches.
  EXPECT_EQ(count(h, "<rect"), 6u + 2u * 60u * 16u + 9u + 2u + 2u * 20u);
  if (!std::getenv("MYRIAD_KEEP_REPORT")) fs::remove_all(dir);
}

// A reopened report (resume, `myriad report`) reads its metrics back; a replayed step replaces the
// earlier record; stage rows and a contrast run show up in the HTML.
TEST(Report, ReopensReplaysAndContrasts) {
  const fs::path dir = fs::temp_directory_path() / ("myriad_report2_" + std::to_string(getpid()));
  const fs::path other = dir / "other";
  fs::remove_all(dir);
  {
    RunReport r(dir.string());
    for (int64_t t = 1; t <= 10; ++t)
      r.scalars(t, {{"loss", 3.0 - 0.1 * t}, {"layer1/load/maxvio", 0.5 / t}});
    r.stage_eval("S1", "mk_niah_k4", {256, 512}, {}, {{1.0}, {0.5}});
  }
  {
    RunReport r(dir.string());  // resumed at step 8: steps 9, 10 are logged again
    for (int64_t t = 9; t <= 12; ++t)
      r.scalars(t, {{"loss", 2.0 - 0.1 * t}, {"layer1/load/maxvio", 0.05}});
    r.stage_summary({{"stage", "S1"},
                     {"seq_len", 256},
                     {"heldout_loss", 2.5},
                     {"passkey", 0.25},
                     {"gate", false},
                     {"gate_reasons", {"passkey accuracy 0.25 < 0.95 at length 256"}}});
    EXPECT_THROW(r.stage_summary({{"seq_len", 1}}), std::exception);
    RunReport o(other.string());
    for (int64_t t = 1; t <= 12; ++t) o.scalars(t, {{"loss", 3.0}, {"layer1/load/maxvio", 0.9}});
    r.add_contrast("no balancing", other.string());
    EXPECT_THROW(r.add_contrast("x", (dir / "missing").string()), std::exception);
    r.write_html();
  }
  const std::string h = slurp(dir / "report.html");
  std::string why;
  EXPECT_TRUE(balanced(h, why)) << why;
  EXPECT_NE(h.find("mk_niah_k4 accuracy, stage S1"), std::string::npos);
  EXPECT_NE(h.find("random depth"), std::string::npos);
  EXPECT_NE(h.find("<th>stage</th>"), std::string::npos);
  EXPECT_NE(h.find("passkey accuracy 0.25 &lt; 0.95"), std::string::npos);
  EXPECT_NE(h.find("max-violation"), std::string::npos);
  EXPECT_EQ(count(h, ">no balancing<"), 2u);  // legend of the loss and max-violation plots
  // The loss polyline of this run has 12 points (steps 9, 10 replaced, not duplicated).
  const size_t a = h.find("<polyline");
  const size_t b = h.find("\"/>", a);
  const std::string pts = h.substr(a, b - a);
  EXPECT_EQ(std::count(pts.begin(), pts.end(), ','), 12);
  fs::remove_all(dir);
}

TEST(Report, NumberFormatting) {
  EXPECT_EQ(format_length(16384), "16K");
  EXPECT_EQ(format_length(1 << 20), "1M");
  EXPECT_EQ(format_length(262144), "256K");
  EXPECT_EQ(format_length(1536), "1.5K");
  EXPECT_EQ(format_length(300), "300");
  EXPECT_EQ(format_length(64), "64");
  EXPECT_EQ(format_count(5413000), "5.41M");
  EXPECT_EQ(format_count(2e9), "2B");
  EXPECT_EQ(format_count(12345), "12.3K");
  EXPECT_EQ(format_count(950), "950");
  EXPECT_EQ(format_number(3e-4), "3e-4");
  EXPECT_EQ(format_number(1.5e-4), "1.5e-4");
  EXPECT_EQ(format_number(9.9999e-4), "1e-3");
  EXPECT_EQ(format_number(2.5), "2.5");
  EXPECT_EQ(format_number(1234.5678), "1235");
  EXPECT_EQ(format_number(0.123456), "0.1235");
  EXPECT_EQ(format_number(123456), "1.23e5");
  EXPECT_EQ(format_number(-0.5), "-0.5");
  EXPECT_EQ(format_number(0), "0");
  EXPECT_EQ(format_number(NAN), "–");
  EXPECT_EQ(format_duration(8.24), "8.2 s");
  EXPECT_EQ(format_duration(42), "42 s");
  EXPECT_EQ(format_duration(642), "10 min 42 s");
  EXPECT_EQ(format_duration(7500), "2 h 05 min");
}

TEST(Report, AxisTicks) {
  auto fmt = [](const std::vector<double>& t) {
    std::string s;
    for (double v : t) {
      if (!s.empty()) s += ' ';
      s += format_number(v);
    }
    return s;
  };
  EXPECT_EQ(fmt(axis_ticks(0, 10)), "0 2 4 6 8 10");
  EXPECT_EQ(fmt(axis_ticks(1, 330)), "50 100 150 200 250 300");
  EXPECT_EQ(fmt(axis_ticks(0, 1)), "0 0.2 0.4 0.6 0.8 1");
  EXPECT_EQ(fmt(axis_ticks(-0.03, 0.07)), "-0.02 0 0.02 0.04 0.06");
  EXPECT_EQ(fmt(axis_ticks(2e-5, 3e-3)), "5e-4 1e-3 1.5e-3 2e-3 2.5e-3 3e-3");
  EXPECT_EQ(fmt(axis_ticks(5, 5)), "5");
  EXPECT_TRUE(axis_ticks(2, 1).empty());
  // Log scale: 1-2-5 per decade over a few decades, decades only over many, 1-2-5 steps in a
  // narrow range.
  EXPECT_EQ(fmt(axis_ticks(1e-4, 1e-2, true)), "1e-4 2e-4 5e-4 1e-3 2e-3 5e-3 0.01");
  EXPECT_EQ(fmt(axis_ticks(0.5, 2e5, true)), "1 10 100 1000 10000 1e5");
  EXPECT_EQ(fmt(axis_ticks(2.5, 6.2, true)), "3 4 5 6");
}

// A multi-stage run as the trainer logs it: stage boundaries with the stage lengths on every time
// series, the summary line, the stage table and one heatmap (with a value per cell) per stage and
// task; a stage row logged again (a resumed stage end) replaces the first.
TEST(Report, StagesSummaryAndHeatmaps) {
  const fs::path dir = temp_dir("report3");
  {
    RunReport r(dir.string());
    const int64_t len[] = {256, 1024, 16384};
    for (int64_t t = 1; t <= 30; ++t) {
      const int i = static_cast<int>((t - 1) / 10);
      r.scalars(t, {{"loss", 6.0 / t + 2},
                    {"lr", 1e-3},
                    {"grad/norm", 1.0},
                    {"stage", i},
                    {"seq_len", static_cast<double>(len[i])},
                    {"tokens", 4096.0 * t},
                    {"perf/tokens_per_s", 4096},
                    {"perf/wall_seconds", 2.0 * t}});
      if (t % 10) continue;
      r.scalars(t, {{"heldout/loss", 6.0 / t + 2.1}, {"stage/end", i}});
      const std::string name = "ctx" + format_length(len[i]);
      r.stage_eval(name, "passkey", {len[i] / 2, len[i]}, {0.0, 1.0}, {{1.0, 0.5}, {0.25, 0.0}});
      r.stage_eval(name, "vt_h2", {len[i] / 2, len[i]}, {}, {{1.0}, {0.0}});
      for (int again = 0; again < 2; ++again)
        r.stage_summary({{"stage", name},
                         {"index", i},
                         {"seq_len", len[i]},
                         {"step", t},
                         {"tokens", 4096 * t},
                         {"heldout_loss", 6.0 / t + 2.1},
                         {"train_loss", 6.0 / t + 2},
                         {"gate", i != 1},
                         {"gate_reasons", nlohmann::json::array()},
                         {"eval_seconds", 12.5}});
    }
    r.write_html();
  }
  const std::string h = slurp(dir / "report.html");
  std::string why;
  EXPECT_TRUE(balanced(h, why)) << why;
  // Stage boundaries: 2 dashed lines and 3 length labels on each of the 4 time series with data
  // (loss, lr, gradient norm, throughput; plots without data are left out).
  EXPECT_EQ(count(h, "stroke-dasharray"), 4u * 2u);
  EXPECT_EQ(count(h, "class=\"stage\">1K<"), 4u);
  EXPECT_EQ(count(h, "class=\"stage\">16K<"), 4u);
  EXPECT_EQ(count(h, "class=\"stage\">256<"), 4u);
  EXPECT_EQ(count(h, "e+0"), 0u);  // no printf exponents anywhere
  // Summary: gates, tokens, wall time, throughput, final loss per stage.
  EXPECT_NE(h.find("<b>2/3</b><span>stage gates passed"), std::string::npos);
  EXPECT_NE(h.find("<b>123K</b><span>tokens"), std::string::npos);
  EXPECT_NE(h.find("<b>1 min 00 s</b><span>wall time"), std::string::npos);
  EXPECT_NE(h.find("<b>2048</b><span>tokens/s"), std::string::npos);
  EXPECT_NE(h.find("<b>ctx16K</b> (16K) 2.3 / 2.2"), std::string::npos);
  // Stage table: one row per stage.
  EXPECT_EQ(count(h, "<tr><td>ctx"), 3u);
  // Heatmaps: 3 stages × 2 tasks, each cell with its value; the colour scale once.
  EXPECT_EQ(count(h, "class=\"evalgrid\""), 6u);
  EXPECT_NE(h.find("passkey accuracy, stage ctx16K"), std::string::npos);
  // Cells, depth headers, the colour scale's ends.
  EXPECT_EQ(count(h, "%</text>"), 3u * (4u + 2u) + 3u * 2u + 2u);
  EXPECT_EQ(count(h, "class=\"scale\""), 1u);
  // Accuracy against length: one plot per task, one curve per stage, on a log2 length axis.
  EXPECT_NE(h.find("passkey accuracy against context length"), std::string::npos);
  EXPECT_NE(h.find("vt_h2 accuracy against context length"), std::string::npos);
  EXPECT_NE(h.find("after ctx16K (16K)"), std::string::npos);
  EXPECT_NE(h.find(">context length (tokens)<"), std::string::npos);
  fs::remove_all(dir);
}

// Two runs side by side: training rows from metrics.jsonl, the eval.json tables (held-out loss and
// accuracy per length, eval cost), and compare.html with one curve per run.
TEST(Report, ComparesRuns) {
  const fs::path a = temp_dir("cmp_a"), b = temp_dir("cmp_b"), out = temp_dir("cmp_out");
  for (const auto& [dir, loss] : {std::pair{a, 2.5}, std::pair{b, 3.0}}) {
    {
      RunReport r(dir.string());
      r.stage_summary({{"stage", "ctx256"},
                       {"index", 0},
                       {"seq_len", 256},
                       {"step", 10},
                       {"tokens", 163840},
                       {"heldout_loss", loss},
                       {"wall_seconds", 80.0}});
    }
    std::ofstream(dir / "eval.json")
        << nlohmann::json{{"grids",
                           {{{"task", "passkey"},
                             {"lengths", {256, 1024}},
                             {"depths", {0.0, 1.0}},
                             {"accuracy", {{1.0, 0.5}, {0.0, 0.0}}},
                             {"seconds", 2.0},
                             {"prompt_tokens", 4000},
                             {"cache_bytes_peak", 1 << 20}}}},
                          {"heldout_loss", {{"256", loss}, {"1024", loss - 0.1}}},
                          {"peak_rss_mib", 300.0}};
  }
  const std::string md =
      write_comparison({{"A", a.string()}, {"B", b.string()}}, out.string(), "test comparison");
  EXPECT_NE(md.find("| A | 256 | 164K | 1 min 20 s | 2048 | 2.5 |"), std::string::npos) << md;
  EXPECT_NE(md.find("| B | 3 | 2.9 |"), std::string::npos) << md;  // held-out loss at 256, 1K
  EXPECT_NE(md.find("| A | passkey | 75% | 0% |"), std::string::npos) << md;
  EXPECT_NE(md.find("| A | 2000 | 1 MiB | 300 MiB |"), std::string::npos) << md;
  const std::string h = slurp(out / "compare.html");
  std::string why;
  EXPECT_TRUE(balanced(h, why)) << why;
  EXPECT_NE(h.find("passkey accuracy against context length"), std::string::npos);
  EXPECT_NE(h.find("Held-out loss against context length"), std::string::npos);
  EXPECT_EQ(slurp(out / "compare.md"), md);
  EXPECT_THROW(write_comparison({{"C", (out / "missing").string()}}, out.string(), "x"),
               myriad::Error);
  for (const auto& d : {a, b, out}) fs::remove_all(d);
}
