// The RL trainer (train/rl.h) end to end on a briefly SFT-trained tiny model: SFT data is
// trained on assistant tokens only and exports the agent chat template; an RL run takes its
// steps, logs, evaluates and writes trajectory records; the on-policy first update has ρ ≡ 1 and
// no clipping (§7.6 item 7 through the whole trainer); a run killed with SIGKILL resumes to the
// same rewards and weights as an uninterrupted run; bad RL recipes are refused naming the field.
#include <gtest/gtest.h>
#include <omp.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "core/allocator.h"
#include "core/error.h"
#include "data/corpus.h"
#include "model/config.h"
#include "ops/cross_entropy.h"
#include "train/recipe.h"
#include "train/rl.h"
#include "train/trainer.h"

namespace myriad::train {
namespace {

namespace fs = std::filesystem;

struct OneThread {
  int threads = omp_get_max_threads();
  OneThread() { omp_set_num_threads(1); }
  ~OneThread() { omp_set_num_threads(threads); }
};

fs::path temp_dir(const std::string& sub = "") {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  fs::path d = fs::path(::testing::TempDir()) / "myriad_test_rl" /
               (std::string(info->test_suite_name()) + "." + info->name() + sub);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// A tiny model after a few SFT steps on calculator traces, as a model directory.
fs::path sft_model(const fs::path& dir) {
  const Recipe r = Recipe::parse(R"(
seed = 3
[model]
preset = "tiny"
[data]
corpus = "sft"
sft_sources = ["calculator"]
sft_noise = [0.5]
sft_examples = 600
vocab_size = 400
heldout_fraction = 0.05
heldout_batches = 1
[optimizer]
lr = 3e-3
[schedule]
kind = "constant"
warmup = 2
[log]
tensorboard = false
html = false
[[stage]]
name = "sft"
seq_len = 256
steps = 12
tokens_per_step = 2048
batch_size = 8
)");
  Trainer t(r, dir.string());
  t.set_quiet(true);
  t.run();
  const fs::path m = dir / "model";
  fs::create_directories(m);
  t.decoder().config().save((m / "config.json").string());
  t.decoder().weights().save((m / "model.safetensors").string());
  fs::copy_file(dir / "tokenizer.model", m / "tokenizer.model");
  fs::copy_file(dir / "chat_template.txt", m / "chat_template.txt");
  return m;
}

// The SFT model the RL tests start from, trained once per test binary rather than once per
// test: ctest runs every test in its own process, and under AddressSanitizer each training took
// about 4 minutes. A process trains it in a directory of its own and publishes it by renaming
// that directory to a name keyed by this binary (size and modification time), so another
// process finds it whole or not at all; if two train it at once, the second rename fails and
// that process uses the first one's (training is deterministic: the same model).
const fs::path& model_dir() {
  static const fs::path m = [] {
    OneThread one;
    const fs::path exe = fs::read_symlink("/proc/self/exe");
    const std::string stamp =
        std::to_string(fs::file_size(exe)) + "-" +
        std::to_string(static_cast<uint64_t>(fs::last_write_time(exe).time_since_epoch().count()));
    const fs::path root = fs::path(::testing::TempDir()) / "myriad_test_rl";
    const fs::path shared = root / ("sft-" + stamp);
    if (fs::exists(shared / "model" / "model.safetensors")) return shared / "model";
    const fs::path d = root / ("sft-training-" + std::to_string(getpid()));
    fs::remove_all(d);
    sft_model(d);
    std::error_code taken;
    fs::rename(d, shared, taken);
    if (taken) fs::remove_all(d);
    return shared / "model";
  }();
  return m;
}

std::string rl_recipe(const fs::path& init, int64_t steps, const std::string& extra = "") {
  return "seed = 5\n[model]\ninit = \"" + init.string() +
         "\"\n[task]\nenvs = [\"calculator\"]\ntasks_per_step = 4\ngroup_size = 4\n"
         "max_new_tokens_per_turn = 32\n[optimizer]\nlr = 1e-3\n[train]\nsteps = " +
         std::to_string(steps) +
         "\nmicro_batch = 8\nengine_batch = 16\n[eval]\nevery = 0\ntasks = 4\nk = 2\n"
         "[log]\ntensorboard = false\nhtml = false\n" +
         extra;
}

}  // namespace

// §7.6 item 1: masked positions have exactly zero effect. In the loss: log-probs, advantages and
// old / behaviour log-probs at mask-0 positions are never read. In the model update: the policy
// surrogate is a cross-entropy whose mask-0 rows weigh 0, so changing the hidden states (hence the
// logits) of those rows leaves the loss and every other gradient bit-identical.
TEST(RlPitfalls, P01_MaskedPositionsHaveZeroEffect) {
  rl::LossInput in;
  in.mask = {0, 1, 1, 0, 0, 1, 0};
  in.A = {9, 0.5, 0.5, -3, 7, -0.25, 1};
  in.logp = {-1, -0.7, -1.3, -0.2, -4, -0.9, -2};
  in.logp_old = {-2, -0.8, -1.1, -0.3, -1, -1.0, -5};
  in.logp_behavior = in.logp_old;
  in.logp_ref = {-3, -0.75, -1.2, -1, -1, -0.95, -1};
  rl::LossConfig cfg;
  cfg.kl_beta = 0.01, cfg.tis_cap = 2;
  for (const char* agg : {"token_mean", "seq_mean", "constant"})
    for (const char* level : {"token", "sequence"}) {
      cfg.loss_agg = agg, cfg.ratio_level = level;
      rl::LossInput p = in;
      for (size_t t = 0; t < p.mask.size(); ++t)
        if (!p.mask[t]) p.A[t] = 1e6, p.logp[t] = -50, p.logp_old[t] = 3, p.logp_ref[t] = 8;
      const rl::LossResult a = rl::policy_loss({in}, cfg), b = rl::policy_loss({p}, cfg);
      EXPECT_EQ(a.loss, b.loss) << agg << " " << level;
      EXPECT_EQ(a.grad, b.grad) << agg << " " << level;
      for (size_t t = 0; t < in.mask.size(); ++t)
        if (!in.mask[t]) {
          EXPECT_EQ(a.grad[0][t], 0.0);
        }
    }
  // The surrogate's weighted cross-entropy.
  const int64_t n = 6, d = 8, v = 11;
  std::vector<double> hv(n * d), wv(v * d);
  for (size_t i = 0; i < hv.size(); ++i) hv[i] = std::sin(0.37 * static_cast<double>(i));
  for (size_t i = 0; i < wv.size(); ++i) wv[i] = 0.3 * std::cos(0.21 * static_cast<double>(i));
  const std::vector<double> weight = {0.0, 0.7, 0.0, 1.3, 0.2, 0.0};
  const std::vector<int64_t> y = {1, 4, 7, 2, 10, 0};
  const auto run = [&](const std::vector<double>& h_in) {
    Tensor h = Tensor::from_doubles(h_in, {n, d}).requires_grad_();
    Tensor w = Tensor::from_doubles(wv, {v, d}).requires_grad_();
    Tensor loss = ops::linear_cross_entropy(h, w, Tensor::from_ints(y, {n}), 1024,
                                            Tensor::from_doubles(weight, {n}));
    loss.backward();
    return std::vector<std::vector<double>>{loss.to_doubles(), h.grad().to_doubles(),
                                            w.grad().to_doubles()};
  };
  std::vector<double> perturbed = hv;
  for (int64_t r = 0; r < n; ++r)
    if (weight[static_cast<size_t>(r)] == 0)
      for (int64_t j = 0; j < d; ++j) perturbed[static_cast<size_t>(r * d + j)] += 5.0 * (j + 1);
  const auto a = run(hv), b = run(perturbed);
  EXPECT_EQ(a[0], b[0]);
  EXPECT_EQ(a[1], b[1]);  // including exact zeros on the masked rows
  EXPECT_EQ(a[2], b[2]);
  for (int64_t r = 0; r < n; ++r)
    if (weight[static_cast<size_t>(r)] == 0) {
      for (int64_t j = 0; j < d; ++j) EXPECT_EQ(a[1][static_cast<size_t>(r * d + j)], 0.0);
    }
}

// Post-training issue item 5: an update on a 16K-token trajectory run as 4K segments carrying
// the decode state equals the one-pass update within 1e-5, and (with activation recomputation)
// its peak tensor memory stays within 1.5x of a one-pass update on a 4K trajectory.
TEST(Rl, LongTrajectoryUpdateRunsInSegments) {
  // Under AddressSanitizer (a Debug build, ~20x slower) the same check at a quarter of the size.
#if defined(__SANITIZE_ADDRESS__)
  const int64_t kSeg = 1024;
#else
  const int64_t kSeg = 4096;
#endif
  model::Decoder dec = [] {
    model::Decoder d = model::Decoder::random(model::preset("tiny"), 17);
    d.weights().requires_grad_(true);
    return d;
  }();
  const auto trajectory = [](int64_t T, uint64_t seed) {
    agent::Trajectory t;
    data::Rng rng(seed);
    for (int64_t i = 0; i < T; ++i) {
      t.tokens.push_back(static_cast<int32_t>(10 + rng.below(500)));
      t.loss_mask.push_back((i / 37) % 3 == 1 ? 1 : 0);  // assistant spans among observations
    }
    std::vector<double> g(static_cast<size_t>(T), 0.0);
    for (int64_t i = 1; i < T; ++i)
      if (t.loss_mask[static_cast<size_t>(i)])  // token_mean: A / N
        g[static_cast<size_t>(i)] = (rng.uniform() - 0.4) / static_cast<double>(T / 3);
    return std::make_pair(std::vector<agent::Trajectory>{t}, std::vector<std::vector<double>>{g});
  };
  const auto grads = [&]() {
    std::vector<double> all;
    for (const auto& [name, w] : dec.weights().tensors())
      if (w.grad().defined())
        for (double x : w.grad().to_doubles()) all.push_back(x);
    dec.weights().requires_grad_(true);  // clears the gradients
    return all;
  };
  Allocator& arena = allocator_for(DeviceType::CPU);
  const size_t base = arena.stats().in_use;
  const auto [b4, g4] = trajectory(kSeg, 1);
  policy_backward(dec, b4, g4, 1.0, 1);
  const double peak4 = static_cast<double>(arena.stats().peak - base);
  (void)grads();
  const auto [b16, g16] = trajectory(4 * kSeg, 2);
  policy_backward(dec, b16, g16, 1.0, 1, kSeg, true);
  const double peak16 = static_cast<double>(arena.stats().peak - base);
  const std::vector<double> seg = grads();
  std::printf("peak tensor memory: 4K one pass %.1f MiB, 16K in 4K segments %.1f MiB\n",
              peak4 / 1048576, peak16 / 1048576);
  EXPECT_LE(peak16, 1.5 * peak4);
  policy_backward(dec, b16, g16, 1.0, 1);
  const std::vector<double> one = grads();
  ASSERT_EQ(seg.size(), one.size());
  double worst = 0, scale = 0;
  for (size_t i = 0; i < one.size(); ++i)
    worst = std::max(worst, std::abs(seg[i] - one[i])), scale = std::max(scale, std::abs(one[i]));
  EXPECT_LT(worst, 1e-5 * std::max(1.0, scale)) << "largest gradient " << scale;
  EXPECT_GT(scale, 0.0);
}

// The SFT run writes the agent chat template, which export puts in the model directory (the
// loss mask itself is checked in tests/agent: Sft.DocumentsMaskAllButTheAssistant).
TEST(Rl, SftRunKeepsTheAgentTemplate) {
  const fs::path m = model_dir();
  std::ifstream f(m / "chat_template.txt");
  std::stringstream ss;
  ss << f.rdbuf();
  EXPECT_NE(ss.str().find("assistant = <|assistant|>{content}<|end|>"), std::string::npos);
}

TEST(Rl, RunsLogsAndWritesRecords) {
  OneThread one;
  const fs::path out = temp_dir();
  RlTrainer t(RlRecipe::parse(rl_recipe(model_dir(), 2)), out.string());
  t.set_quiet(true);
  t.run();
  ASSERT_TRUE(t.finished());
  ASSERT_EQ(t.history().size(), 2u);
  EXPECT_EQ(t.evals().size(), 2u);  // at the start and at the end
  EXPECT_TRUE(fs::exists(out / "rollouts" / "step-1.jsonl"));
  EXPECT_TRUE(fs::exists(out / "trajectories-calculator.html"));
  EXPECT_TRUE(fs::exists(out / "model" / "chat_template.txt"));
  std::ifstream rec(out / "rollouts" / "step-1.jsonl");
  std::string line;
  int n = 0;
  while (std::getline(rec, line)) {
    const agent::Trajectory tr = agent::Trajectory::from_json(nlohmann::json::parse(line));
    EXPECT_EQ(tr.env, "calculator");
    EXPECT_EQ(tr.policy_version, 0u);
    ++n;
  }
  EXPECT_GE(n, 16);
  // One update per batch: on-policy, ρ ≡ 1, nothing clipped.
  for (const RlStepRecord& h : t.history()) EXPECT_EQ(h.clip_fraction, 0.0);
  std::ifstream metrics(out / "metrics.jsonl");
  std::string all((std::istreambuf_iterator<char>(metrics)), std::istreambuf_iterator<char>());
  for (const char* k : {"rl/mean_reward", "rl/entropy", "rl/staleness", "rl/tool_call_rate",
                        "eval/calculator/pass@1", "eval/calculator/pass@2"})
    EXPECT_NE(all.find(k), std::string::npos) << k;
}

TEST(Rl, ResumeAfterSigkillRepeatsRewardsAndWeights) {
  OneThread one;
  const fs::path init = model_dir();
  const RlRecipe r =
      RlRecipe::parse(rl_recipe(init, 4, "[checkpoint]\nevery = 1\nkeep_last = 2\n"));
  RlTrainer full(r, temp_dir("full").string());
  full.set_quiet(true);
  full.run();
  ASSERT_EQ(full.history().size(), 4u);
  const fs::path out = temp_dir("killed");
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    try {
      RlTrainer t(r, out.string());
      t.set_quiet(true);
      t.run();
    } catch (...) {
    }
    _exit(0);
  }
  int status = 0;
  bool exited = false;
  while (!fs::exists(out / "checkpoints" / "step-000000002") && !exited) {
    exited = waitpid(pid, &status, WNOHANG) == pid;
    usleep(1000);
  }
  if (!exited) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
  }
  ASSERT_FALSE(exited) << "the child ended before it was killed";
  RlTrainer t(r, out.string());
  t.set_quiet(true);
  t.run(true);
  ASSERT_TRUE(t.finished());
  ASSERT_EQ(t.history().size(), 4u);  // restored history plus the steps run here
  for (size_t i = 0; i < 4; ++i) {
    const RlStepRecord &a = t.history()[i], &b = full.history()[i];
    EXPECT_EQ(a.mean_reward, b.mean_reward) << "step " << a.step;
    EXPECT_EQ(a.loss, b.loss) << "step " << a.step;
    EXPECT_EQ(a.weights_hash, b.weights_hash) << "step " << a.step;
  }
}

// PPO + GAE (§7.5): the value head's loss is logged each step, and its state (head and optimiser)
// resumes exactly: the policy weights after a stop and resume equal an uninterrupted run's.
TEST(Rl, GaeEstimatorLogsTheValueLossAndResumes) {
  OneThread one;
  const RlRecipe r = RlRecipe::parse(
      rl_recipe(model_dir(), 3, "[advantage]\nestimator = \"gae\"\n[checkpoint]\nevery = 1\n"));
  const fs::path full_dir = temp_dir("full");
  RlTrainer full(r, full_dir.string());
  full.set_quiet(true);
  full.run();
  const fs::path out = temp_dir("split");
  {
    RlTrainer a(r, out.string());
    a.set_quiet(true);
    a.stop_after(1);
    a.run();
  }
  RlTrainer b(r, out.string());
  b.set_quiet(true);
  b.run(true);
  ASSERT_EQ(b.history().size(), 3u);
  for (size_t i = 0; i < 3; ++i)
    EXPECT_EQ(b.history()[i].weights_hash, full.history()[i].weights_hash) << "step " << i + 1;
  std::ifstream m(full_dir / "metrics.jsonl");
  std::vector<double> vl;
  for (std::string line; std::getline(m, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("rl/value_loss")) vl.push_back(j["rl/value_loss"].get<double>());
  }
  ASSERT_EQ(vl.size(), 3u);
  for (double x : vl) EXPECT_TRUE(std::isfinite(x) && x >= 0);
}

TEST(Rl, BadRecipesNameTheField) {
  const std::string init = model_dir().string();
  const auto error = [&](const std::string& extra, const std::string& from = "",
                         const std::string& to = "") -> std::string {
    std::string text = rl_recipe(init, 2, extra);
    if (!from.empty()) text.replace(text.find(from), from.size(), to);
    try {
      RlRecipe::parse(text);
    } catch (const std::exception& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(error("[loss]\nloss_agg = \"mean\"\n").find("loss.loss_agg"), std::string::npos);
  EXPECT_NE(error("[loss]\nratio_level = \"x\"\n").find("loss.ratio_level"), std::string::npos);
  EXPECT_NE(error("[loss]\neps_low = 1.5\n").find("loss.eps_low"), std::string::npos);
  EXPECT_NE(error("[advantage]\nlambda_process = -1.0\n").find("advantage.lambda_process"),
            std::string::npos);
  EXPECT_NE(error("", "micro_batch = 8", "micro_batch = 8\nbogus = 1").find("train.bogus"),
            std::string::npos);
  EXPECT_NE(error("", "tasks = 4\n", "tasks = 0\n").find("eval.tasks"), std::string::npos);
  try {
    RlRecipe::parse("[model]\ninit = \"x\"\n[task]\nenvs = [\"chess\"]\n");
    FAIL();
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("task.envs"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("calculator"), std::string::npos) << e.what();
  }
  try {
    RlTrainer t(RlRecipe::parse("[task]\nenvs = [\"calculator\"]\n"), temp_dir().string());
    FAIL();
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("model.init"), std::string::npos) << e.what();
  }
  // SFT recipe fields.
  try {
    Recipe::parse(
        "[model]\npreset = \"tiny\"\n[data]\ncorpus = \"sft\"\n[[stage]]\nname = \"a\"\n"
        "seq_len = 64\nsteps = 1\ntokens_per_step = 64\n");
    FAIL();
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("data.sft_sources"), std::string::npos) << e.what();
  }
}

}  // namespace myriad::train
