// The run report (TRAINING.md §4): metrics.jsonl (one JSON object per line, flushed, so a crash
// loses nothing) and a self-contained report.html with inline SVG plots (loss, lr, grad norm and
// jitter, routing entropy, per-layer expert-load heatmaps over steps, per-stage passkey grids).
// No external scripts or styles.
#pragma once
#include <cstdint>
#include <fstream>
#include <map>
#include <string>
#include <vector>

namespace myriad::train {

class RunReport {
 public:
  explicit RunReport(const std::string& dir);  // creates dir, appends to metrics.jsonl
  // One line {"step": s, "<name>": v, ...}; non-finite values are written as null.
  void scalars(int64_t step, const std::map<std::string, double>& values);
  // Passkey accuracy acc[i][j] at context length lengths[i] and depth depths[j] (fractions).
  void stage_eval(const std::string& stage, const std::vector<int64_t>& lengths,
                  const std::vector<double>& depths, const std::vector<std::vector<double>>& acc);
  // Per-expert loads (c_j/q or counts) of one MoE layer at a step, for the heatmaps.
  void expert_load(int64_t step, int64_t layer, const std::vector<double>& loads);
  void write_html() const;  // report.html from everything recorded so far
  std::string html() const;
  const std::string& dir() const { return dir_; }

 private:
  struct Grid {
    std::string stage;
    std::vector<int64_t> lengths;
    std::vector<double> depths;
    std::vector<std::vector<double>> acc;
  };
  std::string dir_;
  std::ofstream jsonl_;
  std::map<std::string, std::vector<std::pair<int64_t, double>>> series_;
  std::map<int64_t, std::vector<std::pair<int64_t, std::vector<double>>>> loads_;  // by layer
  std::vector<Grid> grids_;
};

}  // namespace myriad::train
