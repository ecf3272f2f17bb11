// Induction (copying from context) on pure copy data: each row is N random tokens followed by the
// same N tokens again, so the second copy is predictable only by looking back. Trains a model of
// the tiny preset's shape (vocabulary 64) with the recipe optimiser and prints the mean loss
// every 25 steps, and the loss on each copy at the end: the first copy cannot go below ln 60
// ≈ 4.09; a model that has learned induction drives the second copy toward 0 (the mean
// toward 2.05). docs/LONG_CONTEXT.md uses it to separate "the architecture cannot copy" from "the
// data mix gives too little copy signal".
//
//   OMP_NUM_THREADS=1 bench_induction [--layout hybrid|kda|mla] [--layers 8] [--batch 64]
//       [--steps 500] [--lr 3e-3] [--optimizer muon|adamw]
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>

#include "core/autograd.h"
#include "data/corpus.h"
#include "model/config.h"
#include "model/decoder.h"
#include "train/evals.h"
#include "train/optim.h"
#include "train/trainer.h"

using namespace myriad;

int main(int argc, char** argv) {
  CLI::App app{"induction on pure copy data"};
  std::string layout = "hybrid", optimizer = "muon";
  int64_t layers = 8, batch = 64, steps = 500, n = 32;
  double lr = 3e-3;
  app.add_option("--layout", layout, "hybrid (3:1 KDA:MLA), kda or mla")
      ->check(CLI::IsMember({"hybrid", "kda", "mla"}));
  app.add_option("--layers", layers, "layers (hybrid: MLA every 4th, and the last)")
      ->check(CLI::Range(1, 64));
  app.add_option("--batch", batch, "rows per step")->check(CLI::Range(1, 4096));
  app.add_option("--steps", steps, "optimizer steps")->check(CLI::Range(1, 1000000));
  app.add_option("--tokens", n, "random tokens per copy")->check(CLI::Range(2, 4096));
  app.add_option("--lr", lr, "peak learning rate (20 warm-up steps)");
  app.add_option("--optimizer", optimizer, "matrix optimizer")
      ->check(CLI::IsMember({"muon", "adamw"}));
  CLI11_PARSE(app, argc, argv);

  model::ModelConfig c = model::tiny();
  c.vocab_size = 64;
  c.num_hidden_layers = layers;
  c.linear_attn_config.kda_layers.clear();
  c.linear_attn_config.full_attn_layers.clear();
  for (int64_t i = 1; i <= layers; ++i) {
    const bool mla = layout == "mla" || (layout == "hybrid" && (i % 4 == 0 || i == layers));
    (mla ? c.linear_attn_config.full_attn_layers : c.linear_attn_config.kda_layers).push_back(i);
  }
  c.validate();
  model::Decoder dec = model::Decoder::random(c, 1);
  dec.weights().requires_grad_(true);
  train::OptimConfig oc;
  oc.lr = lr;
  oc.matrix_optimizer = optimizer;
  train::Optimizer opt(train::Trainer::optimizer_params(dec), oc);
  data::Rng rng(3);
  const int64_t T = 2 * n;
  std::printf("%s, %lld layers (%zu KDA, %zu MLA), %lld rows of 2 x %lld tokens, %s lr %g\n",
              layout.c_str(), static_cast<long long>(layers),
              c.linear_attn_config.kda_layers.size(), c.linear_attn_config.full_attn_layers.size(),
              static_cast<long long>(batch), static_cast<long long>(n), optimizer.c_str(), lr);
  auto make = [&](std::vector<int64_t>& ids, std::vector<int64_t>& lab) {
    ids.clear(), lab.clear();
    for (int64_t b = 0; b < batch; ++b) {
      std::vector<int64_t> row;
      for (int64_t i = 0; i < n; ++i) row.push_back(4 + static_cast<int64_t>(rng.below(60)));
      row.insert(row.end(), row.begin(), row.end());
      for (int64_t t = 0; t < T; ++t) ids.push_back(row[t]), lab.push_back(row[(t + 1) % T]);
    }
  };
  std::vector<int64_t> ids, lab;
  double avg = 0;
  for (int64_t step = 0; step < steps; ++step) {
    make(ids, lab);
    Tensor loss = train::Trainer::sequence_loss(dec, Tensor::from_ints(ids, {batch, T}),
                                                Tensor::from_ints(lab, {batch, T}));
    opt.zero_grad();
    loss.backward();
    opt.clip_grad_norm();
    opt.step(step < 20 ? lr * static_cast<double>(step + 1) / 20 : lr);
    avg += loss.item();
    if ((step + 1) % 25 == 0) {
      std::printf("step %5lld  mean loss %.3f\n", static_cast<long long>(step + 1), avg / 25);
      std::fflush(stdout);
      avg = 0;
    }
  }
  // Fresh rows: the loss on each copy (train::induction_probe, as `myriad eval --induction`).
  std::vector<int32_t> alphabet;
  for (int32_t t = 4; t < 64; ++t) alphabet.push_back(t);
  const train::CopyLosses p = train::induction_probe(dec, alphabet, n, batch, 4);
  std::printf("held-out loss: first copy %.3f, second copy %.3f (ln 60 = %.3f)\n", p.first,
              p.second, std::log(60.0));
  return 0;
}
