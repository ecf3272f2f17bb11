// FLOPs per token and a roofline estimate of one training step: each piece of work takes the
// longer of its FLOPs at the GEMM rate (scaled for attention and KDA kernels) and its bytes at
// the memory bandwidth, pipelined with 1F1B, plus the exposed communication.
#pragma once
#include "plan/comm.h"

namespace myriad::plan {

struct FlopCounts {      // forward FLOPs per token
  double matmul = 0;     // 2 × active matrix parameters (the embedding lookup excluded)
  double attention = 0;  // MLA softmax attention, causal, averaged over a sequence of `seq`
  double kda = 0;  // chunked KDA, H·(6d_k² + 3·C·d_k + C²) with C = 64 (Kimi Linear eq. 13)
  double total() const { return matmul + attention + kda; }
};
FlopCounts forward_flops_per_token(const ModelConfig& c, const ParamCounts& pc, int64_t seq);

struct StageTime {  // one micro-batch through the slowest stage, forward + backward (+ recompute)
  double gemm = 0, experts = 0, attention = 0, kda = 0, memory = 0;
  double total() const { return gemm + experts + attention + kda + memory; }
};

struct StepEstimate {
  double tokens = 0;                 // per optimiser step, all replicas
  double model_flops_per_token = 0;  // 3 × forward (llm.c convention: 6N + attention)
  double hw_flops_per_token = 0;     // including recomputation
  double expert_tokens = 0;          // tokens per local expert per micro-batch
  StageTime stage;
  double compute = 0, bubble = 0, optimizer = 0, comm_exposed = 0, step = 0;
  double mfu = 0;  // model FLOPs / (step · devices · peak): bf16 peak, fp32 peak for f32 runs
  double tokens_per_s = 0, tokens_per_s_per_device = 0;
};

// Fills *comm (which needs the backward time to judge overlap) when given.
StepEstimate training_step(const ModelConfig& c, const ParamCounts& pc, const Hardware& hw,
                           const TrainSetup& s, CommBreakdown* comm = nullptr);

}  // namespace myriad::plan
