// Training memory on the CPU, predicted against measured (planner issue: "predicted memory for
// small CPU training runs is within 15% of measured peak"). scripts/check_plan_memory.sh runs it.
//
//   bench_train_memory <preset | config> [--seq=256] [--batch=8] [--steps=3] [--adamw=0]
//                      [--bf16=0] [--tolerance=0.15]
//
// Measured: the CPU arena's high-water mark of bytes handed out (AllocatorStats::peak, every
// tensor: weights, gradients, optimiser state, the autograd tape, workspaces) minus the bytes in
// use before the model exists, over `steps` optimiser steps run as the trainer runs them (one
// micro-batch of [batch, seq] tokens: zero_grad, Trainer::sequence_loss, backward, global-norm
// clip, Muon or AdamW; with --bf16=1 a bf16 working copy runs forward and backward and its
// gradients are accumulated into fp32 master gradients, as precision = "bf16" does). VmHWM − the
// baseline VmRSS is printed too (it adds the arena's cached free blocks, oneDNN and libraries).
// Predicted: plan::training_memory for the same config, seq, batch (one micro-batch), optimiser
// and precision on the "zen5" hardware entry, one device, no recomputation. Exit status 1 when
// |predicted / measured − 1| > tolerance.
#include <omp.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "bench_util.h"
#include "core/allocator.h"
#include "core/autograd.h"
#include "model/decoder.h"
#include "ops/elementwise.h"
#include "plan/memory.h"
#include "train/mixed_precision.h"
#include "train/optim.h"
#include "train/trainer.h"

namespace {

using namespace myriad;

double proc_status_kb(const char* key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(key, 0) == 0) return std::atof(line.c_str() + std::string(key).size());
  return 0;
}

constexpr double MiB = 1024.0 * 1024.0;

}  // namespace

int main(int argc, char** argv) {
  const auto seq = static_cast<int64_t>(myriad::bench::take_flag(argc, argv, "seq", "SEQ", 256));
  const auto batch =
      static_cast<int64_t>(myriad::bench::take_flag(argc, argv, "batch", "BATCH", 8));
  const int steps = static_cast<int>(myriad::bench::take_flag(argc, argv, "steps", "STEPS", 3));
  const bool adamw = myriad::bench::take_flag(argc, argv, "adamw", "ADAMW", 0) != 0;
  const bool bf16 = myriad::bench::take_flag(argc, argv, "bf16", "BF16", 0) != 0;
  const double tol = myriad::bench::take_flag(argc, argv, "tolerance", "TOLERANCE", 0.15);
  if (argc != 2) {
    std::fprintf(stderr,
                 "usage: bench_train_memory <preset | config> [--seq=256] [--batch=8] "
                 "[--steps=3] [--adamw=0] [--bf16=0] [--tolerance=0.15]\n");
    return 2;
  }
  try {
    const std::string name = argv[1];
    const model::ModelConfig c =
        std::filesystem::exists(name) ? model::ModelConfig::load(name) : model::preset(name);
    Allocator& arena = allocator_for(DeviceType::CPU);
    const size_t base = arena.stats().in_use;
    const double rss0 = proc_status_kb("VmRSS:");

    model::Decoder dec = model::Decoder::random(c, 1);
    dec.weights().requires_grad_(true);
    train::OptimConfig oc;
    oc.matrix_optimizer = adamw ? "adamw" : "muon";
    oc.lr = 1e-3;
    train::Optimizer opt(train::Trainer::optimizer_params(dec), oc);
    std::optional<train::Bf16Copy> shadow;
    if (bf16) shadow.emplace(dec), shadow->attach(opt);

    std::vector<int64_t> ids(batch * (seq + 1));
    for (size_t i = 0; i < ids.size(); ++i)
      ids[i] = static_cast<int64_t>((i * 2654435761u) % static_cast<uint64_t>(c.vocab_size));
    std::vector<int64_t> in, lab;
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t t = 0; t < seq; ++t) {
        in.push_back(ids[b * (seq + 1) + t]);
        lab.push_back(ids[b * (seq + 1) + t + 1]);
      }
    const Tensor x = Tensor::from_ints(in, {batch, seq}), y = Tensor::from_ints(lab, {batch, seq});
    double loss = 0;
    // Last step, in MiB above the baseline: in use after the forward (weights, optimiser state
    // and the tape), and the high-water mark after the forward, the backward and the update.
    double fwd_in_use = 0, fwd_peak = 0, bwd_peak = 0, upd_peak = 0;
    auto mib = [&](size_t v) { return static_cast<double>(v - base) / MiB; };
    for (int s = 0; s < steps; ++s) {
      opt.zero_grad();
      Tensor l = train::Trainer::sequence_loss(shadow ? shadow->decoder() : dec, x, y);
      fwd_in_use = mib(arena.stats().in_use);
      fwd_peak = mib(arena.stats().peak);
      l.backward();
      bwd_peak = mib(arena.stats().peak);
      loss = l.item();
      if (shadow) shadow->accumulate_grads();
      opt.clip_grad_norm();
      opt.step(oc.lr);
      upd_peak = mib(arena.stats().peak);
      if (shadow) shadow->refresh_buffers();
    }
    const double measured = static_cast<double>(arena.stats().peak - base);
    const double rss = (proc_status_kb("VmHWM:") - rss0) * 1024.0;

    plan::TrainSetup su;
    su.seq = seq;
    su.batch = batch;
    su.micro_batch = batch;
    su.recompute = plan::Recompute::None;
    su.optimizer = adamw ? plan::Optimizer::AdamW : plan::Optimizer::Muon;
    su.bf16 = bf16;
    su.zero = 0;
    const plan::MemoryBreakdown p =
        plan::training_memory(c, plan::count_params(c), plan::hardware("zen5"), su);
    const double ratio = p.total / measured;
    std::printf(
        "bench_train_memory: %s, seq %lld, batch %lld, %s, %s, %d steps (loss %.4f), %d "
        "threads\n",
        name.c_str(), static_cast<long long>(seq), static_cast<long long>(batch),
        adamw ? "AdamW" : "Muon", bf16 ? "bf16 + fp32 master" : "f32", steps, loss,
        omp_get_max_threads());
    std::printf(
        "  predicted (myriad plan, zen5): %.2f MiB = weights %.2f + grads %.2f + master %.2f + "
        "optimizer %.2f + activations %.2f + workspace %.2f\n",
        p.total / MiB, p.weights / MiB, p.grads / MiB, p.master / MiB, p.optimizer / MiB,
        p.activations / MiB, p.workspace / MiB);
    std::printf("  measured peak tensor memory:   %.2f MiB (arena high-water mark - baseline)\n",
                measured / MiB);
    std::printf(
        "  last step: %.2f MiB in use after the forward; high-water mark %.2f after the forward, "
        "%.2f after the backward, %.2f after the update\n",
        fwd_in_use, fwd_peak, bwd_peak, upd_peak);
    std::printf("  measured VmHWM - baseline RSS: %.2f MiB (adds cached blocks, libraries)\n",
                rss / MiB);
    const bool ok = std::abs(ratio - 1) <= tol;
    std::printf("RESULT predicted_mib=%.3f measured_mib=%.3f ratio=%.4f tolerance=%.2f %s\n",
                p.total / MiB, measured / MiB, ratio, tol, ok ? "OK" : "OFF");
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_train_memory: %s\n", e.what());
    return 2;
  }
}
