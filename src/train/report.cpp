#include "train/report.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"

namespace myriad::train {

std::string html_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '&':
        o += "&amp;";
        break;
      case '<':
        o += "&lt;";
        break;
      case '>':
        o += "&gt;";
        break;
      case '"':
        o += "&quot;";
        break;
      default:
        o += c;
    }
  }
  return o;
}

namespace {

// SVG coordinates: one decimal.
std::string num(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", v);
  return b;
}

const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e",
                         "#9467bd", "#8c564b", "#e377c2", "#17becf"};

using Series = std::vector<std::pair<int64_t, double>>;

// ---- SVG helpers ----
std::string text(double x, double y, const std::string& s, const char* anchor = "start",
                 const std::string& extra = "") {
  return "<text x=\"" + num(x) + "\" y=\"" + num(y) + "\" text-anchor=\"" + anchor + "\"" +
         (extra.empty() ? "" : " " + extra) + ">" + html_escape(s) + "</text>";
}
std::string rect(double x, double y, double w, double h, const std::string& style) {
  return "<rect x=\"" + num(x) + "\" y=\"" + num(y) + "\" width=\"" + num(w) + "\" height=\"" +
         num(h) + "\" " + style + "/>";
}
std::string line(double x0, double y0, double x1, double y1, const std::string& style) {
  return "<line x1=\"" + num(x0) + "\" y1=\"" + num(y0) + "\" x2=\"" + num(x1) + "\" y2=\"" +
         num(y1) + "\" " + style + "/>";
}
std::string svg_open(const char* cls, double w, double h) {
  return std::string("<svg class=\"") + cls + "\" xmlns=\"http://www.w3.org/2000/svg\" width=\"" +
         num(w) + "\" height=\"" + num(h) + "\">";
}
std::string rgb(double r, double g, double b) {
  char s[32];
  std::snprintf(s, sizeof s, "#%02x%02x%02x", static_cast<int>(r), static_cast<int>(g),
                static_cast<int>(b));
  return s;
}
// Piecewise-linear colour map through `stops` (RGB) at t in [0, 1].
std::string ramp(double t, const std::vector<std::array<double, 3>>& stops) {
  t = std::clamp(std::isfinite(t) ? t : 0.0, 0.0, 1.0) * static_cast<double>(stops.size() - 1);
  const size_t i = std::min(static_cast<size_t>(t), stops.size() - 2);
  const double f = t - static_cast<double>(i);
  const auto &a = stops[i], &b = stops[i + 1];
  return rgb(a[0] + f * (b[0] - a[0]), a[1] + f * (b[1] - a[1]), a[2] + f * (b[2] - a[2]));
}
// Accuracy: red (0), yellow (0.5), green (1). Expert load relative to the mean: blue (0), white
// (1), red (≥ 2).
std::string acc_colour(double a) {
  return ramp(a, {{{215, 48, 39}}, {{254, 224, 139}}, {{26, 152, 80}}});
}
std::string load_colour(double v) {
  return ramp(v / 2, {{{33, 102, 172}}, {{247, 247, 247}}, {{178, 24, 43}}});
}
// A horizontal colour scale: `n` swatches from colour(0) to colour(1), labelled at both ends.
std::string colour_scale(const std::function<std::string(double)>& colour, const std::string& lo,
                         const std::string& mid, const std::string& hi) {
  const int n = 20;
  const double w = 10, x0 = 40;
  std::string o = svg_open("scale", x0 * 2 + n * w, 30);
  for (int i = 0; i < n; ++i)
    o += rect(x0 + i * w, 2, w, 12, "fill=\"" + colour((i + .5) / n) + "\"");
  o += text(x0 - 4, 12, lo, "end") + text(x0 + n * w / 2, 27, mid, "middle") +
       text(x0 + n * w + 4, 12, hi);
  return o + "</svg>";
}

// A stage's start on the time axis (between its first step and the step before) and its label.
struct StageMark {
  double x;
  std::string label;
};

struct Line {
  std::string name;
  Series pts;
  bool dots = false;  // markers only (e.g. the held-out loss at stage ends)
};

std::string legend(const std::vector<Line>& lines) {
  std::string o = "<div class=\"legend\">";
  for (size_t i = 0; i < lines.size(); ++i)
    o += std::string("<span><i style=\"background:") + kColors[i % 8] +
         (lines[i].dots ? ";border-radius:50%;width:8px;height:8px" : "") + "\"></i>" +
         html_escape(lines[i].name) + "</span>";
  return o + "</div>";
}

// A line plot over steps with ticked axes, the stage boundaries and a legend above it; y on a
// log scale when asked (points ≤ 0 are then left out). Empty without data.
// The x axis of a line plot: steps by default; `lengths` draws x on a log2 scale with token
// lengths as tick labels ("1K", "16K"); y0 / y1 fix the y range when finite; markers puts a dot
// on every point.
struct XAxis {
  std::string label = "step";
  bool lengths = false;
  double y0 = NAN, y1 = NAN;
  bool markers = false;
};

std::string line_plot(const std::string& title, const std::string& ylabel,
                      const std::vector<Line>& lines, const std::vector<StageMark>& stages,
                      bool logy = false, const XAxis& ax = {}) {
  const double W = 640, H = 250, L = 64, R = 14, T = 20, B = 42;
  auto ok = [&](double y) { return std::isfinite(y) && (!logy || y > 0); };
  auto fy = [&](double v) { return logy ? std::log10(v) : v; };
  auto fx = [&](double v) { return ax.lengths ? std::log2(std::max(v, 1.0)) : v; };
  double x0 = 1e300, x1 = -1e300, y0 = 1e300, y1 = -1e300;
  for (const auto& l : lines)
    for (const auto& [x, y] : l.pts)
      if (ok(y)) {
        x0 = std::min<double>(x0, fx(static_cast<double>(x))),
        x1 = std::max<double>(x1, fx(static_cast<double>(x)));
        y0 = std::min(y0, fy(y)), y1 = std::max(y1, fy(y));
      }
  if (x0 > x1) return "";  // no data
  if (std::isfinite(ax.y0)) y0 = std::min(y0, fy(ax.y0));
  if (std::isfinite(ax.y1)) y1 = std::max(y1, fy(ax.y1));
  std::string o = "<div class=\"card\"><h2>" + html_escape(title) + "</h2>";
  if (lines.size() > 1) o += legend(lines);
  o += svg_open("plot", W, H);
  for (const auto& s : stages) x0 = std::min(x0, s.x);
  if (x1 - x0 < 1) x1 = x0 + 1;
  const double pad =
      y1 > y0 ? 0.05 * (y1 - y0) : (logy ? 0.05 : std::max(0.05 * std::abs(y0), 1e-9));
  y0 -= pad, y1 += pad;
  auto px = [&](double x) { return L + (fx(x) - x0) / (x1 - x0) * (W - L - R); };
  auto py = [&](double v) { return H - B - (fy(v) - y0) / (y1 - y0) * (H - T - B); };
  // Stage bands (every other one shaded), boundaries and length labels.
  for (size_t i = 0; i < stages.size(); ++i) {
    const double a = px(std::max(stages[i].x, x0));  // step axes only
    const double b = i + 1 < stages.size() ? px(stages[i + 1].x) : W - R;
    if (i % 2) o += rect(a, T, b - a, H - T - B, "fill=\"#f1f4f9\"");
    if (stages[i].x > x0) o += line(a, T, a, H - B, "stroke=\"#7a869a\" stroke-dasharray=\"4,3\"");
    if (b - a > 18) o += text(a + 3, T - 6, stages[i].label, "start", "class=\"stage\"");
  }
  // Grid lines and ticks.
  const double lo = logy ? std::pow(10.0, y0) : y0, hi = logy ? std::pow(10.0, y1) : y1;
  for (double v : axis_ticks(lo, hi, logy))
    o += line(L, py(v), W - R, py(v), "stroke=\"#e3e3e3\"") +
         text(L - 6, py(v) + 4, format_number(v), "end");
  if (ax.lengths) {  // powers of two
    for (double e = std::ceil(x0); e <= x1 + 1e-9; ++e) {
      const double v = std::exp2(e);
      o += line(px(v), H - B, px(v), H - B + 4, "stroke=\"#444\"") +
           text(px(v), H - B + 16, format_length(static_cast<int64_t>(v)), "middle");
    }
  } else {
    std::vector<double> xt = axis_ticks(x0, x1);
    if (xt.size() > 1 && xt[1] - xt[0] < 1) xt = {x0, x1};  // steps are integers
    for (double v : xt)
      o += line(px(v), H - B, px(v), H - B + 4, "stroke=\"#444\"") +
           text(px(v), H - B + 16, v >= 1e4 ? format_count(v) : format_number(v), "middle");
  }
  o += rect(L, T, W - L - R, H - T - B, "fill=\"none\" stroke=\"#888\"");
  o += text((L + W - R) / 2, H - 6, ax.label, "middle", "class=\"axis\"");
  o += text(0, 0, ylabel + (logy ? " (log)" : ""), "middle",
            "class=\"axis\" transform=\"translate(14," + num((T + H - B) / 2) + ") rotate(-90)\"");
  for (size_t i = 0; i < lines.size(); ++i) {
    const char* c = kColors[i % 8];
    if (lines[i].dots) {
      for (const auto& [x, y] : lines[i].pts)
        if (ok(y))
          o += "<circle cx=\"" + num(px(x)) + "\" cy=\"" + num(py(y)) + "\" r=\"3.5\" fill=\"" + c +
               "\"/>";
      continue;
    }
    o += std::string("<polyline fill=\"none\" stroke=\"") + c + "\" stroke-width=\"1.5\" points=\"";
    for (const auto& [x, y] : lines[i].pts)
      if (ok(y)) o += num(px(x)) + "," + num(py(y)) + " ";
    o += "\"/>";
    if (ax.markers)
      for (const auto& [x, y] : lines[i].pts)
        if (ok(y))
          o += "<circle cx=\"" + num(px(x)) + "\" cy=\"" + num(py(y)) + "\" r=\"3\" fill=\"" + c +
               "\"/>";
  }
  return o + "</svg></div>\n";
}

}  // namespace

std::string format_length(int64_t n) {
  auto in = [&](double unit, const char* u) {
    const double x = static_cast<double>(n) / unit;
    char b[32];
    std::snprintf(b, sizeof b, x == std::round(x) ? "%.0f%s" : "%.3g%s", x, u);
    return std::string(b);
  };
  if (n >= (1 << 20)) return in(1 << 20, "M");
  if (n >= 1024) return in(1024, "K");
  return std::to_string(n);
}

std::string format_count(double n) {
  if (!std::isfinite(n)) return "–";
  const double a = std::abs(n);
  auto in = [&](double unit, const char* u) {
    char b[32];
    std::snprintf(b, sizeof b, "%.3g%s", n / unit, u);
    return std::string(b);
  };
  if (a >= 1e9) return in(1e9, "B");
  if (a >= 1e6) return in(1e6, "M");
  if (a >= 1e4) return in(1e3, "K");
  return format_number(std::round(n));
}

std::string format_number(double v) {
  if (!std::isfinite(v)) return std::isnan(v) ? "–" : v > 0 ? "∞" : "-∞";
  if (v == 0) return "0";
  char b[32];
  const double a = std::abs(v);
  if (a >= 1e-2 && a < 1e5) {
    std::snprintf(b, sizeof b, a >= 1e3 ? "%.0f" : "%.4g", v);
    return b;
  }
  int e = static_cast<int>(std::floor(std::log10(a)));
  std::snprintf(b, sizeof b, "%.3g", v / std::pow(10.0, e));
  if (std::abs(std::atof(b)) >= 10) std::snprintf(b, sizeof b, "%.3g", v / std::pow(10.0, ++e));
  return std::string(b) + "e" + std::to_string(e);
}

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "–";
  char b[48];
  if (s < 10)
    std::snprintf(b, sizeof b, "%.1f s", s);
  else if (s < 60)
    std::snprintf(b, sizeof b, "%.0f s", s);
  else if (s < 3600)
    std::snprintf(b, sizeof b, "%d min %02d s", static_cast<int>(s) / 60, static_cast<int>(s) % 60);
  else
    std::snprintf(b, sizeof b, "%d h %02d min", static_cast<int>(s) / 3600,
                  static_cast<int>(s) % 3600 / 60);
  return b;
}

std::vector<double> axis_ticks(double lo, double hi, bool log) {
  std::vector<double> t;
  if (!(lo <= hi) || !std::isfinite(lo) || !std::isfinite(hi)) return t;
  if (log && lo > 0 && hi / lo >= 10) {
    const int d0 = static_cast<int>(std::floor(std::log10(lo)));
    const int d1 = static_cast<int>(std::ceil(std::log10(hi)));
    const bool fine = d1 - d0 <= 3;
    for (int d = d0; d <= d1; ++d)
      for (double m : fine ? std::vector<double>{1, 2, 5} : std::vector<double>{1}) {
        const double v = m * std::pow(10.0, d);
        if (v >= lo * (1 - 1e-9) && v <= hi * (1 + 1e-9)) t.push_back(v);
      }
    return t;
  }
  if (hi == lo) return {lo};
  const double span = hi - lo, mag = std::pow(10.0, std::floor(std::log10(span / 6)));
  double step = 10 * mag;
  for (double m : {1.0, 2.0, 5.0})
    if (span / (m * mag) <= 7) {
      step = m * mag;
      break;
    }
  for (auto k = static_cast<int64_t>(std::ceil(lo / step - 1e-9)); k * step <= hi + 1e-9 * step;
       ++k)
    if (!log || k * step > 0) t.push_back(static_cast<double>(k) * step);
  return t;
}

namespace {

// Appends (step, v), first dropping points at or after `step` (a resumed run logs them again).
template <class V>
void put(std::vector<std::pair<int64_t, V>>& s, int64_t step, V v) {
  while (!s.empty() && s.back().first >= step) s.pop_back();
  s.emplace_back(step, std::move(v));
}

std::vector<nlohmann::json> read_jsonl(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream f(path);
  std::string line;
  while (std::getline(f, line)) {
    // A crash can leave a torn last line; everything before it is intact.
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object()) out.push_back(std::move(j));
  }
  return out;
}

// Per step, the largest "layer<i>/load/maxvio" of the series.
Series max_over_layers(const std::map<std::string, Series>& series) {
  std::map<int64_t, double> m;
  for (const auto& [k, v] : series)
    if (k.size() > 12 && k.compare(k.size() - 12, 12, "/load/maxvio") == 0)
      for (const auto& [step, x] : v)
        if (std::isfinite(x)) m[step] = m.count(step) ? std::max(m[step], x) : x;
  return Series(m.begin(), m.end());
}

}  // namespace

RunReport::RunReport(const std::string& dir) : dir_(dir) {
  std::filesystem::create_directories(dir);
  const std::string p = (std::filesystem::path(dir) / "metrics.jsonl").string();
  for (const auto& j : read_jsonl(p)) ingest(j, false);
  jsonl_.open(p, std::ios::app);
  MYRIAD_CHECK(jsonl_.good(), "report: cannot open ", p);
}

void RunReport::ingest(const nlohmann::json& j, bool write) {
  if (j.contains("stage_eval")) {
    Grid g;
    g.stage = j["stage_eval"].get<std::string>();
    g.task = j.value("task", std::string("passkey"));
    g.lengths = j.at("lengths").get<std::vector<int64_t>>();
    g.depths = j.at("depths").get<std::vector<double>>();
    g.acc = j.at(j.contains("accuracy") ? "accuracy" : "passkey_accuracy")
                .get<std::vector<std::vector<double>>>();
    std::erase_if(grids_, [&](const Grid& o) { return o.stage == g.stage && o.task == g.task; });
    grids_.push_back(std::move(g));
  } else if (j.contains("stage_summary")) {
    const auto& row = j["stage_summary"];
    std::erase_if(summaries_, [&](const nlohmann::json& o) { return o["stage"] == row["stage"]; });
    summaries_.push_back(row);
  } else if (j.contains("vision_eval")) {
    vision_ = j["vision_eval"];
  } else if (j.contains("expert_load")) {
    put(loads_[j.at("layer").get<int64_t>()], j.at("step").get<int64_t>(),
        j["expert_load"].get<std::vector<double>>());
  } else if (j.contains("step")) {
    const auto step = j["step"].get<int64_t>();
    for (const auto& [k, v] : j.items())
      if (k != "step") put(series_[k], step, v.is_number() ? v.get<double>() : NAN);
  }
  if (write) {
    jsonl_ << j.dump() << "\n";
    jsonl_.flush();
  }
}

void RunReport::vision_eval(const nlohmann::json& record) {
  ingest({{"vision_eval", record}}, true);
}

void RunReport::scalars(int64_t step, const std::map<std::string, double>& values) {
  nlohmann::json j;
  j["step"] = step;
  for (const auto& [k, v] : values)
    j[k] = std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr);
  ingest(j, true);
}

void RunReport::stage_eval(const std::string& stage, const std::string& task,
                           const std::vector<int64_t>& lengths, const std::vector<double>& depths,
                           const std::vector<std::vector<double>>& acc) {
  const size_t cols = std::max<size_t>(depths.size(), 1);
  MYRIAD_CHECK(acc.size() == lengths.size(), "report: stage ", stage, " ", task, " grid has ",
               acc.size(), " rows for ", lengths.size(), " lengths");
  for (const auto& row : acc)
    MYRIAD_CHECK(row.size() == cols, "report: stage ", stage, " ", task, " grid row has ",
                 row.size(), " values for ", cols, " depth columns");
  ingest({{"stage_eval", stage},
          {"task", task},
          {"lengths", lengths},
          {"depths", depths},
          {"accuracy", acc}},
         true);
}

void RunReport::stage_summary(const nlohmann::json& row) {
  MYRIAD_CHECK(row.is_object() && row.contains("stage"), "report: a stage row needs \"stage\"");
  ingest({{"stage_summary", row}}, true);
}

void RunReport::add_contrast(const std::string& label, const std::string& other_dir) {
  const std::string p = (std::filesystem::path(other_dir) / "metrics.jsonl").string();
  MYRIAD_CHECK(std::filesystem::exists(p), "report: contrast run ", other_dir,
               " has no metrics.jsonl");
  contrast_label_ = label;
  contrast_.clear();
  for (const auto& j : read_jsonl(p))
    if (j.contains("step") && !j.contains("expert_load") && !j.contains("stage_eval")) {
      const auto step = j["step"].get<int64_t>();
      for (const auto& [k, v] : j.items())
        if (k != "step") put(contrast_[k], step, v.is_number() ? v.get<double>() : NAN);
    }
}

void RunReport::expert_load(int64_t step, int64_t layer, const std::vector<double>& loads) {
  ingest({{"step", step}, {"layer", layer}, {"expert_load", loads}}, true);
}

namespace {

double last(const Series& s) {
  return s.empty() ? NAN : s.back().second;
}
// The value of `s` at `step`, else the last one before it.
double at_or_before(const Series& s, int64_t step) {
  double v = NAN;
  for (const auto& [x, y] : s)
    if (x <= step) v = y;
  return v;
}

const char* kStyle =
    "body{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:1340px}"
    "h1{font-size:22px;margin:0 0 2px}h2{font-size:14px;margin:0 0 4px}"
    "h3{font-size:14px;margin:14px 0 4px}.path{color:#777;font-size:12px;margin:0 0 12px}"
    ".summary{display:flex;flex-wrap:wrap;gap:10px;margin:8px 0}"
    ".stat{background:#f3f5f8;border-radius:6px;padding:6px 12px}"
    ".stat b{display:block;font-size:17px}.stat span{font-size:11px;color:#666}"
    ".losses{font-size:13px;margin:6px 0 14px}"
    ".grid{display:flex;flex-wrap:wrap;gap:14px 24px}.card{margin:6px 0;max-width:640px}"
    ".legend{font-size:12px;margin:0 0 2px;display:flex;flex-wrap:wrap;gap:2px 14px}"
    ".legend i{display:inline-block;width:14px;height:3px;margin:0 5px 3px 0;"
    "vertical-align:middle}"
    "table{border-collapse:collapse;font-size:12px;margin:6px 0 14px}"
    "td,th{border:1px solid #ddd;padding:3px 8px;text-align:right;vertical-align:top}"
    "th{background:#f3f5f8}td:first-child,td.gate{text-align:left}.pass{color:#1a7f37}"
    ".fail{color:#c62828}.why{color:#666;font-size:11px;text-align:left}"
    "svg{display:block;font-size:11px}svg .axis{font-size:12px;fill:#444}"
    "svg .stage{font-size:11px;fill:#51607a;font-weight:bold}";

}  // namespace

std::string RunReport::html() const {
  auto pick = [&](auto pred) {
    std::vector<Line> out;
    for (const auto& [k, v] : series_)
      if (pred(k)) out.push_back({k, v});
    return out;
  };
  auto has = [](const std::string& k, const char* s) { return k.find(s) != std::string::npos; };
  auto get = [&](const char* k) { return series_.count(k) ? series_.at(k) : Series{}; };
  // Stage rows: the recorded ones, else (older runs without eval) from the held-out records.
  std::vector<nlohmann::json> rows = summaries_;
  if (rows.empty())
    for (const auto& [step, i] : get("stage/end"))
      rows.push_back({{"stage", "stage " + std::to_string(static_cast<int>(i))},
                      {"index", static_cast<int>(i)},
                      {"step", step},
                      {"heldout_loss", at_or_before(get("heldout/loss"), step)}});
  // Stage starts and lengths: per-step "stage" / "seq_len" records, "stage/end", the rows.
  std::map<int, double> start;
  std::map<int, int64_t> len;
  const Series stage = get("stage"), seq_len = get("seq_len");
  for (const auto& [step, i] : stage)
    if (!start.count(static_cast<int>(i))) start[static_cast<int>(i)] = step - 0.5;
  for (const auto& [step, i] : seq_len)
    len[static_cast<int>(at_or_before(stage, step))] = static_cast<int64_t>(i);
  for (const auto& [step, i] : get("stage/end")) start[static_cast<int>(i) + 1] = step + 0.5;
  for (size_t k = 0; k < rows.size(); ++k) {
    const int i = rows[k].value("index", static_cast<int>(k));
    if (rows[k].contains("seq_len") && rows[k]["seq_len"].is_number())
      len[i] = rows[k]["seq_len"].get<int64_t>();
    if (rows[k].contains("step") && rows[k]["step"].is_number())
      start[i + 1] = rows[k]["step"].get<double>() + 0.5;
  }
  std::vector<StageMark> marks;
  const int64_t last_step =
      series_.count("loss") && !get("loss").empty() ? get("loss").back().first : 0;
  for (const auto& [i, x] : start)
    if (i == 0 || x < last_step)
      marks.push_back(
          {i == 0 ? 0.5 : x, len.count(i) ? format_length(len[i]) : "stage " + std::to_string(i)});
  if (!marks.empty() && !start.count(0))
    marks.insert(marks.begin(), {0.5, len.count(0) ? format_length(len[0]) : "stage 0"});

  std::ostringstream o;
  o << "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"/><title>Myriad run "
       "report</title><style>"
    << kStyle << "</style></head><body>\n<h1>Myriad run report</h1>\n<p class=\"path\">"
    << html_escape(dir_) << "</p>\n";

  // Summary line.
  {
    const Series loss = get("loss");
    const double tokens = last(get("tokens"));
    double wall = last(get("perf/wall_seconds"));
    const bool train_time = !std::isfinite(wall);  // older runs: the sum of the step times
    if (train_time) {
      wall = 0;
      for (const auto& [x, y] : get("perf/step_seconds")) wall += std::isfinite(y) ? y : 0;
    }
    int gates = 0, passed = 0;
    for (const auto& r : rows)
      if (r.contains("gate") && r["gate"].is_boolean()) ++gates, passed += r["gate"].get<bool>();
    auto stat = [&](const std::string& v, const std::string& what) {
      o << "<div class=\"stat\"><b>" << v << "</b><span>" << what << "</span></div>";
    };
    o << "<div class=\"summary\">";
    if (!loss.empty())
      stat(format_number(loss.back().second),
           "train loss at step " + std::to_string(loss.back().first));
    stat(std::to_string(rows.size()), rows.size() == 1 ? "stage done" : "stages done");
    if (gates) stat(std::to_string(passed) + "/" + std::to_string(gates), "stage gates passed");
    if (std::isfinite(tokens)) stat(format_count(tokens), "tokens");
    if (wall > 0) stat(format_duration(wall), train_time ? "training time" : "wall time");
    if (std::isfinite(tokens) && wall > 0) stat(format_count(tokens / wall), "tokens/s");
    o << "</div>\n";
    if (!rows.empty()) {
      o << "<div class=\"losses\">Final loss per stage (held-out / train): ";
      for (size_t k = 0; k < rows.size(); ++k) {
        const auto& r = rows[k];
        const int i = r.value("index", static_cast<int>(k));
        double tl = r.contains("train_loss") && r["train_loss"].is_number()
                        ? r["train_loss"].get<double>()
                        : NAN;
        if (!std::isfinite(tl) && r.contains("step"))
          tl = at_or_before(loss, r["step"].get<int64_t>());
        const double hl = r.contains("heldout_loss") && r["heldout_loss"].is_number()
                              ? r["heldout_loss"].get<double>()
                              : NAN;
        o << (k ? " &nbsp;·&nbsp; " : "") << "<b>" << html_escape(r["stage"].get<std::string>())
          << "</b>" << (len.count(i) ? " (" + format_length(len[i]) + ")" : "") << " "
          << format_number(hl) << " / " << format_number(tl);
      }
      o << "</div>\n";
    }
  }

  // Stage table.
  if (!rows.empty()) {
    auto cell = [&](const nlohmann::json& r, const char* k, std::string (*f)(double)) {
      return r.contains(k) && r[k].is_number() ? f(r[k].get<double>()) : std::string("–");
    };
    o << "<table><tr><th>stage</th><th>length</th><th>end step</th><th>tokens</th><th>held-out "
         "loss</th><th>passkey</th><th>effective length</th><th>gate</th><th>eval time</th></tr>\n";
    for (const auto& r : rows) {
      std::string gate = "–";
      if (r.contains("gate") && r["gate"].is_boolean()) {
        gate = r["gate"].get<bool>() ? "<span class=\"pass\">✓ pass</span>"
                                     : "<span class=\"fail\">✗ fail</span>";
        for (const auto& why : r.value("gate_reasons", nlohmann::json::array()))
          gate += "<div class=\"why\">" + html_escape(why.get<std::string>()) + "</div>";
      }
      o << "<tr><td>" << html_escape(r["stage"].get<std::string>()) << "</td><td>"
        << cell(r, "seq_len", [](double v) { return format_length(static_cast<int64_t>(v)); })
        << "</td><td>" << cell(r, "step", format_number) << "</td><td>"
        << cell(r, "tokens", format_count) << "</td><td>" << cell(r, "heldout_loss", format_number)
        << "</td><td>"
        << cell(r, "passkey",
                [](double v) { return format_number(std::round(v * 1000) / 10) + "%"; })
        << "</td><td>"
        << cell(r, "effective_length",
                [](double v) {
                  return v > 0 ? format_length(static_cast<int64_t>(v)) : std::string("0");
                })
        << "</td><td class=\"gate\">" << gate << "</td><td>"
        << cell(r, "eval_seconds", format_duration) << "</td></tr>\n";
    }
    o << "</table>\n";
  }

  // Time series.
  const std::string mine = contrast_label_.empty() ? "train" : "this run";
  auto with_contrast = [&](std::vector<Line> v, const Series& other) {
    if (!contrast_label_.empty() && !other.empty()) v.push_back({contrast_label_, other});
    return v;
  };
  o << "<div class=\"grid\">\n";
  {
    Series loss = get("loss").empty() ? get("loss/value") : get("loss");
    std::vector<Line> l =
        with_contrast({{mine, loss}}, contrast_.count("loss") ? contrast_.at("loss") : Series{});
    if (const Series h = get("heldout/loss"); !h.empty())
      l.push_back({"held-out (stage end)", h, true});
    double lo = 1e300, hi = 0;
    for (const auto& x : l)
      for (const auto& [s, y] : x.pts)
        if (std::isfinite(y) && y > 0) lo = std::min(lo, y), hi = std::max(hi, y);
    o << line_plot("Loss", "loss", l, marks, hi > 2 * lo);
  }
  if (const Series mv = max_over_layers(series_); !mv.empty())
    o << line_plot("Expert load max-violation (max over MoE layers of max_j c_j/q - 1)",
                   "max-violation", with_contrast({{mine, mv}}, max_over_layers(contrast_)), marks);
  o << line_plot("Learning rate", "lr",
                 pick([&](const std::string& k) { return k == "lr" || has(k, "/lr"); }), marks);
  o << line_plot("Gradient norm", "‖g‖",
                 pick([](const std::string& k) { return k == "grad/norm"; }), marks, true);
  o << line_plot("Gradient jitter J", "J",
                 pick([](const std::string& k) { return k == "grad/jitter"; }), marks);
  {  // One line per entropy kind: the mean over MoE layers (per-layer lines do not fit a legend).
    std::map<std::string, std::map<int64_t, std::pair<double, int>>> kinds;
    for (const auto& [k, v] : series_)
      if (const size_t at = k.find("route/"); at != std::string::npos && has(k, "entropy"))
        for (const auto& [step, x] : v)
          if (std::isfinite(x)) {
            auto& [sum, n] = kinds[k.substr(at + 6)][step];
            sum += x, ++n;
          }
    std::vector<Line> l;
    for (const auto& [kind, steps] : kinds) {
      Series m;
      for (const auto& [step, sn] : steps) m.emplace_back(step, sn.first / sn.second);
      l.push_back({kind + " (mean over layers)", m});
    }
    o << line_plot("Routing entropy", "entropy", l, marks);
  }
  if (const Series tps = get("perf/tokens_per_s"); !tps.empty())
    o << line_plot("Throughput", "tokens/s", {{"tokens/s", tps}}, marks);
  o << "</div>\n";

  // Vision (TRAINING.md §9): accuracy per question kind over the run, then the last evaluation's
  // caption confusion and sample test images with the model's replies.
  if (vision_.is_object()) {
    std::vector<Line> acc;
    for (const auto& [k, v] : series_)
      if (k.rfind("vision/", 0) == 0) acc.push_back({k.substr(7), v});
    o << "<h2 style=\"margin-top:16px\">Vision</h2>\n<div class=\"grid\">\n";
    if (!acc.empty()) o << line_plot("Test accuracy (exact match)", "accuracy", acc, marks);
    o << "</div>\n<p>Step " << vision_.value("step", int64_t{0}) << ":";
    for (const auto& [k, v] : vision_["accuracy"].items())
      o << " " << html_escape(k) << " " << format_number(v.get<double>()) << " ("
        << vision_["asked"].value(k, int64_t{0}) << " asked);";
    o << "</p>\n<table><tr><th>true \\ reply</th>";
    const auto& classes = vision_["classes"];
    for (const auto& c : classes) o << "<th>" << html_escape(c.get<std::string>()) << "</th>";
    o << "<th>other</th></tr>\n";
    for (size_t i = 0; i < vision_["confusion"].size(); ++i) {
      const auto& row = vision_["confusion"][i];
      int64_t total = 0;
      for (const auto& x : row) total += x.get<int64_t>();
      o << "<tr><th>" << html_escape(classes[i].get<std::string>()) << "</th>";
      for (size_t k = 0; k < row.size(); ++k) {
        const int64_t n = row[k].get<int64_t>();
        const double f = total ? static_cast<double>(n) / static_cast<double>(total) : 0.0;
        o << "<td style=\"background:rgba(" << (k == i ? "40,140,60," : "200,40,40,")
          << format_number(f) << ")\">" << n << "</td>";
      }
      o << "</tr>\n";
    }
    o << "</table>\n<div style=\"display:flex;flex-wrap:wrap;gap:8px;margin-top:8px\">\n";
    for (const auto& sm : vision_.value("samples", nlohmann::json::array())) {
      const bool ok = sm["label"] == sm["reply"];
      o << "<figure style=\"margin:0;text-align:center\"><img width=\"84\" height=\"84\" "
           "style=\"image-rendering:pixelated\" src=\"data:image/png;base64,"
        << sm["png"].get<std::string>() << "\"><figcaption style=\"color:" << (ok ? "#282" : "#c22")
        << "\">" << html_escape(sm["reply"].get<std::string>()) << "<br><small>("
        << html_escape(sm["label"].get<std::string>()) << ")</small></figcaption></figure>\n";
    }
    o << "</div>\n";
  }

  // Agentic RL (train/rl.h): held-out pass rates per environment, then the per-step statistics
  // of the rollouts and the update; the contrast run's main curves alongside.
  if (std::any_of(series_.begin(), series_.end(),
                  [](const auto& kv) { return kv.first.rfind("rl/", 0) == 0; })) {
    auto getc = [&](const std::string& k) {
      return contrast_.count(k) ? contrast_.at(k) : Series{};
    };
    auto lines = [&](std::vector<std::pair<std::string, std::string>> keys, bool contrast) {
      std::vector<Line> l;
      for (const auto& [k, name] : keys) {
        const Series v = get(k.c_str());
        if (v.empty()) continue;
        l.push_back({name, v});
        if (contrast && !contrast_label_.empty() && !getc(k).empty())
          l.push_back({name + ", " + contrast_label_, getc(k)});
      }
      return l;
    };
    std::vector<std::string> envs;
    for (const auto& [k, v] : series_)
      if (k.rfind("eval/", 0) == 0 && has(k, "/pass@1") && !has(k, "greedy"))
        envs.push_back(k.substr(5, k.find('/', 5) - 5));
    o << "<h2 style=\"margin-top:16px\">Agentic RL</h2>\n<div class=\"grid\">\n";
    for (const std::string& e : envs) {
      std::vector<std::pair<std::string, std::string>> keys = {
          {"eval/" + e + "/pass@1", "pass@1"}, {"eval/" + e + "/greedy_pass@1", "greedy pass@1"}};
      for (const auto& [k, v] : series_)
        if (k.rfind("eval/" + e + "/pass@", 0) == 0 && k != "eval/" + e + "/pass@1")
          keys.push_back({k, k.substr(k.rfind('/') + 1)});
      o << line_plot("Held-out " + e + ": pass rates", "rate", lines(keys, true), marks);
      o << "<p class=\"losses\"><a href=\"trajectories-" << html_escape(e)
        << ".html\">rendered held-out episodes of the last evaluation</a></p>";
    }
    o << line_plot("Training rollouts: reward and solved rate", "rate",
                   lines({{"rl/mean_reward", "mean reward"}, {"rl/solved", "solved"}}, true),
                   marks);
    o << line_plot("Tool calls (episodes with one) and tool errors (per call)", "rate",
                   lines({{"rl/tool_call_rate", "tool-call rate"},
                          {"rl/tool_error_rate", "tool-error rate"},
                          {"rl/truncated", "truncated"}},
                         false),
                   marks);
    o << line_plot(
        "Turns and response length", "per episode",
        lines({{"rl/mean_turns", "assistant turns"}, {"rl/response_tokens", "policy tokens"}},
              false),
        marks);
    o << line_plot("Policy entropy (mean over sampled tokens)", "nats",
                   lines({{"rl/entropy", "entropy"}}, true), marks);
    o << line_plot("Clip fraction, KL (k3), importance weight, staleness", "value",
                   lines({{"rl/clip_fraction", "clip fraction"},
                          {"rl/kl", "KL"},
                          {"rl/tis_mean", "mean importance weight"},
                          {"rl/staleness", "staleness (policy versions)"}},
                         false),
                   marks);
    o << line_plot("Policy loss, gradient norm, value loss", "value",
                   lines({{"rl/loss", "policy loss"},
                          {"rl/grad_norm", "gradient norm"},
                          {"rl/value_loss", "value loss (GAE)"}},
                         false),
                   marks);
    o << line_plot("Groups per step (all-equal ones dropped)", "groups",
                   lines({{"rl/groups_kept", "kept"}, {"rl/groups_dropped", "dropped"}}, false),
                   marks);
    o << "</div>\n";
  }

  // Accuracy against context length, one curve per stage, for each task; and the effective
  // length (TRAINING.md §6) against the training tokens at each stage end.
  if (!grids_.empty()) {
    std::vector<std::string> tasks;
    for (const Grid& g : grids_)
      if (std::find(tasks.begin(), tasks.end(), g.task) == tasks.end()) tasks.push_back(g.task);
    o << "<div class=\"grid\">\n";
    for (const std::string& t : tasks) {
      std::vector<Line> l;
      for (const Grid& g : grids_) {
        if (g.task != t) continue;
        Series pts;
        for (size_t i = 0; i < g.lengths.size(); ++i) {
          double sum = 0;
          for (double a : g.acc[i]) sum += a;
          pts.emplace_back(g.lengths[i], g.acc[i].empty() ? NAN : sum / g.acc[i].size());
        }
        std::string name = "after " + g.stage;
        for (const auto& r : rows)
          if (r["stage"] == g.stage && r.contains("seq_len") && r["seq_len"].is_number())
            name += " (" + format_length(r["seq_len"].get<int64_t>()) + ")";
        l.push_back({name, pts});
      }
      XAxis ax{"context length (tokens)", true, 0.0, 1.0, true};
      o << line_plot(t + " accuracy against context length", "accuracy", l, {}, false, ax);
    }
    Series eff;
    for (const auto& r : rows)
      if (r.contains("tokens") && r["tokens"].is_number() && r.contains("effective_length") &&
          r["effective_length"].is_number())
        eff.emplace_back(r["tokens"].get<int64_t>(), r["effective_length"].get<double>());
    if (!eff.empty()) {
      XAxis ax{"training tokens", false, 0.0, 256.0, true};  // a readable range when all are 0
      o << line_plot("Effective length (mean accuracy ≥ 0.9) against training tokens",
                     "effective length (tokens)", {{"effective length", eff}}, {}, false, ax);
    }
    o << "</div>\n";
  }

  // Eval grids: per stage, one length × depth heatmap per task.
  if (!grids_.empty()) {
    o << "<h2 style=\"margin-top:16px\">Long-context evaluation: accuracy by context length and "
         "needle depth</h2>\n"
      << colour_scale(acc_colour, "0%", "accuracy", "100%") << "\n";
    std::vector<std::string> order;
    for (const Grid& g : grids_)
      if (std::find(order.begin(), order.end(), g.stage) == order.end()) order.push_back(g.stage);
    for (const std::string& st : order) {
      std::string head = "Stage " + html_escape(st);
      for (const auto& r : rows)
        if (r["stage"] == st) {
          if (r.contains("seq_len"))
            head += " (" + format_length(r["seq_len"].get<int64_t>()) + ")";
          if (r.contains("gate") && r["gate"].is_boolean())
            head += r["gate"].get<bool>() ? " — gate <span class=\"pass\">pass</span>"
                                          : " — gate <span class=\"fail\">fail</span>";
        }
      o << "<h3>" << head << "</h3><div class=\"grid\">\n";
      for (const Grid& g : grids_) {
        if (g.stage != st) continue;
        const size_t nd = std::max<size_t>(g.depths.size(), 1);
        const double cw = g.depths.empty() ? 84 : 54, ch = 24, L = 62, T = 34;
        const double W = L + cw * static_cast<double>(nd) + 6,
                     H = T + ch * static_cast<double>(g.lengths.size()) + 6;
        o << "<div class=\"card\"><h2>" << html_escape(g.task) << " accuracy, stage "
          << html_escape(g.stage) << "</h2>" << svg_open("evalgrid", W, H);
        o << text(L + cw * nd / 2, 11, g.depths.empty() ? "random depth" : "needle depth", "middle",
                  "class=\"axis\"");
        o << text(0, 0, "length", "middle",
                  "class=\"axis\" transform=\"translate(12," +
                      num(T + ch * g.lengths.size() / 2.0) + ") rotate(-90)\"");
        for (size_t j = 0; j < nd; ++j)
          if (!g.depths.empty())
            o << text(L + cw * (j + 0.5), T - 6,
                      format_number(std::round(g.depths[j] * 1000) / 10) + "%", "middle");
        for (size_t i = 0; i < g.lengths.size(); ++i) {
          o << text(L - 6, T + ch * (i + 0.5) + 4, format_length(g.lengths[i]), "end");
          for (size_t j = 0; j < nd; ++j) {
            const double a = g.acc[i][j];
            o << rect(L + cw * j, T + ch * i, cw, ch,
                      "fill=\"" + acc_colour(a) + "\" stroke=\"#fff\"")
              << text(L + cw * (j + 0.5), T + ch * (i + 0.5) + 4,
                      std::isfinite(a) ? format_number(std::round(a * 100)) + "%" : "–", "middle",
                      a < 0.2 || a > 0.8 ? "fill=\"#fff\"" : "");
          }
        }
        o << "</svg></div>\n";
      }
      o << "</div>\n";
    }
  }

  // Expert loads: experts (y) × logged steps (x), relative to the step's mean.
  if (!loads_.empty())
    o << "<h2 style=\"margin-top:16px\">Expert load per MoE layer (c_j relative to the mean, per "
         "logged step)</h2>\n"
      << colour_scale(load_colour, "0", "load / mean", "≥ 2") << "<div class=\"grid\">\n";
  for (const auto& [layer, steps] : loads_) {
    const size_t n = steps.empty() ? 0 : steps.front().second.size();
    const double L = 44, T = 16, B = 34, w = 560, h = std::clamp(8.0 * n, 64.0, 256.0);
    const double cw = w / std::max<size_t>(steps.size(), 1), ch = h / std::max<size_t>(n, 1);
    o << "<div class=\"card\"><h2>Expert load, layer " << layer << "</h2>"
      << svg_open("heatmap", L + w + 8, T + h + B);
    for (size_t t = 0; t < steps.size(); ++t) {
      const auto& v = steps[t].second;
      double mean = 0;
      for (double x : v) mean += x / static_cast<double>(v.size());
      for (size_t j = 0; j < v.size(); ++j)
        o << rect(L + cw * t, T + ch * j, cw + 0.3, ch + 0.3,
                  "fill=\"" + load_colour(mean > 0 ? v[j] / mean : 0) + "\"");
    }
    // Column of a step: the first logged step at or after it.
    auto col = [&](double step) {
      const auto it = std::lower_bound(steps.begin(), steps.end(), step,
                                       [](const auto& p, double s) { return p.first < s; });
      return L + cw * static_cast<double>(it - steps.begin());
    };
    for (const auto& m : marks)
      if (m.x > steps.front().first)
        o << line(col(m.x), T - 4, col(m.x), T + h, "stroke=\"#222\" stroke-dasharray=\"4,3\"")
          << text(col(m.x) + 3, T - 5, m.label, "start", "class=\"stage\"");
    if (!steps.empty())
      for (double v : axis_ticks(steps.front().first, steps.back().first))
        if (v == std::round(v)) o << text(col(v) + cw / 2, T + h + 14, format_number(v), "middle");
    o << text(L + w / 2, T + h + 30, "step", "middle", "class=\"axis\"")
      << text(0, 0, "expert", "middle",
              "class=\"axis\" transform=\"translate(14," + num(T + h / 2) + ") rotate(-90)\"")
      << text(L - 4, T + 9, "0", "end") << text(L - 4, T + h, std::to_string(n - 1), "end")
      << "</svg></div>\n";
  }
  if (!loads_.empty()) o << "</div>\n";
  o << "</body></html>\n";
  return o.str();
}

void RunReport::write_html() const {
  const std::string p = (std::filesystem::path(dir_) / "report.html").string();
  std::ofstream f(p);
  f << html();
  MYRIAD_CHECK(f.good(), "report: cannot write ", p);
}

namespace {
std::string pct(double v) {
  return std::isfinite(v) ? format_number(std::round(v * 1000) / 10) + "%" : "–";
}
double mean_row(const nlohmann::json& row) {
  double s = 0;
  int n = 0;
  for (const auto& v : row)
    if (v.is_number()) s += v.get<double>(), ++n;
  return n ? s / n : NAN;
}
}  // namespace

std::string write_comparison(const std::vector<std::pair<std::string, std::string>>& runs,
                             const std::string& out_dir, const std::string& title) {
  namespace fs = std::filesystem;
  MYRIAD_CHECK(!runs.empty(), "compare: no runs");
  std::ostringstream md;
  std::vector<nlohmann::json> evals(runs.size());
  // Training.
  md << "| run | stages | tokens | wall time | tokens/s | held-out loss at stage ends |\n"
        "|---|---|---|---|---|---|\n";
  for (size_t k = 0; k < runs.size(); ++k) {
    const auto& [label, dir] = runs[k];
    MYRIAD_CHECK(fs::exists(fs::path(dir) / "metrics.jsonl"), "compare: ", dir,
                 " has no metrics.jsonl");
    const RunReport rep(dir);
    std::string stages, losses;
    double tokens = NAN, wall = NAN;
    for (const auto& r : rep.stage_rows()) {
      const std::string len = r.contains("seq_len") && r["seq_len"].is_number()
                                  ? format_length(r["seq_len"].get<int64_t>())
                                  : r["stage"].get<std::string>();
      stages += (stages.empty() ? "" : " → ") + len;
      if (r.contains("heldout_loss") && r["heldout_loss"].is_number())
        losses += (losses.empty() ? "" : " / ") + format_number(r["heldout_loss"].get<double>());
      if (r.contains("tokens") && r["tokens"].is_number()) tokens = r["tokens"].get<double>();
      if (r.contains("wall_seconds") && r["wall_seconds"].is_number())
        wall = r["wall_seconds"].get<double>();
    }
    md << "| " << label << " | " << stages << " | " << format_count(tokens) << " | "
       << (std::isfinite(wall) ? format_duration(wall) : "–") << " | "
       << (std::isfinite(wall) && wall > 0 ? format_count(tokens / wall) : "–") << " | " << losses
       << " |\n";
    const fs::path ev = fs::path(dir) / "eval.json";
    if (fs::exists(ev)) {
      std::ifstream f(ev);
      evals[k] = nlohmann::json::parse(f);
    }
  }
  // Held-out loss per length, accuracy per task and length, memory.
  std::vector<std::string> loss_lengths, tasks;
  std::vector<int64_t> lengths;
  for (const auto& e : evals) {
    if (e.is_null()) continue;
    const nlohmann::json losses = e.value("heldout_loss", nlohmann::json::object());
    for (const auto& [L, v] : losses.items())
      if (std::find(loss_lengths.begin(), loss_lengths.end(), L) == loss_lengths.end())
        loss_lengths.push_back(L);
    for (const auto& g : e["grids"]) {
      const std::string t = g["task"].get<std::string>();
      if (std::find(tasks.begin(), tasks.end(), t) == tasks.end()) tasks.push_back(t);
      for (int64_t L : g["lengths"].get<std::vector<int64_t>>())
        if (std::find(lengths.begin(), lengths.end(), L) == lengths.end()) lengths.push_back(L);
    }
  }
  std::sort(
      loss_lengths.begin(), loss_lengths.end(),
      [](const std::string& a, const std::string& b) { return std::stoll(a) < std::stoll(b); });
  std::sort(lengths.begin(), lengths.end());
  std::vector<Line> loss_lines;
  if (!loss_lengths.empty()) {
    md << "\nHeld-out loss at each context length:\n\n| run |";
    for (const auto& L : loss_lengths) md << " " << format_length(std::stoll(L)) << " |";
    md << "\n|---|";
    for (size_t i = 0; i < loss_lengths.size(); ++i) md << "---|";
    md << "\n";
    for (size_t k = 0; k < runs.size(); ++k) {
      md << "| " << runs[k].first << " |";
      Series pts;
      const auto hl = evals[k].is_null() ? nlohmann::json::object()
                                         : evals[k].value("heldout_loss", nlohmann::json::object());
      for (const auto& L : loss_lengths) {
        const double v = hl.contains(L) ? hl[L].get<double>() : NAN;
        md << " " << (std::isfinite(v) ? format_number(v) : "–") << " |";
        pts.emplace_back(std::stoll(L), v);
      }
      md << "\n";
      loss_lines.push_back({runs[k].first, pts});
    }
  }
  std::map<std::string, std::vector<Line>> acc_lines;
  if (!tasks.empty()) {
    md << "\nRetrieval accuracy (mean over depths and items) at each context length:\n\n| run | "
          "task |";
    for (int64_t L : lengths) md << " " << format_length(L) << " |";
    md << "\n|---|---|";
    for (size_t i = 0; i < lengths.size(); ++i) md << "---|";
    md << "\n";
    for (const std::string& t : tasks)
      for (size_t k = 0; k < runs.size(); ++k) {
        if (evals[k].is_null()) continue;
        for (const auto& g : evals[k]["grids"]) {
          if (g["task"] != t) continue;
          const auto ls = g["lengths"].get<std::vector<int64_t>>();
          md << "| " << runs[k].first << " | " << t << " |";
          Series pts;
          for (int64_t L : lengths) {
            const auto it = std::find(ls.begin(), ls.end(), L);
            const double v = it == ls.end() ? NAN : mean_row(g["accuracy"][it - ls.begin()]);
            md << " " << pct(v) << " |";
            if (std::isfinite(v)) pts.emplace_back(L, v);
          }
          md << "\n";
          acc_lines[t].push_back({runs[k].first, pts});
        }
      }
    md << "\nEvaluation cost (the engine, one process per run):\n\n| run | prompt tokens/s | "
          "cache peak | peak RSS |\n|---|---|---|---|\n";
    for (size_t k = 0; k < runs.size(); ++k) {
      if (evals[k].is_null()) continue;
      double tok = 0, sec = 0, peak = 0;
      for (const auto& g : evals[k]["grids"]) {
        tok += g.value("prompt_tokens", 0.0), sec += g.value("seconds", 0.0);
        peak = std::max(peak, g.value("cache_bytes_peak", 0.0));
      }
      md << "| " << runs[k].first << " | " << (sec > 0 ? format_count(tok / sec) : "–") << " | "
         << format_number(peak / (1 << 20)) << " MiB | "
         << format_number(evals[k].value("peak_rss_mib", NAN)) << " MiB |\n";
    }
  }
  fs::create_directories(out_dir);
  std::ostringstream h;
  h << "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"/><title>" << html_escape(title)
    << "</title><style>" << kStyle << "</style></head><body>\n<h1>" << html_escape(title)
    << "</h1>\n<div class=\"grid\">\n";
  for (const auto& [t, l] : acc_lines)
    h << line_plot(t + " accuracy against context length", "accuracy", l, {}, false,
                   XAxis{"context length (tokens)", true, 0.0, 1.0, true});
  if (!loss_lines.empty())
    h << line_plot("Held-out loss against context length", "loss", loss_lines, {}, false,
                   XAxis{"context length (tokens)", true, NAN, NAN, true});
  h << "</div>\n<pre>" << html_escape(md.str()) << "</pre>\n</body></html>\n";
  std::ofstream(fs::path(out_dir) / "compare.html") << h.str();
  std::ofstream(fs::path(out_dir) / "compare.md") << md.str();
  return md.str();
}

}  // namespace myriad::train
