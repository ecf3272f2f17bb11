#!/usr/bin/env python3
"""Cross-check Myriad's Kimi-K3 forward pass against llama.cpp (an independent engine).

    scripts/peers/llama_cpp.sh                       # once: builds llama.cpp into build/peers/
    build/peers/venv/bin/python tools/reference/llama_cpp_k3.py [--model DIR] [--work DIR]

What it does:
1. A tiny K3-form model written by Myriad: --model DIR, or (default) `myriad train` runs a
   20-step recipe on the synthetic corpus (preset tiny with the MLA output gate on, 4 heads,
   attn_res_block_size 3: 8 layers = 6 KDA + 2 MLA, dense layer 0, 7 latent-MoE layers of 8
   experts top-2, AttnRes, SiTU) into WORK/k3-model. Myriad's flat layout and the K3 release
   layout are both accepted (class Layout).
2. Variants of it (function variants): trained, experts0 (routed experts zeroed), perturbed (norm
   weights and AttnRes pseudo-queries randomised) and eps_neutral (perturbed, with the inputs of
   the norms whose eps the engines choose differently scaled up).
3. For each variant: Myriad's logits (`myriad logits`); the K3 release layout, converted by
   llama.cpp's convert_hf_to_gguf.py --outtype f32 and run by llama.cpp (tools/peers/
   llama_logits.cpp) as one prefill and one token per decode call; and an independent float64
   NumPy forward (k3_forward_f64, written from MODEL.md, recurrent KDA) with each engine's eps
   conventions, which says which engine is right when they differ.
4. llama.cpp's own error floor: the transformers Kimi Linear fixtures
   (tests/fixtures/models/kimi_linear_tiny{,_rope0}) converted the same way, llama.cpp against
   the transformers logits stored with them (Myriad and the f64 forward against the same).
Reports max |diff|, max |diff| / max |ref|, the RMS relative error and argmax agreement; writes
WORK/report.json. Exit status 1 when, above --tol (max|d|/max|ref|): an engine differs from the
f64 forward with its own eps (all variants but `trained`), or the engines differ from each other
on eps_neutral.

EPS: llama.cpp normalises the KDA q/k with x / sqrt(sum x^2 + rms_norm_eps) and uses rms_norm_eps
in the MLA q_a / kv_a RMSNorms; Myriad (like fla and DeepSeek) uses 1e-6 in both. On a barely
trained tiny model (sum u^2 ~ 1e-3) that alone moves the logits by 2e-3 .. 3e-1 relative.

LAYOUT (Myriad's flat layout -> what llama.cpp's KimiK3Model converter reads):
- config.json: Myriad writes a flat text config with architectures ["KimiLinearForCausalLM"] and
  model_type "kimi_linear"; with those the converter picks its Kimi Linear class (no AttnRes,
  latent MoE or SiTU). The converter keys on architectures[0] == "KimiK3ForConditionalGeneration";
  here it gets the release form {"architectures": [that], "model_type": "kimi_k3",
  "text_config": <Myriad's config>} (the converter lifts text_config to the top level).
- tensors: A_log [1, 1, H, 1] -> [H] (the converter slices [:H] on dim 0 and llama.cpp's K3 loader
  wants a 1-D [H]); every text tensor gets the "language_model." prefix (optional: the converter
  strips it). No other name or shape changes.
- vocab: the converter's K3 set_vocab (borrowed from Kimi Linear) wants a tokenizer.json whose
  pre-tokenizer hash llama.cpp knows, or else Kimi's TikToken tokenizer through AutoTokenizer
  (trust_remote_code: tiktoken.model + tokenization_kimi.py). Myriad's tokenizer.model is neither,
  so this script swaps set_vocab for the converter's own `tokenizer.ggml.model = "none"`
  (llama.cpp then has vocab_size dummy tokens, enough to run on token ids).
- other converter requirements Myriad already meets: num_key_value_heads == num_attention_heads
  (kv_b_proj split), mla_use_nope true, hidden_act "situ", moe_router_activation_func "sigmoid",
  the dense layer as mlp.{gate,up,down}_proj, per-expert experts.{j}.w1/w2/w3, conv1d [P, 1, K].
  llama.cpp runs KDA with num_attention_heads heads (linear_attn_config.num_heads is not read).
"""
import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time

import numpy as np
from safetensors.numpy import load_file, save_file

ROOT = pathlib.Path(__file__).resolve().parents[2]
PEERS = ROOT / "build" / "peers"

RECIPE = """\
seed = 7
deterministic = true
precision = "f32"
balancer = "quantile"

[model]
preset = "tiny"

[model.overrides]
mla_use_output_gate = true
num_attention_heads = 4
num_key_value_heads = 4
attn_res_block_size = 3
linear_attn_config = { num_heads = 4 }

[data]
tokenizer = "tokenizer.model"
vocab_size = 512
corpus = "synthetic"
max_corpus_bytes = 300_000
shard_dir = "shards"
shard_tokens = 65_536
heldout_fraction = 0.02
heldout_batches = 1

[optimizer]
matrix_optimizer = "muon"
lr = 3e-3
weight_decay = 0.1
clip_norm = 1.0

[schedule]
kind = "constant"
warmup = 2

[checkpoint]
dir = "checkpoints"
every = 1000
keep_last = 1

[log]
every = 10
jsonl = true
tensorboard = false
html = false

[[stage]]
name = "s0"
seq_len = 64
steps = 20
tokens_per_step = 512
batch_size = 8
"""

def log(*a):
    print(*a, file=sys.stderr, flush=True)


def run(cmd, logfile=None, env=None):
    t0 = time.time()
    with open(logfile, "w") if logfile else open(os.devnull, "w") as f:
        p = subprocess.run([str(c) for c in cmd], stdout=f, stderr=subprocess.STDOUT,
                           env={**os.environ, **(env or {})})
    if p.returncode != 0:
        tail = pathlib.Path(logfile).read_text()[-3000:] if logfile else ""
        sys.exit(f"failed ({p.returncode}): {' '.join(map(str, cmd))}\n{tail}")
    return time.time() - t0


def read_model(d):
    d = pathlib.Path(d)
    index = d / "model.safetensors.index.json"
    files = (sorted({d / f for f in json.loads(index.read_text())["weight_map"].values()})
             if index.exists() else [d / "model.safetensors"])
    tensors = {}
    for f in files:
        tensors.update(load_file(f))
    return json.loads((d / "config.json").read_text()), tensors


def write_model(d, config, tensors, extra_from=None):
    d = pathlib.Path(d)
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps(config, indent=2))
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(d / "model.safetensors"),
              metadata={"format": "pt"})
    if extra_from:  # the tokenizer and whatever else sits beside the weights
        for f in pathlib.Path(extra_from).iterdir():
            if f.is_file() and f.name != "config.json" and not f.name.endswith(
                    (".safetensors", ".safetensors.index.json")):
                shutil.copy(f, d / f.name)
    return d


PREFIX = "language_model."


class Layout:
    """The layout a Myriad model directory came in: Myriad's current flat one, or the K3 release
    one (text_config, "language_model." prefix, A_log [H]) once Myriad writes that natively.
    canonical() gives the flat text config and unprefixed text tensors the variants and the f64
    forward work on; myriad() and release() map a canonical set back."""

    def __init__(self, config, tensors):
        self.config = config
        self.release = "text_config" in config
        self.text = {**config, **config["text_config"]} if self.release else dict(config)
        self.prefixed = any(k.startswith(PREFIX) for k in tensors)
        self.shapes = {self._strip(k): v.shape for k, v in tensors.items()}
        self.other = {k: v for k, v in tensors.items()            # vision tower, projector
                      if self.prefixed and not k.startswith(PREFIX)}

    def _strip(self, name):
        return name[len(PREFIX):] if name.startswith(PREFIX) else name

    def canonical(self, tensors):
        return {self._strip(k): v for k, v in tensors.items() if k not in self.other}

    def myriad(self, tensors):
        """As Myriad wrote it (names, shapes, config)."""
        out = {(PREFIX + k if self.prefixed else k): v.reshape(self.shapes.get(k, v.shape))
               for k, v in tensors.items()}
        return self.config, {**out, **self.other}

    def release_layout(self, tensors):
        """The K3 release layout that llama.cpp's converter reads."""
        if self.release:
            cfg = self.config
        else:
            text = dict(self.config)
            text["architectures"] = ["KimiLinearForCausalLM"]
            text["model_type"] = "kimi_linear"
            cfg = {"architectures": ["KimiK3ForConditionalGeneration"], "model_type": "kimi_k3",
                   "text_config": text}
        out = {PREFIX + k: (v.reshape(-1) if k.endswith(".A_log") else v)
               for k, v in tensors.items()}
        return cfg, {**out, **self.other}


def transformers_kimi_linear_layout(tensors):
    """transformers 5.24 saves the dense layer-0 MLP of kimi_linear as block_sparse_moe.{gate,up,
    down}_proj; the Kimi Linear release (and the converter) calls it mlp.*."""
    out = {}
    for name, t in tensors.items():
        parts = name.split(".")
        if (len(parts) == 6 and parts[3] == "block_sparse_moe"
                and parts[4] in ("gate_proj", "up_proj", "down_proj")):
            name = ".".join(parts[:3] + ["mlp"] + parts[4:])
        out[name] = t
    return out


def compare(a, ref):
    a = a.astype(np.float64)
    ref = ref.astype(np.float64)
    diff = np.abs(a - ref)
    return {
        "max_abs": float(diff.max()),
        "max_rel": float(diff.max() / np.abs(ref).max()),
        "rms_rel": float(np.sqrt((diff ** 2).mean() / (ref ** 2).mean())),
        "argmax_agree": float((a.argmax(-1) == ref.argmax(-1)).mean()),
        "ref_max_abs": float(np.abs(ref).max()),
    }


def fmt(c):
    return (f"max|d| {c['max_abs']:.3e}  max|d|/max|ref| {c['max_rel']:.3e}  "
            f"rms rel {c['rms_rel']:.3e}  argmax {c['argmax_agree']:.3f}")


# An independent float64 NumPy forward pass, written from MODEL.md (recurrent KDA form), the
# arbiter when the two engines disagree. eps_lora: the q_a / kv_a RMSNorm eps; l2_eps: the eps in
# the KDA q/k L2 norm x / sqrt(sum x^2 + eps). Myriad (and fla / DeepSeek) use 1e-6 for both;
# llama.cpp uses rms_norm_eps for both.
def _sig(x): return 1.0 / (1.0 + np.exp(-x))
def _silu(x): return x * _sig(x)
def _rms(x, w, eps): return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w
def _situ(g, u, b1, b2): return (b1 * np.tanh(g / b1) * _sig(g)) * (b2 * np.tanh(u / b2))

def k3_forward_f64(cfg, W, ids, eps_lora=1e-6, l2_eps=1e-6):
    """Kimi-K3 text model in float64 NumPy, written from docs MODEL.md §3-§8 (recurrent KDA)."""
    W = {k: v.astype(np.float64) for k, v in W.items()}
    eps = cfg["rms_norm_eps"]; d = cfg["hidden_size"]; L = cfg["num_hidden_layers"]
    lac = cfg["linear_attn_config"]; H = lac["num_heads"]; dk = lac["head_dim"]; Kc = lac["short_conv_kernel_size"]
    gmin = lac.get("gate_lower_bound"); full_rank = lac.get("use_full_rank_gate", False)
    Hm = cfg["num_attention_heads"]; dn = cfg["qk_nope_head_dim"]; dpe = cfg["qk_rope_head_dim"]
    dv = cfg["v_head_dim"]; r = cfg["kv_lora_rank"]; S = cfg.get("attn_res_block_size") or 0
    b1 = cfg.get("activation_situ_beta", 4.0); b2 = cfg.get("activation_situ_linear_beta", 25.0)
    situ = cfg.get("hidden_act") == "situ"
    act = (lambda g, u: _situ(g, u, b1, b2)) if situ else (lambda g, u: _silu(g) * u)
    mla_layers = set(i - 1 for i in lac["full_attn_layers"])
    w = lambda n: W[n]
    out = []
    for row in ids:
        T = len(row)
        def kda(i, x):
            p = f"model.layers.{i}.self_attn."
            P = H * dk
            us = []
            for n in "qkv":
                xh = x @ w(p + f"{n}_proj.weight").T                  # [T, P]
                cw = w(p + f"{n}_conv1d.weight").reshape(P, Kc)
                u = np.zeros_like(xh)
                for j in range(Kc):                                    # tap K-1 = current token
                    sh = np.zeros_like(xh); sh[j:] = xh[:T - j] if j else xh
                    u += cw[:, Kc - 1 - j] * sh
                us.append(_silu(u).reshape(T, H, dk))
            q, k, v = us
            q = q / np.sqrt((q * q).sum(-1, keepdims=True) + l2_eps)
            k = k / np.sqrt((k * k).sum(-1, keepdims=True) + l2_eps)
            z = (x @ w(p + "f_a_proj.weight").T) @ w(p + "f_b_proj.weight").T + w(p + "dt_bias")
            z = z.reshape(T, H, dk)
            A = np.exp(w(p + "A_log").reshape(H))[None, :, None]
            g = gmin * _sig(A * z) if gmin is not None else -A * np.logaddexp(0, z)
            beta = _sig(x @ w(p + "b_proj.weight").T)                 # [T, H]
            St = np.zeros((H, dk, dk)); o = np.zeros((T, H, dk))
            for t in range(T):
                St = St * np.exp(g[t])[:, :, None]
                e = v[t] - np.einsum("hkv,hk->hv", St, k[t])
                St = St + beta[t][:, None, None] * np.einsum("hk,hv->hkv", k[t], e)
                o[t] = np.einsum("hkv,hk->hv", St, q[t] / np.sqrt(dk))
            G = (x @ w(p + "g_proj.weight").T if full_rank else
                 (x @ w(p + "g_a_proj.weight").T) @ w(p + "g_b_proj.weight").T).reshape(T, H, dk)
            o = _rms(o, w(p + "o_norm.weight"), eps) * _sig(G)
            return o.reshape(T, H * dk) @ w(p + "o_proj.weight").T
        def mla(i, x):
            p = f"model.layers.{i}.self_attn."
            if p + "q_a_proj.weight" in W:
                q = _rms(x @ w(p + "q_a_proj.weight").T, w(p + "q_a_layernorm.weight"), eps_lora) @ w(p + "q_b_proj.weight").T
            else:
                q = x @ w(p + "q_proj.weight").T
            q = q.reshape(T, Hm, dn + dpe)
            ck = x @ w(p + "kv_a_proj_with_mqa.weight").T
            c = _rms(ck[:, :r], w(p + "kv_a_layernorm.weight"), eps_lora); kpe = ck[:, r:]
            kv = (c @ w(p + "kv_b_proj.weight").T).reshape(T, Hm, dn + dv)
            kn, vv = kv[..., :dn], kv[..., dn:]
            sc = (np.einsum("thd,shd->hts", q[..., :dn], kn) + np.einsum("thd,sd->hts", q[..., dn:], kpe)) / np.sqrt(dn + dpe)
            sc = np.where(np.tril(np.ones((T, T), bool))[None], sc, -np.inf)
            pr = np.exp(sc - sc.max(-1, keepdims=True)); pr /= pr.sum(-1, keepdims=True)
            o = np.einsum("hts,shd->thd", pr, vv).reshape(T, Hm * dv)
            if p + "g_proj.weight" in W:
                o = o * _sig(x @ w(p + "g_proj.weight").T)
            return o @ w(p + "o_proj.weight").T
        def ffn(i, x):
            p = f"model.layers.{i}."
            if p + "mlp.gate_proj.weight" in W:
                return act(x @ w(p + "mlp.gate_proj.weight").T, x @ w(p + "mlp.up_proj.weight").T) @ w(p + "mlp.down_proj.weight").T
            m = p + "block_sparse_moe."
            s = _sig(x @ w(m + "gate.weight").T)
            sel = np.argsort(-(s + w(m + "gate.e_score_correction_bias")), -1, kind="stable")[:, :cfg["num_experts_per_token"]]
            latent = m + "routed_expert_down_proj.weight" in W
            zin = x @ w(m + "routed_expert_down_proj.weight").T if latent else x
            u = np.zeros((T, zin.shape[1]))
            for t in range(T):
                pw = s[t, sel[t]]
                if cfg.get("moe_renormalize", True): pw = pw / (pw.sum() + 1e-20)
                pw = pw * cfg.get("routed_scaling_factor", 1.0)
                for j, pj in zip(sel[t], pw):
                    e = m + f"experts.{j}."
                    u[t] += pj * (act(zin[t] @ w(e + "w1.weight").T, zin[t] @ w(e + "w3.weight").T) @ w(e + "w2.weight").T)
            y = u
            if latent:
                if m + "routed_expert_norm.weight" in W: y = _rms(y, w(m + "routed_expert_norm.weight"), eps)
                y = y @ w(m + "routed_expert_up_proj.weight").T
            if m + "shared_experts.gate_proj.weight" in W:
                y = y + act(x @ w(m + "shared_experts.gate_proj.weight").T, x @ w(m + "shared_experts.up_proj.weight").T) @ w(m + "shared_experts.down_proj.weight").T
            return y
        def attnres(srcs, pair):
            V = np.stack(srcs)                                        # [n, T, d]
            kk = V / np.sqrt((V * V).mean(-1, keepdims=True) + eps)
            a = (kk * w(pair + "norm.weight") * w(pair + "proj.weight").reshape(d)).sum(-1)
            a = np.exp(a - a.max(0)); a /= a.sum(0)
            return (a[..., None] * V).sum(0)
        def attend(i, x):
            xn = _rms(x, w(f"model.layers.{i}.input_layernorm.weight"), eps)
            return mla(i, xn) if i in mla_layers else kda(i, xn)
        def ffn_sub(i, x):
            return ffn(i, _rms(x, w(f"model.layers.{i}.post_attention_layernorm.weight"), eps))
        h = W["model.embed_tokens.weight"][row]
        if not S:
            for i in range(L):
                h = h + attend(i, h); h = h + ffn_sub(i, h)
        else:
            B, P = [], h
            for i in range(L):
                pre = f"model.layers.{i}."
                X = attnres(B + [P], pre + "self_attention_res_") if B else P
                fresh = i % S == 0
                if fresh: B.append(P)
                a = attend(i, X)
                P = a if fresh else P + a
                X = attnres(B + [P], pre + "mlp_res_")
                P = P + ffn_sub(i, X)
            h = attnres(B + [P], "model.output_attn_res_")
        out.append(_rms(h, W["model.norm.weight"], eps) @ W["lm_head.weight"].T)
    return np.stack(out)


class Peer:
    def __init__(self, args):
        self.llama_dir = pathlib.Path(args.llama_dir)
        self.logits_bin = pathlib.Path(args.llama_logits)
        self.python = args.python
        for p in (self.llama_dir / "convert_hf_to_gguf.py", self.logits_bin):
            if not p.exists():
                sys.exit(f"{p} missing: run scripts/peers/llama_cpp.sh first")

    def convert(self, src, gguf, logfile):
        # llama.cpp's converter with set_vocab replaced by its own "no vocabulary" writer.
        wrapper = ROOT / "tools" / "peers" / "convert_no_vocab.py"
        env = {"PYTHONPATH": str(self.llama_dir / "gguf-py")}
        return run([self.python, wrapper, self.llama_dir, src, gguf, "f32"], logfile, env)

    def logits(self, gguf, ids, out, step, logfile):
        tok = pathlib.Path(out).with_suffix(".tokens.txt")
        tok.write_text("\n".join(" ".join(str(int(x)) for x in row) for row in ids) + "\n")
        cmd = [self.logits_bin, gguf, tok, out, "--threads", "1"] + (["--step"] if step else [])
        run(cmd, logfile)
        return load_file(str(out))["logits"]


def myriad_logits(args, model_dir, ids, out, logfile):
    tok = pathlib.Path(out).with_suffix(".ids.safetensors")
    save_file({"input_ids": np.ascontiguousarray(ids.astype(np.int64))}, str(tok))
    run([args.myriad, "logits", model_dir, "--tokens", tok, "--out", out], logfile,
        {"OMP_NUM_THREADS": "1"})
    t = load_file(str(out))
    return t[sorted(t)[0]] if "logits" not in t else t["logits"]


def variants(config, tensors, seed):
    """trained: as written. experts0: routed experts zeroed (no routing flips possible).
    perturbed: experts0 with every norm weight scaled by U(0.5, 1.5) and the AttnRes pseudo-queries
    drawn N(0, 1). eps_neutral: perturbed with the KDA q/k projections and q/k conv weights,
    q_a_proj and the latent rows of kv_a_proj_with_mqa scaled by 8, so that the norms whose eps the engines choose differently
    (the KDA q/k L2 norm, the q_a / kv_a RMSNorms) see inputs far above either eps."""
    rng = np.random.default_rng(seed)
    zero = {k: (np.zeros_like(v) if ".block_sparse_moe.experts." in k else v)
            for k, v in tensors.items()}
    pert = {}
    for k, v in zero.items():
        if k.endswith("_res_proj.weight"):
            v = rng.standard_normal(v.shape).astype(v.dtype)
        elif v.ndim == 1 and (k.endswith("norm.weight") or k.endswith("layernorm.weight")):
            v = (v * rng.uniform(0.5, 1.5, v.shape)).astype(v.dtype)
        pert[k] = v
    r = config["kv_lora_rank"]
    mla = {i - 1 for i in config["linear_attn_config"]["full_attn_layers"]}
    big = {}
    for k, v in pert.items():
        parts = k.split(".")
        layer = int(parts[2]) if parts[1] == "layers" else -1
        if layer >= 0 and layer not in mla and k.endswith(
                (".q_proj.weight", ".k_proj.weight", ".q_conv1d.weight", ".k_conv1d.weight")):
            v = v * 8
        elif k.endswith(".q_a_proj.weight"):
            v = v * 8
        elif k.endswith(".kv_a_proj_with_mqa.weight"):
            v = v.copy()
            v[:r] *= 8
        big[k] = v
    return {"trained": tensors, "experts0": zero, "perturbed": pert, "eps_neutral": big}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", help="a Myriad K3 model directory (default: train a tiny one)")
    ap.add_argument("--work", default=str(PEERS / "k3check"))
    ap.add_argument("--myriad", default=str(ROOT / "build" / "cpu" / "myriad"))
    ap.add_argument("--llama-dir", default=os.environ.get("LLAMA_CPP_DIR", str(PEERS / "llama.cpp")))
    ap.add_argument("--llama-logits", default=os.environ.get(
        "LLAMA_LOGITS", str(PEERS / "bin" / "llama_logits")))
    ap.add_argument("--python", default=sys.executable, help="python that runs the converter")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=80, help="tokens per sequence (>64 crosses a chunk)")
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--tol", type=float, default=1e-3,
                    help="max|d|/max|ref| allowed for the variants without routed experts")
    ap.add_argument("--no-floor", action="store_true", help="skip the Kimi Linear floor")
    args = ap.parse_args()

    peer = Peer(args)
    work = pathlib.Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    report = {"k3": {}, "kimi_linear_floor": {}}

    # 1. the Myriad K3 model
    if args.model:
        model = pathlib.Path(args.model)
    else:
        model = work / "k3-model"
        if not (model / "model" / "config.json").exists():
            (work / "k3-tiny.toml").write_text(RECIPE)
            log(f"training a tiny K3 model with {args.myriad} (20 steps)")
            shutil.rmtree(model, ignore_errors=True)
            run([args.myriad, "train", work / "k3-tiny.toml", "--out", model],
                work / "train.log", {"OMP_NUM_THREADS": "1"})
        model = model / "model"
    raw_config, raw = read_model(model)
    layout = Layout(raw_config, raw)
    config, tensors = layout.text, layout.canonical(raw)
    report["myriad_layout"] = "release" if layout.release else "flat"
    report["k3_model"] = str(model)
    rng = np.random.default_rng(args.seed)
    ids = rng.integers(0, config["vocab_size"], size=(args.batch, args.seq))
    report["tokens"] = [args.batch, args.seq]
    log(f"model {model} ({report['myriad_layout']} layout): {config['num_hidden_layers']} layers, d={config['hidden_size']}, "
        f"{config['num_experts']} experts top-{config['num_experts_per_token']}, tokens {ids.shape}")

    failed = []
    for name, ts in variants(config, tensors, args.seed).items():
        vdir = work / name
        mdir = write_model(vdir / "myriad", *layout.myriad(ts), extra_from=model)
        my = myriad_logits(args, mdir, ids, vdir / "myriad_logits.safetensors", vdir / "myriad.log")
        rcfg, rts = layout.release_layout(ts)
        hdir = write_model(vdir / "release", rcfg, rts)
        gguf = vdir / "model-f32.gguf"
        peer.convert(hdir, gguf, vdir / "convert.log")
        f64_my = k3_forward_f64(config, ts, ids)                    # Myriad's eps conventions
        eps = config["rms_norm_eps"]
        f64_ll = k3_forward_f64(config, ts, ids, eps_lora=eps, l2_eps=eps)  # llama.cpp's
        res = {"myriad_vs_f64": compare(my, f64_my), "eps_effect_f64": compare(f64_ll, f64_my)}
        log(f"K3 {name:11s} f64 eps {eps:g}      vs f64 (eps 1e-6): {fmt(res['eps_effect_f64'])}")
        log(f"K3 {name:11s} Myriad            vs f64 (eps 1e-6): {fmt(res['myriad_vs_f64'])}")
        for mode, step in (("prefill", False), ("decode", True)):
            lg = peer.logits(gguf, ids, vdir / f"llama_{mode}.safetensors", step,
                             vdir / f"llama_{mode}.log")
            res[f"llama_{mode}_vs_f64"] = compare(lg, f64_ll)
            res[f"llama_{mode}_vs_myriad"] = compare(lg, my)
            log(f"K3 {name:11s} llama.cpp {mode:7s} vs f64 (eps {eps:g}): "
                f"{fmt(res[f'llama_{mode}_vs_f64'])}")
            log(f"K3 {name:11s} llama.cpp {mode:7s} vs Myriad         : "
                f"{fmt(res[f'llama_{mode}_vs_myriad'])}")
        # Pass/fail: each engine against the f64 forward with its own eps conventions (all
        # variants but the routed one), and engine against engine where the eps cannot matter.
        checks = [] if name == "trained" else ["myriad_vs_f64", "llama_prefill_vs_f64",
                                               "llama_decode_vs_f64"]
        if name == "eps_neutral":
            checks += ["llama_prefill_vs_myriad", "llama_decode_vs_myriad"]
        failed += [f"{name}/{c}" for c in checks if res[c]["max_rel"] > args.tol]
        report["k3"][name] = res

    # 4. the Kimi Linear floor: llama.cpp (and Myriad) against transformers' fixture logits
    if not args.no_floor:
        for fx in ("kimi_linear_tiny", "kimi_linear_tiny_rope0"):
            fdir = ROOT / "tests" / "fixtures" / "models" / fx
            if not (fdir / "model.safetensors").exists():
                continue
            fcfg, fts = read_model(fdir)
            fids = load_file(str(fdir / "inputs.safetensors"))["input_ids"]
            fref = load_file(str(fdir / "outputs.safetensors"))["logits"]
            vdir = work / fx
            hdir = write_model(vdir / "hf", fcfg, transformers_kimi_linear_layout(fts))
            gguf = vdir / "model-f32.gguf"
            peer.convert(hdir, gguf, vdir / "convert.log")
            res = {}
            for mode, step in (("prefill", False), ("decode", True)):
                lg = peer.logits(gguf, fids, vdir / f"llama_{mode}.safetensors", step,
                                 vdir / f"llama_{mode}.log")
                res["llama_" + mode] = compare(lg, fref)
                log(f"{fx:22s} llama.cpp {mode:7s} vs transformers: {fmt(res['llama_' + mode])}")
            my = myriad_logits(args, fdir, fids, vdir / "myriad_logits.safetensors",
                               vdir / "myriad.log")
            res["myriad"] = compare(my, fref)
            log(f"{fx:22s} Myriad            vs transformers: {fmt(res['myriad'])}")
            res["f64"] = compare(k3_forward_f64(fcfg, transformers_kimi_linear_layout(fts), fids), fref)
            log(f"{fx:22s} f64 forward       vs transformers: {fmt(res['f64'])}")
            report["kimi_linear_floor"][fx] = res

    (work / "report.json").write_text(json.dumps(report, indent=2))
    log(f"report: {work / 'report.json'}")
    if failed:
        log(f"FAIL (max|d|/max|ref| > {args.tol:g}): {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
