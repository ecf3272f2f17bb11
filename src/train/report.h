// The run report (TRAINING.md §4): metrics.jsonl (one JSON object per line, flushed, so a crash
// loses nothing) and a self-contained report.html with inline SVG plots (loss, lr, grad norm and
// jitter, routing entropy, per-layer expert-load heatmaps over steps, per-stage passkey grids).
// No external scripts or styles. Opening a directory that already has a metrics.jsonl (a resumed
// run, or `myriad report`) reads it back first; a step logged again (a resume replays the steps
// after its checkpoint) replaces the earlier record in the plots.
#pragma once
#include <cstdint>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace myriad::train {

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
  // One row of the stage table: an object with "stage" and any of "seq_len", "step",
  // "heldout_loss", "passkey", "effective_length", "gate" (bool), "gate_reasons" (strings),
  // "eval_seconds".
  void stage_summary(const nlohmann::json& row);
  // Another run's metrics (e.g. the same recipe without balancing), drawn as a second line in
  // the loss and max-violation plots. Not written to this run's metrics.jsonl.
  void add_contrast(const std::string& label, const std::string& other_dir);
  // Per-expert loads (c_j/q or counts) of one MoE layer at a step, for the heatmaps.
  void expert_load(int64_t step, int64_t layer, const std::vector<double>& loads);
  void write_html() const;  // report.html from everything recorded so far
  std::string html() const;
  const std::string& dir() const { return dir_; }
  // Scalar series by name: (step, value) in step order.
  const std::map<std::string, std::vector<std::pair<int64_t, double>>>& series() const {
    return series_;
  }

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
  std::string contrast_label_;
  std::map<std::string, std::vector<std::pair<int64_t, double>>> contrast_;
};

}  // namespace myriad::train
