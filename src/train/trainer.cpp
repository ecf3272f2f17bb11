#include "train/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>

#include "agent/sft.h"
#include "core/autograd.h"
#include "core/error.h"
#include "data/corpus.h"
#include "data/shards.h"
#include "data/synthetic.h"
#include "data/tokenizer.h"
#include "ops/cross_entropy.h"
#include "ops/elementwise.h"
#include "ops/reduce.h"
#include "ops/shape.h"
#include "train/balancer.h"
#include "train/checkpoint.h"
#include "train/events.h"
#include "train/expert_parallel.h"
#include "train/mixed_precision.h"
#include "train/report.h"
#include "train/signals.h"
#include "vision/fashion_mnist.h"

namespace myriad::train {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {
// Every tensor a decode cache carries between segments, in a fixed order.
std::vector<Tensor*> cache_tensors(model::DecodeCache& c) {
  std::vector<Tensor*> out;
  for (auto& k : c.kda) out.insert(out.end(), {&k.conv_BCK, &k.S_BHKV});
  for (auto& m : c.mla)
    out.insert(out.end(), {&m.latent_BSC, &m.window_gate_BS, &m.admitted_BNC, &m.admitted_bias_BN,
                           &m.latent_sum_BR});
  return out;
}

void detach_cache(model::DecodeCache& c) {
  for (Tensor* t : cache_tensors(c))
    if (t->defined()) *t = t->detach();
}

// A differentiable dtype conversion (the auxiliary loss is computed in fp32 from bf16 scores).
Tensor to_dtype(const Tensor& x, DType t) {
  if (x.dtype() == t) return x;
  Tensor out = x.to(t);
  const DType src = x.dtype();
  record("to_dtype", out, {x},
         [src](const Tensor& g) -> std::vector<Tensor> { return {g.to(src)}; });
  return out;
}
// The output projection the loss uses: lm_head, or the tied embedding.
const Tensor& output_head(const model::Decoder& dec) {
  return dec.weights().get(dec.weights().contains("lm_head.weight") ? "lm_head.weight"
                                                                    : "model.embed_tokens.weight");
}

// Context parallel: a chunk's carried state (or its gradient) to the neighbouring rank. A header
// per tensor (defined, dtype, rank, up to 4 sizes), then the bytes; both sides list the same
// cache fields, so the header's length is known to the receiver.
constexpr size_t kHead = 7;
void send_tensors(dist::Comm& c, const std::vector<Tensor>& ts, int dest) {
  std::vector<int64_t> head(kHead * ts.size(), 0);
  std::vector<Tensor> host(ts.size());
  size_t bytes = 0;
  for (size_t i = 0; i < ts.size(); ++i) {
    if (!ts[i].defined()) continue;
    MYRIAD_CHECK(ts[i].dim() <= 4, "context parallel: a state tensor of rank ", ts[i].dim());
    host[i] = ts[i].detach().to(kCPU).contiguous();
    head[kHead * i] = 1;
    head[kHead * i + 1] = static_cast<int64_t>(host[i].dtype());
    head[kHead * i + 2] = host[i].dim();
    for (int64_t d = 0; d < host[i].dim(); ++d) head[kHead * i + 3 + d] = host[i].size(d);
    bytes += host[i].nbytes();
  }
  std::vector<char> data(bytes);
  size_t off = 0;
  for (const Tensor& t : host)
    if (t.defined()) {
      std::memcpy(data.data() + off, t.data_ptr(), t.nbytes());
      off += t.nbytes();
    }
  c.send("cp_state_header", head.data(), head.size() * sizeof(int64_t), dest);
  c.send("cp_state", data.data(), data.size(), dest);
}

std::vector<Tensor> recv_tensors(dist::Comm& c, size_t n, int src) {
  std::vector<int64_t> head(kHead * n);
  c.recv("cp_state_header", head.data(), head.size() * sizeof(int64_t), src);
  std::vector<Tensor> out(n);
  size_t bytes = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!head[kHead * i]) continue;
    Shape shape(head.begin() + static_cast<std::ptrdiff_t>(kHead * i + 3),
                head.begin() + static_cast<std::ptrdiff_t>(kHead * i + 3 + head[kHead * i + 2]));
    out[i] = Tensor::empty(shape, static_cast<DType>(head[kHead * i + 1]));
    bytes += out[i].nbytes();
  }
  std::vector<char> data(bytes);
  c.recv("cp_state", data.data(), data.size(), src);
  size_t off = 0;
  for (Tensor& t : out)
    if (t.defined()) {
      std::memcpy(t.data_ptr(), data.data() + off, t.nbytes());
      off += t.nbytes();
    }
  return out;
}
}  // namespace

NamedParams Trainer::optimizer_params(const model::Decoder& dec) {
  NamedParams params;
  for (const auto& s : dec.weights().specs())
    if (s.trainable && param_group(s.name, s.shape) != ParamGroup::BalancerOwned)
      params.emplace_back(s.name, dec.weights().get(s.name));
  return params;
}

Tensor Trainer::sequence_loss(const model::Decoder& dec, const Tensor& ids_BT,
                              const Tensor& labels_BT, int64_t segment_len, bool detach_state,
                              const std::function<Tensor()>& after_forward, bool recompute,
                              const Tensor& weights_BT, const Tensor& image_embeds) {
  const int64_t B = ids_BT.size(0), T = ids_BT.size(1), d = dec.config().hidden_size;
  const int64_t L = segment_len > 0 && segment_len < T ? segment_len : T;
  MYRIAD_CHECK(T % L == 0, "trainer: segment_len ", L, " does not divide the sequence length ", T);
  MYRIAD_CHECK(!image_embeds.defined() || L == T,
               "trainer: image rows train in one pass (segment_len must be 0)");
  // Weighted rows: segment s's weighted mean counts by its share of the counted weight.
  std::vector<double> share;
  if (weights_BT.defined() && L < T) {
    const std::vector<double> w = weights_BT.to_doubles();
    const std::vector<int64_t> y = labels_BT.to_ints();
    share.assign(static_cast<size_t>(T / L), 0.0);
    double all = 0;
    for (int64_t i = 0; i < B * T; ++i)
      if (y[i] != ops::kIgnoreIndex) share[(i % T) / L] += w[i], all += w[i];
    for (double& x : share) x = all > 0 ? x / all : 0.0;
  }
  const Tensor& head = output_head(dec);
  std::optional<model::DecodeCache> cache;
  if (L < T) cache.emplace(dec.new_cache());
  Tensor total;
  for (int64_t s = 0; s < T; s += L) {
    const Tensor x = L < T ? ops::contiguous(ops::slice(ids_BT, 1, s, s + L)) : ids_BT;
    const Tensor y = L < T ? ops::contiguous(ops::slice(labels_BT, 1, s, s + L)) : labels_BT;
    const Tensor wy = !weights_BT.defined() ? Tensor()
                      : L < T               ? ops::contiguous(ops::slice(weights_BT, 1, s, s + L))
                                            : weights_BT;
    model::ForwardOutput f =
        dec.forward(x, cache ? &*cache : nullptr,
                    {.logits = false, .recompute = recompute, .image_embeds = image_embeds});
    const Tensor extra = after_forward ? after_forward() : Tensor();
    Tensor loss = ops::linear_cross_entropy(ops::reshape(f.normed_BTD, {B * L, d}), head,
                                            ops::reshape(y, {B * L}), 1024,
                                            wy.defined() ? ops::reshape(wy, {B * L}) : Tensor());
    if (f.admission_loss.defined()) loss = ops::add(loss, f.admission_loss);
    if (extra.defined()) loss = ops::add(loss, to_dtype(extra, loss.dtype()));
    // Every segment holds B * L scored tokens: weighting by L / T gives the one-pass mean.
    // With weights, by the segment's share of the counted weight instead.
    if (L < T)
      loss = ops::mul(loss, share.empty() ? static_cast<double>(L) / static_cast<double>(T)
                                          : share[static_cast<size_t>(s / L)]);
    total = total.defined() ? ops::add(total, loss) : loss;
    if (detach_state && cache) detach_cache(*cache);
  }
  return total;
}

double Trainer::segmented_backward(const model::Decoder& dec, const Tensor& ids_BT,
                                   const Tensor& labels_BT, int64_t segment_len,
                                   const Tensor& weights_BT, double scale, bool recompute) {
  const int64_t B = ids_BT.size(0), T = ids_BT.size(1), d = dec.config().hidden_size;
  const int64_t L = segment_len > 0 && segment_len < T ? segment_len : T;
  MYRIAD_CHECK(T % L == 0, "trainer: segment_len ", L, " does not divide the sequence length ", T);
  const int64_t S = T / L;
  // Each segment's share of the one-pass mean (by counted weight when weighted).
  std::vector<double> share(static_cast<size_t>(S), 0.0);
  {
    const std::vector<double> w =
        weights_BT.defined() ? weights_BT.to_doubles() : std::vector<double>();
    const std::vector<int64_t> y = labels_BT.to_ints();
    double all = 0;
    for (int64_t i = 0; i < B * T; ++i)
      if (y[static_cast<size_t>(i)] != ops::kIgnoreIndex) {
        const double x = w.empty() ? 1.0 : w[static_cast<size_t>(i)];
        share[static_cast<size_t>((i % T) / L)] += x, all += x;
      }
    for (double& x : share) x = all > 0 ? x / all : 0.0;
  }
  const Tensor& head = output_head(dec);
  const auto seg = [&](const Tensor& t, int64_t s) {
    return ops::contiguous(ops::slice(t, 1, s * L, (s + 1) * L));
  };
  // Pass 1, no graph: the cache at every segment boundary.
  std::vector<model::DecodeCache> at(static_cast<size_t>(S), dec.new_cache());
  {
    NoGradGuard ng;
    model::DecodeCache c = dec.new_cache();
    for (int64_t s = 0; s + 1 < S; ++s) {
      dec.forward(seg(ids_BT, s), &c, {.logits = false});
      at[static_cast<size_t>(s + 1)] = c;
    }
  }
  // Pass 2, last segment first: the segment's loss plus <state out, dL/d state out> from the
  // segment after it; the gradient reaching its state in goes to the segment before.
  std::vector<Tensor> g_out;
  double total = 0;
  for (int64_t s = S - 1; s >= 0; --s) {
    model::DecodeCache c = at[static_cast<size_t>(s)];
    std::vector<Tensor> leaves;
    for (Tensor* t : cache_tensors(c)) {
      if (t->defined()) *t = t->detach().requires_grad_();
      leaves.push_back(*t);
    }
    const model::ForwardOutput f =
        dec.forward(seg(ids_BT, s), &c, {.logits = false, .recompute = recompute});
    const Tensor wy = weights_BT.defined() ? ops::reshape(seg(weights_BT, s), {B * L}) : Tensor();
    Tensor loss = ops::linear_cross_entropy(ops::reshape(f.normed_BTD, {B * L, d}), head,
                                            ops::reshape(seg(labels_BT, s), {B * L}), 1024, wy);
    if (f.admission_loss.defined()) loss = ops::add(loss, f.admission_loss);
    loss = ops::mul(loss, share[static_cast<size_t>(s)]);
    total += loss.item();
    Tensor obj = ops::mul(loss, scale);
    const std::vector<Tensor*> out = cache_tensors(c);
    for (size_t k = 0; k < g_out.size(); ++k)
      if (g_out[k].defined() && out[k]->defined() && out[k]->requires_grad())
        obj = ops::add(obj, ops::sum(ops::mul(*out[k], g_out[k])));
    obj.backward();
    g_out.assign(leaves.size(), Tensor());
    for (size_t k = 0; k < leaves.size(); ++k)
      if (leaves[k].defined() && leaves[k].grad().defined()) g_out[k] = leaves[k].grad();
  }
  return total;
}

struct Trainer::Impl {
  Recipe r;
  fs::path out;
  dist::Comm* comm = nullptr;  // the data-parallel ranks (size 1: one process)
  int rank = 0, ranks = 1;
  // Context parallel: ranks = dps x cp; rank = dp_rank * cp + cp_rank; cp_comm holds the cp
  // ranks of one sequence, in chunk order.
  int cp = 1, dps = 1, dp_rank = 0, cp_rank = 0;
  std::unique_ptr<dist::Comm> cp_comm;
  // Expert parallel: groups of ep consecutive ranks (ep_comm) run the experts of their
  // micro-batches together.
  int ep = 1;
  std::unique_ptr<dist::Comm> ep_comm, replica_comm;  // replica_comm: ranks running my experts
  std::optional<ExpertParallel> ep_runner;
  std::map<std::string, dist::CollectiveStats> comm_totals;  // over the steps run here

  // The communicators this rank uses, the world first.
  std::vector<dist::Comm*> comms() const {
    std::vector<dist::Comm*> v = {comm};
    for (const auto* c : {&cp_comm, &ep_comm, &replica_comm})
      if (*c) v.push_back(c->get());
    return v;
  }
  // This step's collectives over all groups, by name.
  std::map<std::string, dist::CollectiveStats> step_comm() const {
    std::map<std::string, dist::CollectiveStats> m;
    for (const dist::Comm* c : comms())
      for (const auto& [name, cs] : c->stats()) {
        dist::CollectiveStats& t = m[name];
        t.calls += cs.calls, t.bytes += cs.bytes, t.seconds += cs.seconds;
      }
    return m;
  }
  bool setting_up = false;
  std::optional<data::Tokenizer> tok;
  std::optional<model::Decoder> dec;  // fp32 master weights (optimiser, checkpoints, hooks)
  // precision = "bf16": the bf16 working copy that runs forward and backward, refreshed from the
  // master after every step; its gradients go into the fp32 master's after every micro-batch.
  std::optional<Bf16Copy> shadow;
  std::optional<Optimizer> opt;
  std::map<int64_t, Balancer> bal;  // by decoder layer
  std::optional<data::TokenStream> stream;
  std::string stream_dir;  // the shard directory `stream` reads
  // corpus = "fashion_mnist": the image conversations with text rows from `stream_dir` mixed in
  // (it reads its own cursor over the same shards); `test_images` for the stage-end evaluation.
  std::unique_ptr<vision::ImageTextStream> images;
  std::optional<vision::ImageSet> test_images;
  std::optional<CheckpointManager> ckpt;
  std::optional<RunReport> report;
  std::optional<EventWriter> events;
  Monitor mon;
  std::vector<StepRecord> hist;
  std::vector<StageResult> stages;
  std::optional<StageEvaluator> evaluator;  // [eval]
  int64_t step = 0, stop_at = -1, last_saved = -1;
  bool quiet = false, tty = false, finished = false, gate_stop = false;
  double train_seconds = 0;
  int64_t timed_steps = 0;
  // Wall time of the run: the checkpoint's (on resume) plus this process's since run() began.
  double wall_base = 0;
  Clock::time_point wall_start = Clock::now();

  double wall() const {
    return wall_base + std::chrono::duration<double>(Clock::now() - wall_start).count();
  }
  // Tokens trained on in the first `s` steps.
  int64_t tokens_at(int64_t s) const {
    int64_t n = 0;
    for (const StageSpec& sp : r.stages) {
      n += std::min(s, sp.steps) * sp.tokens_per_step;
      if ((s -= std::min(s, sp.steps)) == 0) break;
    }
    return n;
  }

  const model::Decoder& fw() const { return shadow ? shadow->decoder() : *dec; }
  // after_step: only the optimizer's step() changed the master since the last sync; it wrote the
  // copy's trainable tensors itself (Bf16Copy::attach).
  void sync_shadow(bool after_step = false) {
    if (shadow) after_step ? shadow->refresh_buffers() : shadow->refresh();
  }

  std::string path(const std::string& p) const {
    return fs::path(p).is_absolute() ? p : (out / p).string();
  }

  std::vector<agent::SftSource> sft_sources() const {
    std::vector<agent::SftSource> out;
    for (size_t i = 0; i < r.sft_sources.size(); ++i)
      out.push_back({r.sft_sources[i], r.sft_noise.empty() ? 0.0 : r.sft_noise[i], r.sft_examples});
    return out;
  }

  std::vector<std::string> corpus() const {
    if (r.corpus == "sft") return agent::sft_text(sft_sources(), r.seed);
    if (r.corpus == "synthetic")
      return data::synthetic_fallback_corpus(r.seed, static_cast<size_t>(r.max_corpus_bytes));
    return data::builtin_corpus(static_cast<size_t>(r.max_corpus_bytes));
  }

  // Rank 0 builds the files (tokenizer, shards) first; the other ranks then find and load them.
  void setup() {
    rank = comm->rank(), ranks = comm->size();
    cp = static_cast<int>(r.parallel.cp);
    MYRIAD_CHECK(ranks % cp == 0, "parallel.cp = ", cp, " does not divide the ", ranks,
                 " ranks started");
    dps = ranks / cp, dp_rank = rank / cp, cp_rank = rank % cp;
    MYRIAD_CHECK(r.parallel.dp == 0 || r.parallel.dp == dps, "parallel.dp = ", r.parallel.dp,
                 " but ", ranks, " rank", ranks == 1 ? " was" : "s were", " started with cp = ", cp,
                 " (mpirun -np N sets the ranks; dp = 0 takes them all)");
    for (const StageSpec& sp : r.stages) {
      // Uneven dealing is allowed (a rank may get one micro-batch fewer, or none: the 16K stage
      // of a curriculum has one per step); expert parallel runs collectives inside every
      // micro-batch, so its ranks must get the same number.
      MYRIAD_CHECK(r.parallel.ep <= 1 || sp.micro_batches() % dps == 0, "stage ", sp.name, ": ",
                   sp.micro_batches(), " micro-batches per step do not divide over ", dps,
                   " data-parallel ranks, which expert parallel needs (tokens_per_step / "
                   "(batch_size * seq_len) must be a multiple of dp)");
      MYRIAD_CHECK(cp == 1 || (sp.seq_len % cp == 0 &&
                               (sp.segment_len == 0 || sp.segment_len == sp.seq_len / cp)),
                   "stage ", sp.name, ": context parallel splits seq_len ", sp.seq_len, " into ",
                   cp, " chunks; segment_len must be 0 or seq_len / cp");
    }
    MYRIAD_CHECK(cp == 1 || r.corpus != "fashion_mnist",
                 "parallel.cp: image rows train in one pass, not context parallel");
    if (cp > 1) cp_comm = comm->split(dp_rank, cp_rank);
    ep = static_cast<int>(r.parallel.ep);
    if (ep > 1) {
      MYRIAD_CHECK(dps % ep == 0, "parallel.ep = ", ep, " does not divide the ", dps,
                   " data-parallel ranks");
      MYRIAD_CHECK(cp == 1, "parallel.ep: not with context parallel (cp = ", cp, ")");
      MYRIAD_CHECK(r.corpus != "fashion_mnist", "parallel.ep: image rows are not supported");
      MYRIAD_CHECK(r.parallel.zero == 1, "parallel.ep: needs zero = 1 (ZeRO-1)");
      ep_comm = comm->split(rank / ep, rank % ep);
      replica_comm = comm->split(rank % ep, rank);
      ep_runner.emplace(*ep_comm);
    }
    if (ranks > 1) {
      if (r.parallel.timeout_s > 0) comm->set_timeout(r.parallel.timeout_s);
      quiet = quiet || rank != 0;
      if (rank != 0) comm->barrier("setup");
    }
    setting_up = true;
    build();
    setting_up = false;
    if (ranks > 1 && rank == 0) comm->barrier("setup");
  }

  void build() {
    fs::create_directories(out);
    const std::string tok_path = path(r.tokenizer), shard_dir = path(r.shard_dir);
    std::vector<std::string> docs;
    if (!r.model_init.empty() && !fs::exists(tok_path))
      fs::copy_file(fs::path(r.model_init) / "tokenizer.model", tok_path);
    if (!fs::exists(tok_path) ||
        (r.corpus != "sft" && !fs::exists(fs::path(shard_dir) / "meta.json")))
      docs = corpus();
    if (fs::exists(tok_path)) {
      tok.emplace(data::Tokenizer::load(tok_path));
    } else {
      MYRIAD_CHECK(!docs.empty(), "data: the ", r.corpus, " corpus is empty");
      std::vector<std::string> tdocs = docs;
      if (r.corpus == "fashion_mnist") {  // the questions and answers tokenise well too
        const vision::ImageSet probe = vision::synthetic_images(2000, r.seed);
        for (int64_t i = 0; i < 2000; ++i) {
          const vision::Example e = vision::make_example(
              probe, static_cast<vision::Question>(i % vision::kQuestionKinds), r.seed, i);
          tdocs.push_back(e.question + "\n" + e.answer);
        }
      }
      tok.emplace(data::Tokenizer::train(tdocs, static_cast<int>(r.vocab_size), tok_path));
    }
    if (!fs::exists(fs::path(shard_dir) / "meta.json")) {
      if (r.corpus == "sft") {
        agent::EpisodeLimits lim;
        lim.max_total_tokens = r.sft_max_tokens;
        const agent::SftDocs sd = agent::sft_documents(sft_sources(), *tok, r.seed, lim);
        data::write_token_shards(sd.tokens, tok->vocab_size(), tok->eos(), shard_dir,
                                 r.shard_tokens, r.heldout_fraction, r.seed, &sd.weights);
      } else {
        data::write_token_shards(docs, *tok, shard_dir, r.shard_tokens, r.heldout_fraction, r.seed);
      }
    }
    if (r.corpus == "sft") {  // the server renders chats as the SFT data did
      std::ofstream f(out / "chat_template.txt", std::ios::trunc);
      f << agent::kAgentTemplateText;
      MYRIAD_CHECK(f.good(), "cannot write ", (out / "chat_template.txt").string());
    }

    const model::ModelConfig cfg =
        r.model(r.model_init.empty() ? tok->vocab_size()
                                     : model::ModelConfig::load(r.model_init).vocab_size);
    MYRIAD_CHECK(ep == 1 || (cfg.num_experts > 0 && cfg.num_experts % ep == 0),
                 "parallel.ep = ", ep, ": the model's ", cfg.num_experts,
                 " routed experts do not divide over the EP ranks");
    if (r.model_init.empty()) {
      dec.emplace(model::Decoder::random(cfg, r.seed));
    } else {
      dec.emplace(model::Decoder::load(r.model_init));
      MYRIAD_CHECK(dec->config().to_json() == cfg.to_json(),
                   "model.init: model.overrides cannot change an initial model's config");
    }
    dec->weights().requires_grad_(true);  // replaces the tensors: collect them afterwards
    opt.emplace(optimizer_params(*dec), r.optimizer);
    ExpertShards shards;
    if (ep > 1) {
      // "...experts.<j>.<proj>.weight" runs on the EP rank holding the block of expert j.
      const int64_t per = cfg.num_experts / ep;
      shards = {ep,
                [per](const std::string& name) {
                  const size_t at = name.find(".experts.");
                  return at == std::string::npos
                             ? -1
                             : static_cast<int>(std::stoll(name.substr(at + 9)) / per);
                },
                replica_comm.get()};
    }
    opt->distribute(comm, r.parallel.zero == 1, shards);
    if (r.precision == "bf16") shadow.emplace(*dec), shadow->attach(*opt);
    for (int64_t i = 0; i < cfg.num_hidden_layers; ++i)
      if (cfg.is_moe_layer(i))
        bal.emplace(i, Balancer(cfg.myriad.balancer, cfg.num_experts, cfg.num_experts_per_token));
    use_stage_data(0);
    ckpt.emplace(path(r.checkpoint_dir), r.keep_last);
    if (rank == 0 && (r.log_jsonl || r.log_html)) report.emplace(out.string());
    if (rank == 0 && r.log_tensorboard) events.emplace((out / "tensorboard").string());
    if (r.eval.enabled) {
      evaluator.emplace(r.eval, r.seed + 0x9e3779b97f4a7c15ull);  // not training's
      // Every rank runs its share of the items; one all-reduce gives all ranks every answer.
      if (ranks > 1)
        evaluator->share(rank, ranks, [this](std::vector<double>& v) {
          comm->all_reduce_sum("eval_answers", v.data(), v.size());
        });
    }
    tty = isatty(fileno(stdout)) != 0;
  }

  std::string stage_dir(size_t i) const {
    const StageSpec& sp = r.stages[i];
    return sp.data_mix == "long" ? (out / ("stage-" + sp.name)).string() : path(r.shard_dir);
  }

  // §5.2 mix for a "long" stage: about 1.25x the tokens the stage trains on, so an epoch is not
  // repeated, tokenised into the stage's own shards (with their own held-out split).
  void build_long_mix(size_t i, const std::string& dir) {
    const StageSpec& sp = r.stages[i];
    const int64_t prev = i > 0 ? r.stages[i - 1].seq_len : std::max<int64_t>(1, sp.seq_len / 4);
    const int64_t total = std::max(sp.steps * sp.tokens_per_step, 8 * sp.seq_len) * 5 / 4;
    const data::Filler filler =
        r.corpus == "builtin" ? data::Filler::wordnet(false) : data::Filler::fixed();
    const data::LongContextMix mix =
        data::mix_long_context(r.seed + i, corpus(), sp.seq_len, prev, total, *tok, filler,
                               sp.synthetic_fraction, static_cast<int>(sp.answer_weight));
    data::write_token_shards(mix.docs, tok->vocab_size(), tok->eos(), dir, r.shard_tokens,
                             r.heldout_fraction, r.seed + i, &mix.weights);
    if (!quiet)
      std::printf(
          "stage %s: long-context mix in %s (%lld long, %lld short, %lld synthetic tokens)\n",
          sp.name.c_str(), dir.c_str(), static_cast<long long>(mix.long_tokens),
          static_cast<long long>(mix.short_tokens), static_cast<long long>(mix.synthetic_tokens));
  }

  // Points `stream` at stage i's data (built on first use); a new directory starts a new stream.
  void use_stage_data(size_t i) {
    const std::string dir = stage_dir(i);
    if (dir == stream_dir) return;
    if (r.stages[i].data_mix == "long" && rank == 0 && !fs::exists(fs::path(dir) / "meta.json"))
      build_long_mix(i, dir);
    if (r.stages[i].data_mix == "long" && ranks > 1 && !setting_up) comm->barrier("stage_data");
    stream.emplace(dir, "train", r.seed);
    stream_dir = dir;
    if (r.corpus == "fashion_mnist") {
      vision::TaskMix mix;
      std::copy(r.question_weights.begin(), r.question_weights.end(), mix.weights.begin());
      mix.text_fraction = r.text_fraction;
      images = std::make_unique<vision::ImageTextStream>(
          vision::fashion_or_synthetic("train", 6000, r.seed), *tok, *dec->config().vision, mix,
          std::make_unique<data::TokenStream>(dir, "train", r.seed + 1), r.seed);
      if (!test_images) test_images = vision::fashion_or_synthetic("test", 1000, r.seed);
    }
    MYRIAD_CHECK(stream->vocab_size() <= dec->config().vocab_size, "data: shards in ", dir,
                 " have vocab ", stream->vocab_size(), " > the model's ", dec->config().vocab_size);
  }

  // Index of the stage that step `s` (0-based, the next step to run) belongs to.
  size_t stage_of(int64_t s) const {
    int64_t end = 0;
    for (size_t i = 0; i < r.stages.size(); ++i)
      if (s < (end += r.stages[i].steps)) return i;
    return r.stages.size();
  }
  int64_t stage_end(size_t i) const {
    int64_t end = 0;
    for (size_t j = 0; j <= i; ++j) end += r.stages[j].steps;
    return end;
  }

  // with_optimizer = false: without the optimizer state (a ZeRO-1 save writes it per rank).
  TrainState state(bool with_optimizer = true) const {
    TrainState s;
    s.step = step;
    s.model = dec->weights().tensors();
    if (with_optimizer) s.optimizer = opt->gathered_state_dict();
    for (const auto& [l, b] : bal) s.balancer[cat("layer", l, ".bias")] = dec->selection_bias(l);
    s.rng_seed = r.seed;
    s.rng_offset = static_cast<uint64_t>(step);
    s.data_cursor = stream->state().to_json();
    s.recipe = r.text;
    if (images) s.extra["image_stream"] = images->state();
    s.extra["config"] = dec->config().to_json();
    s.extra["data_dir"] = fs::path(stream_dir).lexically_relative(out).string();
    s.extra["monitor"] = mon.state();
    for (const auto& [l, b] : bal) s.extra["balancers"][std::to_string(l)] = b.state();
    s.extra["stages"] = nlohmann::json::array();
    for (const StageResult& st : stages)
      s.extra["stages"].push_back(
          {{"name", st.name}, {"end_step", st.end_step}, {"heldout_loss", st.heldout_loss}});
    if (evaluator) s.extra["evaluator"] = evaluator->state();
    s.extra["wall_seconds"] = wall();
    return s;
  }

  // Expert parallel: the other ranks' experts are stale between steps (each rank updates only
  // those it runs); a checkpoint, an evaluation or the caller after run() needs them current.
  void sync_experts() {
    if (ep == 1) return;
    opt->sync_experts();
    sync_shadow();
  }

  // Every rank takes part. ZeRO-1: each rank writes the optimizer state it owns, rank 0 the
  // rest (CheckpointManager's data-parallel save); otherwise rank 0 writes it all.
  void save() {
    if (last_saved == step) return;
    sync_experts();
    if (ranks > 1 && r.parallel.zero == 1) {
      ckpt->save(state(false), *comm, opt->owned_state_dict());
    } else {
      const TrainState s = state();
      if (rank == 0) ckpt->save(s);
      if (ranks > 1) comm->barrier("checkpoint");
    }
    last_saved = step;
  }

  // Model weights, optimiser and step; the data cursor, monitor and balancer state only when
  // `data` is set (a rollback keeps reading forward, skipping the window that failed, and keeps
  // its monitor history: the skips that caused it).
  void restore(const TrainState& s, bool data) {
    NoGradGuard ng;
    for (const auto& [name, t] : s.model) {
      Tensor dst = dec->weights().get(dec->weights().canonical(name));
      dst.copy_(t);
    }
    opt->load_state_dict(s.optimizer);
    if (data && s.step < r.total_steps()) {
      // A checkpoint at a stage boundary holds the finished stage's cursor: the next stage's
      // data then starts fresh, as it does in an uninterrupted run.
      use_stage_data(stage_of(s.step));
      const bool same = !s.extra.is_object() || !s.extra.contains("data_dir") ||
                        s.extra["data_dir"].get<std::string>() ==
                            fs::path(stream_dir).lexically_relative(out).string();
      if (same) stream->restore(data::TokenStream::State::from_json(s.data_cursor));
      if (same && images && s.extra.is_object() && s.extra.contains("image_stream"))
        images->restore(s.extra["image_stream"].get<std::string>());
    }
    // Stages that ended after the checkpoint end again (and are evaluated again) on the way back.
    std::erase_if(stages, [&](const StageResult& st) { return st.end_step > s.step; });
    if (evaluator) evaluator->forget_after(s.step);
    if (data && s.extra.is_object()) {
      if (s.extra.contains("stages")) {
        stages.clear();
        for (const auto& st : s.extra["stages"])
          stages.push_back({st.at("name").get<std::string>(), st.at("end_step").get<int64_t>(),
                            st.at("heldout_loss").is_number()
                                ? st["heldout_loss"].get<double>()
                                : std::numeric_limits<double>::quiet_NaN()});
      }
      if (evaluator && s.extra.contains("evaluator")) evaluator->load_state(s.extra["evaluator"]);
      if (s.extra.contains("wall_seconds")) {
        wall_base = s.extra["wall_seconds"].get<double>();
        wall_start = Clock::now();
      }
      if (s.extra.contains("monitor")) mon.load_state(s.extra["monitor"]);
      if (s.extra.contains("balancers"))
        for (auto& [l, b] : bal) {
          const std::string key = std::to_string(l);
          if (s.extra["balancers"].contains(key)) b.load_state(s.extra["balancers"][key]);
        }
    }
    sync_shadow();
    step = s.step;
    last_saved = s.step;
  }

  // The held-out batches are dealt over the ranks like training's micro-batches; one all-reduce
  // of the per-batch losses (zeros elsewhere), then the sum in batch order: the bits of one
  // process.
  double heldout_loss(const StageSpec& sp) const {
    NoGradGuard ng;
    data::TokenStream hs(stream_dir, "heldout", r.seed);
    std::vector<double> losses(static_cast<size_t>(r.heldout_batches), 0.0);
    for (int64_t i = 0; i < r.heldout_batches; ++i) {
      // SFT: the loss of the assistant's tokens (the mask), on rows that start at conversations.
      const bool sft = r.corpus == "sft";
      const data::Batch b = hs.next(sp.batch_size, sp.seq_len, sft);
      if (i % ranks != rank) continue;
      losses[static_cast<size_t>(i)] =
          sequence_loss(fw(), b.input_ids, b.labels, sp.segment_len, false, {}, false,
                        sft ? b.loss_weights : Tensor())
              .item();
    }
    if (ranks > 1) comm->all_reduce_sum("heldout_losses", losses.data(), losses.size());
    double sum = 0;
    for (double l : losses) sum += l;
    return sum / static_cast<double>(r.heldout_batches);
  }

  void log(int64_t s, const std::map<std::string, double>& v) {
    if (report) report->scalars(s, v);
    if (events) events->scalars(s, v);
  }

  void progress(const StepRecord& h, double tokens_per_s) {
    if (quiet) return;
    const double per_step = timed_steps ? train_seconds / static_cast<double>(timed_steps) : 0;
    const double eta = per_step * static_cast<double>(r.total_steps() - step);
    std::printf(
        "%s[%s] step %lld/%lld  loss %.4f  lr %.2e  gnorm %.3f  maxvio %.3f  %.0f tok/s  "
        "ETA %02d:%02d%s%s",
        tty ? "\r" : "", h.stage.c_str(), static_cast<long long>(h.step),
        static_cast<long long>(r.total_steps()), h.loss, h.lr, h.grad_norm, h.max_violation,
        tokens_per_s, static_cast<int>(eta) / 60, static_cast<int>(eta) % 60,
        h.decision == Decision::Apply  ? ""
        : h.decision == Decision::Skip ? "  SKIP"
                                       : "  ROLLBACK",
        tty ? "   " : "\n");
    std::fflush(stdout);
  }

  // Context parallel: this rank's chunk of the micro-batch's sequences. The decode state comes in
  // from the rank before (forward) and goes out to the rank after; its gradient comes back from
  // the rank after and goes to the rank before (backward): segmented_backward's exchange, across
  // processes. Returns this chunk's share of the micro-batch loss, with sequence_loss's weights
  // (L / T, or the chunk's share of the counted weight).
  double cp_backward(const model::Decoder& d, const data::Batch& b, const StageSpec& sp,
                     double scale, const std::function<Tensor()>& after_forward) {
    const int64_t B = b.input_ids.size(0), T = b.input_ids.size(1), L = T / cp;
    const int64_t D = d.config().hidden_size, c = cp_rank;
    const auto chunk = [&](const Tensor& t) {
      return ops::contiguous(ops::slice(t, 1, c * L, (c + 1) * L));
    };
    double share = static_cast<double>(L) / static_cast<double>(T);
    if (b.loss_weights.defined()) {
      const std::vector<double> w = b.loss_weights.to_doubles();
      const std::vector<int64_t> y = b.labels.to_ints();
      double mine = 0, all = 0;
      for (int64_t i = 0; i < B * T; ++i)
        if (y[static_cast<size_t>(i)] != ops::kIgnoreIndex) {
          all += w[static_cast<size_t>(i)];
          if ((i % T) / L == c) mine += w[static_cast<size_t>(i)];
        }
      share = all > 0 ? mine / all : 0.0;
    }
    const bool carry_grad = !sp.detach_state;
    model::DecodeCache cache = d.new_cache();
    std::vector<Tensor> leaves;
    if (c > 0) {
      const std::vector<Tensor*> in = cache_tensors(cache);
      std::vector<Tensor> got = recv_tensors(*cp_comm, in.size(), static_cast<int>(c - 1));
      for (size_t k = 0; k < in.size(); ++k) {
        if (got[k].defined() && carry_grad) got[k].requires_grad_();
        *in[k] = got[k];
        leaves.push_back(got[k]);
      }
      cache.position = c * L;
      for (auto& m : cache.mla)
        if (m.latent_sum_BR.defined()) m.count = c * L;
    }
    const model::ForwardOutput f =
        d.forward(chunk(b.input_ids), &cache, {.logits = false, .recompute = sp.recompute});
    const Tensor extra = after_forward ? after_forward() : Tensor();
    const Tensor& head = output_head(d);
    const Tensor wy =
        b.loss_weights.defined() ? ops::reshape(chunk(b.loss_weights), {B * L}) : Tensor();
    Tensor loss = ops::linear_cross_entropy(ops::reshape(f.normed_BTD, {B * L, D}), head,
                                            ops::reshape(chunk(b.labels), {B * L}), 1024, wy);
    if (f.admission_loss.defined()) loss = ops::add(loss, f.admission_loss);
    if (extra.defined()) loss = ops::add(loss, to_dtype(extra, loss.dtype()));
    loss = ops::mul(loss, share);
    const std::vector<Tensor*> out = cache_tensors(cache);
    Tensor obj = ops::mul(loss, scale);
    if (c + 1 < cp) {
      std::vector<Tensor> state;
      for (Tensor* t : out) state.push_back(*t);
      send_tensors(*cp_comm, state, static_cast<int>(c + 1));
      if (carry_grad) {
        const std::vector<Tensor> g = recv_tensors(*cp_comm, out.size(), static_cast<int>(c + 1));
        for (size_t k = 0; k < out.size(); ++k)
          if (g[k].defined() && out[k]->defined() && out[k]->requires_grad())
            obj = ops::add(obj, ops::sum(ops::mul(*out[k], g[k].to(out[k]->dtype()))));
      }
    }
    obj.backward();
    if (c > 0 && carry_grad) {
      std::vector<Tensor> g(leaves.size());
      for (size_t k = 0; k < leaves.size(); ++k)
        if (leaves[k].defined() && leaves[k].grad().defined()) g[k] = leaves[k].grad();
      send_tensors(*cp_comm, g, static_cast<int>(c - 1));
    }
    return loss.item();
  }

  void train_step(const StageSpec& sp) {
    const auto t0 = Clock::now();
    for (dist::Comm* c : comms())
      c->reset_stats();  // this step's collectives, logged as comm/<name>/{bytes,seconds}
    const int64_t n_micro = sp.micro_batches();
    // A poisoned step fires once, so a rollback past it does not poison it again.
    const auto pit = std::find(r.poison_steps.begin(), r.poison_steps.end(), step + 1);
    const bool poison = pit != r.poison_steps.end();
    if (poison) r.poison_steps.erase(pit);
    opt->zero_grad();
    double loss_sum = 0, aux_sum = 0;
    std::vector<double> mb_loss(static_cast<size_t>(2 * n_micro), 0.0);  // LM loss, then aux
    std::map<int64_t, model::RouteStats> sample;
    const model::Decoder& d = fw();
    const bool aux_mode = d.config().myriad.balancer.mode == "aux_loss";
    MYRIAD_CHECK(!(aux_mode && sp.recompute), "stage ", sp.name,
                 ": recompute = true cannot be combined with the aux_loss balancer (the auxiliary "
                 "loss needs the router's graph after the forward)");
    const int64_t seg = sp.segment_len > 0 && sp.segment_len < sp.seq_len ? sp.segment_len : 0;
    const int64_t L = cp > 1 ? sp.seq_len / cp : seg ? seg : sp.seq_len;
    // Expert parallel: the group's ranks run their experts together in these micro-batches.
    struct Runner {
      const model::Decoder& d;
      ~Runner() { d.set_expert_runner(nullptr); }
    } runner{d};
    if (ep_runner) d.set_expert_runner(&*ep_runner);
    for (int64_t mb = 0; mb < n_micro; ++mb) {
      // Every rank reads every micro-batch (the cursors stay equal, so a checkpoint resumes at
      // any dp) and trains on those dealt to it, round-robin.
      const data::Batch b = images ? images->next(sp.batch_size, sp.seq_len)
                                   : stream->next(sp.batch_size, sp.seq_len,
                                                  sp.data_mix == "long" || r.corpus == "sft");
      if (mb % dps != dp_rank) continue;
      const Tensor embeds =
          b.pixel_values.defined()
              ? d.encode_images(
                    b.pixel_values.to(d.weights().get("model.embed_tokens.weight").dtype()),
                    b.grids)
              : Tensor();
      double aux_mb = 0;
      // The balancers see every segment's routing; in aux_loss mode each MoE layer adds its
      // α n Σ f_j P_j term (per sequence of the segment with aux_scope = "sequence").
      const std::function<Tensor()> after_forward = [&]() -> Tensor {
        Tensor aux;
        for (auto& [l, bl] : bal) {
          const model::RouteStats& rs = d.last_route(l);
          bl.observe(rs.scores_Nn, rs.selected_Nk, d.selection_bias(l));
          if (mb + dps >= n_micro) sample[l] = {rs.scores_Nn, rs.selected_Nk, {}};
          if (aux_mode && rs.scores_graph.defined()) {
            const DType t = rs.scores_graph.dtype() == DType::F64 ? DType::F64 : DType::F32;
            Tensor a = bl.aux_loss(to_dtype(rs.scores_graph, t), rs.selected_Nk, L);
            aux = aux.defined() ? ops::add(aux, a) : a;
          }
        }
        if (aux.defined())
          aux_mb += aux.item() * static_cast<double>(L) / static_cast<double>(sp.seq_len);
        return aux;
      };
      const double scale =
          poison && mb == 0 ? std::numeric_limits<double>::quiet_NaN() : 1.0 / n_micro;
      double value = 0;  // this rank's part of the micro-batch loss (all of it without cp)
      if (cp > 1) {
        value = cp_backward(d, b, sp, scale, after_forward);
      } else {
        const Tensor loss = sequence_loss(d, b.input_ids, b.labels, sp.segment_len, sp.detach_state,
                                          after_forward, sp.recompute, b.loss_weights, embeds);
        ops::mul(loss, scale).backward();
        value = loss.item();
      }
      if (shadow) shadow->accumulate_grads();
      if (r.deterministic) opt->stash_gradients();  // summed in micro-batch order at any dp
      // The logged loss is the language-model loss; the auxiliary term is logged as loss/aux.
      mb_loss[static_cast<size_t>(mb)] =
          poison ? std::numeric_limits<double>::quiet_NaN() : value - aux_mb;
      mb_loss[static_cast<size_t>(n_micro + mb)] = aux_mb;
    }
    // To their owners (deterministic: the stashed micro-batches, in micro-batch order).
    opt->reduce_gradients(r.deterministic ? n_micro : 0, cp);
    // Each micro-batch's loss comes from one data-parallel group (its chunks from the cp ranks):
    // the sum over ranks is exact without cp, and the total is taken in micro-batch order.
    if (ranks > 1) comm->all_reduce_sum("dp_loss_all_reduce", mb_loss.data(), mb_loss.size());
    for (int64_t mb = 0; mb < n_micro; ++mb) {
      loss_sum += mb_loss[static_cast<size_t>(mb)];
      aux_sum += mb_loss[static_cast<size_t>(n_micro + mb)];
    }
    StepStats st;
    st.step = step + 1;
    st.loss = loss_sum / static_cast<double>(n_micro);
    st.grad_norm = opt->clip_grad_norm(&st.group_norms);
    const Decision dn = mon.decide(st.loss, st.grad_norm);
    const double lr = lr_at(r.schedule, step) * sp.lr_scale;
    if (dn == Decision::Apply) opt->step(lr);
    for (auto& [l, bl] : bal) {
      bl.all_reduce(*comm, dec->selection_bias(l));  // the global batch's counts, histogram
      LayerRouting lr_stats;
      lr_stats.layer = l;
      lr_stats.counts = bl.counts();
      lr_stats.tokens = bl.tokens();
      lr_stats.top_k = dec->config().num_experts_per_token;
      lr_stats.scores_Nn = sample[l].scores_Nn;
      lr_stats.selected_Nk = sample[l].selected_Nk;
      Tensor bias = dec->selection_bias(l);
      if (dn == Decision::Rollback) {
        Tensor scratch = bias.clone();  // resets the accumulators; the bias is restored below
        bl.update(scratch);
      } else {
        const Tensor old = bias.clone();
        bl.update(bias);
        for (double v : bias.to_doubles())
          if (!std::isfinite(v)) {
            bias.copy_(old);  // non-finite routing scores must not poison the bias
            break;
          }
      }
      lr_stats.bias = bias.to_doubles();
      st.layers.push_back(std::move(lr_stats));
    }
    ++step;
    for (const auto& [name, cs] : step_comm()) {
      dist::CollectiveStats& t = comm_totals[name];
      t.calls += cs.calls, t.bytes += cs.bytes, t.seconds += cs.seconds;
    }
    std::map<std::string, double> scalars = mon.step(st);
    if (aux_mode) scalars["loss/aux"] = aux_sum / static_cast<double>(n_micro);
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    train_seconds += secs;
    ++timed_steps;
    StepRecord h{step, sp.name, st.loss, st.grad_norm, lr, 0, dn};
    for (const auto& [k, v] : scalars)
      if (k.size() > 12 && k.compare(k.size() - 12, 12, "/load/maxvio") == 0)
        h.max_violation = std::max(h.max_violation, v);
    const double tps = static_cast<double>(sp.tokens_per_step) / secs;
    if (dn == Decision::Rollback) {
      if (auto s = ckpt->load_latest(true)) {
        restore(*s, false);
        std::fprintf(stderr, "trainer: 3 skipped steps; rolled back to step %lld\n",
                     static_cast<long long>(step));
      } else {
        std::fprintf(stderr, "trainer: 3 skipped steps but no checkpoint to roll back to\n");
      }
    }
    sync_shadow(dn != Decision::Rollback);  // the updated biases (or the rolled-back weights)
    hist.push_back(h);
    if (h.step % r.log_every == 0 || dn != Decision::Apply) {
      scalars["loss"] = st.loss;
      scalars["lr"] = lr;
      scalars["grad/norm"] = st.grad_norm;
      scalars["perf/tokens_per_s"] = tps;
      scalars["perf/step_seconds"] = secs;
      scalars["perf/wall_seconds"] = wall();
      scalars["stage"] = static_cast<double>(stage_of(h.step - 1));
      scalars["seq_len"] = static_cast<double>(sp.seq_len);
      scalars["tokens"] = static_cast<double>(tokens_at(h.step));
      scalars["decision"] = static_cast<double>(dn);
      if (ranks > 1) {
        double bytes = 0, seconds = 0;
        for (const auto& [name, cs] : step_comm()) {
          scalars["comm/" + name + "/bytes"] = cs.bytes;
          scalars["comm/" + name + "/seconds"] = cs.seconds;
          bytes += cs.bytes, seconds += cs.seconds;
        }
        scalars["comm/bytes"] = bytes;
        scalars["comm/seconds"] = seconds;
      }
      log(h.step, scalars);
      for (const auto& ls : st.layers) {
        const double q = static_cast<double>(ls.tokens * ls.top_k) /
                         static_cast<double>(std::max<size_t>(1, ls.counts.size()));
        std::vector<double> loads;
        for (int64_t c : ls.counts) loads.push_back(static_cast<double>(c) / q);
        if (report) report->expert_load(h.step, ls.layer, loads);
        if (events) events->histogram(cat("layer", ls.layer, "/load"), h.step, loads);
      }
    }
    progress(h, tps);
  }

  // The stage's held-out loss and, with [eval], its grids and gate; one stage row in the report.
  // Returns the evaluator's outcome (null without [eval]).
  const StageOutcome* end_stage(size_t i) {
    const StageSpec& sp = r.stages[i];
    sync_experts();
    const double hl = heldout_loss(sp);
    stages.push_back({sp.name, step, hl});
    log(step, {{"heldout/loss", hl}, {"stage/end", static_cast<double>(i)}});
    if (!quiet)
      std::printf("%sstage %s done at step %lld: held-out loss %.4f\n", tty ? "\n" : "",
                  sp.name.c_str(), static_cast<long long>(step), hl);
    nlohmann::json row = {{"stage", sp.name},      {"index", i},
                          {"seq_len", sp.seq_len}, {"step", step},
                          {"heldout_loss", hl},    {"tokens", tokens_at(step)},
                          {"wall_seconds", wall()}};
    if (!hist.empty() && hist.back().step == step) row["train_loss"] = hist.back().loss;
    if (images && r.vision_eval_images > 0) evaluate_vision(row);
    const StageOutcome* o = nullptr;
    if (evaluator) {
      o = &evaluate(i, hl);
      double passkey = -1;
      for (const auto& g : o->grids) {
        if (report) report->stage_eval(o->stage, g.task, g.lengths, g.depths, g.accuracy);
        if (g.task == "passkey") passkey = g.mean;
      }
      row.update({{"effective_length", o->effective_length},
                  {"gate", o->gate.pass},
                  {"gate_reasons", o->gate.reasons},
                  {"eval_seconds", o->seconds}});
      if (passkey >= 0) row["passkey"] = passkey;
      if (!o->gate.pass && r.eval.gate == "stop" && i + 1 < r.stages.size()) {
        gate_stop = true;
        stop_at = step;
      }
    }
    for (auto& [k, v] : row.items())
      if (v.is_number_float() && !std::isfinite(v.get<double>())) v = nullptr;
    if (report) report->stage_summary(row);
    if (report && r.log_html) report->write_html();
    return o;
  }

  // TRAINING.md §9: greedy answers to test images (captions and each grid question kind).
  void evaluate_vision(nlohmann::json& row) {
    const auto t0 = Clock::now();
    const int64_t n = r.vision_eval_images;
    const vision::FashionEval ev =
        vision::evaluate_fashion(*dec, *tok, *test_images, n, std::max<int64_t>(1, n / 5), r.seed);
    std::map<std::string, double> v;
    for (int k = 0; k < vision::kQuestionKinds; ++k) {
      const auto q = static_cast<vision::Question>(k);
      v[std::string("vision/") + vision::question_name(q)] = ev.accuracy(q);
      row[std::string("vision_") + vision::question_name(q)] = ev.accuracy(q);
    }
    log(step, v);
    if (report) report->vision_eval(vision::eval_record(step, ev, *test_images));
    if (!quiet) {
      std::printf("vision eval (%.0f s):",
                  std::chrono::duration<double>(Clock::now() - t0).count());
      for (const auto& [k, x] : v) std::printf("  %s %.3f", k.c_str() + 7, x);
      std::printf("\n");
    }
  }

  // §6 grids (through infer::Engine, on its own thread) and the §5.4 gate; §5.4 (4) looks for a
  // spike in the stage's last 10%.
  const StageOutcome& evaluate(size_t i, double hl) {
    const StageSpec& sp = r.stages[i];
    const int64_t window = std::max<int64_t>(1, sp.steps / 10);
    bool spike = false;
    for (const auto& sk : mon.spikes()) spike |= sk.step > step - window && sk.step <= step;
    evaluator->evaluate(*dec, *tok, sp.name, sp.seq_len, step, hl, spike);
    const StageOutcome& o = evaluator->outcomes().back();
    if (!quiet) {
      std::printf("eval %-10s (%.0f s):", o.stage.c_str(), o.seconds);
      for (const auto& g : o.grids) {
        std::printf("  %s", g.task.c_str());
        for (size_t j = 0; j < g.lengths.size(); ++j)
          std::printf(" %lld:%.2f", static_cast<long long>(g.lengths[j]), g.at(j));
      }
      std::printf("\n  gate %s", o.gate.pass ? "pass" : "FAIL");
      for (const auto& why : o.gate.reasons) std::printf("; %s", why.c_str());
      std::printf("\n");
      std::fflush(stdout);
    }
    return o;
  }
};

Trainer::Trainer(Recipe recipe, std::string out_dir, dist::Comm* comm)
    : impl_(std::make_unique<Impl>()) {
  impl_->r = std::move(recipe);
  impl_->out = out_dir;
  impl_->comm = comm ? comm : &dist::world();
  impl_->setup();
}
Trainer::~Trainer() = default;

void Trainer::run(bool resume) {
  Impl& m = *impl_;
  if (resume)
    if (auto s = m.ckpt->load_latest(true)) {
      m.restore(*s, true);
      if (!m.quiet) std::printf("resumed from step %lld\n", static_cast<long long>(m.step));
    }
  StopSignal sig;
  const int64_t total = m.r.total_steps();
  while (m.step < total) {
    double stop = sig.requested() ? 1 : 0;  // a signal that reached any rank stops them all
    if (m.ranks > 1) m.comm->all_reduce_sum("stop_signal", &stop, 1);
    if (stop > 0 || (m.stop_at >= 0 && m.step >= m.stop_at)) {
      m.save();
      if (m.report && m.r.log_html) m.report->write_html();
      if (!m.quiet)
        std::printf("%sstopped at step %lld; checkpoint saved\n", m.tty ? "\n" : "",
                    static_cast<long long>(m.step));
      return;
    }
    const size_t si = m.stage_of(m.step);
    m.use_stage_data(si);
    m.train_step(m.r.stages[si]);
    if (m.images && m.r.vision_eval_every > 0 && m.step % m.r.vision_eval_every == 0 &&
        m.step != m.stage_end(si)) {
      nlohmann::json unused;
      m.evaluate_vision(unused);  // the accuracy curve between stage ends
    }
    if (m.step == m.stage_end(si)) {
      const StageOutcome* o = m.end_stage(si);
      if (on_stage_end) {
        const StageSpec& sp = m.r.stages[si];
        on_stage_end(StageEnd{si, sp.name, sp.seq_len, m.step, *m.dec, *m.tok,
                              m.report ? &*m.report : nullptr, m.stages.back().heldout_loss, o});
      }
    }
    if (m.r.checkpoint_every > 0 && m.step % m.r.checkpoint_every == 0) m.save();
  }
  m.save();
  if (m.events) m.events->flush();
  if (m.report && m.r.log_html) m.report->write_html();
  m.finished = true;
}

void Trainer::stop_after(int64_t step) {
  impl_->stop_at = step;
}
void Trainer::set_quiet(bool quiet) {
  impl_->quiet = quiet || impl_->rank != 0;
}
const std::vector<StepRecord>& Trainer::history() const {
  return impl_->hist;
}
const std::map<std::string, dist::CollectiveStats>& Trainer::collective_totals() const {
  return impl_->comm_totals;
}
const std::vector<StageResult>& Trainer::stage_results() const {
  return impl_->stages;
}
int64_t Trainer::step() const {
  return impl_->step;
}
bool Trainer::finished() const {
  return impl_->finished;
}
const model::Decoder& Trainer::decoder() const {
  return *impl_->dec;
}
const Monitor& Trainer::monitor() const {
  return impl_->mon;
}
const std::vector<StageOutcome>& Trainer::stage_outcomes() const {
  static const std::vector<StageOutcome> none;
  return impl_->evaluator ? impl_->evaluator->outcomes() : none;
}
bool Trainer::gate_stopped() const {
  return impl_->gate_stop;
}

}  // namespace myriad::train
