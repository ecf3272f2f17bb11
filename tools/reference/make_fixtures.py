#!/usr/bin/env python3
"""Golden whole-model fixtures from Hugging Face transformers (MODEL.md §11, docs/REFERENCE_NOTES.md).

  make_fixtures.py [--out DIR] [--only NAME ...]      (default DIR: tests/fixtures/models)

For each tiny float32 model (MODELS below) it writes DIR/<name>/:
  config.json, model.safetensors   exactly as save_pretrained writes them (checkpoint names)
  inputs.safetensors               input_ids int64 [B, T]
  outputs.safetensors              logits f32 [B, T, V]; hidden.<i> / attn_out.<i> / ffn_out.<i>
                                   f32 [B, T, d] for decoder layer i; loss f32 [] (mean next-token
                                   cross-entropy over B*(T-1) positions, labels = input_ids);
                                   grad.<checkpoint name> (d loss / d that tensor);
                                   greedy_ids int64 [8] (generate(do_sample=False) on row 0, new
                                   tokens only) and greedy_logits f32 [8, V] (the logits each step
                                   picked from). Metadata key "fixture" records seed and versions.

Every parameter (A_log, dt_bias, norm weights, e_score_correction_bias included) is drawn from a
fixed-seed generator with O(1) activations in mind. A seed is kept only when every top-k routing
choice, grouped-routing choice and greedy token wins by a clear margin, so that float32 rounding in
another implementation cannot flip a discrete choice. Before writing, the script checks its own
fixtures: the saved files reload into identical logits, the cached greedy decode agrees with
uncached forwards, and an independent float64 forward written from docs/REFERENCE_NOTES.md (plain
torch ops on the saved checkpoint tensors, recurrent KDA) matches the transformers logits, hidden
states, loss and gradients.

Dependencies: runs as is when transformers matches requirements.txt; otherwise it creates the
virtualenv $MYRIAD_REF_VENV (default tools/reference/.venv), pip-installs requirements.txt there
and re-runs itself with it. fla and causal_conv1d are hidden from transformers so that its
torch-only KDA and conv paths run (the ones REFERENCE_NOTES.md describes).
"""
import argparse
import math
import pathlib
import shutil
import sys

import refenv  # tools/reference/refenv.py: the venv these scripts run in

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
MARGIN = 2e-3  # minimum lead of every discrete choice (routing scores, greedy logits)


# ----------------------------------------------------------------------------------------------
# Model definitions

KIMI = dict(
    vocab_size=256, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
    num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=2, rms_norm_eps=1e-5,
    q_lora_rank=None, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
    num_experts=8, num_experts_per_token=2, num_shared_experts=1, routed_scaling_factor=2.446,
    moe_renormalize=True, moe_router_activation_func="sigmoid", use_grouped_topk=False,
    num_expert_group=1, topk_group=1, first_k_dense_replace=1, moe_layer_freq=1,
    num_nextn_predict_layers=0, tie_word_embeddings=False,
    bos_token_id=1, eos_token_id=2, pad_token_id=None,  # pad None: no nn.Embedding padding_idx
    linear_attn_config=dict(num_heads=2, head_dim=16, short_conv_kernel_size=4,
                            kda_layers=[1, 2, 3], full_attn_layers=[4]),
)

DEEPSEEK = dict(
    vocab_size=256, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
    num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=2, rms_norm_eps=1e-6,
    q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
    n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, routed_scaling_factor=2.5,
    n_group=2, topk_group=1, norm_topk_prob=True, first_k_dense_replace=1, num_mtp_layers=0,
    tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=None,
    max_position_embeddings=64, rope_interleave=True,
    # rope_theta 10 puts the YaRN ramp bounds at low = 0, high = 2 for d_pe = 8 and L0 = 16, so the
    # four frequency pairs get ramp 0, 0.5, 1, 1: kept, blended and divided by the factor.
    rope_parameters=dict(rope_type="yarn", rope_theta=10.0, factor=4.0,
                         original_max_position_embeddings=16, beta_fast=32.0, beta_slow=1.0,
                         mscale=1.0, mscale_all_dim=1.0),
)

MODELS = {
    # name: (arch, config kwargs, T, first seed, gradient tensors (checkpoint names))
    "kimi_linear_tiny": ("kimi", KIMI, 16, 1000, [
        "model.embed_tokens.weight",
        "model.layers.1.self_attn.A_log",
        "model.layers.1.self_attn.dt_bias",
        "model.layers.1.self_attn.q_conv1d.weight",
        "model.layers.3.self_attn.kv_b_proj.weight",
        "model.layers.2.block_sparse_moe.gate.weight",
        "model.layers.2.block_sparse_moe.experts.{e}.w1.weight",
    ]),
    "kimi_linear_tiny_rope0": ("kimi", {**KIMI, "qk_rope_head_dim": 0}, 16, 2000, [
        "model.layers.0.self_attn.A_log",
        "model.layers.3.self_attn.kv_a_proj_with_mqa.weight",
        "model.layers.3.self_attn.kv_b_proj.weight",
        "model.layers.1.block_sparse_moe.experts.{e}.w1.weight",
    ]),
    "deepseek_v3_tiny": ("deepseek", DEEPSEEK, 20, 3000, [
        "model.embed_tokens.weight",
        "model.layers.0.self_attn.q_b_proj.weight",
        "model.layers.2.self_attn.kv_a_proj_with_mqa.weight",
        "model.layers.2.self_attn.kv_b_proj.weight",
        "model.layers.1.mlp.gate.weight",
        "model.layers.1.mlp.experts.{e}.gate_proj.weight",
    ]),
}
B, NEW_TOKENS = 2, 8


def main():
    refenv.ensure_pinned(__file__)
    # Hide the optional kernel packages: transformers would otherwise call fla's Triton chunk_kda
    # and fused_recurrent_kda (and causal_conv1d) instead of its own torch implementations.
    for mod in ("fla", "causal_conv1d"):
        sys.modules[mod] = None
    import warnings

    warnings.filterwarnings("ignore")
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    torch.set_num_threads(1)

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=pathlib.Path, default=ROOT / "tests/fixtures/models")
    ap.add_argument("--only", nargs="*", choices=sorted(MODELS))
    args = ap.parse_args()
    for name in args.only or MODELS:
        make_model_fixture(name, args.out / name)


# ----------------------------------------------------------------------------------------------
# Building and randomising


def build(arch, cfg_kwargs, seed):
    import torch
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM, KimiLinearConfig, KimiLinearForCausalLM

    torch.manual_seed(seed)
    if arch == "kimi":
        cfg = KimiLinearConfig(**cfg_kwargs)
        cls = KimiLinearForCausalLM
    else:
        cfg = DeepseekV3Config(**{k: (dict(v) if isinstance(v, dict) else v) for k, v in cfg_kwargs.items()})
        cls = DeepseekV3ForCausalLM
    cfg._attn_implementation = "eager"
    model = cls(cfg).float().eval()
    randomise(model, seed)
    return model


def randomise(model, seed):
    """Redraw every tensor so that each one visibly changes the output (default init is too tame)."""
    import torch

    gen = torch.Generator().manual_seed(seed)

    def normal(shape, std):
        return torch.randn(*shape, generator=gen) * std

    def uniform(shape, lo, hi):
        return torch.rand(*shape, generator=gen) * (hi - lo) + lo

    with torch.no_grad():
        for name, p in list(model.named_parameters()) + list(model.named_buffers()):
            if name.endswith("A_log"):
                new = uniform(p.shape, 1.0, 16.0).log()  # fla / Kimi Linear init: A in U(1, 16)
            elif name.endswith("dt_bias"):
                new = uniform(p.shape, -3.0, 0.5)  # softplus(z) spread over ~0.05 .. 1
            elif name.endswith("e_score_correction_bias"):
                new = normal(p.shape, 0.1)
            elif "inv_freq" in name:
                continue  # RoPE tables, not parameters
            elif p.dim() == 1:
                new = uniform(p.shape, 0.5, 1.5)  # RMSNorm weights
            elif name.endswith("embed_tokens.weight"):
                new = normal(p.shape, 1.0)
            else:  # [out, in], fused experts [n, out, in], conv [C, 1, K]: unit-variance outputs
                new = normal(p.shape, p.shape[-1] ** -0.5)
            p.copy_(new)


# ----------------------------------------------------------------------------------------------
# Discrete-choice margins


class RouterProbe:
    """Forward pre-hooks on every router: records the smallest lead of a routing decision."""

    def __init__(self, model):
        self.min_margin = math.inf
        self.bias_changes = 0  # tokens whose top-k set differs without the selection bias
        self.handles = []
        for mod in model.modules():
            if type(mod).__name__.endswith("TopkRouter"):
                self.handles.append(mod.register_forward_pre_hook(self.hook))

    def hook(self, mod, inputs):
        import torch

        with torch.no_grad():
            x = inputs[0].reshape(-1, mod.hidden_dim).float()
            s = torch.sigmoid(x @ mod.weight.float().t())
            biased = s + mod.e_score_correction_bias
            n, g, k = mod.num_experts, mod.num_group, mod.top_k
            if g > 1:
                group_score = biased.view(-1, g, n // g).topk(2, dim=-1)[0].sum(-1)
                gs = group_score.sort(-1, descending=True)[0]
                self.min_margin = min(self.min_margin, (gs[:, mod.topk_group - 1] - gs[:, mod.topk_group]).min().item())
                keep = group_score.topk(mod.topk_group, dim=-1)[1]
                mask = torch.zeros(biased.shape[0], g, dtype=torch.bool).scatter_(1, keep, True)
                mask = mask.repeat_interleave(n // g, dim=1)
                biased = biased.masked_fill(~mask, -math.inf)
            srt = biased.sort(-1, descending=True)[0]
            self.min_margin = min(self.min_margin, (srt[:, k - 1] - srt[:, k]).min().item())
            with_bias = biased.topk(k, dim=-1)[1].sort(-1)[0]
            without = s.masked_fill(biased == -math.inf, -math.inf).topk(k, dim=-1)[1].sort(-1)[0]
            self.bias_changes += (with_bias != without).any(-1).sum().item()

    def remove(self):
        for h in self.handles:
            h.remove()


# ----------------------------------------------------------------------------------------------
# Fixture generation


def checkpoint_grad(model, arch, name):
    """Gradient of a checkpoint tensor, undoing transformers' in-memory renames and fusions."""
    import re

    cfg = model.config
    params = dict(model.named_parameters())
    m = re.match(r"model\.layers\.(\d+)\.(block_sparse_moe|mlp)\.experts\.(\d+)\.(\w+)\.weight", name)
    if m:
        layer, _, e, w = m.groups()
        inter = cfg.moe_intermediate_size
        gu = params[f"model.layers.{layer}.mlp.experts.gate_up_proj"].grad[int(e)]
        down = params[f"model.layers.{layer}.mlp.experts.down_proj"].grad[int(e)]
        return {"w1": gu[:inter], "gate_proj": gu[:inter], "w3": gu[inter:], "up_proj": gu[inter:],
                "w2": down, "down_proj": down}[w]
    m = re.match(r"(model\.layers\.\d+\.self_attn\.)([qkv])_conv1d\.weight", name)
    if m:
        p = cfg.linear_num_heads * cfg.linear_head_dim
        i = "qkv".index(m.group(2))
        return params[m.group(1) + "conv1d.weight"].grad[i * p:(i + 1) * p]
    name = name.replace(".block_sparse_moe.", ".mlp.")
    for leaf in ("A_log", "dt_bias", "f_a_proj.weight", "f_b_proj.weight"):
        if arch == "kimi" and name.endswith("self_attn." + leaf):
            name = name.replace("self_attn.", "self_attn.forget_gate.")
    return params[name].grad


def make_model_fixture(name, out):
    import torch
    import transformers
    from safetensors.torch import load_file, save_file

    arch, cfg_kwargs, T, seed0, grad_names = MODELS[name]
    for seed in range(seed0, seed0 + 200):
        model = build(arch, cfg_kwargs, seed)
        V = model.config.vocab_size
        ids = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(seed))
        probe = RouterProbe(model)
        acts = {}
        hooks = []

        def keep(key):
            def hook(mod, inp, out):
                acts[key] = (out[0] if isinstance(out, tuple) else out).detach().clone()
            return hook

        for i, layer in enumerate(model.model.layers):
            hooks += [layer.register_forward_hook(keep(f"hidden.{i}")),
                      layer.self_attn.register_forward_hook(keep(f"attn_out.{i}")),
                      layer.mlp.register_forward_hook(keep(f"ffn_out.{i}"))]
        model.zero_grad()
        res = model(input_ids=ids, labels=ids, use_cache=False)
        res.loss.backward()
        for h in hooks:
            h.remove()
        logits = res.logits.detach().clone()

        model.generation_config.eos_token_id = None  # always exactly NEW_TOKENS new tokens
        model.generation_config.pad_token_id = 0
        with torch.no_grad():
            gen = model.generate(ids[:1], max_new_tokens=NEW_TOKENS, do_sample=False, return_dict_in_generate=True,
                                 output_logits=True)
        probe.remove()
        greedy = gen.sequences[0, T:].clone()
        greedy_logits = torch.cat(gen.logits, dim=0).float()
        top2 = greedy_logits.topk(2, dim=-1)[0]
        greedy_margin = (top2[:, 0] - top2[:, 1]).min().item()
        ok = (probe.min_margin >= MARGIN and greedy_margin >= MARGIN and len(greedy) == NEW_TOKENS
              and (arch != "kimi" or probe.bias_changes > 0))
        print(f"{name}: seed {seed}: routing margin {probe.min_margin:.2e}, greedy margin {greedy_margin:.2e}, "
              f"bias changes {probe.bias_changes} -> {'ok' if ok else 'retry'}")
        if ok:
            break
    else:
        sys.exit(f"{name}: no seed with clear margins")

    grads = {}
    for g in grad_names:
        for e in range(model.config.num_local_experts):  # {e}: the first expert that got tokens
            t = checkpoint_grad(model, arch, g.format(e=e))
            if t is not None and t.abs().sum() > 0:
                break
        assert t is not None and t.abs().sum() > 0, f"{name}: zero gradient for {g}"
        grads["grad." + g.format(e=e)] = t.detach().clone().contiguous()

    # Cached decode must equal uncached forwards over the growing prefix.
    with torch.no_grad():
        seq = torch.cat([ids[:1], greedy[None]], dim=1)
        full = model(input_ids=seq[:, :-1], use_cache=False).logits[0, T - 1:]
        assert torch.equal(full.argmax(-1), greedy), f"{name}: cached greedy differs from uncached argmax"
        step_err = (full - greedy_logits).abs().max().item()
        assert step_err < 1e-4, f"{name}: cached step logits differ by {step_err}"
        cached = model(input_ids=ids, use_cache=True).logits
        assert (cached - logits).abs().max().item() < 1e-5, f"{name}: prefill with cache differs"

    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    (out / "generation_config.json").unlink(missing_ok=True)

    # The saved checkpoint reloads into bit-identical logits.
    cls = type(model)
    again = cls.from_pretrained(out, attn_implementation="eager").float().eval()
    with torch.no_grad():
        assert torch.equal(again(input_ids=ids, use_cache=False).logits, logits), f"{name}: reload differs"

    # An independent float64 forward from the saved tensors (docs/REFERENCE_NOTES.md).
    ckpt = load_file(out / "model.safetensors")
    import json

    cfg = json.loads((out / "config.json").read_text())
    leaves = {k[len("grad."):]: v for k, v in grads.items()}
    ref, ref_hidden, ref_loss, ref_grads = independent_forward(arch, cfg, ckpt, ids, leaves)
    err = (ref - logits.double()).abs().max().item()
    herr = max((ref_hidden[i] - acts[f"hidden.{i}"].double()).abs().max().item() for i in range(len(ref_hidden)))
    lerr = abs(ref_loss.item() - res.loss.item())
    gerr = max((ref_grads[k] - grads["grad." + k].double()).abs().max().item() for k in leaves)
    print(f"{name}: independent float64 forward vs transformers: logits {err:.2e}, hidden {herr:.2e}, "
          f"loss {lerr:.2e}, gradients {gerr:.2e}")
    assert max(err, herr, lerr, gerr) < 1e-4, f"{name}: independent forward differs"

    # One metadata key: safetensors writes a multi-key map in no fixed order.
    meta = {"fixture": f"tools/reference/make_fixtures.py seed={seed} transformers={transformers.__version__} "
                       f"torch={torch.__version__}"}
    save_file({"input_ids": ids.contiguous()}, out / "inputs.safetensors", metadata=meta)
    outputs = {"logits": logits.contiguous(), "loss": res.loss.detach().reshape(()).clone(),
               "greedy_ids": greedy.contiguous(), "greedy_logits": greedy_logits.contiguous()}
    outputs.update({k: v.contiguous() for k, v in acts.items()})
    outputs.update(grads)
    save_file(outputs, out / "outputs.safetensors", metadata=meta)
    sizes = {p.name: p.stat().st_size for p in sorted(out.iterdir())}
    print(f"{name}: wrote {out} ({sum(sizes.values())} bytes: {sizes})")


# ----------------------------------------------------------------------------------------------
# Independent float64 forward (what a re-implementation computes, from checkpoint tensors only)


def independent_forward(arch, cfg, w, ids, grad_names):
    """Logits, per-layer hidden states, loss and d loss / d (tensors named in grad_names)."""
    import torch

    W = {k: v.double().requires_grad_(k in grad_names) for k, v in w.items()}
    f = torch.nn.functional

    def rms(x, weight, eps):
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * weight

    def lin(x, name):
        return x @ W[name].t()

    def glu(x, gate, up, down):
        return lin(f.silu(lin(x, gate)) * lin(x, up), down)

    n_layers, d = cfg["num_hidden_layers"], cfg["hidden_size"]
    eps = cfg["rms_norm_eps"]
    Bn, T = ids.shape
    h = W["model.embed_tokens.weight"][ids]
    hidden = []
    if arch == "kimi":
        la = cfg["linear_attn_config"]
        mla_layers = {i - 1 for i in la["full_attn_layers"]}
        moe_prefix, expert_names = "block_sparse_moe", ("w1", "w3", "w2")
        n_exp, top_k, n_group, topk_group = (cfg["num_experts"], cfg["num_experts_per_token"],
                                             cfg["num_expert_group"], cfg["topk_group"])
        norm_topk = cfg["moe_renormalize"]
    else:
        mla_layers = set(range(n_layers))
        moe_prefix, expert_names = "mlp", ("gate_proj", "up_proj", "down_proj")
        n_exp, top_k, n_group, topk_group = (cfg["n_routed_experts"], cfg["num_experts_per_tok"],
                                             cfg["n_group"], cfg["topk_group"])
        norm_topk = cfg["norm_topk_prob"]

    def kda(x, p):
        H, dk, K = la["num_heads"], la["head_dim"], la["short_conv_kernel_size"]

        def conv_silu(u, wc):  # u [B,T,P], wc [P,1,K]; tap K-1 multiplies the current token
            out = torch.zeros_like(u)
            for j in range(K):
                out[:, j:] += u[:, : T - j] * wc[:, 0, K - 1 - j]
            return f.silu(out)

        def l2(u):
            return u / torch.sqrt((u * u).sum(-1, keepdim=True) + 1e-6)

        q = l2(conv_silu(lin(x, p + "q_proj.weight"), W[p + "q_conv1d.weight"]).view(Bn, T, H, dk)) * dk**-0.5
        k = l2(conv_silu(lin(x, p + "k_proj.weight"), W[p + "k_conv1d.weight"]).view(Bn, T, H, dk))
        v = conv_silu(lin(x, p + "v_proj.weight"), W[p + "v_conv1d.weight"]).view(Bn, T, H, dk)
        z = lin(lin(x, p + "f_a_proj.weight"), p + "f_b_proj.weight") + W[p + "dt_bias"]
        g = -W[p + "A_log"].reshape(H, 1).exp() * f.softplus(z.view(Bn, T, H, dk), threshold=20.0)
        beta = torch.sigmoid(lin(x, p + "b_proj.weight"))  # [B,T,H]
        S = torch.zeros(Bn, H, dk, dk, dtype=torch.float64)
        o = torch.zeros(Bn, T, H, dk, dtype=torch.float64)
        for t in range(T):
            S = S * g[:, t].exp()[..., None]
            e = v[:, t] - torch.einsum("bhkv,bhk->bhv", S, k[:, t])
            S = S + torch.einsum("bhk,bhv->bhkv", k[:, t], beta[:, t, :, None] * e)
            o[:, t] = torch.einsum("bhkv,bhk->bhv", S, q[:, t])
        gate = lin(lin(x, p + "g_a_proj.weight"), p + "g_b_proj.weight").view(Bn, T, H, dk)
        o = rms(o, W[p + "o_norm.weight"], eps) * torch.sigmoid(gate)
        return lin(o.reshape(Bn, T, H * dk), p + "o_proj.weight")

    def rope_tables():
        rp = cfg.get("rope_parameters") or dict(cfg.get("rope_scaling") or {}, rope_theta=cfg.get("rope_theta"))
        dr = cfg["qk_rope_head_dim"]
        base, s, L0 = rp["rope_theta"], rp["factor"], rp["original_max_position_embeddings"]
        theta = base ** (-torch.arange(0, dr, 2, dtype=torch.float64) / dr)

        def corr_dim(r):
            return dr * math.log(L0 / (2 * math.pi * r)) / (2 * math.log(base))

        low = max(math.floor(corr_dim(rp["beta_fast"])), 0)
        high = min(math.ceil(corr_dim(rp["beta_slow"])), dr - 1)
        ramp = ((torch.arange(dr // 2, dtype=torch.float64) - low) / max(high - low, 1e-3)).clamp(0, 1)
        inv = theta * (1 - ramp) + theta / s * ramp
        ang = torch.arange(T, dtype=torch.float64)[:, None] * inv  # [T, dr/2]
        msc = 0.1 * rp["mscale_all_dim"] * math.log(s) + 1.0
        return ang.cos(), ang.sin(), msc * msc

    def rotate_pairs(x, cos, sin):  # pairs (2i, 2i+1), DeepSeek layout, kept in place
        a, b = x[..., 0::2], x[..., 1::2]
        return torch.stack([a * cos - b * sin, b * cos + a * sin], dim=-1).flatten(-2)

    def mla(x, p):
        H, dn, dr, dv, r = (cfg["num_attention_heads"], cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"],
                            cfg["v_head_dim"], cfg["kv_lora_rank"])
        if cfg["q_lora_rank"] is None:
            q = lin(x, p + "q_proj.weight")
        else:
            q = lin(rms(lin(x, p + "q_a_proj.weight"), W[p + "q_a_layernorm.weight"], 1e-6), p + "q_b_proj.weight")
        q = q.view(Bn, T, H, dn + dr)
        ckv = lin(x, p + "kv_a_proj_with_mqa.weight")
        c, kpe = rms(ckv[..., :r], W[p + "kv_a_layernorm.weight"], 1e-6), ckv[..., r:]
        kv = lin(c, p + "kv_b_proj.weight").view(Bn, T, H, dn + dv)
        qn, qpe, kn, v = q[..., :dn], q[..., dn:], kv[..., :dn], kv[..., dn:]
        tau = (dn + dr) ** -0.5
        if arch == "deepseek":
            cos, sin, m2 = rope_tables()
            qpe = rotate_pairs(qpe, cos[:, None], sin[:, None])
            kpe = rotate_pairs(kpe, cos, sin)
            tau *= m2
        score = (torch.einsum("bthd,bshd->bhts", qn, kn) + torch.einsum("bthd,bsd->bhts", qpe, kpe)) * tau
        score = score.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), -math.inf)
        o = torch.einsum("bhts,bshd->bthd", score.softmax(-1), v)
        return lin(o.reshape(Bn, T, H * dv), p + "o_proj.weight")

    def moe(x, p):
        flat = x.reshape(-1, d)
        s = torch.sigmoid(flat @ W[p + "gate.weight"].t())
        biased = s + W[p + "gate.e_score_correction_bias"]
        gsz = n_exp // n_group
        gscore = biased.view(-1, n_group, gsz).topk(2, dim=-1)[0].sum(-1)
        keep = torch.zeros_like(gscore, dtype=torch.bool).scatter_(1, gscore.topk(topk_group, -1)[1], True)
        biased = biased.masked_fill(~keep.repeat_interleave(gsz, 1), -math.inf)
        idx = biased.topk(top_k, dim=-1)[1]
        wts = s.gather(1, idx)
        if norm_topk:
            wts = wts / (wts.sum(-1, keepdim=True) + 1e-20)
        wts = wts * cfg["routed_scaling_factor"]
        y = torch.zeros_like(flat)
        for tok in range(flat.shape[0]):
            for j in range(top_k):
                e = f"{p}experts.{idx[tok, j].item()}."
                a, u, dn_ = (e + n + ".weight" for n in expert_names)
                y[tok] += wts[tok, j] * glu(flat[tok], a, u, dn_)
        y = y + glu(flat, p + "shared_experts.gate_proj.weight", p + "shared_experts.up_proj.weight",
                    p + "shared_experts.down_proj.weight")
        return y.view_as(x)

    for i in range(n_layers):
        p = f"model.layers.{i}."
        x = rms(h, W[p + "input_layernorm.weight"], eps)
        h = h + (mla(x, p + "self_attn.") if i in mla_layers else kda(x, p + "self_attn."))
        x = rms(h, W[p + "post_attention_layernorm.weight"], eps)
        if p + moe_prefix + ".gate.weight" in W:
            h = h + moe(x, p + moe_prefix + ".")
        else:  # dense FFN: transformers 5.24 saves kimi_linear's as block_sparse_moe.*_proj (see notes)
            dp = p + ("mlp." if p + "mlp.gate_proj.weight" in W else "block_sparse_moe.")
            h = h + glu(x, dp + "gate_proj.weight", dp + "up_proj.weight", dp + "down_proj.weight")
        hidden.append(h)
    logits = rms(h, W["model.norm.weight"], eps) @ W["lm_head.weight"].t()
    loss = f.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
    loss.backward()
    return logits.detach(), [x.detach() for x in hidden], loss.detach(), {k: W[k].grad for k in grad_names}


if __name__ == "__main__":
    main()
