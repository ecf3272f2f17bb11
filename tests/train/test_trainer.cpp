// The training loop end to end on a micro model (tiny preset, 2 layers): loss decreases,
// deterministic runs repeat bit for bit, resume continues exactly (after a clean stop and after a
// SIGKILL), a poisoned step is skipped and reported, and recipes name their bad keys.
#include <gtest/gtest.h>
#include <omp.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "train/recipe.h"
#include "train/trainer.h"

namespace myriad::train {
namespace {

namespace fs = std::filesystem;

fs::path temp_dir(const std::string& sub = "") {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  fs::path d = fs::path(::testing::TempDir()) / "myriad_test_trainer" /
               (std::string(info->test_suite_name()) + "." + info->name() + sub);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// A tokenizer and shard set (synthetic corpus) shared by the runs of this process, built by the
// first run; per process, so concurrent test processes never share or delete it under another.
struct DataDir {
  fs::path path = fs::path(::testing::TempDir()) / "myriad_test_trainer" / cat("data-", getpid());
  DataDir() {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~DataDir() { fs::remove_all(path); }
};
const fs::path& data_dir() {
  static const DataDir d;
  return d.path;
}

// The micro model gains nothing from threads, and one thread keeps the runs fast on a loaded
// machine (spinning OpenMP workers) and lets the SIGKILL test fork safely (libgomp's pool does not
// survive fork()).
struct OneThread {
  int threads = omp_get_max_threads();
  OneThread() { omp_set_num_threads(1); }
  ~OneThread() { omp_set_num_threads(threads); }
};

std::string micro_recipe(int64_t steps, const std::string& extra = "") {
  return cat(R"(
seed = 7
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
             (data_dir() / "tok.model").string(), R"("
shard_dir = ")",
             (data_dir() / "shards").string(), R"("
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
[log]
tensorboard = false
html = false
[[stage]]
name = "s0"
seq_len = 32
steps = )",
             steps, R"(
tokens_per_step = 256
batch_size = 4
)",
             extra);
}

std::vector<double> run_losses(const Recipe& r, const fs::path& out, int64_t stop = -1,
                               bool resume = false) {
  Trainer t(r, out.string());
  t.set_quiet(true);
  if (stop >= 0) t.stop_after(stop);
  t.run(resume);
  std::vector<double> l;
  for (const auto& h : t.history()) l.push_back(h.loss);
  return l;
}

TEST(Trainer, LossDecreases) {
  OneThread one_thread;
  const Recipe r = Recipe::parse(micro_recipe(30));
  Trainer t(r, temp_dir().string());
  t.set_quiet(true);
  t.run();
  ASSERT_EQ(t.history().size(), 30u);
  ASSERT_TRUE(t.finished());
  double first = 0, last = 0;
  for (int i = 0; i < 5; ++i) first += t.history()[i].loss / 5;
  for (int i = 25; i < 30; ++i) last += t.history()[i].loss / 5;
  EXPECT_LT(last, first - 0.5) << "first " << first << " last " << last;
  EXPECT_LT(first, std::log(320.0) + 0.5);
  ASSERT_EQ(t.stage_results().size(), 1u);
  EXPECT_TRUE(std::isfinite(t.stage_results()[0].heldout_loss));
  EXPECT_EQ(t.monitor().skips(), 0);
  for (const auto& h : t.history()) EXPECT_EQ(h.decision, Decision::Apply);
}

TEST(Trainer, DeterministicRunsAreBitIdentical) {
  OneThread one_thread;
  const Recipe r = Recipe::parse(micro_recipe(6));
  const auto a = run_losses(r, temp_dir("a"));
  const auto b = run_losses(r, temp_dir("b"));
  ASSERT_EQ(a.size(), 6u);
  EXPECT_EQ(a, b);  // exact equality of doubles
}

TEST(Trainer, ResumeContinuesExactly) {
  OneThread one_thread;
  const Recipe r = Recipe::parse(micro_recipe(10, "[checkpoint]\nevery = 5\nkeep_last = 5\n"));
  const auto full = run_losses(r, temp_dir("full"));
  const fs::path out = temp_dir("split");
  const auto head = run_losses(r, out, 5);
  ASSERT_EQ(head.size(), 5u);
  Trainer t(r, out.string());
  t.set_quiet(true);
  t.run(true);
  ASSERT_EQ(t.history().size(), 5u);
  EXPECT_EQ(t.history().front().step, 6);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(t.history()[i].loss, full[5 + i]) << "step " << 6 + i;
  EXPECT_EQ(std::vector<double>(full.begin(), full.begin() + 5), head);
}

// A child trains with a checkpoint every step and is killed with SIGKILL mid-run; the parent
// resumes from whatever the child left and must reproduce the uninterrupted trajectory.
TEST(Trainer, ResumeAfterSigkill) {
  OneThread one_thread;
  const Recipe r = Recipe::parse(micro_recipe(12, "[checkpoint]\nevery = 1\nkeep_last = 2\n"));
  const auto full = run_losses(r, temp_dir("full"));
  const fs::path out = temp_dir("killed");
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    try {
      Trainer t(r, out.string());
      t.set_quiet(true);
      t.run();
    } catch (...) {
    }
    _exit(0);
  }
  // Kill once a few checkpoints exist (polling the checkpoint dir, no timing assumptions).
  int status = 0;
  bool exited = false;
  while (!fs::exists(out / "checkpoints" / "step-000000004") && !exited) {
    exited = waitpid(pid, &status, WNOHANG) == pid;
    usleep(1000);
  }
  if (!exited) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
  }
  ASSERT_FALSE(exited) << "the child ended before it was killed";
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  Trainer t(r, out.string());
  t.set_quiet(true);
  t.run(true);
  ASSERT_TRUE(t.finished());
  ASSERT_FALSE(t.history().empty());
  const int64_t first = t.history().front().step;
  EXPECT_GE(first, 2);
  for (const auto& h : t.history()) EXPECT_EQ(h.loss, full[h.step - 1]) << "step " << h.step;
}

TEST(Trainer, PoisonedStepIsSkippedAndReported) {
  OneThread one_thread;
  const Recipe r = Recipe::parse(micro_recipe(8, "[debug]\npoison_steps = [4]\n"));
  const fs::path out = temp_dir();
  Trainer t(r, out.string());
  t.set_quiet(true);
  t.run();
  ASSERT_EQ(t.history().size(), 8u);
  for (const auto& h : t.history()) {
    EXPECT_EQ(h.decision, h.step == 4 ? Decision::Skip : Decision::Apply) << "step " << h.step;
    EXPECT_EQ(std::isfinite(h.loss), h.step != 4);
  }
  EXPECT_EQ(t.monitor().skips(), 1);
  for (const auto& h : t.history()) EXPECT_TRUE(std::isfinite(h.grad_norm) || h.step == 4);
  // The skip is in metrics.jsonl: a null loss at step 4, counted in loss/skips.
  std::ifstream f(out / "metrics.jsonl");
  std::string line;
  bool seen = false;
  while (std::getline(f, line)) {
    const auto j = nlohmann::json::parse(line);
    if (j.value("step", 0) != 4 || !j.contains("loss")) continue;
    seen = true;
    EXPECT_TRUE(j["loss"].is_null()) << line.substr(0, 200);
    EXPECT_EQ(j.value("loss/skips", 0.0), 1.0);
    EXPECT_EQ(j.value("decision", 0.0), static_cast<double>(Decision::Skip));
  }
  EXPECT_TRUE(seen);
}

// Three consecutive non-finite steps roll back to the last checkpoint; training then goes on
// (with fresh data) to the end.
TEST(Trainer, ThreeSkipsRollBack) {
  OneThread one_thread;
  const Recipe r = Recipe::parse(micro_recipe(
      8, "[checkpoint]\nevery = 2\nkeep_last = 5\n[debug]\npoison_steps = [4, 5, 6]\n"));
  Trainer t(r, temp_dir().string());
  t.set_quiet(true);
  t.run();
  ASSERT_TRUE(t.finished());
  EXPECT_EQ(t.monitor().rollbacks(), 1);
  std::vector<std::pair<int64_t, Decision>> got;
  for (const auto& h : t.history()) got.emplace_back(h.step, h.decision);
  const std::vector<std::pair<int64_t, Decision>> want = {
      {1, Decision::Apply}, {2, Decision::Apply},    {3, Decision::Apply}, {4, Decision::Skip},
      {5, Decision::Skip},  {6, Decision::Rollback}, {5, Decision::Apply}, {6, Decision::Apply},
      {7, Decision::Apply}, {8, Decision::Apply}};
  EXPECT_EQ(got, want);
  EXPECT_EQ(t.step(), 8);
}

// Stages run in order on the same weights, each ends with a held-out evaluation, and log.every
// thins metrics.jsonl.
TEST(Trainer, StagesRunInOrder) {
  OneThread one_thread;
  std::string text = micro_recipe(3,
                                  "[[stage]]\nname = \"s1\"\nseq_len = 64\nsteps = 2\n"
                                  "tokens_per_step = 256\nlr_scale = 0.5\n");
  text.replace(text.find("[log]"), 5, "[log]\nevery = 2");
  const Recipe r = Recipe::parse(text);
  ASSERT_EQ(r.stages[1].batch_size, 4);  // default: min(tokens_per_step, 2048) / seq_len
  const fs::path out = temp_dir();
  Trainer t(r, out.string());
  t.set_quiet(true);
  t.run();
  ASSERT_EQ(t.history().size(), 5u);
  EXPECT_EQ(t.history()[2].stage, "s0");
  EXPECT_EQ(t.history()[3].stage, "s1");
  EXPECT_DOUBLE_EQ(t.history()[3].lr, 0.5 * t.history()[2].lr);
  ASSERT_EQ(t.stage_results().size(), 2u);
  EXPECT_EQ(t.stage_results()[0].name, "s0");
  EXPECT_EQ(t.stage_results()[0].end_step, 3);
  EXPECT_EQ(t.stage_results()[1].end_step, 5);
  std::ifstream f(out / "metrics.jsonl");
  std::string line;
  std::vector<int64_t> logged, evals;
  while (std::getline(f, line)) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("loss")) logged.push_back(j["step"]);
    if (j.contains("heldout/loss")) evals.push_back(j["step"]);
  }
  EXPECT_EQ(logged, (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(evals, (std::vector<int64_t>{3, 5}));
}

TEST(Recipe, ErrorsNameTheKey) {
  auto err = [](const std::string& text) {
    try {
      Recipe::parse(text);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string stage = "[[stage]]\nseq_len = 32\nsteps = 2\ntokens_per_step = 128\n";
  const std::string model = "[model]\npreset = \"tiny\"\n";
  EXPECT_NE(err(model + "[optimizer]\nlr = \"x\"\n" + stage).find("optimizer.lr"),
            std::string::npos);
  EXPECT_NE(err(model + "[optimizer]\nlrr = 1\n" + stage).find("optimizer.lrr"), std::string::npos);
  EXPECT_NE(err("precision = \"bf16\"\n" + model + stage).find("precision"), std::string::npos);
  EXPECT_NE(err(model).find("stage"), std::string::npos);
  EXPECT_NE(err(model + "[[stage]]\nseq_len = 32\nsteps = 2\ntokens_per_step = 100\n")
                .find("stage[0].tokens_per_step"),
            std::string::npos);
  EXPECT_NE(err("[model]\npreset = \"nope\"\n" + stage).find("model"), std::string::npos);
  EXPECT_NE(err(model + "[model.overrides]\nhidden_size = -3\n" + stage).find("model"),
            std::string::npos);
  const Recipe r = Recipe::parse(model + stage + stage);
  EXPECT_EQ(r.total_steps(), 4);
  EXPECT_EQ(r.stages[1].name, "stage1");
  EXPECT_EQ(r.stages[0].batch_size * r.stages[0].seq_len * r.stages[0].micro_batches(), 128);
}

TEST(Recipe, TinyCpuRecipeParses) {
  const Recipe r = Recipe::load(std::string(MYRIAD_SOURCE_DIR) + "/configs/recipes/tiny-cpu.toml");
  EXPECT_EQ(r.stages.size(), 2u);
  EXPECT_EQ(r.model(512).hidden_size, 128);
}

}  // namespace
}  // namespace myriad::train
