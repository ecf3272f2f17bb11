#include "train/recipe.h"

#include "data/synthetic.h"
#include "data/tokenizer.h"

#include <toml++/toml.h>

#include <cmath>
#include <fstream>
#include <set>
#include <sstream>
#include "train/toml_section.h"

#include "core/error.h"

namespace myriad::train {
using namespace toml_recipe;  // NOLINT: Section, subtable, to_json, one_of

Recipe Recipe::parse(std::string_view text, std::string_view source) {
  toml::table root;
  try {
    root = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    std::ostringstream os;
    os << e;
    throw Error(cat(source, ": ", os.str()));
  }
  Recipe r;
  r.text = std::string(text);
  Section top(&root, "");
  for (const char* t :
       {"model", "data", "optimizer", "schedule", "checkpoint", "log", "eval", "debug", "parallel"})
    top.node(t);
  top.node("stage");
  top.get("balancer", r.balancer_mode);
  top.get("precision", r.precision);
  top.get("seed", r.seed);
  top.get("deterministic", r.deterministic);
  top.finish();
  if (!r.balancer_mode.empty())
    one_of("balancer", r.balancer_mode, {"quantile", "quantile_band", "sign", "aux_loss", "none"});
  one_of("precision", r.precision, {"f32", "bf16"});

  Section m(subtable(root, "model"), "model.");
  m.get("preset", r.model_preset);
  m.get("config", r.model_config);
  m.get("init", r.model_init);
  m.get("vision", r.model_vision);
  if (const toml::node* o = m.node("overrides")) {
    MYRIAD_CHECK(o->is_table(), "model.overrides: expected a table");
    r.model_overrides = to_json(*o, "model.overrides");
  }
  m.finish();
  MYRIAD_CHECK((r.model_preset.empty() ? 0 : 1) + (r.model_config.empty() ? 0 : 1) +
                       (r.model_init.empty() ? 0 : 1) <=
                   1,
               "model: give one of model.preset, model.config and model.init");
  if (!r.model_init.empty()) r.model_config = r.model_init;  // its config.json
  if (!r.model_vision.empty()) one_of("model.vision", r.model_vision, {"tiny"});

  Section d(subtable(root, "data"), "data.");
  d.get("tokenizer", r.tokenizer);
  d.get("vocab_size", r.vocab_size);
  d.get("corpus", r.corpus);
  d.get("max_corpus_bytes", r.max_corpus_bytes);
  d.get("shard_dir", r.shard_dir);
  d.get("shard_tokens", r.shard_tokens);
  d.get("heldout_fraction", r.heldout_fraction);
  d.get("heldout_batches", r.heldout_batches);
  d.get("sft_sources", r.sft_sources);
  d.get("sft_noise", r.sft_noise);
  d.get("sft_examples", r.sft_examples);
  d.get("sft_max_tokens", r.sft_max_tokens);
  d.get("text_fraction", r.text_fraction);
  d.get("question_weights", r.question_weights);
  d.get("vision_eval_images", r.vision_eval_images);
  d.get("vision_eval_every", r.vision_eval_every);
  d.finish();
  one_of("data.corpus", r.corpus, {"builtin", "synthetic", "sft", "fashion_mnist"});
  const bool fm = r.corpus == "fashion_mnist";
  MYRIAD_CHECK(!fm || !r.model_vision.empty() || !r.model_init.empty(),
               "data.corpus: \"fashion_mnist\" needs a model with a vision tower (model.vision)");
  MYRIAD_CHECK(r.text_fraction >= 0 && r.text_fraction < 1,
               "data.text_fraction: must be in [0, 1), got ", r.text_fraction);
  MYRIAD_CHECK(r.question_weights.size() == 5,
               "data.question_weights: five weights (caption, grid_what, grid_where, grid_count, "
               "grid_exists), got ",
               r.question_weights.size());
  for (double x : r.question_weights)
    MYRIAD_CHECK(x >= 0, "data.question_weights: each must be >= 0, got ", x);
  MYRIAD_CHECK(r.vision_eval_images >= 0, "data.vision_eval_images: must be >= 0, got ",
               r.vision_eval_images);
  MYRIAD_CHECK(r.vision_eval_every >= 0, "data.vision_eval_every: must be >= 0, got ",
               r.vision_eval_every);
  MYRIAD_CHECK(r.corpus != "sft" || !r.sft_sources.empty(),
               "data.sft_sources: corpus = \"sft\" needs at least one source");
  MYRIAD_CHECK(r.corpus == "sft" || r.sft_sources.empty(),
               "data.sft_sources: only with corpus = \"sft\"");
  MYRIAD_CHECK(r.sft_noise.empty() || r.sft_noise.size() == r.sft_sources.size(),
               "data.sft_noise: one value per source (", r.sft_sources.size(), "), got ",
               r.sft_noise.size());
  for (double x : r.sft_noise)
    MYRIAD_CHECK(x >= 0 && x <= 1, "data.sft_noise: each must be in [0, 1], got ", x);
  d.check_positive("sft_examples", static_cast<double>(r.sft_examples));
  d.check_positive("sft_max_tokens", static_cast<double>(r.sft_max_tokens));
  MYRIAD_CHECK(r.vocab_size >= 16, "data.vocab_size: must be at least 16, got ", r.vocab_size);
  d.check_positive("max_corpus_bytes", static_cast<double>(r.max_corpus_bytes));
  d.check_positive("shard_tokens", static_cast<double>(r.shard_tokens));
  MYRIAD_CHECK(r.heldout_fraction > 0 && r.heldout_fraction < 1,
               "data.heldout_fraction: must be in (0, 1), got ", r.heldout_fraction);

  r.optimizer.lr = 1e-3;
  read_optimizer(root, r.optimizer);

  Section s(subtable(root, "schedule"), "schedule.");
  s.get("kind", r.schedule.kind);
  s.get("warmup", r.schedule.warmup);
  s.get("min_ratio", r.schedule.min_ratio);
  s.get("decay_steps", r.schedule.decay_steps);
  s.get("decay_shape", r.schedule.decay_shape);
  s.finish();
  one_of("schedule.kind", r.schedule.kind, {"wsd", "cosine", "constant"});
  one_of("schedule.decay_shape", r.schedule.decay_shape, {"1-sqrt", "linear"});
  MYRIAD_CHECK(r.schedule.min_ratio >= 0 && r.schedule.min_ratio <= 1,
               "schedule.min_ratio: must be in [0, 1]");

  Section c(subtable(root, "checkpoint"), "checkpoint.");
  c.get("dir", r.checkpoint_dir);
  c.get("every", r.checkpoint_every);
  c.get("keep_last", r.keep_last);
  c.finish();
  MYRIAD_CHECK(r.keep_last >= 1, "checkpoint.keep_last: must be at least 1");

  Section pa(subtable(root, "parallel"), "parallel.");
  pa.get("dp", r.parallel.dp);
  pa.get("ep", r.parallel.ep);
  pa.get("cp", r.parallel.cp);
  pa.get("zero", r.parallel.zero);
  pa.get("timeout_s", r.parallel.timeout_s);
  pa.finish();
  MYRIAD_CHECK(r.parallel.dp >= 0, "parallel.dp: must be >= 0 (0: every rank)");
  MYRIAD_CHECK(r.parallel.ep >= 1, "parallel.ep: must be >= 1");
  MYRIAD_CHECK(r.parallel.cp >= 1, "parallel.cp: must be >= 1");
  MYRIAD_CHECK(r.parallel.zero == 0 || r.parallel.zero == 1,
               "parallel.zero: 0 (replicated optimizer state) or 1 (ZeRO-1), got ",
               r.parallel.zero);
  MYRIAD_CHECK(r.parallel.timeout_s >= 0, "parallel.timeout_s: must be >= 0 (0: the default)");

  Section l(subtable(root, "log"), "log.");
  l.get("every", r.log_every);
  l.get("jsonl", r.log_jsonl);
  l.get("tensorboard", r.log_tensorboard);
  l.get("html", r.log_html);
  l.finish();
  l.check_positive("every", static_cast<double>(r.log_every));

  Section ev(subtable(root, "eval"), "eval.");
  EvalRecipe& e = r.eval;
  e.enabled = subtable(root, "eval") != nullptr;
  ev.get("enabled", e.enabled);
  ev.get("tasks", e.tasks);
  ev.get("length_factors", e.length_factors);
  ev.get("max_length", e.max_length);
  ev.get("depths", e.depths);
  ev.get("seeds", e.seeds);
  ev.get("mk_niah_keys", e.mk_niah_keys);
  ev.get("vt_hops", e.vt_hops);
  ev.get("segment", e.segment);
  ev.get("gate", e.gate);
  ev.finish();
  for (const std::string& t : e.tasks) one_of("eval.tasks", t, {"passkey", "mk_niah", "vt"});
  MYRIAD_CHECK(!e.length_factors.empty(), "eval.length_factors: must not be empty");
  for (double f : e.length_factors)
    MYRIAD_CHECK(f > 0, "eval.length_factors: must be positive, got ", f);
  for (double d : e.depths)
    MYRIAD_CHECK(d >= 0 && d <= 1, "eval.depths: must be in [0, 1], got ", d);
  ev.check_positive("max_length", static_cast<double>(e.max_length));
  ev.check_positive("seeds", static_cast<double>(e.seeds));
  ev.check_positive("mk_niah_keys", static_cast<double>(e.mk_niah_keys));
  ev.check_positive("vt_hops", static_cast<double>(e.vt_hops));
  ev.check_positive("segment", static_cast<double>(e.segment));
  one_of("eval.gate", e.gate, {"report", "stop"});

  Section dbg(subtable(root, "debug"), "debug.");
  if (const toml::node* p = dbg.node("poison_steps")) {
    MYRIAD_CHECK(p->is_array(), "debug.poison_steps: expected an array of steps");
    for (const auto& v : *p->as_array()) {
      MYRIAD_CHECK(v.is_integer() && *v.value<int64_t>() >= 1,
                   "debug.poison_steps: expected step numbers >= 1");
      r.poison_steps.push_back(*v.value<int64_t>());
    }
  }
  dbg.finish();

  const toml::node* st = root.get("stage");
  MYRIAD_CHECK(st && st->is_array_of_tables() && !st->as_array()->empty(),
               "stage: the recipe needs at least one [[stage]]");
  int64_t i = 0;
  for (const auto& n : *st->as_array()) {
    Section g(n.as_table(), cat("stage[", i++, "]."));
    StageSpec sp;
    sp.name = cat("stage", i - 1);
    g.get("name", sp.name);
    g.get("seq_len", sp.seq_len);
    g.get("steps", sp.steps);
    g.get("tokens_per_step", sp.tokens_per_step);
    g.get("batch_size", sp.batch_size);
    g.get("lr_scale", sp.lr_scale);
    g.get("data_mix", sp.data_mix);
    g.get("synthetic_fraction", sp.synthetic_fraction);
    g.get("answer_weight", sp.answer_weight);
    g.get("segment_len", sp.segment_len);
    g.get("detach_state", sp.detach_state);
    g.get("recompute", sp.recompute);
    g.finish();
    g.check_positive("seq_len", static_cast<double>(sp.seq_len));
    g.check_positive("steps", static_cast<double>(sp.steps));
    g.check_positive("tokens_per_step", static_cast<double>(sp.tokens_per_step));
    g.check_positive("lr_scale", sp.lr_scale);
    one_of(g.key("data_mix"), sp.data_mix, {"base", "long"});
    MYRIAD_CHECK(sp.synthetic_fraction >= 0 && sp.synthetic_fraction <= data::kMaxSyntheticFraction,
                 g.key("synthetic_fraction"), ": ", sp.synthetic_fraction, " must be in [0, ",
                 data::kMaxSyntheticFraction, "] (text stays the majority)");
    MYRIAD_CHECK(sp.answer_weight >= 1 && sp.answer_weight <= 255, g.key("answer_weight"), ": ",
                 sp.answer_weight, " must be in [1, 255]");
    MYRIAD_CHECK(sp.segment_len >= 0, g.key("segment_len"), ": ", sp.segment_len,
                 " must be >= 0 (0: no segments)");
    MYRIAD_CHECK(sp.segment_len == 0 || sp.seq_len % sp.segment_len == 0, g.key("segment_len"),
                 ": ", sp.segment_len, " does not divide seq_len = ", sp.seq_len);
    if (sp.batch_size == 0)
      sp.batch_size =
          std::max<int64_t>(1, std::min<int64_t>(sp.tokens_per_step, 2048) / sp.seq_len);
    MYRIAD_CHECK(sp.tokens_per_step % (sp.batch_size * sp.seq_len) == 0, g.key("tokens_per_step"),
                 ": ", sp.tokens_per_step,
                 " is not a multiple of batch_size * seq_len = ", sp.batch_size * sp.seq_len);
    r.stages.push_back(sp);
  }
  r.schedule.peak = r.optimizer.lr;
  r.schedule.total = r.total_steps();
  MYRIAD_CHECK(r.schedule.warmup < r.schedule.total, "schedule.warmup: ", r.schedule.warmup,
               " must be below the total steps ", r.schedule.total);
  // Validates the model section now (a recipe without one gets its model from --init).
  if (!r.model_preset.empty() || !r.model_config.empty()) r.model(r.vocab_size);
  return r;
}

Recipe Recipe::load(const std::string& path) {
  std::ifstream f(path);
  MYRIAD_CHECK(f, "recipe: cannot read ", path);
  std::stringstream ss;
  ss << f.rdbuf();
  return parse(ss.str(), path);
}

int64_t Recipe::total_steps() const {
  int64_t t = 0;
  for (const auto& s : stages) t += s.steps;
  return t;
}

model::ModelConfig Recipe::model(int64_t vocab) const {
  MYRIAD_CHECK(!model_preset.empty() || !model_config.empty(),
               "model: give one of model.preset, model.config and model.init (or myriad train "
               "--init)");
  model::ModelConfig base =
      model_preset.empty() ? model::ModelConfig::load(model_config) : model::preset(model_preset);
  nlohmann::json outer = nlohmann::json::parse(base.to_json());
  // Overrides name text-model keys; a wrapped config (K3 release, kimi_k25) holds them in
  // text_config.
  nlohmann::json& j = outer.contains("text_config") ? outer["text_config"] : outer;
  j.merge_patch(model_overrides);
  j["vocab_size"] = vocab;
  if (!balancer_mode.empty()) j["myriad"]["balancer"]["mode"] = balancer_mode;
  model::ModelConfig c;
  try {
    c = model::ModelConfig::from_json(outer.dump(), "model.overrides");
    if (model_vision == "tiny") {  // Myriad's tokenizers hold the image markers at fixed ids
      c.vision = vision::tiny_vision();
      c.media_placeholder_token_id = data::kMediaPadId;
    }
    c.validate();
  } catch (const Error& e) {
    throw Error(cat("model: ", e.what()));
  }
  return c;
}

}  // namespace myriad::train
