#!/usr/bin/env python3
"""Greedy decode throughput of transformers' KimiLinearForCausalLM on the CPU: the torch side of
scripts/bench_decode_vs_torch.sh (the Myriad side is `bench_decode DIR`, bench/bench_decode.cpp).

  bench_decode_torch.py MODEL_DIR [--ctx 1024] [--new 32] [--show 8] [--threads N] [--batches 1,16]

MODEL_DIR holds config.json + model.safetensors (written by bench_decode). For each batch size it
runs model.generate() (greedy, use_cache=True, float32) on the same prompts as bench_decode:
sequence b of the batch is token i -> 4 + (i * 7919 + b * 131) mod (V - 4), all `ctx` long. One
warm-up generate of 4 tokens first, as bench_decode does. The timed window opens when the first
new token of the batch reaches the streamer (prefill done) and closes at the last one, so
tokens/s = batch * (new - 1) / window: decode steps only, as bench_decode times its engine.
Prints `RESULT torch batch=.. tokens_per_s=.. cache_bytes_per_seq=..` (every tensor the returned
cache holds, over the batch, after prompt + new - 1 tokens) and `TOKENS batch=.. seq=.. ids...`
(the first --show greedy tokens of each sequence), the same lines bench_decode prints.

fla and causal_conv1d are hidden, so transformers runs its torch-only KDA and conv paths.
EOS is disabled (bench_decode sets ignore_eos): every sequence gets exactly `new` tokens.
--threads defaults to $OMP_NUM_THREADS (torch.set_num_threads and set_num_interop_threads).
Dependencies: as bench_torch_cpu.py (re-runs itself in $MYRIAD_REF_VENV, default
tools/reference/.venv, when the running python lacks the pinned transformers).
"""
import argparse
import os
import sys
import time

import refenv  # tools/reference/refenv.py: the venv these scripts run in


def prompts(batch, n, V):
    import torch

    return torch.tensor([[4 + (i * 7919 + b * 131) % (V - 4) for i in range(n)] for b in range(batch)])


class Timer:
    """A generate() streamer: the first put is the prompt, then one [B] tensor per new token."""

    def __init__(self):
        self.puts, self.t_first, self.t_last, self.ids = 0, None, None, []

    def put(self, t):
        self.puts += 1
        if self.puts == 1:
            return
        now = time.perf_counter()
        self.t_first = self.t_first or now
        self.t_last = now
        self.ids.append(t.view(-1).tolist())

    def end(self):
        pass


def cache_bytes(cache):
    """Bytes of every tensor held by the cache's layers."""
    import torch

    total = 0
    for layer in getattr(cache, "layers", []):
        for v in vars(layer).values():
            v = v.values() if isinstance(v, dict) else v  # linear-attention layers: conv / recurrent states
            for t in v if isinstance(v, (list, tuple, type({}.values()))) else [v]:
                if isinstance(t, torch.Tensor):
                    total += t.numel() * t.element_size()
    return total


def main():
    refenv.ensure_pinned(__file__)
    for mod in ("fla", "causal_conv1d"):  # force transformers' torch-only KDA and conv paths
        sys.modules[mod] = None
    import warnings

    warnings.filterwarnings("ignore")
    import torch
    import transformers
    from transformers import KimiLinearForCausalLM

    transformers.logging.set_verbosity_error()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--show", type=int, default=8)
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "0") or 0))
    args = ap.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
        torch.set_num_interop_threads(args.threads)

    model = KimiLinearForCausalLM.from_pretrained(args.model, dtype=torch.float32).float().eval()
    cfg = model.config
    gc = model.generation_config
    gc.eos_token_id = gc.pad_token_id = gc.bos_token_id = None
    gc.do_sample, gc.max_length = False, None
    print(f"bench_decode_torch: {args.model}, torch {torch.__version__}, transformers {transformers.__version__}, "
          f"{torch.get_num_threads()} threads, float32, {cfg.num_hidden_layers} layers, d {cfg.hidden_size}, "
          f"V {cfg.vocab_size}; attention: {cfg._attn_implementation}, experts: {cfg._experts_implementation}")

    with torch.inference_mode():
        for batch in (int(b) for b in args.batches.split(",")):
            ids = prompts(batch, args.ctx, cfg.vocab_size)
            mask = torch.ones_like(ids)
            model.generate(ids, attention_mask=mask, max_new_tokens=4, use_cache=True)  # warm-up
            timer = Timer()
            out = model.generate(ids, attention_mask=mask, max_new_tokens=args.new, use_cache=True,
                                 streamer=timer, return_dict_in_generate=True)
            rate = batch * (args.new - 1) / (timer.t_last - timer.t_first)
            cb = cache_bytes(out.past_key_values) // batch
            print(f"RESULT torch batch={batch} ctx={args.ctx} tokens_per_s={rate:.2f} cache_bytes_per_seq={cb}")
            for b in range(batch):
                print(f"TOKENS batch={batch} seq={b} " + " ".join(str(s[b]) for s in timer.ids[: args.show]))
            sys.stdout.flush()


if __name__ == "__main__":
    main()
