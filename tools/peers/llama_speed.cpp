// llama_speed: llama.cpp's side of scripts/bench_vs_llamacpp.sh. Prefill and greedy decode
// tokens/s of a GGUF model, on the same synthetic prompts bench_decode feeds Myriad.
// Our code, linked against the libllama that scripts/peers/llama_cpp.sh builds.
//
//   llama_speed MODEL.gguf [--ctx 1024] [--new 64] [--parallel 1] [--threads 1] [--show 8]
//               [--ubatch 512] [--no-repack]
//
// --no-repack: no CPU weight repacking (llama_model_params::use_extra_bufts = false). This
// llama.cpp aborts on q8_0 GGUFs of the kimi-k3, kimi-linear and deepseek2 forms with it
// (GGML_ASSERT(*cur_backend_id != -1) while reserving the graph), so their q8_0 rows run without.
//
// Sequence s's prompt is token 4 + (i * 7919 + s * 131) % (V - 4) at position i, as in
// bench/bench_decode.cpp. Caches are f32 and flash attention is off (Myriad's f32 latent cache
// and its own attention kernels). Timings (after one untimed warm-up pass):
// - prefill: the first sequence's prompt as one llama_decode call (n_batch = ctx, processed in
//   micro-batches of --ubatch tokens, llama.cpp's default 512);
// - decode: --parallel sequences, each prefilled, then --new steps of one token per sequence in
//   one llama_decode call per step (llama.cpp's parallel decoding), greedy; tokens/s counts
//   every sequence's tokens.
// Prints RESULT lines like bench_decode's, and each sequence's first --show greedy tokens.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "llama.h"

namespace {

using Clock = std::chrono::steady_clock;

void quiet_log(ggml_log_level level, const char* text, void*) {
  if (level >= GGML_LOG_LEVEL_WARN) std::fputs(text, stderr);
}

std::vector<llama_token> prompt(int n, int V, int salt) {
  std::vector<llama_token> p;
  for (long i = 0; i < n; ++i)
    p.push_back(static_cast<llama_token>(4 + (i * 7919 + salt * 131) % (V - 4)));
  return p;
}

int argmax(const float* row, int V) {
  int best = 0;
  for (int v = 1; v < V; ++v)
    if (row[v] > row[best]) best = v;
  return best;
}

double seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

struct Run {
  double prefill_s = 0, decode_s = 0;
  std::vector<std::vector<llama_token>> out;
};

// Prefills every sequence (sequence 0 timed on its own), then decodes `steps` greedy tokens for
// all of them together.
bool run(llama_context* ctx, int V, int n_ctx, int parallel, int steps, Run& r) {
  llama_memory_clear(llama_get_memory(ctx), true);
  llama_batch batch = llama_batch_init(n_ctx > parallel ? n_ctx : parallel, 0, 1);
  r.out.assign(parallel, {});
  std::vector<llama_token> next(parallel);
  for (int s = 0; s < parallel; ++s) {
    const std::vector<llama_token> p = prompt(n_ctx, V, s);
    batch.n_tokens = 0;
    for (int i = 0; i < n_ctx; ++i) {
      const int j = batch.n_tokens++;
      batch.token[j] = p[i], batch.pos[j] = i, batch.n_seq_id[j] = 1, batch.seq_id[j][0] = s;
      batch.logits[j] = i == n_ctx - 1;
    }
    const auto t0 = Clock::now();
    if (llama_decode(ctx, batch) != 0) return false;
    if (s == 0) r.prefill_s = seconds(t0, Clock::now());
    next[s] = argmax(llama_get_logits_ith(ctx, -1), V);
    r.out[s].push_back(next[s]);
  }
  const auto t0 = Clock::now();
  for (int step = 0; step < steps; ++step) {
    batch.n_tokens = 0;
    for (int s = 0; s < parallel; ++s) {
      const int j = batch.n_tokens++;
      batch.token[j] = next[s], batch.pos[j] = n_ctx + step, batch.n_seq_id[j] = 1;
      batch.seq_id[j][0] = s, batch.logits[j] = 1;
    }
    if (llama_decode(ctx, batch) != 0) return false;
    for (int s = 0; s < parallel; ++s) {
      next[s] = argmax(llama_get_logits_ith(ctx, s), V);
      r.out[s].push_back(next[s]);
    }
  }
  r.decode_s = seconds(t0, Clock::now());
  llama_batch_free(batch);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: %s MODEL.gguf [--ctx N] [--new N] [--parallel N] [--threads N] "
                 "[--show N] [--ubatch N] [--no-repack]\n",
                 argv[0]);
    return 2;
  }
  const std::string model_path = argv[1];
  int n_ctx = 1024, steps = 64, parallel = 1, threads = 1, show = 8, ubatch = 512;
  bool repack = true;
  for (int i = 2; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--no-repack")) {
      repack = false;
      continue;
    }
    auto num = [&](int& v) {
      if (i + 1 >= argc) return false;
      v = std::atoi(argv[++i]);
      return v > 0 || (v == 0 && &v == &show);
    };
    bool ok = false;
    if (!std::strcmp(argv[i], "--ctx"))
      ok = num(n_ctx);
    else if (!std::strcmp(argv[i], "--new"))
      ok = num(steps);
    else if (!std::strcmp(argv[i], "--parallel"))
      ok = num(parallel);
    else if (!std::strcmp(argv[i], "--threads"))
      ok = num(threads);
    else if (!std::strcmp(argv[i], "--show"))
      ok = num(show);
    else if (!std::strcmp(argv[i], "--ubatch"))
      ok = num(ubatch);
    if (!ok) {
      std::fprintf(stderr, "bad argument %s\n", argv[i]);
      return 2;
    }
  }

  llama_log_set(quiet_log, nullptr);
  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  mp.n_gpu_layers = 0;
  mp.use_extra_bufts = repack;
  llama_model* model = llama_model_load_from_file(model_path.c_str(), mp);
  if (!model) {
    std::fprintf(stderr, "cannot load %s\n", model_path.c_str());
    return 1;
  }
  const int V = llama_vocab_n_tokens(llama_model_get_vocab(model));

  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = static_cast<uint32_t>((n_ctx + steps + 8) * parallel);
  cp.n_batch = static_cast<uint32_t>(n_ctx > parallel ? n_ctx : parallel);
  cp.n_ubatch = static_cast<uint32_t>(ubatch);
  cp.n_seq_max = static_cast<uint32_t>(parallel);
  cp.kv_unified = false;  // a cache stream per sequence: attention never spans other sequences
  cp.n_threads = threads;
  cp.n_threads_batch = threads;
  cp.type_k = GGML_TYPE_F32;
  cp.type_v = GGML_TYPE_F32;
  cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
  cp.no_perf = true;
  llama_context* ctx = llama_init_from_model(model, cp);
  if (!ctx) {
    std::fprintf(stderr, "cannot create a context\n");
    return 1;
  }

  Run warm, r;
  if (!run(ctx, V, n_ctx, parallel, 4, warm) || !run(ctx, V, n_ctx, parallel, steps, r)) {
    std::fprintf(stderr, "llama_decode failed\n");
    return 1;
  }
  std::printf("RESULT llama.cpp prefill ctx=%d tokens_per_s=%.2f\n", n_ctx, n_ctx / r.prefill_s);
  std::printf("RESULT llama.cpp batch=%d ctx=%d tokens_per_s=%.2f\n", parallel, n_ctx,
              static_cast<double>(steps) * parallel / r.decode_s);
  for (int s = 0; s < parallel; ++s) {
    std::printf("TOKENS batch=%d seq=%d", parallel, s);
    for (int i = 0; i < show && i < static_cast<int>(r.out[s].size()); ++i)
      std::printf(" %d", r.out[s][i]);
    std::printf("\n");
  }
  llama_free(ctx);
  llama_model_free(model);
  llama_backend_free();
  return 0;
}
