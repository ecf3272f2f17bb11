// The run report (TRAINING.md §4): metrics.jsonl (one JSON object per line, flushed, so a crash
// loses nothing) and a self-contained report.html with inline SVG: a summary line (held-out and
// train loss per stage, gates passed, tokens, wall time, tokens/s), the stage table, plots with
// ticked axes and the stage boundaries (loss, max-violation, lr, grad norm and jitter, routing
// entropy, throughput), the eval grids as length × depth heatmaps per stage and per-layer
// expert-load heatmaps over steps. No external scripts or styles. Opening a directory that already
// has a metrics.jsonl (a resumed run, or `myriad report`) reads it back first; a step logged again
// (a resume replays the steps after its checkpoint) replaces the earlier record in the plots.
#pragma once
#include <cstdint>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace myriad::train {

// Text made safe inside HTML (&, <, > and quotes escaped).
std::string html_escape(const std::string& s);

// Number formatting of the report (exposed for tests).
// Token lengths in binary units: 16384 -> "16K", 1048576 -> "1M", 1536 -> "1.5K", 300 -> "300".
std::string format_length(int64_t tokens);
// Counts in decimal units, 3 significant digits: 5413000 -> "5.41M", 2e9 -> "2B", 950 -> "950".
std::string format_count(double n);
// 4 significant digits (integers from 1000), no trailing zeros; scientific outside
// [0.01, 1e5): 3e-4 -> "3e-4", 0.0015 -> "1.5e-3", 123456 -> "1.23e5".
std::string format_number(double v);
// "8.2 s", "42 s", "10 min 42 s", "2 h 05 min".
std::string format_duration(double seconds);
// Axis ticks inside [lo, hi] at 1-2-5 steps (about 4-8 of them); log: powers of ten (with 2× and
// 5× when the range spans few decades), or 1-2-5 steps within a narrow range. Empty if lo > hi.
std::vector<double> axis_ticks(double lo, double hi, bool log = false);

class RunReport {
 public:
  explicit RunReport(const std::string& dir);  // creates dir, appends to metrics.jsonl
  // One line {"step": s, "<name>": v, ...}; non-finite values are written as null.
  void scalars(int64_t step, const std::map<std::string, double>& values);
  // Accuracy acc[i][j] of `task` at context length lengths[i] and depth depths[j] (fractions).
  // Tasks with needles at random depths pass no depths and one value per row.
  void stage_eval(const std::string& stage, const std::string& task,
                  const std::vector<int64_t>& lengths, const std::vector<double>& depths,
                  const std::vector<std::vector<double>>& acc);
  // One row of the stage table: an object with "stage" and any of "index", "seq_len", "step",
  // "tokens", "wall_seconds", "train_loss", "heldout_loss", "passkey", "effective_length",
  // "gate" (bool), "gate_reasons" (strings), "eval_seconds". A later row of a stage replaces it.
  void stage_summary(const nlohmann::json& row);
  // Another run's metrics (e.g. the same recipe without balancing), drawn as a second line in
  // the loss and max-violation plots. Not written to this run's metrics.jsonl.
  void add_contrast(const std::string& label, const std::string& other_dir);
  // Per-expert loads (c_j/q or counts) of one MoE layer at a step, for the heatmaps.
  void expert_load(int64_t step, int64_t layer, const std::vector<double>& loads);
  // A multimodal evaluation (vision::eval_record: accuracy per question kind, the caption
  // confusion, sample images with replies); the report shows the last one.
  void vision_eval(const nlohmann::json& record);
  void write_html() const;  // report.html from everything recorded so far
  std::string html() const;
  const std::string& dir() const { return dir_; }
  // Scalar series by name: (step, value) in step order.
  const std::map<std::string, std::vector<std::pair<int64_t, double>>>& series() const {
    return series_;
  }
  const std::vector<nlohmann::json>& stage_rows() const { return summaries_; }

 private:
  void ingest(const nlohmann::json& j, bool write);
  struct Grid {
    std::string stage, task;
    std::vector<int64_t> lengths;
    std::vector<double> depths;
    std::vector<std::vector<double>> acc;
  };
  std::string dir_;
  std::ofstream jsonl_;
  std::map<std::string, std::vector<std::pair<int64_t, double>>> series_;
  std::map<int64_t, std::vector<std::pair<int64_t, std::vector<double>>>> loads_;  // by layer
  std::vector<Grid> grids_;
  std::vector<nlohmann::json> summaries_;
  nlohmann::json vision_;  // the last vision_eval record
  std::string contrast_label_;
  std::map<std::string, std::vector<std::pair<int64_t, double>>> contrast_;
};

// Side-by-side comparison of runs (label, run directory): each run's training (stages, tokens,
// wall time, tokens/s, held-out loss per stage) from its metrics.jsonl and, when the run
// directory has one, its eval.json (`myriad eval --json`: grids, held-out loss per length, cache
// peak, peak RSS). Writes out_dir/compare.html (accuracy and held-out loss against context
// length, one curve per run) and out_dir/compare.md; returns the Markdown tables.
std::string write_comparison(const std::vector<std::pair<std::string, std::string>>& runs,
                             const std::string& out_dir, const std::string& title);

}  // namespace myriad::train
