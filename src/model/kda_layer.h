// The KDA attention sublayer (MODEL.md §4; transformers KimiLinearDeltaAttention as described in
// docs/REFERENCE_NOTES.md §5): q/k/v projections, depthwise causal conv + SiLU, L2-normed q/k,
// decay gate (softplus, or K3's lower bound), write strength β, the chunked delta rule (or one
// recurrent step when decoding), gated RMSNorm with a low-rank or full-rank output gate, o_proj.
#pragma once
#include <string>
#include <vector>

#include "model/cache.h"
#include "model/config.h"
#include "model/weights.h"

namespace myriad::model {

class KdaLayer {
 public:
  KdaLayer(const ModelConfig& c, const Weights* w, int64_t layer);
  static void add_specs(const ModelConfig& c, int64_t layer, std::vector<ParamSpec>& out);
  // x [B, T, d] (after the pre-norm) -> [B, T, d]. With a state, continues from it and updates
  // it (a single token runs the recurrent step); without, starts from zeros.
  Tensor forward(const Tensor& x_BTD, KdaState* state = nullptr) const;
  // Batched decode: x [N, 1, d], one token of each of N sequences with its own (non-empty)
  // state: the states are stacked along B for one recurrent step, then handed back.
  Tensor forward_batch(const Tensor& x_N1D, const std::vector<KdaState*>& states) const;

 private:
  static Tensor stacked(const std::vector<Tensor>& rows);
  const Tensor& w(const char* name) const { return w_->get(prefix_ + name); }
  // x . W^T through project() (int8 where the weights have a copy).
  Tensor lin(const Tensor& x, const char* name) const { return project(x, *w_, prefix_ + name); }
  const Weights* w_;
  std::string prefix_;
  int64_t H_, dk_, K_;
  double eps_;
  bool lower_bound_, full_rank_gate_;
  double g_min_;
  std::vector<std::string> x_projs_;  // the projections of x, in forward's one product
};

}  // namespace myriad::model
