// Training memory per device for a parallel layout: weights, gradients, fp32 master and
// optimiser states (ZeRO-sharded over the replicas), and the activations the autograd tape keeps
// for backward, with and without full recomputation.
//
// Layout: world = dp · cp · pp. Non-expert weights are replicated over dp · cp inside a pipeline
// stage; routed experts are sharded over ep ranks (ep divides dp · cp) and replicated over
// dp · cp / ep. There is no tensor parallelism.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "plan/hardware.h"
#include "plan/params.h"

namespace myriad::plan {

struct Layout {
  int64_t dp = 1, ep = 1, pp = 1, cp = 1;
  int64_t gpus() const { return dp * pp * cp; }
  std::string str() const;  // "dp8 ep8 pp2 cp1"
};

enum class Recompute : uint8_t { None, Full };
enum class Optimizer : uint8_t { Muon, AdamW };
// How context parallelism passes state between a sequence's chunks: Scan, a prefix scan of the
// KDA segment transitions with the MLA latents all-gathered (what large layouts want); Carry,
// the decode state handed rank to rank in chunk order and its gradient back (what the engine
// runs today, docs/DISTRIBUTED.md).
enum class CpMode : uint8_t { Scan, Carry };

struct TrainSetup {
  Layout layout;
  int64_t seq = 4096;       // tokens per sequence
  int64_t batch = 1;        // global batch in sequences per optimiser step
  int64_t micro_batch = 1;  // sequences per micro-batch and data-parallel rank
  Recompute recompute = Recompute::None;
  Optimizer optimizer = Optimizer::Muon;
  bool bf16 = true;  // bf16 weights/activations + fp32 master; false: everything f32 (CPU)
  int zero = 1;      // 1: master + optimiser states sharded; 2: + gradients; 3: + weights
  CpMode cp_mode = CpMode::Scan;
  // Micro-batches each pipeline runs per step, and tokens one rank holds per micro-batch.
  int64_t micro_batches() const { return batch / (layout.dp * micro_batch); }
  int64_t tokens_per_micro() const { return micro_batch * seq / layout.cp; }
  // Why the setup cannot run as asked, or "" when it can.
  std::string invalid_reason(const ModelConfig& c) const;
};

// Values per token (and per sequence) that the autograd tape keeps for backward through one
// decoder layer, split by storage precision. "act" values are in the activation dtype (bf16 or
// f32), "f32" ones always fp32. Derived op by op from the model code (MODEL.md §3-§8 as
// composed in src/model/); see memory.cpp.
struct LayerActivations {
  double act = 0, f32 = 0;      // per token
  double f32_per_sequence = 0;  // e.g. KDA final states
  double f32_per_micro = 0;     // per micro-batch, e.g. the head's dW buffer
  // Bytes for one micro-batch of `seqs` sequences of `tokens` tokens each (on this rank).
  double bytes(int act_bytes, double tokens, double seqs) const {
    return tokens * (act * act_bytes + f32 * 4) + 4 * (seqs * f32_per_sequence + f32_per_micro);
  }
};
LayerActivations layer_activations(const ModelConfig& c, int64_t layer, int64_t tokens_per_seq);
// The head: final norm, AttnRes output mix, and the fused cross-entropy's saved dh plus its
// f32 dW buffer [V, d] (computed during the forward).
LayerActivations head_activations(const ModelConfig& c);

// The [begin, end) layer range of each pipeline stage: contiguous, sizes differing by at most
// one, the larger ones last (stage 0 keeps the most micro-batches in flight). The embedding sits
// on the first stage and the head on the last.
std::vector<std::pair<int64_t, int64_t>> stage_layers(int64_t num_layers, int64_t pp);

struct MemoryBreakdown {
  int64_t stage = 0;        // the pipeline stage this describes (the largest)
  double params_local = 0;  // parameters held on one device (before ZeRO-3 sharding)
  double weights = 0, grads = 0, master = 0, optimizer = 0;
  double activations = 0;       // as the setup's recompute mode keeps them, all in-flight
  double activations_none = 0;  // the same without recomputation
  double activations_full = 0;  // the same with full recomputation
  double workspace = 0;         // EP buffers, logits chunk, one layer's gradients in flight
  // weights + master + optimizer + grads + activations + workspace; on CPU hardware with one
  // micro-batch per step, gradients and the tape do not coexist (zero_grad frees the gradients)
  // and only the larger of grads and activations + workspace counts.
  double total = 0;
  double capacity = 0;  // usable bytes per device
  bool fits() const { return total <= capacity; }
};

MemoryBreakdown training_memory(const ModelConfig& c, const ParamCounts& pc, const Hardware& hw,
                                const TrainSetup& s);

}  // namespace myriad::plan
