// llama_logits: run a GGUF model with llama.cpp on given token ids and write every position's
// logits, for cross-checking Myriad against llama.cpp (tools/reference/llama_cpp_k3.py).
// Our code, linked against the libllama that scripts/peers/llama_cpp.sh builds.
//
//   llama_logits MODEL.gguf TOKENS.txt OUT.safetensors [--step] [--threads N] [--no-repack]
//
// --no-repack: no CPU weight repacking (see llama_speed.cpp: q8_0 GGUFs of these forms abort
// with it).
//
// TOKENS.txt: one sequence per line, token ids separated by spaces; all lines the same length.
// OUT.safetensors: "logits" f32 [B, T, V]. Each sequence runs from an empty cache. By default a
// sequence is one llama_decode call (the prefill path); --step feeds one token per call (the
// decode path: KDA recurrent state and MLA latent cache carried between calls). The caches are
// f32 so that the only differences left are the kernels'.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "llama.h"

static void quiet_log(ggml_log_level level, const char* text, void*) {
  if (level >= GGML_LOG_LEVEL_WARN && std::getenv("LLAMA_LOGITS_QUIET") == nullptr)
    std::fputs(text, stderr);
}

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr,
                 "usage: %s MODEL.gguf TOKENS.txt OUT.safetensors [--step] [--threads N] "
                 "[--no-repack]\n",
                 argv[0]);
    return 2;
  }
  const std::string model_path = argv[1], tokens_path = argv[2], out_path = argv[3];
  bool step = false, repack = true;
  int threads = 1;
  for (int i = 4; i < argc; ++i) {
    if (std::strcmp(argv[i], "--step") == 0)
      step = true;
    else if (std::strcmp(argv[i], "--no-repack") == 0)
      repack = false;
    else if (std::strcmp(argv[i], "--threads") == 0 && i + 1 < argc)
      threads = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "unknown argument %s\n", argv[i]);
      return 2;
    }
  }

  std::vector<std::vector<llama_token>> seqs;
  {
    std::ifstream in(tokens_path);
    std::string line;
    while (std::getline(in, line)) {
      std::istringstream ss(line);
      std::vector<llama_token> s;
      long v;
      while (ss >> v) s.push_back(static_cast<llama_token>(v));
      if (!s.empty()) seqs.push_back(std::move(s));
    }
  }
  if (seqs.empty()) {
    std::fprintf(stderr, "no tokens in %s\n", tokens_path.c_str());
    return 1;
  }
  const size_t T = seqs[0].size();
  for (const auto& s : seqs)
    if (s.size() != T) {
      std::fprintf(stderr, "sequences differ in length\n");
      return 1;
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
  cp.n_ctx = static_cast<uint32_t>(T < 64 ? 64 : T);
  cp.n_batch = cp.n_ctx;
  cp.n_ubatch = cp.n_ctx;
  cp.n_seq_max = 1;
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

  std::vector<float> logits;
  logits.reserve(seqs.size() * T * static_cast<size_t>(V));
  llama_batch batch = llama_batch_init(static_cast<int32_t>(T), 0, 1);
  for (const auto& s : seqs) {
    llama_memory_clear(llama_get_memory(ctx), true);
    const size_t chunk = step ? 1 : T;
    for (size_t p0 = 0; p0 < T; p0 += chunk) {
      batch.n_tokens = 0;
      for (size_t p = p0; p < p0 + chunk; ++p) {
        const int i = batch.n_tokens++;
        batch.token[i] = s[p];
        batch.pos[i] = static_cast<llama_pos>(p);
        batch.n_seq_id[i] = 1;
        batch.seq_id[i][0] = 0;
        batch.logits[i] = 1;
      }
      if (llama_decode(ctx, batch) != 0) {
        std::fprintf(stderr, "llama_decode failed\n");
        return 1;
      }
      for (int i = 0; i < batch.n_tokens; ++i) {
        const float* row = llama_get_logits_ith(ctx, i);
        logits.insert(logits.end(), row, row + V);
      }
    }
  }
  llama_batch_free(batch);

  // safetensors: u64 header length, JSON header (padded to 8 bytes), then the data.
  std::string header = "{\"logits\":{\"dtype\":\"F32\",\"shape\":[" + std::to_string(seqs.size()) +
                       "," + std::to_string(T) + "," + std::to_string(V) +
                       "],\"data_offsets\":[0," + std::to_string(logits.size() * 4) + "]}}";
  while (header.size() % 8) header += ' ';
  std::ofstream out(out_path, std::ios::binary);
  const uint64_t n = header.size();
  out.write(reinterpret_cast<const char*>(&n), 8);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(reinterpret_cast<const char*>(logits.data()),
            static_cast<std::streamsize>(logits.size() * sizeof(float)));
  if (!out) {
    std::fprintf(stderr, "cannot write %s\n", out_path.c_str());
    return 1;
  }

  llama_free(ctx);
  llama_model_free(model);
  llama_backend_free();
  std::fprintf(stderr, "llama_logits: %zu x %zu tokens, vocab %d -> %s%s\n", seqs.size(), T, V,
               out_path.c_str(), step ? " (one token per decode)" : "");
  return 0;
}
