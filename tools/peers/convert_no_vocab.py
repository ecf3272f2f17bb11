#!/usr/bin/env python3
"""Run llama.cpp's convert_hf_to_gguf.py on a Myriad model directory that has no tokenizer
llama.cpp knows (token ids only): the Kimi K3, Kimi Linear and DeepSeek-V2/V3 converters' set_vocab
is replaced by the converter's own "no vocabulary" writer (llama.cpp then holds vocab_size dummy
tokens, enough to run on ids).

    python convert_no_vocab.py LLAMA_CPP_DIR MODEL_DIR OUT.gguf OUTTYPE   # f32, bf16, q8_0, ...

Run with PYTHONPATH=LLAMA_CPP_DIR/gguf-py (the sdist's gguf-py, which knows KIMI_K3).
"""
import runpy
import sys

llama_dir, src, out, outtype = sys.argv[1:5]
sys.path.insert(0, llama_dir)
import conversion.deepseek as ds  # noqa: E402
import conversion.kimi_k3 as k3  # noqa: E402
import conversion.kimi_linear as kl  # noqa: E402


def no_vocab(self):
    self._set_vocab_none()


for cls in (k3.KimiK3Model, kl.KimiLinearModel, ds.DeepseekV2Model):
    cls.set_vocab = no_vocab
sys.argv = ["convert_hf_to_gguf.py", src, "--outtype", outtype, "--outfile", out]
runpy.run_path(llama_dir + "/convert_hf_to_gguf.py", run_name="__main__")
