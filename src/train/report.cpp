#include "train/report.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"

namespace myriad::train {
namespace {

std::string esc(const std::string& s) {
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

std::string num(double v) {
  std::ostringstream s;
  s.precision(4);
  s << v;
  return s.str();
}

const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e",
                         "#9467bd", "#8c564b", "#e377c2", "#17becf"};

using Series = std::vector<std::pair<int64_t, double>>;

// A line plot of named series over steps; y on a log scale when asked (all values > 0).
std::string line_plot(const std::string& title,
                      const std::vector<std::pair<std::string, Series>>& s, bool logy = false) {
  const double W = 640, H = 240, L = 60, R = 170, T = 24, B = 30;
  double x0 = 1e300, x1 = -1e300, y0 = 1e300, y1 = -1e300;
  auto fy = [&](double v) { return logy ? std::log10(v) : v; };
  for (const auto& [name, pts] : s)
    for (const auto& [x, y] : pts)
      if (std::isfinite(y) && (!logy || y > 0)) {
        x0 = std::min<double>(x0, x), x1 = std::max<double>(x1, x);
        y0 = std::min(y0, fy(y)), y1 = std::max(y1, fy(y));
      }
  std::ostringstream o;
  o << "<h2>" << esc(title)
    << "</h2>\n<svg class=\"plot\" xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W
    << "\" height=\"" << H << "\">";
  o << "<rect x=\"" << L << "\" y=\"" << T << "\" width=\"" << W - L - R << "\" height=\""
    << H - T - B << "\" fill=\"none\" stroke=\"#888\"/>";
  if (x0 > x1) return o.str() + "<text x=\"80\" y=\"120\">no data</text></svg>\n";
  if (x1 == x0) x1 = x0 + 1;
  if (y1 == y0) y1 = y0 + 1;
  auto px = [&](double x) { return L + (x - x0) / (x1 - x0) * (W - L - R); };
  auto py = [&](double y) { return H - B - (fy(y) - y0) / (y1 - y0) * (H - T - B); };
  auto lab = [&](double v) { return num(logy ? std::pow(10.0, v) : v); };
  o << "<text x=\"" << L - 4 << "\" y=\"" << T + 10 << "\" text-anchor=\"end\" font-size=\"10\">"
    << lab(y1) << "</text><text x=\"" << L - 4 << "\" y=\"" << H - B
    << "\" text-anchor=\"end\" font-size=\"10\">" << lab(y0) << "</text>";
  o << "<text x=\"" << L << "\" y=\"" << H - 12 << "\" font-size=\"10\">step " << x0
    << "</text><text x=\"" << W - R << "\" y=\"" << H - 12
    << "\" text-anchor=\"end\" font-size=\"10\">" << x1 << "</text>";
  for (size_t i = 0; i < s.size(); ++i) {
    const char* c = kColors[i % 8];
    o << "<polyline fill=\"none\" stroke=\"" << c << "\" stroke-width=\"1.5\" points=\"";
    for (const auto& [x, y] : s[i].second)
      if (std::isfinite(y) && (!logy || y > 0)) o << num(px(x)) << "," << num(py(y)) << " ";
    o << "\"/><text x=\"" << W - R + 8 << "\" y=\"" << T + 12 + 14 * i
      << "\" font-size=\"11\" fill=\"" << c << "\">" << esc(s[i].first) << "</text>";
  }
  return o.str() + "</svg>\n";
}

// Blue (0) - white (1) - red (≥ 2) for relative loads; white-green for accuracies.
std::string load_colour(double v) {
  const double t = std::clamp(v, 0.0, 2.0);
  int r = 255, g = 255, b = 255;
  if (t < 1)
    r = g = static_cast<int>(255 * t);
  else
    g = b = static_cast<int>(255 * (2 - t));
  std::ostringstream o;
  o << "rgb(" << r << "," << g << "," << b << ")";
  return o.str();
}

std::string acc_colour(double a) {
  const int v = static_cast<int>(255 * (1 - std::clamp(a, 0.0, 1.0)));
  std::ostringstream o;
  o << "rgb(" << v << "," << std::min(255, v + 120) << "," << v << ")";
  return o.str();
}

}  // namespace

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

std::string RunReport::html() const {
  auto pick = [&](auto pred) {
    std::vector<std::pair<std::string, Series>> out;
    for (const auto& [k, v] : series_)
      if (pred(k)) out.emplace_back(k, v);
    return out;
  };
  auto has = [](const std::string& k, const char* s) { return k.find(s) != std::string::npos; };
  std::ostringstream o;
  o << "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"/><title>Myriad run report</title>"
       "<style>body{font-family:sans-serif;margin:20px}h2{font-size:15px;margin:18px 0 4px}"
       "svg{display:block}</style></head><body>\n<h1>Myriad run report</h1>\n";
  o << "<p>" << esc(dir_) << "</p>\n";
  const std::string mine = contrast_label_.empty() ? "loss" : "this run";
  auto with_contrast = [&](std::vector<std::pair<std::string, Series>> v, const Series& other) {
    if (!contrast_label_.empty() && !other.empty()) v.emplace_back(contrast_label_, other);
    return v;
  };
  if (!summaries_.empty()) {
    o << "<h2>Stages</h2>\n<table border=\"1\" cellpadding=\"4\" "
         "style=\"border-collapse:collapse;font-size:12px\"><tr><th>stage</th><th>length</th>"
         "<th>end step</th><th>held-out loss</th><th>passkey (mean)</th><th>effective length</th>"
         "<th>gate</th><th>eval s</th></tr>\n";
    auto cell = [&](const nlohmann::json& r, const char* k) {
      if (!r.contains(k) || r[k].is_null()) return std::string("-");
      return r[k].is_number() ? num(r[k].get<double>()) : esc(r[k].dump());
    };
    for (const auto& r : summaries_) {
      std::string gate = "-";
      if (r.contains("gate")) {
        gate = r["gate"].get<bool>() ? "pass" : "fail";
        for (const auto& why : r.value("gate_reasons", nlohmann::json::array()))
          gate += "<br/>" + esc(why.get<std::string>());
      }
      o << "<tr><td>" << esc(r["stage"].get<std::string>()) << "</td><td>" << cell(r, "seq_len")
        << "</td><td>" << cell(r, "step") << "</td><td>" << cell(r, "heldout_loss") << "</td><td>"
        << cell(r, "passkey") << "</td><td>" << cell(r, "effective_length") << "</td><td>" << gate
        << "</td><td>" << cell(r, "eval_seconds") << "</td></tr>\n";
    }
    o << "</table>\n";
  }
  {
    Series loss;
    for (const char* k : {"loss", "loss/value"})
      if (series_.count(k)) loss = series_.at(k);
    Series other;
    if (contrast_.count("loss")) other = contrast_.at("loss");
    o << line_plot("Loss", with_contrast({{mine, loss}}, other));
  }
  if (const Series mv = max_over_layers(series_); !mv.empty())
    o << line_plot("Expert load max-violation (max over MoE layers of max_j c_j/q - 1)",
                   with_contrast({{contrast_label_.empty() ? "max-violation" : mine, mv}},
                                 max_over_layers(contrast_)));
  o << line_plot("Learning rate",
                 pick([&](const std::string& k) { return k == "lr" || has(k, "/lr"); }));
  o << line_plot("Gradient norm", pick([](const std::string& k) { return k == "grad/norm"; }),
                 true);
  o << line_plot("Gradient jitter J",
                 pick([](const std::string& k) { return k == "grad/jitter"; }));
  o << line_plot("Routing entropy",
                 pick([&](const std::string& k) { return has(k, "route/") && has(k, "entropy"); }));
  for (const auto& [layer, rows] : loads_) {  // experts (y) × steps (x), c_j relative to mean
    const size_t n = rows.empty() ? 0 : rows.front().second.size();
    const double cw = std::max(2.0, 600.0 / std::max<size_t>(rows.size(), 1));
    const double ch = std::max(2.0, 256.0 / std::max<size_t>(n, 1));
    o << "<h2>Expert load, layer " << layer << " (experts × steps " << rows.front().first << ".."
      << rows.back().first << "; blue 0, white mean, red ≥ 2× mean)</h2>\n<svg class=\"heatmap\" "
      << "xmlns=\"http://www.w3.org/2000/svg\" width=\"" << num(cw * rows.size() + 2)
      << "\" height=\"" << num(ch * n + 2) << "\">";
    for (size_t t = 0; t < rows.size(); ++t) {
      const auto& v = rows[t].second;
      double mean = 0;
      for (double x : v) mean += x / static_cast<double>(v.size());
      for (size_t j = 0; j < v.size(); ++j)
        o << "<rect x=\"" << num(cw * t) << "\" y=\"" << num(ch * j) << "\" width=\"" << num(cw)
          << "\" height=\"" << num(ch) << "\" fill=\"" << load_colour(mean > 0 ? v[j] / mean : 0)
          << "\"/>";
    }
    o << "</svg>\n";
  }
  for (const Grid& g : grids_) {  // lengths (y) × depths (x), accuracy
    const double cw = g.depths.empty() ? 90 : 56, ch = 22, L = 70, T = 20;
    const size_t nd = std::max<size_t>(g.depths.size(), 1);
    o << "<h2>" << esc(g.task) << " accuracy, stage " << esc(g.stage)
      << "</h2>\n<svg class=\"evalgrid\" "
      << "xmlns=\"http://www.w3.org/2000/svg\" width=\"" << num(L + cw * nd + 4) << "\" height=\""
      << num(T + ch * g.lengths.size() + 4) << "\">";
    for (size_t j = 0; j < nd; ++j)
      o << "<text x=\"" << num(L + cw * (j + 0.5)) << "\" y=\"14\" font-size=\"10\" "
        << "text-anchor=\"middle\">"
        << (g.depths.empty() ? std::string("random depth") : "depth " + num(g.depths[j]))
        << "</text>";
    for (size_t i = 0; i < g.lengths.size(); ++i) {
      o << "<text x=\"" << L - 4 << "\" y=\"" << num(T + ch * (i + 0.7)) << "\" font-size=\"10\" "
        << "text-anchor=\"end\">" << g.lengths[i] << "</text>";
      for (size_t j = 0; j < nd; ++j)
        o << "<rect x=\"" << num(L + cw * j) << "\" y=\"" << num(T + ch * i) << "\" width=\"" << cw
          << "\" height=\"" << ch << "\" fill=\"" << acc_colour(g.acc[i][j])
          << "\" stroke=\"#fff\"/><text x=\"" << num(L + cw * (j + 0.5)) << "\" y=\""
          << num(T + ch * (i + 0.7)) << "\" font-size=\"10\" text-anchor=\"middle\">"
          << num(g.acc[i][j]) << "</text>";
    }
    o << "</svg>\n";
  }
  o << "</body></html>\n";
  return o.str();
}

void RunReport::write_html() const {
  const std::string p = (std::filesystem::path(dir_) / "report.html").string();
  std::ofstream f(p);
  f << html();
  MYRIAD_CHECK(f.good(), "report: cannot write ", p);
}

}  // namespace myriad::train
