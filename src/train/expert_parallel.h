// Expert parallel (docs/DISTRIBUTED.md): the ranks of an EP group share out every MoE layer's
// routed experts in equal contiguous blocks (rank e of ep runs experts [e n/ep, (e+1) n/ep)). Each
// rank routes its own tokens; run() sends every (token, slot) row to the rank running its expert
// (all-to-all-v "ep_dispatch", after a small "ep_counts" exchange of the per-expert row counts),
// that rank runs its experts on the rows of all ranks at once (one grouped GEMM per projection),
// and the outputs go back in the routing order ("ep_combine"). Dropless: every row is computed.
// Both exchanges are differentiable, so gradients make the same trips back; the expert weights'
// gradients arise only on the rank running them. The model module only sees an ExpertRunner.
//
// Every rank of the group must run the same forward and backward passes in step (the trainer's
// micro-batches); a forward outside them (evaluation) runs without the runner.
#pragma once
#include <vector>

#include "dist/comm.h"
#include "model/moe.h"

namespace myriad::train {

class ExpertParallel final : public model::ExpertRunner {
 public:
  explicit ExpertParallel(dist::Comm& ep_group) : comm_(ep_group) {}
  Tensor run(const model::Moe& moe, const Tensor& xs_MD,
             const std::vector<int64_t>& counts) const override;
  // The experts [first, first + count) this rank runs in a layer of n experts.
  std::pair<int64_t, int64_t> local_experts(int64_t n) const;

 private:
  dist::Comm& comm_;
};

}  // namespace myriad::train
