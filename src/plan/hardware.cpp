#include "plan/hardware.h"

#include "core/error.h"

namespace myriad::plan {
namespace {

constexpr double GiB = 1024.0 * 1024.0 * 1024.0;

std::vector<Hardware> make_table() {
  std::vector<Hardware> t;
  Hardware h200;
  h200.name = "h200";
  h200.description = "NVIDIA H200 SXM, HGX 8-GPU node, NVLink 4, 400 Gb/s InfiniBand per GPU";
  h200.peak_flops = 989e12;      // P
  h200.peak_flops_f32 = 67e12;   // P (no tensor cores)
  h200.gemm_flops = 800e12;      // M: bf16 8192^3 GEMM, 796-803 TFLOP/s
  h200.gemm_flops_f32 = 60e12;   // A: 90% of the fp32 peak
  h200.mem_bytes = 140.0 * GiB;  // P: "141 GB"; the loaned H200 shows about 139 GiB
  h200.mem_bw = 4.24e12;         // M: 1 GiB device copy
  h200.node_size = 8;
  h200.link_bw = 360e9;      // A: 80% of NVLink 4's 450 GB/s per direction
  h200.net_bw = 45e9;        // A: 90% of 400 Gb/s
  h200.a2a_link_bw = 360e9;  // A: DeepEP reached 96% of H800's NVLink; 80% assumed here
  h200.a2a_net_bw = 45e9;    // P: DeepEP internode 43-58 GB/s on CX7 400 Gb/s
  h200.sources =
      "bf16 peak 989 TFLOP/s (P); GEMM 800 TFLOP/s and HBM 4.24 TB/s measured on one H200 (M, "
      "ANCHORS.md §1); 140 GiB HBM (P); NVLink 360 GB/s and IB 45 GB/s per GPU (A, DeepEP "
      "ANCHORS.md §6)";
  t.push_back(h200);

  Hardware h100 = h200;
  h100.name = "h100";
  h100.description = "NVIDIA H100 SXM 80GB, HGX 8-GPU node, NVLink 4, 400 Gb/s InfiniBand per GPU";
  h100.mem_bytes = 80.0 * GiB;   // P
  h100.mem_bw = 3.35e12 * 0.88;  // A: H200's measured 88% of spec applied
  h100.gemm_flops = 750e12;      // A: a little below the H200's measured 800 (power limit)
  h100.sources = "as h200, with 80 GiB and 3.35 TB/s spec HBM (P); GEMM rate assumed (A)";
  t.push_back(h100);

  Hardware zen5;
  zen5.name = "zen5";
  zen5.description = "2-core Zen 5 VM (AVX-512 BF16), oneDNN, the development machine";
  zen5.cpu = true;
  zen5.peak_flops = 0.75e12;      // M + D: ≈128 bf16 FLOP/cycle/core
  zen5.gemm_flops = 0.69e12;      // M: oneDNN bf16 GEMM
  zen5.gemm_flops_f32 = 0.30e12;  // M: oneDNN f32 GEMM 255-350 GFLOP/s
  zen5.mem_bytes = 23.0 * GiB;    // M: the VM's RAM
  zen5.usable = 0.8;
  zen5.mem_bw = 33e9;  // M: one-thread stream
  zen5.node_size = 1;
  zen5.link_bw = zen5.a2a_link_bw = 33e9;
  zen5.net_bw = zen5.a2a_net_bw = 12.5e9;  // A: 100 GbE between hosts
  zen5.attn_eff = 0.3;
  zen5.kda_eff = 0.2;
  zen5.sources = "ANCHORS.md §1 CPU rows (M); 23 GiB RAM of the dev VM (M); 100 GbE assumed (A)";
  t.push_back(zen5);
  return t;
}

const std::vector<Hardware>& table() {
  static const std::vector<Hardware> t = make_table();
  return t;
}

}  // namespace

const Hardware& hardware(std::string_view name) {
  for (const auto& h : table())
    if (h.name == name) return h;
  throw Error(cat("plan: unknown hardware '", name, "' (known: h200, h100, zen5)"));
}

std::vector<std::string> hardware_names() {
  std::vector<std::string> out;
  for (const auto& h : table()) out.push_back(h.name);
  return out;
}

}  // namespace myriad::plan
