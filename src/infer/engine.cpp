// The engine thread (see engine.h and docs/ARCHITECTURE.md "Inference engine"). Each loop turn:
// take cancellations, admit waiting requests in arrival order while their worst-case cache fits
// the budget (dropping kept prefixes to make room), run one prefill chunk of the oldest sequence
// still reading its prompt (starting after the longest kept prefix of it), then one batched
// decode step of every sequence that has finished its prompt.
#include "infer/engine.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <future>
#include <mutex>
#include <random>
#include <stdexcept>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "backend/cpu/cpu.h"
#include "core/autograd.h"
#include "infer/sampling.h"
#include "ops/ops.h"

namespace myriad::infer {

namespace {

using Clock = std::chrono::steady_clock;

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

struct Seq {
  uint64_t id = 0;
  Request req;
  TokenCallback cb;
  CachePlan plan;
  std::unique_ptr<Sampler> sampler;
  std::unique_ptr<TextStream> text;
  model::DecodeCache cache;
  int64_t prefilled = 0;    // prompt tokens read
  Tensor image_rows;        // the images' encoded rows (on the first prefill chunk)
  int64_t image_row = 0;    // rows the prefill has consumed
  int64_t snapshot_at = 0;  // > 0: keep the state at this prompt position as a shared prefix
  int64_t generated = 0;
  int32_t next = -1;  // the token the next decode step feeds
  bool done = false;
};

// A cached prompt prefix (page-aligned): the KDA states after it and the MLA pages holding it,
// which sequences starting with the same tokens share (read only: they append to new pages).
struct Prefix {
  std::vector<int32_t> tokens;
  std::vector<model::KdaState> kda;            // by layer
  std::vector<std::vector<Tensor>> mla_pages;  // by layer
  int64_t bytes = 0;
  uint64_t last_used = 0;
};

}  // namespace

struct Engine::Impl {
  const model::Decoder& m;
  const data::Tokenizer& tok;
  EngineConfig cfg;
  model::CacheSizes sizes;
  int64_t n_mla = 0, latent_width = 0, page_bytes = 0, value_bytes = 4;
  bool paged = true;  // false with the MLA admission gate (its cache stays unpaged)
  DType dtype = DType::F32;
  Device device = kCPU;

  // The page pool (engine thread only): the free pages, and how many were made (read by stats).
  std::vector<Tensor> free_pages;
  std::atomic<int64_t> pages_made = 0;
  // Holders of each page in use (sequences and cached prefixes), by its data pointer.
  std::unordered_map<const void*, int> page_refs;
  std::vector<Prefix> prefixes;  // engine thread; their bytes count in `reserved`
  int64_t prefix_bytes = 0;      // guarded by mu
  uint64_t clock = 0;

  mutable std::mutex mu;
  std::condition_variable cv;
  std::deque<std::unique_ptr<Seq>> waiting;   // guarded by mu
  std::vector<uint64_t> cancels;              // guarded by mu
  EngineStats st;                             // guarded by mu
  uint64_t next_id = 1;                       // guarded by mu
  bool stop = false;                          // guarded by mu
  int64_t reserved = 0;                       // guarded by mu
  std::vector<std::unique_ptr<Seq>> running;  // engine thread only
  std::thread thread;
  double window_s = 0;  // decode rate window
  int64_t window_tokens = 0;

  Impl(const model::Decoder& model, const data::Tokenizer& t, EngineConfig c)
      : m(model), tok(t), cfg(c) {
    const model::ModelConfig& mc = m.config();
    const Tensor& emb = m.weights().get("model.embed_tokens.weight");
    dtype = emb.dtype(), device = emb.device();
    value_bytes = static_cast<int64_t>(dtype_size(dtype));
    sizes = model::cache_sizes(mc, value_bytes, dtype == DType::F64 ? 8 : 4);
    n_mla = mc.num_mla_layers();
    latent_width = mc.kv_lora_rank + mc.qk_rope_head_dim;
    page_bytes = cfg.block_tokens * latent_width * value_bytes;
    paged = !mc.myriad.admission.enabled;
    st.cache_bytes_budget = cfg.cache_budget_bytes;
  }

  CachePlan plan_for(const Request& r) const {
    CachePlan p;
    const int64_t tokens = static_cast<int64_t>(r.prompt.size()) + r.params.max_tokens;
    if (paged) {
      p.pages_per_layer = ceil_div(tokens, cfg.block_tokens);
      p.bytes = sizes.kda_bytes + n_mla * p.pages_per_layer * page_bytes;
      if (p.bytes > cfg.cache_budget_bytes && n_mla > 0 && cfg.allow_sliding_mla) {
        // A sliding MLA window of as many pages as the budget allows.
        p.pages_per_layer = (cfg.cache_budget_bytes - sizes.kda_bytes) / (n_mla * page_bytes);
        p.sliding = true;
        p.bytes = sizes.kda_bytes + n_mla * p.pages_per_layer * page_bytes;
        if (p.pages_per_layer < 2) p.bytes = cfg.cache_budget_bytes + 1;  // cannot run
      }
    } else {
      // Admission gate (unpaged): at most every token kept, with its gate and bias, plus the
      // running latent sum.
      const int64_t rank = m.config().kv_lora_rank;
      p.bytes = sizes.kda_bytes + n_mla * (tokens * (latent_width * value_bytes + 16) + rank * 8);
    }
    return p;
  }

  Tensor take_page() {
    if (!free_pages.empty()) {
      Tensor p = std::move(free_pages.back());
      free_pages.pop_back();
      return p;
    }
    ++pages_made;
    return Tensor::empty({cfg.block_tokens, latent_width}, dtype, device);
  }
  Tensor take_page_ref() {
    Tensor p = take_page();
    page_refs[p.data_ptr()] = 1;
    return p;
  }
  void drop_page(Tensor p) {
    auto it = page_refs.find(p.data_ptr());
    if (it != page_refs.end() && --it->second > 0) return;  // still shared
    if (it != page_refs.end()) page_refs.erase(it);
    free_pages.push_back(std::move(p));
  }

  // Prefix sharing. The longest cached prefix of `prompt` shorter than it, or null.
  Prefix* find_prefix(const std::vector<int32_t>& prompt) {
    Prefix* best = nullptr;
    for (Prefix& p : prefixes)
      if (p.tokens.size() < prompt.size() && (!best || p.tokens.size() > best->tokens.size()) &&
          std::equal(p.tokens.begin(), p.tokens.end(), prompt.begin()))
        best = &p;
    return best;
  }
  // Drops the least recently used prefix (its pages go back once no sequence holds them).
  // Caller holds mu.
  bool evict_prefix() {
    if (prefixes.empty()) return false;
    auto lru = std::min_element(prefixes.begin(), prefixes.end(),
                                [](auto& a, auto& b) { return a.last_used < b.last_used; });
    for (auto& layer : lru->mla_pages)
      for (Tensor& p : layer) drop_page(std::move(p));
    reserved -= lru->bytes, prefix_bytes -= lru->bytes;
    prefixes.erase(lru);
    return true;
  }
  // Keeps the state of `s` (exactly s.snapshot_at prompt tokens read) as a shared prefix, when
  // the budget has room for its bytes (KDA states + pages).
  void keep_prefix(Seq& s) {
    Prefix p;
    p.tokens.assign(s.req.prompt.begin(), s.req.prompt.begin() + s.snapshot_at);
    if (find_prefix(s.req.prompt) && find_prefix(s.req.prompt)->tokens.size() == p.tokens.size())
      return;
    p.bytes = sizes.kda_bytes;
    p.kda.resize(s.cache.kda.size());
    p.mla_pages.resize(s.cache.mla.size());
    for (size_t i = 0; i < s.cache.kda.size(); ++i) {
      const model::KdaState& k = s.cache.kda[i];
      if (k.S_BHKV.defined()) p.kda[i] = {k.conv_BCK.clone(), k.S_BHKV.clone()};
      if (const auto& pg = s.cache.mla[i].pages) {
        p.mla_pages[i] = pg->table;
        p.bytes += static_cast<int64_t>(pg->table.size()) * page_bytes;
      }
    }
    std::lock_guard lk(mu);
    while (static_cast<int64_t>(prefixes.size()) >= cfg.prefix_cache_entries) evict_prefix();
    if (reserved + p.bytes > cfg.cache_budget_bytes) return;
    reserved += p.bytes, prefix_bytes += p.bytes;
    for (auto& layer : p.mla_pages)
      for (const Tensor& t : layer) ++page_refs[t.data_ptr()];
    p.last_used = ++clock;
    prefixes.push_back(std::move(p));
  }

  void setup_cache(Seq& s) {
    s.cache = m.new_cache();
    if (!paged) return;
    // Start from the longest cached prefix, or plan to keep this prompt's page-aligned prefix.
    Prefix* pre = cfg.prefix_cache_entries > 0 && !s.plan.sliding && s.req.grids.empty()
                      ? find_prefix(s.req.prompt)
                      : nullptr;
    const auto P = static_cast<int64_t>(s.req.prompt.size());
    if (pre) {
      pre->last_used = ++clock;
      s.prefilled = s.cache.position = static_cast<int64_t>(pre->tokens.size());
    }
    if (cfg.prefix_cache_entries > 0 && !s.plan.sliding &&
        s.req.grids.empty()) {  // a longer prefix (chat turns)
      const int64_t at = (P - 1) / cfg.block_tokens * cfg.block_tokens;  // >= 1 token to read
      if (at > s.prefilled) s.snapshot_at = at;
    }
    for (int64_t i = 0; i < m.config().num_hidden_layers; ++i) {
      if (pre && pre->kda[i].S_BHKV.defined())
        s.cache.kda[i] = {pre->kda[i].conv_BCK.clone(), pre->kda[i].S_BHKV.clone()};
      if (!m.config().is_mla_layer(i)) continue;
      auto pg = std::make_shared<model::LatentPages>();
      pg->block_tokens = cfg.block_tokens;
      pg->max_pages = s.plan.sliding ? s.plan.pages_per_layer : 0;
      pg->alloc = [this] { return take_page_ref(); };
      if (pre) {
        pg->table = pre->mla_pages[i];
        pg->length = s.cache.position;
        for (const Tensor& t : pg->table) ++page_refs[t.data_ptr()];
      }
      s.cache.mla[i].pages = std::move(pg);
    }
  }

  int64_t used_bytes() const {
    int64_t n = 0;
    for (const auto& s : running) n += static_cast<int64_t>(s->cache.bytes());
    return n;
  }
  void update_usage(int64_t prefilled = 0) {
    const int64_t used = used_bytes();
    std::lock_guard lk(mu);
    st.cache_bytes_used = used;
    st.cache_bytes_peak = std::max(st.cache_bytes_peak, used);
    st.prefilled_tokens += prefilled;
  }

  // Ends a sequence: its pages back to the pool, its reservation released, then the final
  // event (unless `event` is null: already sent), so a client that sees it sees the cache freed.
  void finish(Seq& s, TokenEvent* event, const std::string& reason, const std::string& error = {}) {
    s.done = true;
    for (auto& l : s.cache.mla)
      if (l.pages) {
        for (Tensor& p : l.pages->table) drop_page(std::move(p));
        l.pages.reset();
      }
    s.cache = model::DecodeCache();
    {
      std::lock_guard lk(mu);
      reserved -= s.plan.bytes;
      ++st.requests_finished;
      st.cache_bytes_used = used_bytes();
      st.running = std::count_if(running.begin(), running.end(), [](auto& r) { return !r->done; });
    }
    TokenEvent ev;
    if (!event) event = &ev;
    event->request = s.id, event->finished = true, event->finish_reason = reason,
    event->error = error;
    try {
      s.cb(*event);
    } catch (...) {  // a throwing callback must not take the engine down
    }
  }

  // Samples from one row of logits and streams the event; finishes the sequence when done.
  void emit(Seq& s, std::span<const float> logits) {
    try {
      emit_or_throw(s, logits);
    } catch (const std::exception& e) {
      if (!s.done) finish(s, nullptr, "error", e.what());
    }
  }
  void emit_or_throw(Seq& s, std::span<const float> logits) {
    const Pick pk = s.sampler->sample(logits);
    ++s.generated;
    TokenEvent ev;
    ev.request = s.id, ev.token = pk.token, ev.logprob = pk.logprob, ev.top = pk.top;
    std::string reason;
    const SamplingParams& p = s.req.params;
    if ((!p.ignore_eos && pk.token == tok.eos()) ||
        std::find(p.stop_tokens.begin(), p.stop_tokens.end(), pk.token) != p.stop_tokens.end()) {
      ev.text = s.text->flush();
      reason = "stop";
    } else {
      TextStream::Step step = s.text->push(pk.token);
      ev.text = std::move(step.text);
      if (step.stopped) {
        reason = "stop";
      } else if (s.generated >= p.max_tokens) {
        ev.text += s.text->flush();
        reason = "length";
      }
    }
    {
      std::lock_guard lk(mu);
      ++st.generated_tokens;
    }
    s.next = pk.token;
    if (!reason.empty()) return finish(s, &ev, reason);
    bool go = false;
    try {
      go = s.cb(ev);
    } catch (...) {
    }
    if (!go) finish(s, nullptr, "cancelled");
  }

  std::vector<float> row(const Tensor& logits, int64_t n) const {
    const int64_t V = logits.size(-1);
    return ops::slice(ops::reshape(logits, {-1, V}), 0, n, n + 1).to_floats();
  }

  // One prefill chunk of the oldest sequence still reading its prompt.
  void prefill_step() {
    auto it = std::find_if(running.begin(), running.end(), [](const auto& s) {
      return !s->done && s->prefilled < static_cast<int64_t>(s->req.prompt.size());
    });
    if (it == running.end()) return;
    Seq& s = **it;
    const int64_t T = static_cast<int64_t>(s.req.prompt.size());
    const int64_t a = s.prefilled;
    int64_t b = std::min(T, a + cfg.prefill_chunk);
    if (s.snapshot_at > a && s.snapshot_at < b) b = s.snapshot_at;  // stop there to keep it
    try {
      std::vector<int64_t> ids(s.req.prompt.begin() + a, s.req.prompt.begin() + b);
      Tensor in = Tensor::from_ints(ids, {1, b - a}, DType::I64, device);
      model::ForwardOptions fo{.logits = false};
      if (!s.req.grids.empty()) {  // this chunk's image rows, in placeholder order
        if (!s.image_rows.defined())
          s.image_rows = m.encode_images(s.req.pixel_values.to(device).to(dtype), s.req.grids);
        const int64_t n =
            std::count(ids.begin(), ids.end(), *m.config().media_placeholder_token_id);
        if (n > 0) fo.image_embeds = ops::slice(s.image_rows, 0, s.image_row, s.image_row + n);
        s.image_row += n;
      }
      model::ForwardOutput out = m.forward(in, &s.cache, fo);
      s.prefilled = b;
      update_usage(b - a);
      if (b == s.snapshot_at) keep_prefix(s);
      if (b < T) return;
      {
        std::lock_guard lk(mu);
        st.prompt_tokens += T;
      }
      Tensor last = ops::slice(out.normed_BTD, 1, b - a - 1, b - a);
      Tensor logits = ops::linear(last, m.weights().get("lm_head.weight"));
      emit(s, row(logits, 0));
    } catch (const std::exception& e) {
      finish(s, nullptr, "error", e.what());
    }
  }

  // One decode step shared by every sequence past its prompt.
  void decode_step() {
    std::vector<Seq*> batch;
    for (auto& s : running)
      if (!s->done && s->prefilled == static_cast<int64_t>(s->req.prompt.size()))
        batch.push_back(s.get());
    if (batch.empty()) return;
    const auto N = static_cast<int64_t>(batch.size());
    std::vector<int64_t> ids;
    std::vector<model::DecodeCache*> caches;
    for (Seq* s : batch) ids.push_back(s->next), caches.push_back(&s->cache);
    const auto t0 = Clock::now();
    Tensor logits;
    try {
      logits =
          m.forward_batch(Tensor::from_ints(ids, {N, 1}, DType::I64, device), caches).logits_BTV;
    } catch (const std::exception& e) {
      for (Seq* s : batch) finish(*s, nullptr, "error", e.what());
      return;
    }
    update_usage();
    for (int64_t n = 0; n < N; ++n) emit(*batch[n], row(logits, n));
    window_s += std::chrono::duration<double>(Clock::now() - t0).count();
    window_tokens += N;
    if (window_s >= 1.0) {
      std::lock_guard lk(mu);
      st.decode_tokens_per_s = static_cast<double>(window_tokens) / window_s;
      window_s = 0, window_tokens = 0;
    }
  }

  void loop() {
    NoGradGuard ng;
    for (;;) {
      std::vector<std::unique_ptr<Seq>> dropped;  // cancelled while waiting
      std::unordered_set<uint64_t> cancel_running;
      {
        std::unique_lock lk(mu);
        cv.wait(lk,
                [&] { return stop || !waiting.empty() || !running.empty() || !cancels.empty(); });
        if (stop) break;
        for (uint64_t id : cancels) {
          auto w = std::find_if(waiting.begin(), waiting.end(),
                                [&](const auto& s) { return s->id == id; });
          if (w != waiting.end()) {
            dropped.push_back(std::move(*w));
            waiting.erase(w);
          } else {
            cancel_running.insert(id);
          }
        }
        cancels.clear();
        // Admission in arrival order: the head waits until it fits (no overtaking).
        // Kept prefixes give way to the head when that makes it fit.
        if (!waiting.empty() && static_cast<int64_t>(running.size()) < cfg.max_batch &&
            reserved - prefix_bytes + waiting.front()->plan.bytes <= cfg.cache_budget_bytes)
          while (reserved + waiting.front()->plan.bytes > cfg.cache_budget_bytes &&
                 evict_prefix()) {
          }
        while (!waiting.empty() && static_cast<int64_t>(running.size()) < cfg.max_batch &&
               reserved + waiting.front()->plan.bytes <= cfg.cache_budget_bytes) {
          reserved += waiting.front()->plan.bytes;
          running.push_back(std::move(waiting.front()));
          waiting.pop_front();
        }
      }
      for (auto& s : dropped) {
        s->plan.bytes = 0;  // never reserved
        finish(*s, nullptr, "cancelled");
      }
      for (auto& s : running) {
        if (!s->cache.kda.empty() || s->done) continue;
        setup_cache(*s);
      }
      for (auto& s : running)
        if (!s->done && cancel_running.count(s->id)) finish(*s, nullptr, "cancelled");
      prefill_step();
      decode_step();
      std::erase_if(running, [](const auto& s) { return s->done; });
      std::lock_guard lk(mu);
      st.waiting = static_cast<int64_t>(waiting.size());
      st.running = static_cast<int64_t>(running.size());
      st.cache_bytes_used = used_bytes();
    }
    // Shutdown: everything left ends "cancelled".
    std::deque<std::unique_ptr<Seq>> left;
    {
      std::lock_guard lk(mu);
      left.swap(waiting);
    }
    for (auto& s : running)
      if (!s->done) finish(*s, nullptr, "cancelled");
    for (auto& s : left) {
      s->plan.bytes = 0;
      finish(*s, nullptr, "cancelled");
    }
    running.clear();
  }
};

Engine::Engine(const model::Decoder& model, const data::Tokenizer& tokenizer, EngineConfig config) {
  auto need = [](bool ok, const char* what) {
    if (!ok) throw std::invalid_argument(std::string("engine config: ") + what);
  };
  need(config.max_batch >= 1, "max_batch must be >= 1");
  need(config.cache_budget_bytes > 0, "cache_budget_bytes must be > 0");
  need(config.block_tokens >= 1, "block_tokens must be >= 1");
  need(config.prefill_chunk >= 1, "prefill_chunk must be >= 1");
  need(config.max_context >= 2, "max_context must be >= 2");
  impl_ = std::make_unique<Impl>(model, tokenizer, config);
  // The CPU's parallel regions run on the engine's thread from here: the OpenMP workers this
  // thread kept (a model's load, a training run) would make every region of the engine's wait for
  // a wake-up (backend/cpu/cpu.h). Likewise each submitting thread's, in submit.
  cpu::release_idle_workers();
  impl_->thread = std::thread([this] { impl_->loop(); });
}

Engine::~Engine() {
  {
    std::lock_guard lk(impl_->mu);
    impl_->stop = true;
  }
  impl_->cv.notify_all();
  impl_->thread.join();
}

const model::Decoder& Engine::model() const {
  return impl_->m;
}

CachePlan Engine::plan(const Request& request) const {
  return impl_->plan_for(request);
}

uint64_t Engine::submit(Request request, TokenCallback on_event) {
  cpu::release_idle_workers();
  Impl& I = *impl_;
  auto bad = [](const std::string& what) { throw std::invalid_argument("engine: " + what); };
  if (request.prompt.empty()) bad("the prompt is empty");
  if (!on_event) bad("no event callback");
  validate_sampling(request.params);
  const int64_t V = I.m.config().vocab_size;
  for (int32_t t : request.prompt)
    if (t < 0 || t >= V)
      bad("prompt token " + std::to_string(t) + " is outside the vocabulary [0, " +
          std::to_string(V) + ")");
  if (!request.grids.empty() || request.pixel_values.defined()) {
    const model::ModelConfig& c = I.m.config();
    if (!c.vision || !c.media_placeholder_token_id) bad("this model does not take images");
    int64_t merged = 0, patches = 0;
    for (const vision::Grid& g : request.grids) {
      merged += vision::merged_tokens(*c.vision, g);
      patches += g.t * g.h * g.w;
    }
    const auto pads = std::count(request.prompt.begin(), request.prompt.end(),
                                 static_cast<int32_t>(*c.media_placeholder_token_id));
    if (pads != merged)
      bad("the prompt has " + std::to_string(pads) + " image placeholders for " +
          std::to_string(merged) + " image tokens");
    if (!request.pixel_values.defined() || request.pixel_values.dim() != 2 ||
        request.pixel_values.size(0) != patches ||
        request.pixel_values.size(1) != c.vision->patch_values())
      bad("pixel_values must be [" + std::to_string(patches) + ", " +
          std::to_string(c.vision->patch_values()) + "]");
  }
  const auto P = static_cast<int64_t>(request.prompt.size());
  if (P + request.params.max_tokens > I.cfg.max_context)
    bad("prompt (" + std::to_string(P) + " tokens) + max_tokens (" +
        std::to_string(request.params.max_tokens) + ") exceeds max_context (" +
        std::to_string(I.cfg.max_context) + ")");
  auto s = std::make_unique<Seq>();
  s->plan = I.plan_for(request);
  if (s->plan.bytes > I.cfg.cache_budget_bytes)
    bad("the request needs " + std::to_string(s->plan.bytes) +
        " cache bytes, more than the whole budget of " + std::to_string(I.cfg.cache_budget_bytes) +
        (I.paged && I.n_mla > 0 && I.cfg.allow_sliding_mla
             ? " (even a sliding MLA window of 2 pages per layer does not fit)"
             : ""));
  const uint64_t seed = request.params.seed ? *request.params.seed : std::random_device{}();
  s->sampler = std::make_unique<Sampler>(request.params, request.prompt, seed);
  // Ids past the tokenizer's vocabulary (a model may pad its embedding) decode to nothing.
  s->text = std::make_unique<TextStream>(request.params.stop,
                                         [&tok = I.tok](const std::vector<int32_t>& ids) {
                                           const int32_t n = tok.vocab_size();
                                           std::vector<int32_t> ok;
                                           for (int32_t t : ids)
                                             if (t >= 0 && t < n) ok.push_back(t);
                                           return tok.decode(ok);
                                         });
  s->req = std::move(request);
  s->cb = std::move(on_event);
  uint64_t id;
  {
    std::lock_guard lk(I.mu);
    id = s->id = I.next_id++;
    I.waiting.push_back(std::move(s));
    I.st.waiting = static_cast<int64_t>(I.waiting.size());
  }
  I.cv.notify_all();
  return id;
}

void Engine::cancel(uint64_t request) {
  {
    std::lock_guard lk(impl_->mu);
    impl_->cancels.push_back(request);
  }
  impl_->cv.notify_all();
}

EngineStats Engine::stats() const {
  std::lock_guard lk(impl_->mu);
  EngineStats s = impl_->st;
  s.cache_bytes_reserved = impl_->reserved - impl_->prefix_bytes;
  s.prefix_cache_bytes = impl_->prefix_bytes;
  s.pool_bytes = impl_->pages_made.load() * impl_->page_bytes;
  return s;
}

const EngineConfig& Engine::config() const {
  return impl_->cfg;
}

Engine::Completion Engine::generate(Request request) {
  auto done = std::make_shared<std::promise<Completion>>();
  auto c = std::make_shared<Completion>();
  submit(std::move(request), [done, c](const TokenEvent& e) {
    if (e.token >= 0) c->tokens.push_back(e.token), c->logprobs.push_back(e.logprob);
    c->text += e.text;
    if (e.finished) {
      c->finish_reason = e.finish_reason, c->error = e.error;
      done->set_value(std::move(*c));
    }
    return true;
  });
  return done->get_future().get();
}

}  // namespace myriad::infer
