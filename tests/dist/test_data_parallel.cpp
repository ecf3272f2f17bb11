// Data-parallel training across MPI ranks (docs/DISTRIBUTED.md). ctest runs this program under
// `mpirun --oversubscribe -np 2` and `-np 4` (and alone, as one rank). Every test is a collective:
// all ranks run the distributed trainer, then rank 0 runs the same recipe in one process
// (dist::single()) and compares; the verdict is broadcast so every rank reports it.
//   - deterministic (the default): losses, gradient norms, weights and optimizer state are
//     bit-identical to one process, with ZeRO-1 and with replicated optimizer state, also when
//     the micro-batches do not divide over the ranks;
//   - a checkpoint written at one world size resumes at another (and in one process) and
//     continues bit-identically;
//   - deterministic = false (local accumulation, one reduce-scatter): within 1e-6 relative;
//   - the collectives' byte counts against the planner's prediction for the same layout;
//   - expert parallel (ep = ranks): a model's forward and gradients with the experts shared out
//     equal the unsharded module's, and training equals one process within f32 rounding.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/error.h"
#include "data/tokenizer.h"
#include "dist/comm.h"
#include "model/decoder.h"
#include "ops/ops.h"
#include "plan/comm.h"
#include "plan/hardware.h"
#include "plan/params.h"
#include "train/checkpoint.h"
#include "train/evals.h"
#include "train/expert_parallel.h"
#include "train/recipe.h"
#include "train/trainer.h"

namespace myriad::train {
namespace {

namespace fs = std::filesystem;
using dist::Comm;

Comm& world() {
  return dist::world();
}

// One folder for the whole job (rank 0 makes it, every rank learns its name).
const fs::path& job_dir() {
  static const fs::path dir = [] {
    char buf[512] = {};
    if (world().rank() == 0) {
      std::string t = (fs::path(::testing::TempDir()) / "myriad-dist-XXXXXX").string();
      MYRIAD_CHECK(mkdtemp(t.data()), "mkdtemp failed");
      fs::create_directories(fs::path(t) / "data");
      std::strncpy(buf, t.c_str(), sizeof buf - 1);
    }
    world().broadcast("test_dir", buf, sizeof buf, 0);
    return fs::path(buf);
  }();
  return dir;
}

// Removes the job's folder once every rank is done with it.
struct Cleanup : ::testing::Environment {
  void TearDown() override {
    if (job_dir().empty()) return;
    world().barrier("cleanup");
    if (world().rank() == 0) fs::remove_all(job_dir());
  }
};
[[maybe_unused]] const auto* const kCleanup = ::testing::AddGlobalTestEnvironment(new Cleanup);

// A fresh folder per test (and per tag), shared by the ranks.
fs::path test_dir(const std::string& tag) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const fs::path d = job_dir() / (std::string(info->name()) + "-" + tag);
  if (world().rank() == 0) {
    fs::remove_all(d);
    fs::create_directories(d);
  }
  world().barrier("test_dir");
  return d;
}

// Two stages; every step has 8 micro-batches (so 1, 2 and 4 ranks share them evenly); the second
// stage reads a long-context mix (built by rank 0 when the stage starts) and runs its sequences
// in segments carrying the decode state. A quantile-balanced MoE layer.
std::string recipe(int64_t steps1, int64_t steps2, const std::string& top = "",
                   const std::string& parallel = "") {
  const fs::path data = job_dir() / "data";
  return cat(top, R"(
seed = 11
balancer = "quantile"
[model]
preset = "tiny"
[model.overrides]
num_hidden_layers = 2
hidden_size = 64
intermediate_size = 128
moe_intermediate_size = 32
layer_types = ["linear_attention", "full_attention"]
linear_attn_config = { kda_layers = [1], full_attn_layers = [2] }
[data]
tokenizer = ")",
             (data / "tok.model").string(), R"("
shard_dir = ")",
             (data / "shards").string(), R"("
corpus = "synthetic"
vocab_size = 320
max_corpus_bytes = 200000
shard_tokens = 100000
heldout_fraction = 0.05
heldout_batches = 2
[optimizer]
lr = 1e-2
[schedule]
kind = "constant"
[checkpoint]
every = 2
keep_last = 10
[log]
tensorboard = false
html = false
[parallel]
timeout_s = 500
)",
             parallel, R"(
[[stage]]
name = "short"
seq_len = 32
steps = )",
             steps1, R"(
tokens_per_step = 512
batch_size = 2
)",
             steps2 == 0 ? ""
                         : cat(R"(
[[stage]]
name = "long"
seq_len = 256
steps = )",
                               steps2, R"(
tokens_per_step = 2048
batch_size = 1
segment_len = 128
data_mix = "long"
)"));
}

struct Outcome {
  std::vector<StepRecord> history;
  std::map<std::string, Tensor> weights;
  std::vector<StageResult> stages;
  std::vector<StageOutcome> evals;
};

Outcome train(const std::string& text, const fs::path& out, Comm* comm, int64_t stop = -1,
              bool resume = false) {
  Trainer t(Recipe::parse(text), out.string(), comm);
  t.set_quiet(true);
  if (stop >= 0) t.stop_after(stop);
  t.run(resume);
  return {t.history(), t.decoder().weights().tensors(), t.stage_results(), t.stage_outcomes()};
}

// Rank 0's list of differences, broadcast: every rank fails or passes together.
void expect_none(const std::vector<std::string>& diffs) {
  int64_t n = static_cast<int64_t>(diffs.size());
  world().broadcast("verdict", &n, sizeof n, 0);
  std::string all;
  for (size_t i = 0; i < diffs.size() && i < 20; ++i) all += diffs[i] + "\n";
  EXPECT_EQ(n, 0) << all;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.contiguous().data_ptr(), b.contiguous().data_ptr(), a.nbytes()) == 0;
}

double max_rel(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = a.to_doubles(), y = b.to_doubles();
  double m = 0, scale = 0;
  for (size_t i = 0; i < x.size(); ++i) scale = std::max(scale, std::abs(x[i]));
  for (size_t i = 0; i < x.size(); ++i) m = std::max(m, std::abs(x[i] - y[i]));
  return scale > 0 ? m / scale : m;
}

std::vector<std::string> compare_bitwise(const Outcome& dp, const Outcome& one, size_t from = 0) {
  std::vector<std::string> d;
  if (dp.history.size() != one.history.size() - from)
    d.push_back(cat("steps: ", dp.history.size(), " vs ", one.history.size() - from));
  for (size_t i = 0; i < dp.history.size() && i + from < one.history.size(); ++i) {
    const StepRecord &a = dp.history[i], &b = one.history[i + from];
    if (a.step != b.step || a.loss != b.loss || a.grad_norm != b.grad_norm ||
        a.max_violation != b.max_violation)
      d.push_back(cat("step ", a.step, ": loss ", a.loss, " vs ", b.loss, ", grad norm ",
                      a.grad_norm, " vs ", b.grad_norm, ", maxvio ", a.max_violation, " vs ",
                      b.max_violation));
  }
  for (const auto& [name, t] : one.weights)
    if (!dp.weights.count(name) || !same_bits(dp.weights.at(name), t))
      d.push_back(cat("weight ", name, " differs (max rel ",
                      dp.weights.count(name) ? max_rel(dp.weights.at(name), t) : -1.0, ")"));
  return d;
}

std::vector<std::string> compare_checkpoints(const fs::path& a, const fs::path& b) {
  std::vector<std::string> d;
  CheckpointManager ca((a / "checkpoints").string()), cb((b / "checkpoints").string());
  const auto sa = ca.load_latest(), sb = cb.load_latest();
  if (!sa || !sb) return {"a checkpoint is missing"};
  if (sa->step != sb->step) d.push_back(cat("checkpoint step ", sa->step, " vs ", sb->step));
  if (sa->data_cursor != sb->data_cursor) d.push_back("data cursors differ");
  for (const auto part : {&TrainState::optimizer, &TrainState::balancer}) {
    const auto &x = (*sa).*part, &y = (*sb).*part;
    if (x.size() != y.size()) d.push_back(cat("state sizes ", x.size(), " vs ", y.size()));
    for (const auto& [k, t] : y)
      if (!x.count(k) || !same_bits(x.at(k), t)) d.push_back(cat("state ", k, " differs"));
  }
  return d;
}

struct OneThread {
  int threads = omp_get_max_threads();
  OneThread() { omp_set_num_threads(1); }
  ~OneThread() { omp_set_num_threads(threads); }
};

TEST(DataParallel, BitwiseEqualToOneProcess) {
  OneThread one;
  for (const char* zero : {"zero = 1", "zero = 0"}) {
    const std::string text = recipe(4, 2, "", zero);
    const fs::path dp_dir = test_dir(cat("dp-", zero[7])), one_dir = test_dir("one");
    const Outcome dp = train(text, dp_dir, &world());
    std::vector<std::string> d;
    if (world().rank() == 0) {
      const Outcome ref = train(text, one_dir, &dist::single());
      d = compare_bitwise(dp, ref);
      const auto c = compare_checkpoints(dp_dir, one_dir);
      d.insert(d.end(), c.begin(), c.end());
      if (dp.history.size() != 6) d.push_back(cat("ran ", dp.history.size(), " steps, not 6"));
      // ZeRO-1 checkpoints hold one optimizer part per rank, written by that rank.
      int parts = 0;
      for (const auto& e : fs::directory_iterator(dp_dir / "checkpoints" / "step-000000006"))
        parts += e.path().filename().string().rfind("optimizer-", 0) == 0;
      const int want = zero[7] == '1' && world().size() > 1 ? world().size() : 0;
      if (parts != want) d.push_back(cat(parts, " optimizer parts, expected ", want));
    }
    world().barrier("compare");
    SCOPED_TRACE(cat(zero, ", ", world().size(), " ranks"));
    expect_none(d);
  }
}

// bf16 training with ZeRO-1: each rank's optimizer writes the bf16 working copy of the
// parameters it owns as it updates them, and of the others' as the all-gather brings them, so
// every rank runs the next forward on the same copy as one process does (a stale copy changes
// the next step's loss).
TEST(DataParallel, Bf16BitwiseEqualToOneProcess) {
  OneThread one;
  const std::string text = recipe(3, 0, "precision = \"bf16\"\n", "zero = 1");
  const fs::path dp_dir = test_dir("dp"), one_dir = test_dir("one");
  const Outcome dp = train(text, dp_dir, &world());
  std::vector<std::string> d;
  if (world().rank() == 0) {
    const Outcome ref = train(text, one_dir, &dist::single());
    d = compare_bitwise(dp, ref);
    if (dp.history.size() != 3) d.push_back(cat("ran ", dp.history.size(), " steps, not 3"));
  }
  world().barrier("compare");
  SCOPED_TRACE(cat(world().size(), " ranks"));
  expect_none(d);
}

// A checkpoint written by half the ranks resumes on all of them (2 -> 4, 1 -> 2) and in one
// process, and both continue exactly as the uninterrupted run.
TEST(DataParallel, ResumeAtAnotherWorldSize) {
  OneThread one;
  const std::string text = recipe(4, 2);
  const int half = std::max(1, world().size() / 2);
  const fs::path part_dir = test_dir("part"), one_dir = test_dir("one");
  {
    std::unique_ptr<Comm> group = world().split(world().rank() < half ? 0 : -1, world().rank());
    if (group) train(text, part_dir, group.get(), 3);  // stops after step 3 with a checkpoint
  }
  world().barrier("part");
  std::vector<std::string> d;
  if (world().rank() == 0) {
    fs::copy(part_dir, job_dir() / "part-copy", fs::copy_options::recursive);
  }
  world().barrier("copy");
  const Outcome resumed = train(text, part_dir, &world(), -1, true);
  if (world().rank() == 0) {
    const Outcome ref = train(text, one_dir, &dist::single());
    for (const auto& s : compare_bitwise(resumed, ref, 3))
      d.push_back(cat(half, " -> ", world().size(), " ranks: ", s));
    const Outcome alone = train(text, job_dir() / "part-copy", &dist::single(), -1, true);
    for (const auto& s : compare_bitwise(alone, ref, 3))
      d.push_back(cat(half, " ranks -> one process: ", s));
    fs::remove_all(job_dir() / "part-copy");
  }
  world().barrier("compare");
  expect_none(d);
}

// Micro-batches that do not divide over the ranks: 3 per step in the first stage and 1 in the
// second (so at 2 ranks one rank trains 2 and the other 1, then 1 and none; at 4 ranks one rank
// idles in every step). Still bit-identical to one process, with ZeRO-1 and without. The
// stage-end evaluations (items shared out over the ranks) and held-out losses (3 batches, dealt
// like micro-batches) equal one process's too.
TEST(DataParallel, UnevenMicroBatchesEqualOneProcess) {
  OneThread one;
  for (const char* zero : {"zero = 1", "zero = 0"}) {
    std::string text = recipe(3, 2, "", zero) + R"(
[eval]
tasks = ["passkey", "mk_niah"]
length_factors = [0.5, 1.0]
depths = [0.0, 1.0]
)";
    text.replace(text.find("heldout_batches = 2"), 19, "heldout_batches = 3");
    for (const auto& [from, to] :
         {std::pair<std::string, std::string>{"tokens_per_step = 512", "tokens_per_step = 192"},
          {"tokens_per_step = 2048", "tokens_per_step = 256"}}) {
      const size_t at = text.find(from);
      ASSERT_NE(at, std::string::npos) << from;
      text.replace(at, from.size(), to);
    }
    const fs::path dp_dir = test_dir(cat("dp-", zero[7])), one_dir = test_dir("one");
    const Outcome dp = train(text, dp_dir, &world());
    std::vector<std::string> d;
    if (world().rank() == 0) {
      const Outcome ref = train(text, one_dir, &dist::single());
      d = compare_bitwise(dp, ref);
      if (dp.history.size() != 5) d.push_back(cat("ran ", dp.history.size(), " steps, not 5"));
      if (dp.stages.size() != 2 || ref.stages.size() != 2)
        d.push_back(cat(dp.stages.size(), " and ", ref.stages.size(), " stage ends, not 2"));
      for (size_t i = 0; i < std::min(dp.stages.size(), ref.stages.size()); ++i)
        if (dp.stages[i].heldout_loss != ref.stages[i].heldout_loss)
          d.push_back(cat("stage ", i, " held-out loss ", dp.stages[i].heldout_loss, " vs ",
                          ref.stages[i].heldout_loss));
      if (dp.evals.size() != 2 || ref.evals.size() != 2)
        d.push_back(cat(dp.evals.size(), " and ", ref.evals.size(), " evaluations, not 2"));
      for (size_t i = 0; i < std::min(dp.evals.size(), ref.evals.size()); ++i)
        for (size_t t = 0; t < ref.evals[i].grids.size(); ++t)
          if (t >= dp.evals[i].grids.size() ||
              dp.evals[i].grids[t].accuracy != ref.evals[i].grids[t].accuracy ||
              dp.evals[i].grids[t].prompt_tokens != ref.evals[i].grids[t].prompt_tokens)
            d.push_back(cat("stage ", i, " ", ref.evals[i].grids[t].task, " grid differs"));
    }
    world().barrier("compare");
    SCOPED_TRACE(cat(zero, ", ", world().size(), " ranks"));
    expect_none(d);
  }
}

// The stage-end evaluation's answers shared out over the ranks (shared_completions) equal one
// process's greedy_completions, token for token, for prompts of different lengths (more prompts
// than ranks, and fewer).
TEST(DataParallel, SharedCompletionsEqualOneProcess) {
  OneThread one;
  train(recipe(1, 0), test_dir("data"), &world());  // the job's tokenizer
  NoGradGuard ng;
  const data::Tokenizer tok = data::Tokenizer::load((job_dir() / "data" / "tok.model").string());
  // The recipe's model (one KDA and one MLA layer), untrained.
  const model::Decoder m =
      model::Decoder::random(Recipe::parse(recipe(1, 0)).model(tok.vocab_size()), 5);
  for (const size_t n : {size_t{7}, size_t{1}}) {
    std::vector<std::vector<int32_t>> prompts;
    for (size_t i = 0; i < n; ++i)
      prompts.push_back(
          tok.encode(cat("number ", i, " is ", std::string(3 + 9 * i, 'a' + i % 26))));
    EvalConfig cfg;
    cfg.segment = 16, cfg.max_new_tokens = 6;
    cfg.shard = world().rank(), cfg.shards = world().size();
    cfg.sum = [](std::vector<double>& v) { world().all_reduce_sum("answers", v.data(), v.size()); };
    const Completions shared = shared_completions(m, tok, prompts, cfg);
    std::vector<std::string> d;
    if (world().rank() == 0) {
      const Completions alone = greedy_completions(m, tok, prompts, 16, 6);
      if (shared.tokens != alone.tokens) d.push_back(cat(n, " prompts: the answers differ"));
      size_t total = 0;
      for (const auto& t : alone.tokens) total += t.size();
      if (total == 0) d.push_back("no tokens generated: nothing compared");
      if (shared.cache_bytes_peak <= 0) d.push_back("no cache peak");
    }
    world().barrier("compare");
    expect_none(d);
  }
}

// Without the deterministic order the gradients are accumulated locally and reduce-scattered:
// the sums round differently. The losses stay within 1e-6 relative over the first steps; the
// weights within 3e-5 of each tensor's largest value. Adam divides each update by the gradient's
// own scale, so a gradient near zero carries a rounding difference into its weight at full size:
// most tensors differ by 1e-6 to 6e-6 after three steps, the MoE router's gate by the most
// (5.7e-6, and 1.15e-5 once KDA's triangular solves were blocked and summed in another order, in
// the sanitizer build). One rank's gradients left out of the sum (planted: rank 1 sending zeros)
// moved the losses by 5e-4 to 3e-3 and every weight tensor that trains by 7e-3 or more.
TEST(DataParallel, ReduceScatterWithinTolerance) {
  OneThread one;
  const std::string text = recipe(3, 0, "deterministic = false\n");
  const fs::path dp_dir = test_dir("dp"), one_dir = test_dir("one");
  const Outcome dp = train(text, dp_dir, &world());
  std::vector<std::string> d;
  if (world().rank() == 0) {
    const Outcome ref = train(text, one_dir, &dist::single());
    for (size_t i = 0; i < ref.history.size(); ++i) {
      const double rel = std::abs(dp.history[i].loss - ref.history[i].loss) / ref.history[i].loss;
      if (rel > 1e-6) d.push_back(cat("step ", i + 1, ": loss relative difference ", rel));
    }
    for (const auto& [name, t] : ref.weights)
      if (const double r = max_rel(dp.weights.at(name), t); r > 3e-5)
        d.push_back(cat(name, ": max relative difference ", r));
  }
  world().barrier("compare");
  expect_none(d);
}

// Context parallel: each sequence of a 4K stage split over cp ranks (the KDA state, conv state
// and MLA latents passed forward, their gradients back), against one process running the same
// sequences in cp segments carrying the state: cp = 2 (at 4 ranks as 2 data-parallel groups of
// 2) and cp = 4 at 4 ranks. The state's bytes equal the planner's (CpMode::Carry).
TEST(ContextParallel, EqualsOneProcessSegmentedRun) {
  OneThread one;
  const int W = world().size();
  if (W % 2) GTEST_SKIP() << "needs an even number of ranks";
  const std::string base = recipe(1, 0);
  // 4K in optimised builds; 1K in the sanitizer build, where a 4K step takes minutes.
#ifdef NDEBUG
  const int64_t T = 4096;
#else
  const int64_t T = 1024;
#endif
  const auto stage = [&](const std::string& segment) {
    return cat("\n[[stage]]\nname = \"ctx\"\nseq_len = ", T, "\nsteps = 3\n",
               "tokens_per_step = ", 2 * T, "\nbatch_size = 1\n", segment);
  };
  // The recipe's first stage is replaced by the 4K one.
  const std::string head = base.substr(0, base.find("[[stage]]"));
  std::vector<int> cps = {2};
  if (W == 4) cps.push_back(4);
  for (const int cp : cps) {
    SCOPED_TRACE(cat("cp = ", cp, " x dp = ", W / cp));
    std::string cp_text = head + stage("");
    cp_text.replace(cp_text.find("[parallel]\n"), 11, cat("[parallel]\ncp = ", cp, "\n"));
    const std::string one_text = head + stage(cat("segment_len = ", T / cp, "\n"));
    const fs::path cp_dir = test_dir(cat("cp", cp)), one_dir = test_dir(cat("one", cp));
    Trainer t(Recipe::parse(cp_text), cp_dir.string(), &world());
    t.set_quiet(true);
    t.run();
    const Outcome cpr{t.history(), t.decoder().weights().tensors(), {}, {}};
    double bytes =
        t.collective_totals().count("cp_state") ? t.collective_totals().at("cp_state").bytes : 0.0;
    world().all_reduce_sum("test", &bytes, 1);
    std::vector<std::string> d;
    if (world().rank() == 0) {
      const Outcome ref = train(one_text, one_dir, &dist::single());
      if (cpr.history.size() != 3) d.push_back(cat("ran ", cpr.history.size(), " steps, not 3"));
      for (size_t i = 0; i < ref.history.size() && i < cpr.history.size(); ++i) {
        const double rel =
            std::abs(cpr.history[i].loss - ref.history[i].loss) / ref.history[i].loss;
        const double grel = std::abs(cpr.history[i].grad_norm - ref.history[i].grad_norm) /
                            ref.history[i].grad_norm;
        std::printf(
            "[ CP=%d x DP=%d ] step %zu: loss %.9f vs %.9f (rel %.1e), grad norm rel %.1e\n", cp,
            W / cp, i + 1, cpr.history[i].loss, ref.history[i].loss, rel, grel);
        if (rel > 1e-6 || grel > 1e-5)
          d.push_back(cat("step ", i + 1, ": loss rel ", rel, ", grad norm rel ", grel));
      }
      double worst = 0;
      for (const auto& [name, w] : ref.weights)
        worst = std::max(worst, max_rel(cpr.weights.at(name), w));
      std::printf("[ CP=%d x DP=%d ] weights after 3 steps: max relative difference %.1e\n", cp,
                  W / cp, worst);
      if (worst > 1e-4) d.push_back(cat("weights: max relative difference ", worst));
    }
    world().barrier("compare");
    expect_none(d);
    // The planner's carry traffic for the same layout, per rank and step, times 3 steps.
    plan::TrainSetup setup;
    setup.layout.dp = W / cp, setup.layout.cp = cp;
    setup.seq = T, setup.batch = 2, setup.micro_batch = 1;
    setup.bf16 = false, setup.cp_mode = plan::CpMode::Carry;
    const model::ModelConfig& c = t.decoder().config();
    double want = 0;
    for (const auto& it :
         plan::training_comm(c, plan::count_params(c), plan::hardware("zen5"), setup, 0).items)
      if (it.name == "cp_state") want += 3 * it.bytes;
    if (world().rank() == 0)
      std::printf(
          "[ CP=%d x DP=%d ] cp_state bytes per rank over 3 steps: engine %.0f, planner "
          "%.0f\n",
          cp, W / cp, bytes / W, want);
    EXPECT_NEAR(bytes / W, want, 1e-9 * want + 0.5) << "cp_state bytes against the planner";
  }
}

// The bytes each collective moved in one step against `myriad plan`'s formulas for the same
// layout: dp = ranks, and with the experts shared out (ep = ranks, and ep = 2 at 4 ranks, where
// each expert has 2 replicas). The gradient reduce-scatters and weight all-gathers (fp32) and
// the balancer's all-reduce agree exactly, averaged over the ranks (whole-tensor ownership makes
// single ranks differ by the imbalance); the expert dispatch and combine depend on the routing
// (the planner assumes uniform), within 10%. At ep = 1 the planner's expert_* traffic (experts
// replicated over dp) is part of the engine's dp_* collectives.
TEST(DataParallel, CollectiveBytesMatchPlanner) {
  OneThread one;
  const int W = world().size();
  std::vector<int> eps = {1};
  if (W > 1) eps.push_back(W);
  if (W == 4) eps.push_back(2);
  for (const int ep : eps) {
    const std::string text = recipe(1, 0, "deterministic = false\n", cat("ep = ", ep));
    const fs::path dir = test_dir(cat("ep", ep));
    Trainer t(Recipe::parse(text), dir.string(), &world());
    t.set_quiet(true);
    t.run();
    const std::vector<std::string> names = {
        "dp_reduce_scatter", "dp_all_gather",       "expert_reduce_scatter",
        "expert_all_gather", "balancer_all_reduce", "ep_dispatch",
        "ep_combine"};
    // Bytes, then seconds (not asserted: the ranks share 2 cores, and a collective's time
    // includes the wait for the slowest rank).
    std::vector<double> got(2 * names.size(), 0.0), want(2 * names.size(), 0.0);
    for (size_t k = 0; k < names.size(); ++k)
      if (t.collective_totals().count(names[k])) {
        got[k] = t.collective_totals().at(names[k]).bytes;
        got[names.size() + k] = t.collective_totals().at(names[k]).seconds;
      }
    world().all_reduce_sum("test", got.data(), got.size());
    // The planner, for the same model and layout (fp32 weights).
    const model::ModelConfig& c = t.decoder().config();
    plan::TrainSetup setup;
    setup.layout.dp = W, setup.layout.ep = ep;
    setup.seq = 32, setup.batch = 16, setup.micro_batch = 2;
    setup.bf16 = false;
    for (const auto& it :
         plan::training_comm(c, plan::count_params(c), plan::hardware("zen5"), setup, 0).items)
      for (size_t k = 0; k < names.size(); ++k)
        if (it.name == names[k]) {
          const size_t at = k < 4 && ep == 1 ? k % 2 : k;
          want[at] += it.bytes, want[names.size() + at] += it.seconds;
        }
    SCOPED_TRACE(cat("dp = ", W, ", ep = ", ep));
    for (size_t k = 0; k < names.size(); ++k) {
      const double mean = got[k] / W;
      if (world().rank() == 0)
        std::printf(
            "[ DP=%d EP=%d ] %-22s engine %10.0f  planner %10.0f bytes per rank; engine %8.1f "
            "planner %8.1f us\n",
            W, ep, names[k].c_str(), mean, want[k], 1e6 * got[names.size() + k] / W,
            1e6 * want[names.size() + k]);
      if (k < 5)
        EXPECT_NEAR(mean, want[k], 1e-9 * want[k] + 0.5) << names[k];
      else
        EXPECT_NEAR(mean, want[k], 0.1 * want[k]) << names[k];
    }
  }
}

// Expert parallel at the module level: every rank runs the model on its own tokens with the
// experts shared out over all ranks (rows dispatched to the rank running their expert and
// combined back) and without (all experts here). Logits and the gradient of every parameter
// summed over ranks must agree; an expert's gradient arises only on the rank running it. One
// token per rank leaves some ranks with no rows at all.
TEST(ExpertParallel, ModuleEqualsUnshardedExperts) {
  OneThread one;
  const int W = world().size();
  const model::ModelConfig c = Recipe::parse(recipe(1, 0)).model(97);
  model::Decoder m = model::Decoder::random(c, 5);
  m.weights().requires_grad_(true);
  ExpertParallel ep(world());
  for (const int64_t T : {int64_t{24}, int64_t{1}}) {
    std::vector<int64_t> ids(static_cast<size_t>(2 * T));
    for (size_t i = 0; i < ids.size(); ++i)
      ids[i] = static_cast<int64_t>((i * 31 + 7 * static_cast<size_t>(world().rank()) + 3) % 97);
    const Tensor x = Tensor::from_ints(ids, {2, T});
    // grads[0]: unsharded, grads[1]: expert parallel, each summed over the ranks
    std::map<std::string, std::vector<double>> grads[2];
    Tensor logits[2];
    for (int mode = 0; mode < 2; ++mode) {
      for (auto [name, w] : m.weights().tensors()) w.zero_grad();
      m.set_expert_runner(mode ? &ep : nullptr);
      const Tensor y = m.forward(x).logits_BTV;
      m.set_expert_runner(nullptr);
      ops::sum(ops::mul(y, y)).backward();
      logits[mode] = y.detach();
      for (const auto& [name, w] : m.weights().tensors()) {
        std::vector<double> g =
            w.grad().defined() ? w.grad().to_doubles() : std::vector<double>(w.numel(), 0.0);
        world().all_reduce_sum("test_grads", g.data(), g.size());
        grads[mode][name] = std::move(g);
      }
    }
    SCOPED_TRACE(cat(W, " ranks, T = ", T));
    // The experts' GEMMs see other rows beside a token's (the kernel's blocking changes with the
    // row count): equal to f32 rounding, not bitwise.
    EXPECT_LE(max_rel(logits[1], logits[0]), 1e-5) << "logits";
    // Per tensor, within 1e-4 of its largest gradient, or 1e-7 of the model's largest: a few
    // tensors (the first KDA layer's decay parameters) get gradients of about 1e-10 of the
    // largest, all f32 rounding noise from the experts' differently blocked sums (seen on an AVX2
    // machine; AVX-512's blocking happened to round alike).
    double largest = 0;
    for (const auto& [name, g0] : grads[0])
      for (double v : g0) largest = std::max(largest, std::abs(v));
    int experts_seen = 0;
    for (const auto& [name, g0] : grads[0]) {
      const std::vector<double>& g1 = grads[1][name];
      double m0 = 0, d = 0;
      for (size_t i = 0; i < g0.size(); ++i)
        m0 = std::max(m0, std::abs(g0[i])), d = std::max(d, std::abs(g0[i] - g1[i]));
      experts_seen += name.find(".experts.") != std::string::npos && m0 > 0;
      EXPECT_LE(d, 1e-4 * m0 + 1e-7 * largest) << name << ": gradient max |diff| " << d << " of "
                                               << m0 << " (largest " << largest << ")";
    }
    EXPECT_GT(experts_seen, 0);
  }
}

// Training with the experts shared out over all ranks (ep = dp = ranks) against one process
// with every expert: the gradient sums round differently (an expert's rows from all ranks meet in
// one GEMM), so equal within f32 rounding: losses 1e-6, weights and the QB selection biases 1e-4
// relative after 4 steps and a segmented long-context step. Also the dispatched bytes against
// the planner's (uniform-routing) prediction.
TEST(ExpertParallel, TrainingEqualsOneProcess) {
  OneThread one;
  const int W = world().size();
  if (W == 1) GTEST_SKIP() << "needs 2 or more ranks";
  const std::string text = recipe(4, 1, "", cat("ep = ", W));
  const fs::path ep_dir = test_dir("ep"), one_dir = test_dir("one");
  Trainer t(Recipe::parse(text), ep_dir.string(), &world());
  t.set_quiet(true);
  t.run();
  const Outcome epr{t.history(), t.decoder().weights().tensors(), {}, {}};
  double got[2] = {0, 0};
  for (const auto& [name, s] : t.collective_totals()) {
    if (name == "ep_dispatch") got[0] += s.bytes;
    if (name == "ep_combine") got[1] += s.bytes;
  }
  world().all_reduce_sum("test", got, 2);
  std::vector<std::string> d;
  if (world().rank() == 0) {
    const Outcome ref = train(recipe(4, 1), one_dir, &dist::single());
    if (epr.history.size() != 5) d.push_back(cat("ran ", epr.history.size(), " steps, not 5"));
    for (size_t i = 0; i < ref.history.size() && i < epr.history.size(); ++i) {
      const double rel = std::abs(epr.history[i].loss - ref.history[i].loss) / ref.history[i].loss;
      const double grel =
          std::abs(epr.history[i].grad_norm - ref.history[i].grad_norm) / ref.history[i].grad_norm;
      std::printf("[ EP=%d ] step %zu: loss %.9f vs %.9f (rel %.1e), grad norm rel %.1e\n", W,
                  i + 1, epr.history[i].loss, ref.history[i].loss, rel, grel);
      if (rel > 1e-6 || grel > 1e-5)
        d.push_back(cat("step ", i + 1, ": loss rel ", rel, ", grad norm rel ", grel));
    }
    double worst = 0, bias = 0;
    for (const auto& [name, t] : ref.weights) {
      const double r = max_rel(epr.weights.at(name), t);
      (name.find("e_score_correction_bias") != std::string::npos ? bias : worst) =
          std::max(name.find("e_score_correction_bias") != std::string::npos ? bias : worst, r);
    }
    std::printf("[ EP=%d ] after 5 steps: weights max relative difference %.1e, QB biases %.1e\n",
                W, worst, bias);
    if (worst > 1e-4) d.push_back(cat("weights: max relative difference ", worst));
    if (bias > 1e-4) d.push_back(cat("QB biases: max relative difference ", bias));
  }
  world().barrier("compare");
  expect_none(d);
  // The planner's expected dispatch and combine bytes for this run (uniform routing), summed over
  // the two stages, against the engine's mean over ranks.
  const model::ModelConfig c =
      Recipe::parse(text).model(epr.weights.at("model.embed_tokens.weight").size(0));
  double want[2] = {0, 0};
  for (const auto& [seq, steps, micro] : {std::tuple{32, 4, 2}, std::tuple{256, 1, 1}}) {
    plan::TrainSetup setup;
    setup.layout.dp = W, setup.layout.ep = W;
    setup.seq = seq, setup.batch = 8 * micro, setup.micro_batch = micro;
    setup.bf16 = false;
    for (const auto& it :
         plan::training_comm(c, plan::count_params(c), plan::hardware("zen5"), setup, 0).items) {
      if (it.name == "ep_dispatch") want[0] += steps * it.bytes;
      if (it.name == "ep_combine") want[1] += steps * it.bytes;
    }
  }
  if (world().rank() == 0)
    std::printf(
        "[ EP=%d ] bytes per rank over the run, engine (mean over ranks) vs planner (uniform "
        "routing): dispatch %.0f vs %.0f (%.3f), combine %.0f vs %.0f (%.3f)\n",
        W, got[0] / W, want[0], got[0] / W / want[0], got[1] / W, want[1], got[1] / W / want[1]);
  EXPECT_EQ(got[0], got[1]) << "dispatch and combine move the same rows";
  EXPECT_NEAR(got[0] / W / want[0], 1.0, 0.1) << "dispatch bytes against the planner";
}

// A checkpoint written with the experts shared out (ep = ranks, each rank's optimizer part
// holding the moments of the experts it runs, the weights synchronised before the save) resumes
// in one process without expert parallel and continues as the one-process run does.
TEST(ExpertParallel, CheckpointResumesInOneProcess) {
  OneThread one;
  const int W = world().size();
  if (W == 1) GTEST_SKIP() << "needs 2 or more ranks";
  const fs::path ep_dir = test_dir("ep"), one_dir = test_dir("one");
  train(recipe(4, 1, "", cat("ep = ", W)), ep_dir, &world(), 2);
  std::vector<std::string> d;
  if (world().rank() == 0) {
    const Outcome resumed = train(recipe(4, 1), ep_dir, &dist::single(), -1, true);
    const Outcome ref = train(recipe(4, 1), one_dir, &dist::single());
    if (resumed.history.size() != 3)
      d.push_back(cat("resumed for ", resumed.history.size(), " steps, not 3"));
    for (size_t i = 0; i < resumed.history.size() && i + 2 < ref.history.size(); ++i) {
      const double rel =
          std::abs(resumed.history[i].loss - ref.history[i + 2].loss) / ref.history[i + 2].loss;
      if (rel > 1e-6) d.push_back(cat("step ", i + 3, ": loss rel ", rel));
    }
    double worst = 0;
    for (const auto& [name, t] : ref.weights)
      worst = std::max(worst, max_rel(resumed.weights.at(name), t));
    std::printf("[ EP=%d -> 1 process ] weights after 5 steps: max relative difference %.1e\n", W,
                worst);
    if (worst > 1e-4) d.push_back(cat("weights: max relative difference ", worst));
  }
  world().barrier("compare");
  expect_none(d);
}

}  // namespace
}  // namespace myriad::train
