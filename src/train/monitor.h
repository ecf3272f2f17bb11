// Training monitors (TRAINING.md §4): per MoE layer expert load, bias and routing entropy;
// gradient-norm jitter (global and per group); loss spikes with the skip / rollback policy.
// step() returns a flat map of scalars named as in §4 ("load/cv", "grad/jitter", ...), per-layer
// ones prefixed "layer<i>/", ready for TensorBoard and metrics.jsonl.
#pragma once
#include <cstdint>
#include <deque>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace myriad::train {

struct LayerRouting {
  int64_t layer = 0;              // decoder layer index (the "layer<i>/" prefix)
  std::vector<int64_t> counts;    // c_j over the global step
  int64_t tokens = 0, top_k = 0;  // m and k
  std::vector<double> bias;       // b after the step's update (optional)
  Tensor scores_Nn, selected_Nk;  // a sample of the step's routing for the entropies (optional)
};

struct StepStats {
  int64_t step = 0;
  double loss = 0, grad_norm = 0;             // L_t and the global pre-clip norm g_t
  std::map<std::string, double> group_norms;  // router, experts, attention, embeddings
  std::vector<LayerRouting> layers;
  int64_t shard = -1;                 // data shard, for spike logs
  std::vector<int64_t> sequence_ids;  // for spike logs
};

enum class Decision { Apply, Skip, Rollback };

struct SpikeRecord {
  int64_t step, shard;
  std::vector<int64_t> sequence_ids;
  double loss, z;
};

// μ_t = EMA_ρ(x), σ_t² = EMA_ρ((x − μ_{t−1})²), both bias-corrected (Adam style) so that
// early steps are not all outliers; z(x) = (x − μ)/σ uses the values pushed so far (not x).
class EmaStats {
 public:
  explicit EmaStats(double rho = 0.99) : rho_(rho) {}
  double z(double x) const;  // (x − μ)/σ, 0 until two values were seen
  void push(double x);
  double mean() const;
  double std() const;
  nlohmann::json state() const;  // exact (doubles round-trip through JSON)
  void load_state(const nlohmann::json& j);

 private:
  double rho_, mu_ = 0, var_ = 0;
  int64_t n_ = 0;
};

class Monitor {
 public:
  explicit Monitor(int64_t window = 100) : window_(window) {}

  // The loss-spike policy for step t (call before applying the update): Skip when z_t > 6 or the
  // loss or gradient is not finite, Rollback on the third consecutive skip (then the count
  // restarts). Counts are reported by step() as loss/skips and loss/rollbacks.
  Decision decide(double loss, double grad_norm);
  // All §4 scalars for one step (also records spikes; updates the EMAs and windows).
  std::map<std::string, double> step(const StepStats& s);
  // Routing stability on a fixed probe batch: the fraction of (token, slot) assignments of
  // `selected` [N, k] not present in the previous probe of `layer` (0 on the first probe).
  // The latest value is reported as layer<i>/route/flip_rate.
  double probe(int64_t layer, const Tensor& selected_Nk);

  // Everything step() and decide() carry between steps (EMAs, windows, counters, probes, spike
  // log), so a resumed run logs exactly what an uninterrupted one does.
  nlohmann::json state() const;
  void load_state(const nlohmann::json& j);

  const std::vector<SpikeRecord>& spikes() const { return spikes_; }
  int64_t skips() const { return skips_; }
  int64_t rollbacks() const { return rollbacks_; }

 private:
  struct LayerState {
    std::vector<int64_t> last_active;  // last monitor step with c_j > 0
    std::vector<int64_t> probe;        // previous probe selection
    double flip_rate = 0;
    bool probed = false;
  };
  void grad_stats(const std::string& prefix, double g, std::map<std::string, double>& out);
  int64_t window_, t_ = 0, skips_ = 0, rollbacks_ = 0, consecutive_ = 0;
  EmaStats loss_ema_;
  std::deque<double> loss_hist_;
  std::map<std::string, EmaStats> grad_ema_;
  std::map<std::string, std::deque<double>> grad_hist_;
  std::map<std::string, int64_t> grad_spikes_;
  int64_t loss_spikes_ = 0;
  std::map<int64_t, LayerState> layers_;
  std::vector<SpikeRecord> spikes_;
};

// Helpers, also used by the report: linear-interpolated quantile p ∈ [0, 1] of v; the median.
double quantile(std::vector<double> v, double p);

}  // namespace myriad::train
