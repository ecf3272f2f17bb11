#include "train/optim.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "backend/cpu/cpu.h"
#include "core/autograd.h"
#include "core/error.h"
#include "ops/adamw.h"
#include "ops/elementwise.h"
#include "ops/matmul.h"
#include "ops/shape.h"

namespace myriad::train {
namespace {

bool contains(const std::string& s, const char* part) {
  return s.find(part) != std::string::npos;
}
bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// The tensor itself when it is a contiguous f32 CPU tensor, else an f32 host copy.
Tensor host_f32(const Tensor& t) {
  if (t.device().is_cpu() && t.dtype() == DType::F32 && t.is_contiguous()) return t;
  return t.to(kCPU).to(DType::F32).contiguous();
}
void write_back(Tensor dst, const Tensor& host) {  // dst is a handle: copy_ writes its data
  if (!host.same(dst)) dst.copy_(host);
}

constexpr int64_t kGrain = 1 << 14;

// One block's Σ g² over 8 interleaved f64 sums, per CPU clone (the baseline build ran it on
// 2-lane SSE2 at 8 GB/s). A float's square is exact in f64, so a fused multiply-add rounds as the
// separate multiply and add do: every clone gives the same bits. A bf16 gradient (mixed
// precision's, handed over as it is) is read as the f32 it widens to exactly.
template <class T>
MYRIAD_CPU_CLONES double block_sum_squares(const T* p, int64_t n) {
  typedef double D8 __attribute__((vector_size(64)));
  typedef float F8 __attribute__((vector_size(32)));
  typedef uint32_t U8 __attribute__((vector_size(32)));
  typedef uint16_t H8 __attribute__((vector_size(16)));
  auto f = [](T x) {
    if constexpr (sizeof(T) == 2)
      return cpu::bf16_load(x);
    else
      return x;
  };
  D8 acc = {};  // lane l: the elements i = l mod 8 (GCC left the scalar form in 2-lane registers)
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    F8 x;
    if constexpr (sizeof(T) == 2) {
      H8 h;
      std::memcpy(&h, p + i, sizeof h);
      x = reinterpret_cast<F8>(__builtin_convertvector(h, U8) << 16);
    } else {
      std::memcpy(&x, p + i, sizeof x);
    }
    const D8 d = __builtin_convertvector(x, D8);
    acc += d * d;
  }
  for (; i < n; ++i) acc[i % 8] += static_cast<double>(f(p[i])) * f(p[i]);
  double s = 0;
  for (int l = 0; l < 8; ++l) s += acc[l];
  return s;
}

// A CPU gradient the update kernels read as it is: contiguous f32 or bf16.
bool readable_grad(const Tensor& g) {
  return g.device().is_cpu() && g.is_contiguous() &&
         (g.dtype() == DType::F32 || g.dtype() == DType::BF16);
}

// Σ g² of each tensor in f64, the same value at any thread count: blocks of kGrain elements,
// each summed over 8 interleaved partial sums (p[i] into sum i mod 8), then each tensor's blocks'
// sums in order. All tensors' blocks share one parallel loop (a model's ~800 gradients, most of
// them small, made ~800 thread hand-offs). (One serial f64 chain over a 30M-parameter model's
// gradients took ~40 ms a step.)
std::vector<double> sum_squares(const std::vector<Tensor>& gs) {
  std::vector<Tensor> hs;
  std::vector<int64_t> first(gs.size() + 1, 0);  // tensor i's blocks: first[i] … first[i+1]-1
  for (size_t i = 0; i < gs.size(); ++i) {
    hs.push_back(readable_grad(gs[i]) ? gs[i] : host_f32(gs[i]));
    first[i + 1] = first[i] + (hs[i].numel() + kGrain - 1) / kGrain;
  }
  std::vector<double> part(static_cast<size_t>(first.back()));
  cpu::parallel_for(first.back(), 1, [&](int64_t b, int64_t e) {
    size_t i =
        static_cast<size_t>(std::upper_bound(first.begin(), first.end(), b) - first.begin()) - 1;
    for (int64_t k = b; k < e; ++k) {
      while (k >= first[i + 1]) ++i;
      const Tensor& h = hs[i];
      const int64_t lo = (k - first[i]) * kGrain, hi = std::min(h.numel(), lo + kGrain);
      part[static_cast<size_t>(k)] = h.dtype() == DType::BF16
                                         ? block_sum_squares(h.data<uint16_t>() + lo, hi - lo)
                                         : block_sum_squares(h.data<float>() + lo, hi - lo);
    }
  });
  std::vector<double> out(gs.size(), 0.0);
  for (size_t i = 0; i < gs.size(); ++i)
    for (int64_t k = first[i]; k < first[i + 1]; ++k) out[i] += part[static_cast<size_t>(k)];
  return out;
}

}  // namespace

const char* group_name(ParamGroup g) {
  switch (g) {
    case ParamGroup::Matrix:
      return "matrix";
    case ParamGroup::EmbedHead:
      return "embed_head";
    case ParamGroup::Router:
      return "router";
    case ParamGroup::NoDecay:
      return "no_decay";
    case ParamGroup::BalancerOwned:
      return "balancer";
  }
  return "?";
}

ParamGroup param_group(const std::string& n, const Shape& shape) {
  if (contains(n, "e_score_correction_bias")) return ParamGroup::BalancerOwned;
  if (contains(n, "embed_tokens") || contains(n, "lm_head")) return ParamGroup::EmbedHead;
  if (ends_with(n, ".gate.weight") || contains(n, ".gate.latent_proj.") ||
      contains(n, ".gate.expert_embed"))
    return ParamGroup::Router;
  // Vectors and vector-like weights: norms, biases, conv taps, A_log, dt_bias, AttnRes proj
  // vectors ([1, d]), carry gammas.
  if (contains(n, "norm") || contains(n, "conv") || contains(n, "res_proj") ||
      ends_with(n, ".bias") || contains(n, "A_log") || contains(n, "dt_bias"))
    return ParamGroup::NoDecay;
  if (shape.size() == 2 || (shape.size() == 3 && contains(n, "experts"))) return ParamGroup::Matrix;
  return ParamGroup::NoDecay;
}

Optimizer::Optimizer(NamedParams named_params, OptimConfig config,
                     std::map<std::string, int64_t> heads_per_param)
    : cfg_(std::move(config)) {
  MYRIAD_CHECK(cfg_.matrix_optimizer == "muon" || cfg_.matrix_optimizer == "adamw",
               "Optimizer: matrix_optimizer must be 'muon' or 'adamw', got '",
               cfg_.matrix_optimizer, "'");
  for (auto& [name, p] : named_params) {
    MYRIAD_CHECK(p.defined(), "Optimizer: parameter ", name, " is undefined");
    Slot s;
    s.name = name, s.param = p, s.group = param_group(name, p.shape());
    if (s.group == ParamGroup::BalancerOwned) {
      slots_.push_back(std::move(s));
      continue;
    }
    s.muon = s.group == ParamGroup::Matrix && cfg_.matrix_optimizer == "muon";
    if (s.muon) {
      auto it = heads_per_param.find(name);
      if (cfg_.per_head && it != heads_per_param.end()) s.heads = it->second;
      const int64_t rows = p.size(-2);
      MYRIAD_CHECK(s.heads >= 1 && rows % s.heads == 0, "Optimizer: ", name, " ", p.desc(), " has ",
                   rows, " rows, not divisible into ", s.heads, " heads");
      s.moment = Tensor::zeros(p.shape());
    } else {
      s.exp_avg = Tensor::zeros(p.shape());
      s.exp_avg_sq = Tensor::zeros(p.shape());
    }
    slots_.push_back(std::move(s));
  }
}

// Sum of squares per parameter, then 1 per parameter with a gradient (0 for parameters owned
// elsewhere before the exchange), complete on every rank, so any sum over parameters taken in
// slot order has the same bits at any dp.
std::vector<double> Optimizer::slot_sum_squares() const {
  const size_t n = slots_.size();
  std::vector<double> ss(2 * n, 0.0);
  std::vector<size_t> which;
  std::vector<Tensor> grads;
  for (size_t i = 0; i < n; ++i) {
    const Slot& s = slots_[i];
    if (s.group != ParamGroup::BalancerOwned && mine(i) && s.param.grad().defined())
      which.push_back(i), grads.push_back(s.param.grad());
  }
  const std::vector<double> sums = sum_squares(grads);
  for (size_t j = 0; j < which.size(); ++j) ss[which[j]] = sums[j], ss[n + which[j]] = 1;
  if (sharded() && zero_) comm_->all_reduce_sum("dp_grad_norm", ss.data(), ss.size());
  return ss;
}

double Optimizer::clip_grad_norm(std::map<std::string, double>* groups) {
  const std::vector<double> per = slot_sum_squares();
  if (groups) {
    groups->clear();
    for (size_t i = 0; i < slots_.size(); ++i) {
      const Slot& s = slots_[i];
      if (s.group != ParamGroup::BalancerOwned && per[slots_.size() + i] > 0)
        (*groups)[group_name(s.group)] += per[i];
    }
    for (auto& [k, v] : *groups) v = std::sqrt(v);
  }
  double ss = 0;
  for (size_t i = 0; i < slots_.size(); ++i) ss += per[i];
  const double norm = std::sqrt(ss);
  grad_scale_ = 1;
  if (std::isfinite(norm) && cfg_.clip_norm > 0 && norm > cfg_.clip_norm)
    grad_scale_ = static_cast<float>(cfg_.clip_norm / norm);
  return norm;
}

template <class F>
void Optimizer::for_owned(int r, F&& f) const {
  for (size_t i = 0; i < slots_.size(); ++i)
    if (slots_[i].group != ParamGroup::BalancerOwned && owner(i) == r) f(i);
}

template <class F>
void Optimizer::for_sent(int r, int s, F&& f) const {
  for_owned(r, [&](size_t i) {
    if (has(s, i)) f(i);
  });
}

size_t Optimizer::sent_params(int r, int s) const {
  size_t n = 0;
  for_sent(r, s, [&](size_t i) { n += static_cast<size_t>(slots_[i].param.numel()); });
  return n;
}

size_t Optimizer::sent_values(int r, int s) const {
  size_t n = 0;
  for_sent(r, s, [&](size_t i) { n += static_cast<size_t>(slots_[i].param.numel()) + 1; });
  return n;
}

void Optimizer::distribute(dist::Comm* comm, bool zero, ExpertShards ep) {
  comm_ = comm, zero_ = zero;
  owner_.clear(), holder_.clear(), seg_.clear();
  ep_ = 1, replicas_ = nullptr;
  if (!sharded()) return;
  const int W = comm_->size();
  if (ep.ep > 1) {
    MYRIAD_CHECK(
        zero_ && W % ep.ep == 0 && ep.holder && ep.replicas && ep.replicas->size() == W / ep.ep,
        "optimizer: expert shards need ZeRO-1 and ep (", ep.ep, ") dividing the ", W, " ranks");
    ep_ = ep.ep, replicas_ = ep.replicas;
    holder_.resize(slots_.size());
    for (size_t i = 0; i < slots_.size(); ++i) holder_[i] = ep.holder(slots_[i].name);
  }
  owner_.assign(slots_.size(), 0);
  std::vector<int64_t> owned(static_cast<size_t>(W), 0);
  std::vector<size_t> order(slots_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return slots_[a].param.numel() > slots_[b].param.numel();
  });
  // Largest first to the least-loaded rank among those that run the parameter.
  for (size_t i : order) {
    if (slots_[i].group == ParamGroup::BalancerOwned) continue;
    int best = -1;
    for (int r = 0; r < W; ++r)
      if (has(r, i) &&
          (best < 0 || owned[static_cast<size_t>(r)] < owned[static_cast<size_t>(best)]))
        best = r;
    owner_[i] = best;
    owned[static_cast<size_t>(best)] += slots_[i].param.numel();
  }
  if (zero_)  // ZeRO-1: the moments of other ranks' parameters are not kept
    for (size_t i = 0; i < slots_.size(); ++i)
      if (!mine(i)) slots_[i].exp_avg = slots_[i].exp_avg_sq = slots_[i].moment = Tensor();
}

// This rank's packed gradient, by receiver r: the gradients of r's parameters that this rank
// runs, in slot order, then one "has a gradient" flag per parameter. seg_[r] is the offset of
// r's segment, seg_[W] the total. An owner runs all its parameters, so its own segment is the
// layout of its sums (unpack_gradients).
void Optimizer::layout() {
  if (!seg_.empty()) return;
  const int W = sharded() ? comm_->size() : 1;
  seg_.assign(static_cast<size_t>(W) + 1, 0);
  params_.assign(static_cast<size_t>(W), 0);
  for (int r = 0; r < W; ++r) {
    const auto ur = static_cast<size_t>(r);
    params_[ur] = sent_params(r, me());
    seg_[ur + 1] = seg_[ur] + sent_values(r, me());
  }
}

void Optimizer::pack_gradients(float* out) const {
  const int W = static_cast<int>(seg_.size()) - 1;
  for (int r = 0; r < W; ++r) {
    size_t off = seg_[static_cast<size_t>(r)], flag = off + params_[static_cast<size_t>(r)];
    for_sent(r, me(), [&](size_t i) {
      const Tensor g = slots_[i].param.grad();
      const auto n = static_cast<size_t>(slots_[i].param.numel());
      if (g.defined()) {
        const Tensor h = host_f32(g);
        std::memcpy(out + off, h.data<float>(), n * sizeof(float));
        out[flag] = 1.0f;
      } else {
        std::fill(out + off, out + off + n, 0.0f);
        out[flag] = 0.0f;
      }
      off += n, ++flag;
    });
  }
}

void Optimizer::unpack_gradients(int r, const float* seg) {
  size_t off = 0, flag = sent_params(r, r);
  for_owned(r, [&](size_t i) {
    Slot& s = slots_[i];
    const auto n = static_cast<size_t>(s.param.numel());
    if (seg[flag] > 0) {
      Tensor g = Tensor::empty(s.param.shape());
      std::memcpy(g.data<float>(), seg + off, n * sizeof(float));
      s.param.set_grad(g.to(s.param.device()).to(s.param.dtype()));
    } else {
      s.param.zero_grad();
    }
    off += n, ++flag;
  });
}

void Optimizer::stash_gradients() {
  NoGradGuard ng;
  layout();
  std::vector<float> g(seg_.back());
  pack_gradients(g.data());
  zero_grad();
  if (sharded()) {
    stash_.push_back(std::move(g));
    return;
  }
  // One process: add up as we go, in micro-batch order.
  if (stash_.empty()) {
    stash_.push_back(std::move(g));
    return;
  }
  add_segment(0, g.data(), stash_[0].data());
}

// acc (this rank's sums, its own segment's layout) += x, the segment rank q sent, parameter by
// parameter: a parameter's first gradient is copied, later ones added (float adds in
// micro-batch order, as autograd would accumulate). Parameters q does not run are skipped.
void Optimizer::add_segment(int q, const float* x, float* acc) const {
  const int r = me();
  size_t off = 0, flag = sent_params(r, r), xoff = 0, xflag = sent_params(r, q);
  for_owned(r, [&](size_t i) {
    const auto n = static_cast<size_t>(slots_[i].param.numel());
    if (has(q, i)) {
      if (x[xflag] > 0) {
        if (acc[flag] > 0) {
          for (size_t k = 0; k < n; ++k) acc[off + k] += x[xoff + k];
        } else {
          std::memcpy(acc + off, x + xoff, n * sizeof(float));
          acc[flag] = 1.0f;
        }
      }
      xoff += n, ++xflag;
    }
    off += n, ++flag;
  });
}

void Optimizer::reduce_gradients(int64_t micro_batches, int64_t group) {
  NoGradGuard ng;
  if (stash_.empty() && !sharded()) return;
  layout();
  const int W = static_cast<int>(seg_.size()) - 1;
  const auto me_ = static_cast<size_t>(me());
  std::vector<size_t> counts(static_cast<size_t>(W));
  for (size_t r = 0; r < counts.size(); ++r) counts[r] = seg_[r + 1] - seg_[r];
  std::vector<float> mine_sum(counts[me_], 0.0f);
  if (!stash_.empty() && !sharded()) {
    unpack_gradients(0, stash_[0].data());
    stash_.clear();
    return;
  }
  if (micro_batches > 0) {
    // Deterministic: every stashed micro-batch's slice to its owner (one all-to-all), summed
    // there in the global micro-batch order. Ranks deal micro-batches in groups of `group` (context
    // parallel: the chunk ranks of one data-parallel rank share its micro-batches): rank r holds
    // ceil((n - r / group) / (W / group)) of them, the j-th being micro-batch j * (W / group) + r /
    // group.
    const auto n_micro = static_cast<size_t>(micro_batches), grp = static_cast<size_t>(group);
    MYRIAD_CHECK(group >= 1 && W % group == 0, "optimizer: group ", group, " of ", W, " ranks");
    const size_t dealt = static_cast<size_t>(W) / grp;  // (possibly none)
    const auto held = [&](size_t q) { return (n_micro + dealt - 1 - q / grp) / dealt; };
    MYRIAD_CHECK(stash_.size() == held(me_), "optimizer: ", stash_.size(),
                 " stashed micro-batches on rank ", me_, ", expected ", held(me_), " of ", n_micro);
    std::vector<float> send(stash_.size() * seg_.back());
    std::vector<size_t> send_bytes(static_cast<size_t>(W)), recv_bytes(static_cast<size_t>(W));
    std::vector<size_t> from(static_cast<size_t>(W)), at(static_cast<size_t>(W) + 1, 0);
    size_t off = 0;
    for (size_t r = 0; r < static_cast<size_t>(W); ++r) {
      for (const auto& g : stash_) {
        std::memcpy(send.data() + off, g.data() + seg_[r], counts[r] * sizeof(float));
        off += counts[r];
      }
      send_bytes[r] = stash_.size() * counts[r] * sizeof(float);
      // What rank r sends here: its segment for this rank, once per micro-batch it stashed.
      from[r] = sent_values(static_cast<int>(me_), static_cast<int>(r));
      recv_bytes[r] = held(r) * from[r] * sizeof(float);
      at[r + 1] = at[r] + held(r) * from[r];
    }
    stash_.clear();
    std::vector<float> recv(at.back());
    comm_->all_to_all("dp_all_to_all_grads", send.data(), send_bytes, recv.data(), recv_bytes);
    for (size_t j = 0; j < held(0); ++j)
      for (size_t q = 0; q < static_cast<size_t>(W); ++q)
        if (j < held(q))
          add_segment(static_cast<int>(q), recv.data() + at[q] + j * from[q], mine_sum.data());
  } else {
    // The gradients in reduce-scatters (the bytes the planner predicts): the parameters every
    // rank runs over all ranks, an expert's over the ranks that run it; the "has a gradient"
    // flags in a small all-reduce of their own.
    std::vector<float> packed(seg_.back());
    pack_gradients(packed.data());
    std::vector<float> shared, expert, shared_sum, expert_sum;
    std::vector<double> flags;
    std::vector<size_t> sh(static_cast<size_t>(W), 0), flag_at(static_cast<size_t>(W));
    std::vector<size_t> ex(static_cast<size_t>(replicas_ ? replicas_->size() : 0), 0);
    for (int r = 0; r < W; ++r) {
      const auto ur = static_cast<size_t>(r);
      size_t off = seg_[ur], flag = off + params_[ur];
      flag_at[ur] = flags.size();
      for_owned(r, [&](size_t i) {
        const auto n = static_cast<size_t>(slots_[i].param.numel());
        if (!has(me(), i)) {
          flags.push_back(0.0);
          return;
        }
        std::vector<float>& dst = everywhere(i) ? shared : expert;
        dst.insert(dst.end(), packed.begin() + static_cast<std::ptrdiff_t>(off),
                   packed.begin() + static_cast<std::ptrdiff_t>(off + n));
        (&dst == &shared ? sh[ur] : ex[ur / static_cast<size_t>(ep_)]) += n;
        flags.push_back(packed[flag]);
        off += n, ++flag;
      });
    }
    shared_sum.resize(sh[me_]);
    comm_->reduce_scatter_sum("dp_reduce_scatter", shared.data(), shared_sum.data(), sh);
    if (replicas_) {
      expert_sum.resize(ex[static_cast<size_t>(replicas_->rank())]);
      replicas_->reduce_scatter_sum("expert_reduce_scatter", expert.data(), expert_sum.data(), ex);
    }
    comm_->all_reduce_sum("dp_grad_flags", flags.data(), flags.size());
    size_t off = 0, flag = params_[me_], s_at = 0, e_at = 0, k = flag_at[me_];
    for_owned(static_cast<int>(me_), [&](size_t i) {
      const auto n = static_cast<size_t>(slots_[i].param.numel());
      const bool is_shared = everywhere(i);
      const float* src = is_shared ? shared_sum.data() + s_at : expert_sum.data() + e_at;
      std::memcpy(mine_sum.data() + off, src, n * sizeof(float));
      (is_shared ? s_at : e_at) += n;
      mine_sum[flag] = static_cast<float>(flags[k]);
      off += n, ++flag, ++k;
    });
  }
  if (zero_) {
    unpack_gradients(static_cast<int>(me_), mine_sum.data());
    return;
  }
  // Replicated optimizer: the summed segments to every rank (the same bits everywhere).
  std::vector<size_t> bytes(counts);
  for (size_t& b : bytes) b *= sizeof(float);
  std::vector<float> full(seg_.back());
  comm_->all_gather("dp_all_gather_grads", mine_sum.data(), full.data(), bytes);
  for (int r = 0; r < W; ++r) unpack_gradients(r, full.data() + seg_[static_cast<size_t>(r)]);
}

template <class Pick, class RankOf>
void Optimizer::gather_weights(dist::Comm& c, const char* name, Pick&& pick, RankOf&& rank_of) {
  const int G = c.size();
  std::vector<size_t> counts(static_cast<size_t>(G), 0);
  for (int k = 0; k < G; ++k)
    for_owned(rank_of(k), [&](size_t i) {
      if (pick(i)) counts[static_cast<size_t>(k)] += static_cast<size_t>(slots_[i].param.numel());
    });
  std::vector<float> send(counts[static_cast<size_t>(c.rank())]);
  size_t off = 0;
  for_owned(me(), [&](size_t i) {
    if (!pick(i)) return;
    const Tensor h = host_f32(slots_[i].param);
    std::memcpy(send.data() + off, h.data<float>(), h.nbytes());
    off += static_cast<size_t>(h.numel());
  });
  std::vector<size_t> bytes(counts);
  for (size_t& b : bytes) b *= sizeof(float);
  std::vector<float> all(std::accumulate(counts.begin(), counts.end(), size_t{0}));
  c.all_gather(name, send.data(), all.data(), bytes);
  off = 0;
  for (int k = 0; k < G; ++k)
    for_owned(rank_of(k), [&](size_t i) {
      if (!pick(i)) return;
      Slot& s = slots_[i];
      const auto n = static_cast<size_t>(s.param.numel());
      if (rank_of(k) != me()) {
        Tensor h = Tensor::empty(s.param.shape());
        std::memcpy(h.data<float>(), all.data() + off, n * sizeof(float));
        write_back(s.param, h);
        if (s.mirror.defined()) s.mirror.copy_(h);
      }
      off += n;
    });
}

void Optimizer::sync_experts() {
  if (!replicas_) return;
  NoGradGuard ng;
  gather_weights(
      *comm_, "ep_sync_experts", [&](size_t i) { return !everywhere(i); }, [](int k) { return k; });
}

std::map<std::string, Tensor> Optimizer::owned_state_dict() const {
  std::map<std::string, Tensor> sd = state_dict();
  if (!sharded()) return sd;
  if (comm_->rank() != 0) sd.erase("step");
  for (size_t i = 0; i < slots_.size(); ++i)
    if (!mine(i)) sd.erase(slots_[i].name + ".step");
  return sd;
}

std::map<std::string, Tensor> Optimizer::gathered_state_dict() const {
  if (!sharded() || !zero_) return state_dict();
  const int W = comm_->size();
  // Rank r's bytes: for each of its parameters in slot order, its moment tensors then its step.
  auto slot_bytes = [&](size_t i) {
    const Slot& s = slots_[i];
    const auto n = static_cast<size_t>(s.param.numel()) * sizeof(float);
    return (s.muon ? n : 2 * n) + sizeof(int64_t);
  };
  std::vector<size_t> counts(static_cast<size_t>(W), 0);
  for (int r = 0; r < W; ++r)
    for_owned(r, [&](size_t i) { counts[static_cast<size_t>(r)] += slot_bytes(i); });
  std::vector<char> send(counts[static_cast<size_t>(comm_->rank())]);
  size_t off = 0;
  auto put = [&](const void* p, size_t n) {
    std::memcpy(send.data() + off, p, n);
    off += n;
  };
  for_owned(comm_->rank(), [&](size_t i) {
    const Slot& s = slots_[i];
    for (const Tensor* t : {&s.moment, &s.exp_avg, &s.exp_avg_sq})
      if (t->defined()) put(t->data<float>(), t->nbytes());
    put(&s.steps, sizeof(int64_t));
  });
  std::vector<char> all(std::accumulate(counts.begin(), counts.end(), size_t{0}));
  comm_->all_gather("dp_gather_optimizer_state", send.data(), all.data(), counts);
  std::map<std::string, Tensor> sd;
  const int64_t global = step_;
  sd["step"] = Tensor::from_ints(std::span(&global, 1), {1});
  off = 0;
  for (int r = 0; r < W; ++r)
    for_owned(r, [&](size_t i) {
      const Slot& s = slots_[i];
      auto take = [&](const std::string& key) {
        Tensor t = Tensor::empty(s.param.shape());
        std::memcpy(t.data<float>(), all.data() + off, t.nbytes());
        off += t.nbytes();
        sd[s.name + key] = t;
      };
      if (s.muon) {
        take(".momentum_buffer");
      } else {
        take(".exp_avg");
        take(".exp_avg_sq");
      }
      int64_t steps = 0;
      std::memcpy(&steps, all.data() + off, sizeof steps);
      off += sizeof steps;
      sd[s.name + ".step"] = Tensor::from_ints(std::span(&steps, 1), {1});
    });
  return sd;
}

void Optimizer::zero_grad() {
  for (Slot& s : slots_) s.param.zero_grad();
  grad_scale_ = 1;
}

std::vector<std::string> Optimizer::mirror_into(const NamedParams& low) {
  std::vector<std::string> taken;
  for (const auto& [name, t] : low) {
    auto it =
        std::find_if(slots_.begin(), slots_.end(), [&](const Slot& s) { return s.name == name; });
    if (it == slots_.end() || it->group == ParamGroup::BalancerOwned) continue;
    MYRIAD_CHECK(t.defined() && t.shape() == it->param.shape() && t.dtype() == DType::BF16,
                 "Optimizer::mirror_into: ", name, " needs a bf16 tensor of shape ",
                 it->param.desc(), ", got ", t.defined() ? t.desc() : std::string("undefined"));
    it->mirror = t;
    taken.push_back(name);
  }
  return taken;
}

void Optimizer::step(double lr) {
  NoGradGuard ng;
  ++step_;
  for (size_t i = 0; i < slots_.size(); ++i) {
    Slot& s = slots_[i];
    if (s.group == ParamGroup::BalancerOwned || !mine(i) || !s.param.grad().defined()) continue;
    if (s.muon)
      muon_update(s, lr);
    else
      adamw_update(s, lr);
  }
  grad_scale_ = 1;
  if (!sharded() || !zero_) return;
  // ZeRO-1: every owner's updated weights to every rank that runs them: the parameters every
  // rank runs over all ranks, an expert's over its replicas (member k of replicas_ is world rank
  // k * ep + rank % ep).
  gather_weights(
      *comm_, "dp_all_gather", [&](size_t i) { return everywhere(i); }, [](int k) { return k; });
  if (replicas_) {
    const int e = me() % ep_;
    gather_weights(
        *replicas_, "expert_all_gather", [&](size_t i) { return holder_[i] == e; },
        [&](int k) { return k * ep_ + e; });
  }
}

// §1.2 in one pass over the tensor: moments, bias correction, decoupled decay.
void Optimizer::adamw_update(Slot& s, double lr) {
  ++s.steps;
  const double b1 = cfg_.beta1, b2 = cfg_.beta2, eps = cfg_.eps;
  const double wd = s.group == ParamGroup::NoDecay ? 0.0 : cfg_.weight_decay;
  const double bc1 = 1 - std::pow(b1, static_cast<double>(s.steps));
  const double bc2 = 1 - std::pow(b2, static_cast<double>(s.steps));
  Tensor w = host_f32(s.param);
  const Tensor g = s.param.grad();
  // The mirror in the same pass when the kernel writes the parameter itself.
  const bool fused = s.mirror.defined() && w.same(s.param) && s.mirror.device().is_cpu() &&
                     s.mirror.is_contiguous();
  ops::adamw_update(w, readable_grad(g) ? g : host_f32(g), s.exp_avg, s.exp_avg_sq,
                    {lr, b1, b2, eps, wd, bc1, bc2, grad_scale_}, fused ? &s.mirror : nullptr);
  write_back(s.param, w);
  if (s.mirror.defined() && !fused) s.mirror.copy_(s.param);
}

// §1.3: momentum (Nesterov), NS5 per matrix (per expert, per head block), 0.2·√max(A, B) scale.
void Optimizer::muon_update(Slot& s, double lr) {
  const Shape& shape = s.param.shape();
  const int64_t A = shape[shape.size() - 2], B = shape.back();
  const int64_t E = shape.size() == 3 ? shape[0] : 1, a = A / s.heads;
  const double mu = cfg_.momentum;
  const Tensor w = host_f32(s.param), g = host_f32(s.param.grad());
  Tensor gp = Tensor::empty({E * s.heads, a, B});
  float *W = w.data<float>(), *M = s.moment.data<float>(), *P = gp.data<float>();
  const float* G = g.data<float>();
  const bool nesterov = cfg_.nesterov;
  const float gs = grad_scale_;
  cpu::parallel_for(w.numel(), kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const float gi = G[i] * gs;  // clipping's scale, one f32 product
      M[i] = static_cast<float>(mu * M[i] + gi);
      P[i] = nesterov ? static_cast<float>(gi + mu * M[i]) : M[i];
    }
  });
  const Tensor O = newton_schulz5(gp);
  const float* Op = O.data<float>();
  const double scale = 0.2 * std::sqrt(static_cast<double>(std::max(a, B)));
  const double wd = cfg_.weight_decay;
  cpu::parallel_for(w.numel(), kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      W[i] = static_cast<float>(W[i] - lr * (scale * Op[i] + wd * W[i]));
  });
  write_back(s.param, w);
  if (s.mirror.defined()) s.mirror.copy_(s.param);
}

Tensor newton_schulz5(const Tensor& g_NAB, int steps) {
  MYRIAD_CHECK(g_NAB.dim() == 3, "newton_schulz5: expected [N, A, B], got ", g_NAB.desc());
  NoGradGuard ng;
  const Tensor g = host_f32(g_NAB);
  const int64_t N = g.size(0), A = g.size(1), B = g.size(2);
  const bool tr = A > B;  // iterate on the wide orientation: X Xᵀ is the smaller Gram matrix
  const int64_t r = tr ? B : A, c = tr ? A : B;
  Tensor X = Tensor::empty({N, r, c});
  const float* gp = g.data<float>();
  float* xp = X.data<float>();
  for (int64_t n = 0; n < N; ++n) {
    const float* src = gp + n * A * B;
    double ss = 0;
    for (int64_t i = 0; i < A * B; ++i) ss += static_cast<double>(src[i]) * src[i];
    const float inv = static_cast<float>(1.0 / (std::sqrt(ss) + 1e-7));
    float* dst = xp + n * A * B;
    for (int64_t i = 0; i < A; ++i)
      for (int64_t j = 0; j < B; ++j) dst[tr ? j * A + i : i * B + j] = src[i * B + j] * inv;
  }
  const double ka = 3.4445, kb = -4.7750, kc = 2.0315;
  for (int it = 0; it < steps; ++it) {
    const Tensor P = ops::matmul(X, ops::transpose(X, -2, -1));
    const Tensor Q = ops::add(ops::mul(P, kb), ops::mul(ops::matmul(P, P), kc));
    X = ops::add(ops::mul(X, ka), ops::matmul(Q, X));
  }
  X = X.contiguous();
  if (!tr) return X;
  Tensor out = Tensor::empty({N, A, B});
  const float* x = X.data<float>();
  float* o = out.data<float>();
  for (int64_t n = 0; n < N; ++n)
    for (int64_t i = 0; i < A; ++i)
      for (int64_t j = 0; j < B; ++j) o[n * A * B + i * B + j] = x[n * A * B + j * A + i];
  return out;
}

std::map<std::string, Tensor> Optimizer::state_dict() const {
  std::map<std::string, Tensor> sd;
  const int64_t global = step_;
  sd["step"] = Tensor::from_ints(std::span(&global, 1), {1});
  for (const Slot& s : slots_) {
    if (s.group == ParamGroup::BalancerOwned) continue;
    if (s.exp_avg.defined()) sd[s.name + ".exp_avg"] = s.exp_avg.clone();
    if (s.exp_avg_sq.defined()) sd[s.name + ".exp_avg_sq"] = s.exp_avg_sq.clone();
    if (s.moment.defined()) sd[s.name + ".momentum_buffer"] = s.moment.clone();
    sd[s.name + ".step"] = Tensor::from_ints(std::span(&s.steps, 1), {1});
  }
  return sd;
}

void Optimizer::load_state_dict(const std::map<std::string, Tensor>& sd) {
  auto get = [&](const std::string& key) -> const Tensor& {
    auto it = sd.find(key);
    MYRIAD_CHECK(it != sd.end(), "Optimizer::load_state_dict: missing '", key, "'");
    return it->second;
  };
  auto load = [&](const std::string& key, Tensor& dst) {
    if (!dst.defined()) return;
    const Tensor& src = get(key);
    MYRIAD_CHECK(src.shape() == dst.shape(), "Optimizer::load_state_dict: '", key, "' is ",
                 src.desc(), ", expected ", shape_str(dst.shape()));
    dst.copy_(src);
  };
  for (Slot& s : slots_) {
    if (s.group == ParamGroup::BalancerOwned) continue;
    load(s.name + ".exp_avg", s.exp_avg);
    load(s.name + ".exp_avg_sq", s.exp_avg_sq);
    load(s.name + ".momentum_buffer", s.moment);
    s.steps = get(s.name + ".step").to_ints().at(0);
  }
  step_ = get("step").to_ints().at(0);
}

double qk_clip(NamedParams& named_params, const std::map<int64_t, std::vector<double>>& s_max,
               double tau, int64_t heads, int64_t d_nope, int64_t d_pe) {
  NoGradGuard ng;
  auto find = [&](const std::string& name) -> Tensor* {
    for (auto& [n, t] : named_params)
      if (n == name) return &t;
    return nullptr;
  };
  // Scales rows [first, first + count) of each head block of `rows_per_head` rows.
  auto scale_rows = [](Tensor& t, int64_t rows_per_head, int64_t h, int64_t first, int64_t count,
                       double f) {
    const Tensor w = host_f32(t);
    const int64_t cols = w.numel() / w.size(0);
    float* p = w.data<float>() + (h * rows_per_head + first) * cols;
    for (int64_t i = 0; i < count * cols; ++i) p[i] = static_cast<float>(p[i] * f);
    write_back(t, w);
  };
  int64_t total = 0, clipped = 0;
  for (const auto& [layer, smax] : s_max) {
    const std::string p = "model.layers." + std::to_string(layer) + ".self_attn.";
    Tensor* q = find(p + "q_b_proj.weight");
    if (!q) q = find(p + "q_proj.weight");
    Tensor* kvb = find(p + "kv_b_proj.weight");
    MYRIAD_CHECK(q && kvb, "qk_clip: layer ", layer, " has no q_proj/q_b_proj or kv_b_proj");
    MYRIAD_CHECK(static_cast<int64_t>(smax.size()) == heads, "qk_clip: layer ", layer, " has ",
                 smax.size(), " S_max values for ", heads, " heads");
    MYRIAD_CHECK(q->dim() == 2 && q->size(0) == heads * (d_nope + d_pe), "qk_clip: ", p,
                 " query weight ", q->desc(), " is not [H·(d_nope + d_pe), *] with H = ", heads);
    MYRIAD_CHECK(kvb->dim() == 2 && kvb->size(0) % heads == 0 && kvb->size(0) / heads > d_nope,
                 "qk_clip: ", p, "kv_b_proj.weight ", kvb->desc(), " does not hold ", heads,
                 " heads of ", d_nope, " W^UK rows");
    const int64_t kv_rows = kvb->size(0) / heads;
    for (int64_t h = 0; h < heads; ++h) {
      ++total;
      if (!(smax[h] > tau)) continue;
      ++clipped;
      const double gamma = tau / smax[h], root = std::sqrt(gamma);
      scale_rows(*q, d_nope + d_pe, h, 0, d_nope, root);
      scale_rows(*q, d_nope + d_pe, h, d_nope, d_pe, gamma);
      scale_rows(*kvb, kv_rows, h, 0, d_nope, root);
    }
  }
  return total == 0 ? 0.0 : static_cast<double>(clipped) / static_cast<double>(total);
}

}  // namespace myriad::train
