// llama_quantize: a GGUF rewritten in q4_0 by libllama's own llama_model_quantize (the library
// function behind llama.cpp's llama-quantize tool), for the q4_0 rows of
// scripts/bench_vs_llamacpp.sh: llama.cpp's converter writes f32, bf16 and q8_0 but not q4_0.
// Our code, linked against the libllama that scripts/peers/llama_cpp.sh builds.
//
//   llama_quantize IN.gguf OUT.gguf [--threads 2]
//
// "pure": every quantizable weight in q4_0 (llama.cpp's default mix keeps the output head in a
// higher-precision type; Myriad's --quantize int4 quantizes the head too).
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "llama.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: llama_quantize IN.gguf OUT.gguf [--threads N]\n");
    return 2;
  }
  llama_model_quantize_params p = llama_model_quantize_default_params();
  p.ftype = LLAMA_FTYPE_MOSTLY_Q4_0;
  p.pure = true;
  p.nthread = 2;
  for (int i = 3; i + 1 < argc; i += 2)
    if (std::strcmp(argv[i], "--threads") == 0) p.nthread = std::atoi(argv[i + 1]);
  llama_backend_init();
  const uint32_t rc = llama_model_quantize(argv[1], argv[2], &p);
  llama_backend_free();
  if (rc != 0) std::fprintf(stderr, "llama_quantize: llama_model_quantize failed (%u)\n", rc);
  return rc == 0 ? 0 : 1;
}
