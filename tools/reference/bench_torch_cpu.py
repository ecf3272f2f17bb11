#!/usr/bin/env python3
"""Training-step throughput of transformers' KimiLinearForCausalLM on the CPU: the torch side of
scripts/bench_model.sh (the Myriad side is bench/bench_model.cpp, same config, B, T and steps).

  bench_torch_cpu.py --init CONFIG.json --save DIR [--seed S]
      builds the model from a config.json with transformers' own init and saves it with
      save_pretrained (config.json + model.safetensors), so both sides can load the same weights.
  bench_torch_cpu.py MODEL [--B 2] [--T 512] [--steps 8] [--warmup 2] [--threads N] [--profile]
      MODEL is a directory from --save (or a config.json: transformers' random init); runs
      forward + loss (labels = input_ids, mean next-token cross-entropy) + backward on the
      pseudo-random tokens [B, T] that bench_model also uses, float32, use_cache=False, and prints
      tokens/s from the median step after the warm-up, then the machine-readable line
      `RESULT torch tokens_per_s=<x> ...` (its loss equals bench_model's for the same weights).

fla and causal_conv1d are hidden, so transformers runs its own torch-only paths: the chunked KDA
`chunk_kimi_delta_attention` (chunk 64, a Python loop over chunks) and the F.conv1d causal conv;
the script prints which KDA function and which experts / attention implementations actually ran.
--threads defaults to $OMP_NUM_THREADS (torch.set_num_threads and set_num_interop_threads).
--profile times each layer type's forward + backward on its own, as bench_model --profile=1 does.
--adamw makes each step a full optimiser step (clip_grad_norm_ 1.0 + torch.optim.AdamW, its
default foreach implementation), as bench_model --adamw=1 does.

Dependencies: as make_fixtures.py, runs as is when transformers matches requirements.txt;
otherwise re-runs itself in the virtualenv $MYRIAD_REF_VENV (default tools/reference/.venv),
creating it from requirements.txt when it does not exist.
"""
import argparse
import inspect
import os
import pathlib
import statistics
import sys
import time

import refenv  # tools/reference/refenv.py: the venv these scripts run in


def load_model(path, seed):
    import torch
    from transformers import KimiLinearConfig, KimiLinearForCausalLM

    p = pathlib.Path(path)
    if p.is_dir() and any(p.glob("*.safetensors*")):
        model = KimiLinearForCausalLM.from_pretrained(p, dtype=torch.float32)
    else:
        torch.manual_seed(seed)
        cfg = KimiLinearConfig.from_json_file(p / "config.json" if p.is_dir() else p)
        model = KimiLinearForCausalLM(cfg)
    return model.float()


def tokens(B, T, V, seed):
    """splitmix64(seed * 2^32 + i) mod V for token i of the flattened batch, as bench_model.cpp."""
    import torch

    m = (1 << 64) - 1
    ids = []
    for i in range(B * T):
        z = ((seed << 32) + i + 0x9E3779B97F4A7C15) & m
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
        ids.append((z ^ (z >> 31)) % V)
    return torch.tensor(ids, dtype=torch.int64).view(B, T)


def kda_path():
    """The function transformers' KDA layers call for a multi-token forward."""
    from transformers.models.kimi_linear import modeling_kimi_linear as mk

    impl = inspect.getclosurevars(mk.chunk_kimi_delta_attention).nonlocals.get("implementation")
    impl = impl or mk.chunk_kimi_delta_attention
    return f"{impl.__module__}.{impl.__qualname__}"


def median_time(fn, reps):
    fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def profile(model, ids, step_s):
    """Each layer type's forward + backward on its own (cf. bench_model --profile=1)."""
    import torch

    cfg = model.config
    B, T = ids.shape
    d = cfg.hidden_size
    gen = torch.Generator().manual_seed(7)
    x0 = torch.randn(B, T, d, generator=gen)
    r = torch.randn(B, T, d, generator=gen)
    layers = model.model.layers
    L = cfg.num_hidden_layers

    def fwd_bwd(fwd):
        def run():
            model.zero_grad(set_to_none=True)
            x = x0.clone().requires_grad_()
            (fwd(x) * r).sum().backward()
        return run

    def first(pred):
        return next((i for i in range(L) if pred(i)), None)

    parts = []
    kinds = [
        ("KDA attention", lambda i: cfg.layer_types[i] == "linear_attention",
         lambda m: (lambda x: m.self_attn(x, attention_mask=None))),
        ("MLA attention", lambda i: cfg.layer_types[i] == "full_attention",
         lambda m: (lambda x: m.self_attn(x, attention_mask=None)[0])),
        ("dense FFN", lambda i: cfg.mlp_layer_types[i] == "dense", lambda m: m.mlp),
        ("MoE FFN", lambda i: cfg.mlp_layer_types[i] == "sparse", lambda m: m.mlp),
    ]
    reps = 5
    for name, pred, get in kinds:
        i = first(pred)
        if i is not None:
            n = sum(1 for j in range(L) if pred(j))
            parts.append((name, n, median_time(fwd_bwd(get(layers[i])), reps)))
    norm = model.model.norm

    def norms(x):
        h = x + norm(x)
        return h + norm(h)

    parts.append(("norms + residuals", L, median_time(fwd_bwd(norms), reps)))

    def head():
        model.zero_grad(set_to_none=True)
        h = model.model.norm(model.model.embed_tokens(ids))
        logits = model.lm_head(h)
        torch.nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]).float(), ids.view(-1)).backward()

    parts.append(("embedding + head + loss", 1, median_time(head, reps)))
    print(f"\nProfile: each part's forward + backward alone (median of {reps}), B={B} T={T}")
    print(f"  {'part':<26} {'count':>6} {'ms each':>10} {'ms total':>10} {'share':>7}")
    total = 0.0
    for name, n, s in parts:
        total += n * s
        print(f"  {name:<26} {n:>6} {1e3 * s:>10.2f} {1e3 * n * s:>10.2f} {100 * n * s / step_s:>6.1f}%")
    print(f"  {'sum of parts':<26} {'':>6} {'':>10} {1e3 * total:>10.2f} {100 * total / step_s:>6.1f}%")
    print(f"  {'whole step (median)':<26} {'':>6} {'':>10} {1e3 * step_s:>10.2f}")


def main():
    refenv.ensure_pinned(__file__)
    for mod in ("fla", "causal_conv1d"):  # force transformers' torch-only KDA and conv paths
        sys.modules[mod] = None
    import warnings

    warnings.filterwarnings("ignore")
    import torch
    import transformers

    transformers.logging.set_verbosity_error()

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", nargs="?", help="model directory (config.json [+ safetensors]) or config.json")
    ap.add_argument("--init", help="config.json to build a model from (with --save)")
    ap.add_argument("--save", help="directory to save_pretrained the --init model into")
    ap.add_argument("--B", type=int, default=2)
    ap.add_argument("--T", type=int, default=512)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "0") or 0))
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--adamw", action="store_true",
                    help="full optimiser steps: clip_grad_norm_(1.0) + AdamW(lr 1e-3, betas 0.9/0.95, "
                         "eps 1e-8, weight decay 0.1), as bench_model --adamw=1; loss= is then the "
                         "first step's loss (before any update), loss_last= the last step's")
    args = ap.parse_args()

    if args.threads > 0:
        torch.set_num_threads(args.threads)
        torch.set_num_interop_threads(args.threads)
    if args.init:
        if not args.save:
            ap.error("--init needs --save")
        load_model(args.init, args.seed).save_pretrained(args.save)
        print(f"bench_torch_cpu: saved a {args.init} model to {args.save}")
        return
    if not args.model:
        ap.error("give a model directory or config.json")

    model = load_model(args.model, args.seed)
    model.train()
    cfg = model.config
    ids = tokens(args.B, args.T, cfg.vocab_size, args.seed)
    n_tok = args.B * args.T
    n_params = sum(p.numel() for p in model.parameters())
    print(f"bench_torch_cpu: {args.model}, torch {torch.__version__}, transformers {transformers.__version__}, "
          f"{torch.get_num_threads()} threads, float32, {n_params / 1e6:.2f}M params, B={args.B} T={args.T}")
    print(f"  KDA: {kda_path()}; experts: {cfg._experts_implementation}; attention: {cfg._attn_implementation}")

    opt = None
    if args.adamw:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    times, loss, first_loss = [], 0.0, 0.0
    for s in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        model.zero_grad(set_to_none=True)
        out = model(input_ids=ids, labels=ids, use_cache=False)
        out.loss.backward()
        if opt is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
        loss = out.loss.item()
        if s == 0:
            first_loss = loss
        dt = time.perf_counter() - t0
        if s >= args.warmup:
            times.append(dt)
        print(f"  step {s:2d}{' (warm-up)' if s < args.warmup else '          '} {1e3 * dt:8.1f} ms  loss {loss:.6f}")
    step_s = statistics.median(times)
    print(f"  median step {1e3 * step_s:.1f} ms (min {1e3 * min(times):.1f}, max {1e3 * max(times):.1f})"
          f" -> {n_tok / step_s:.0f} tokens/s")
    if args.profile:
        profile(model, ids, step_s)
    print(f"RESULT torch tokens_per_s={n_tok / step_s:.1f} step_ms={1e3 * step_s:.2f} "
          f"step_min_ms={1e3 * min(times):.2f} B={args.B} T={args.T} steps={args.steps} "
          f"threads={torch.get_num_threads()} loss={first_loss if opt else loss:.6f} loss_last={loss:.6f} "
          f"optimizer={'adamw' if opt else 'none'}")


if __name__ == "__main__":
    main()
