#!/usr/bin/env python3
"""Do two engines compute the same thing? Compares the logits two engines wrote for the same
token ids (safetensors, one f32 tensor [B, T, V] or [T, V] each; `myriad logits` and
tools/peers/llama_logits write them) and prints one line:

    top1 AGREE/N (PCT%)  max|d|/max|ref| X  rms rel Y

With --ids-out FILE and --len T, --vocab V it instead writes the prompt ids scripts/bench_vs_llamacpp.sh
uses (bench_decode's synthetic prompt 0) as i64 input_ids [1, T] (for `myriad logits`) and as a
text line next to it (FILE with .txt, for llama_logits). Exit status 1 when --min-agree is given
and the agreement is below it.
"""
import argparse
import pathlib
import sys

import numpy as np
from safetensors.numpy import load_file, save_file


def one(path):
    t = load_file(path)
    x = t["logits"] if "logits" in t else t[sorted(t)[0]]
    return x.reshape(-1, x.shape[-1]).astype(np.float64)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("a", nargs="?", help="logits of the engine under test (Myriad)")
    ap.add_argument("ref", nargs="?", help="logits of the reference engine (llama.cpp)")
    ap.add_argument("--min-agree", type=float, default=None, help="fail below this fraction")
    ap.add_argument("--ids-out", help="write the prompt ids here instead of comparing")
    ap.add_argument("--len", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=0)
    args = ap.parse_args()
    if args.ids_out:
        ids = 4 + (np.arange(args.len, dtype=np.int64) * 7919) % (args.vocab - 4)
        save_file({"input_ids": ids.reshape(1, -1)}, args.ids_out)
        pathlib.Path(args.ids_out).with_suffix(".txt").write_text(" ".join(map(str, ids)) + "\n")
        return 0
    a, ref = one(args.a), one(args.ref)
    if a.shape != ref.shape:
        sys.exit(f"shapes differ: {a.shape} vs {ref.shape}")
    agree = int((a.argmax(-1) == ref.argmax(-1)).sum())
    n = a.shape[0]
    d = np.abs(a - ref)
    rel = d.max() / np.abs(ref).max()
    rms = np.sqrt((d ** 2).mean() / (ref ** 2).mean())
    print(f"top1 {agree}/{n} ({100.0 * agree / n:.1f}%)  max|d|/max|ref| {rel:.2e}  rms rel {rms:.2e}")
    if args.min_agree is not None and agree < args.min_agree * n:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
