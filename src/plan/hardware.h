// The hardware table the planner sizes against (ANCHORS.md §1, §6). Each number carries its
// status: M measured, P published, A assumed (see `sources`).
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace myriad::plan {

struct Hardware {
  std::string name, description;
  bool cpu = false;
  double peak_flops = 0;      // dense bf16 peak (spec), the MFU denominator
  double peak_flops_f32 = 0;  // dense fp32 peak, the denominator for f32 runs
  double gemm_flops = 0;      // bf16 GEMM rate reached in practice (large square GEMM)
  double gemm_flops_f32 = 0;
  double mem_bytes = 0;    // device memory per GPU (or host RAM)
  double usable = 0.9;     // share of mem_bytes a plan may fill (context, NCCL, fragmentation)
  double mem_bw = 0;       // measured streaming bandwidth, bytes/s
  int node_size = 8;       // devices per node sharing the fast link
  double link_bw = 0;      // intra-node collective bandwidth per device and direction
  double net_bw = 0;       // inter-node bandwidth per device (one NIC each)
  double a2a_link_bw = 0;  // all-to-all (EP dispatch/combine) inside a node
  double a2a_net_bw = 0;   // all-to-all across nodes
  // Achievable shares of gemm_flops for the non-GEMM kernels (A): flash attention and chunked
  // KDA (FlashKDA ≈ 26% of peak, ANCHORS.md §4).
  double attn_eff = 0.6, kda_eff = 0.3;
  std::string sources;
};

const Hardware& hardware(std::string_view name);  // throws naming the known names
std::vector<std::string> hardware_names();

}  // namespace myriad::plan
