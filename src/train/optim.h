// Optimisers of TRAINING.md §1: parameter groups by checkpoint name (§1.1), AdamW (§1.2) for the
// non-matrix groups, Muon (§1.3) for the hidden matrices, global-norm gradient clipping, and the
// QK-clip rescale of MuonClip (§1.4). All optimiser state is fp32 on the host; parameters that are
// not contiguous f32 CPU tensors are updated through a host copy and written back. Deterministic:
// every loop runs in a fixed order and the GEMMs of Newton-Schulz run on the CPU backend.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "dist/comm.h"

namespace myriad::train {

enum class ParamGroup { Matrix, EmbedHead, Router, NoDecay, BalancerOwned };
const char* group_name(ParamGroup g);  // "matrix", "embed_head", "router", "no_decay", "balancer"

// The §1.1 table by checkpoint name and shape. e_score_correction_bias is BalancerOwned: the
// optimiser never touches it.
ParamGroup param_group(const std::string& checkpoint_name, const Shape& shape);

struct OptimConfig {
  std::string matrix_optimizer = "muon";  // or "adamw"
  double lr = 0, weight_decay = 0.1, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, momentum = 0.95;
  bool nesterov = true, per_head = false;
  double clip_norm = 1.0;  // <= 0 disables clipping
  double qk_clip_tau = 100;
};

using NamedParams = std::vector<std::pair<std::string, Tensor>>;

// Expert parallel (docs/DISTRIBUTED.md): groups of `ep` consecutive ranks share out the routed
// experts; holder(name) is the index in the group (0 … ep-1) of the rank that runs the parameter,
// -1 for parameters every rank runs. `replicas` holds the ranks with this rank's index (rank % ep),
// ordered by rank: the ranks that run the same experts.
struct ExpertShards {
  int ep = 1;
  std::function<int(const std::string&)> holder;
  dist::Comm* replicas = nullptr;
};

class Optimizer {
 public:
  // heads_per_param: H for the per-head projections (used when config.per_head is set).
  Optimizer(NamedParams named_params, OptimConfig config,
            std::map<std::string, int64_t> heads_per_param = {});

  // Global L2 norm of all gradients (balancer-owned excluded), computed in double. When it is
  // finite and above clip_norm, the next step() scales every gradient by clip_norm / norm (as an
  // f32 factor) as it reads it: the same f32 products, so the same update, as scaling the
  // gradients in place, without a pass of its own over them. The gradients themselves are left
  // as they are (grad_scale() says what step() will apply; zero_grad() and step() reset it to 1,
  // and each call measures the gradients afresh). NaN or Inf is returned with no scale set (the
  // trainer skips the step). With `groups`, also the norm of each group (group_name keys), for
  // monitoring, from the same sums (one pass over the gradients, not two).
  double clip_grad_norm(std::map<std::string, double>* groups = nullptr);
  float grad_scale() const { return grad_scale_; }
  // One update at learning rate lr. Parameters without a gradient are left alone. A gradient may
  // be f32 or bf16 (mixed precision hands its bf16 gradients over as they are); the update is f32.
  void step(double lr);
  void zero_grad();
  // Mixed precision's working copy: each named bf16 tensor then receives its parameter, rounded
  // to bf16, whenever this optimizer writes the parameter (in AdamW's own pass, after Muon's
  // update, after ZeRO-1's and the expert all-gathers), so it matches the parameter after every
  // step() as long as nothing else writes the parameter. Returns the names it took: those of
  // its parameters, balancer-owned ones excepted (the balancer writes them).
  std::vector<std::string> mirror_into(const NamedParams& low);

  // "<name>.exp_avg", "<name>.exp_avg_sq", "<name>.momentum_buffer", "<name>.step" (i64) and
  // "step" (i64): copies, so later steps do not change a saved dict.
  std::map<std::string, Tensor> state_dict() const;
  void load_state_dict(const std::map<std::string, Tensor>& sd);
  int64_t step_count() const { return step_; }
  const OptimConfig& config() const { return cfg_; }

  // Data parallel over comm's ranks (docs/DISTRIBUTED.md). Every parameter gets an owner: whole
  // tensors, dealt largest first to the least-loaded rank, so Muon's Newton-Schulz sees a whole
  // matrix. reduce_gradients() (after every rank's backward) sums the gradients into their
  // owners; a parameter has a gradient when any micro-batch gave it one. The norms and clipping
  // then use global sums. zero = true (ZeRO-1): only the owner keeps moments and updates, and
  // step() ends with one all-gather of the updated weights; zero = false: the summed gradients
  // are all-gathered and every rank updates every parameter. Both leave every rank with the same
  // bits. A comm of size 1 changes nothing.
  //
  // With expert shards (ZeRO-1 only), an expert's parameters are owned by one of the ranks that
  // run it: only those ranks send its gradients (the all-to-all, or a reduce-scatter over the
  // replicas, "expert_reduce_scatter"), and step() all-gathers its update over the replicas only
  // ("expert_all_gather"). The other ranks' copies go stale until sync_experts().
  void distribute(dist::Comm* comm, bool zero, ExpertShards ep = {});
  // Expert parallel: every expert parameter from its owner to every rank (a collective), so a
  // checkpoint, an evaluation or an export sees current weights everywhere. Nothing without
  // expert shards.
  void sync_experts();
  // Deterministic accumulation: called after each micro-batch's backward, it moves the
  // gradients aside; reduce_gradients() then adds them up on their owners in the global
  // micro-batch order (the trainer deals micro-batches round-robin: rank q's j-th is micro-batch
  // j * ranks + q, so ranks may hold different counts, or none), one all-to-all;
  // micro_batches is the step's global count of stashed micro-batches (0: nothing was stashed,
  // the gradients were accumulated in place); `group` consecutive ranks share one dealing slot
  // (context parallel's chunk ranks). The sums, norms and updates then have the same bits
  // at any number of ranks, a single process included. Without it: local accumulation and one
  // reduce-scatter (the summation order then depends on the ranks).
  void stash_gradients();
  void reduce_gradients(int64_t micro_batches = 0, int64_t group = 1);
  // state_dict() of the whole optimizer: under ZeRO-1 the owners' moments are all-gathered (a
  // collective every rank must call); otherwise state_dict().
  std::map<std::string, Tensor> gathered_state_dict() const;
  // ZeRO-1: the state_dict() entries of the parameters this rank owns ("step" on rank 0 only),
  // the part a data-parallel checkpoint stores per rank.
  std::map<std::string, Tensor> owned_state_dict() const;

 private:
  struct Slot {
    std::string name;
    Tensor param;
    ParamGroup group = ParamGroup::NoDecay;
    bool muon = false;
    int64_t heads = 1;                   // per-head Muon blocks
    Tensor exp_avg, exp_avg_sq, moment;  // host f32, defined as the optimiser needs them
    Tensor mirror;                       // mirror_into's bf16 copy, or undefined
    int64_t steps = 0;                   // AdamW bias correction counts this param's updates
  };
  void adamw_update(Slot& s, double lr);
  void muon_update(Slot& s, double lr);
  // This rank holds parameter i's summed gradient and updates it (every one unless ZeRO-1).
  bool mine(size_t i) const { return owner_.empty() || !zero_ || owner_[i] == comm_->rank(); }
  // The rank that owns parameter i (0 in one process).
  int owner(size_t i) const { return owner_.empty() ? 0 : owner_[i]; }
  // Rank r runs parameter i (every rank but for other ranks' experts under expert parallel).
  bool has(int r, size_t i) const { return everywhere(i) || r % ep_ == holder_[i]; }
  // Every rank runs parameter i (all but the routed experts under expert parallel).
  bool everywhere(size_t i) const { return holder_.empty() || holder_[i] < 0; }
  int me() const { return sharded() ? comm_->rank() : 0; }
  std::vector<double> slot_sum_squares() const;
  void layout();
  void pack_gradients(float* out) const;
  void unpack_gradients(int r, const float* seg);
  void add_segment(int q, const float* x, float* acc) const;
  bool sharded() const { return comm_ && comm_->size() > 1; }
  // f(slot index) for owner r's parameters, in slot order.
  template <class F>
  void for_owned(int r, F&& f) const;
  // f(slot index) for owner r's parameters that rank s runs (sends gradients of), in slot order.
  template <class F>
  void for_sent(int r, int s, F&& f) const;
  // Gradient values rank s sends rank r (its flags follow them).
  size_t sent_params(int r, int s) const;
  // The whole segment rank s sends rank r: the gradient values and one flag per parameter.
  size_t sent_values(int r, int s) const;
  // The updated weights of owners' parameters selected by `pick`, all-gathered over `c` whose
  // member k is world rank rank_of(k).
  template <class Pick, class RankOf>
  void gather_weights(dist::Comm& c, const char* name, Pick&& pick, RankOf&& rank_of);

  OptimConfig cfg_;
  std::vector<Slot> slots_;
  int64_t step_ = 0;
  float grad_scale_ = 1;  // clip_grad_norm's factor for the next step()
  dist::Comm* comm_ = nullptr;
  bool zero_ = true;
  std::vector<int> owner_;   // by slot; empty: single process
  std::vector<int> holder_;  // by slot: expert parallel holder index, -1 every rank; or empty
  int ep_ = 1;
  dist::Comm* replicas_ = nullptr;
  std::vector<size_t> seg_;     // this rank's packed-gradient segment offsets by receiver
  std::vector<size_t> params_;  // gradient values in the segment for rank r; its flags follow
  std::vector<std::vector<float>> stash_;  // stashed micro-batch gradients (one process: the sum)
};

// Newton-Schulz quintic orthogonalisation (§1.3 step 2) of each matrix of a host f32 [N, A, B]
// tensor, in fp32 through ops::matmul; returns a new [N, A, B] tensor.
Tensor newton_schulz5(const Tensor& g_NAB, int steps = 5);

// §1.4 QK-clip for MLA layers: for every head h of layer l with S_max[l][h] > tau, gamma =
// tau / S_max and head h's nope query rows (q_proj or q_b_proj) and W^UK rows of kv_b_proj are
// scaled by sqrt(gamma), its pe query rows by gamma; kv_a_proj_with_mqa is untouched. Returns the
// fraction of clipped heads over all heads listed in s_max.
double qk_clip(NamedParams& named_params, const std::map<int64_t, std::vector<double>>& s_max,
               double tau, int64_t heads, int64_t d_nope, int64_t d_pe);

}  // namespace myriad::train
