#!/usr/bin/env python3
"""Quantized checkpoint fixtures (tests/model/test_quant.cpp, src/model/quant.h).

  quant_fixtures.py [--out DIR]        (default DIR: tests/fixtures/quant)

Writes, from the tiny float32 models of make_fixtures.py (tests/fixtures/models/*), three
quantized copies as published checkpoints store them, each DIR/<name>/ with config.json (the base
config plus its quantization_config), model.safetensors, inputs.safetensors (input_ids [2, T]: the
base fixture's, or the first seeded ones on which every routing and greedy choice of the quantized
model wins by 2e-3) and outputs.safetensors:
  deepseek_v3_fp8_tiny    DeepSeek-V3 / Kimi K2 fine-grained FP8: every Linear but lm_head and the
                          router, F8_E4M3 `X.weight` + F32 `X.weight_scale_inv` per [16, 32]
                          block (weight_block_size [16, 32]: the tiny widths are below 128); the
                          40-row kv_a_proj_with_mqa gets a ceil-sized grid [3, 2] as DeepSeek-V3's
                          576-row one does with 128-blocks.
  deepseek_v3_int4_tiny   Kimi K2 Thinking: compressed-tensors pack-quantized INT4, symmetric,
                          group 32, bf16 scales, routed experts only (K2 Thinking's ignore list):
                          `X.weight_packed` I32, `X.weight_scale` BF16, `X.weight_shape` I64.
  kimi_linear_mxfp4_tiny  Kimi K3-style routed experts in compressed-tensors mxfp4-pack-quantized
                          (MXFP4A16): `X.weight_packed` U8 (two e2m1 per byte), `X.weight_scale`
                          U8 (e8m0), group 32.
outputs.safetensors holds `logits` f32 [B, T, V] of the model with the DEQUANTIZED weights (what a
dequantize-at-load engine must reproduce), `greedy_ids` int64 [8] and `greedy_logits` f32 [8, V]
(row 0, as make_fixtures.py); its metadata records the quantization's own error, max and median
|logit(dequantized weights) - logit(original weights)| on the same inputs.

The quantized tensors are made by the packages' own code: transformers' Fp8Quantize (the op its
FP8 save path runs; transformers refuses FP8 quantization without a GPU, so the op is called
directly) and compressed-tensors' PackedQuantizationCompressor / MXFP4PackedCompressor.compress
with scales from compressed_tensors.quantization.utils.calculate_qparams. The dequantized weights
come from the packages' own inverse: transformers' _dequantize_fp8_weight (ceil grids) and
Fp8Dequantize, compressed-tensors' decompress, each cross-checked against the formula (the
references keep the exact products in float32; compressed-tensors rounds them to the scale dtype,
bf16). For the INT4 model, transformers' own loader (CompressedTensorsConfig(dequantize=True))
must reproduce the logits of the package-rounded weights from the quantized directory
(transformers 5.24 cannot load a quantized kimi_linear directory at all; see make_compressed).

Also writes DIR/tensors.safetensors: single tensors with the packages' dequantized results, for
bit-level unit tests (every fp8 e4m3 / e5m2, fp4 and e8m0 code; an fp8 ceil grid; int4 group
sym/asym, int4 channel with a partial word, int8 channel, mxfp4).
"""
import argparse
import json
import pathlib
import shutil
import sys

import refenv  # tools/reference/refenv.py: the venv these scripts run in

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
BASE = ROOT / "tests/fixtures/models"
NEW_TOKENS = 8
FP8_BLOCK = [16, 32]
MARGIN = 2e-3  # routing and greedy choices of the quantized models must win by this much

# Kimi K2 Thinking's quantization_config (config.json on the hub), scheme and ignore list as is.
K2_THINKING_IGNORE = ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*",
                      "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"]


def main():
    refenv.ensure_pinned(__file__)
    import warnings

    warnings.filterwarnings("ignore")
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    torch.set_num_threads(1)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=pathlib.Path, default=ROOT / "tests/fixtures/quant")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    write_tensor_cases(args.out / "tensors.safetensors")
    make_fp8(args.out / "deepseek_v3_fp8_tiny")
    make_compressed(args.out / "deepseek_v3_int4_tiny", "deepseek_v3_tiny", "int4")
    make_compressed(args.out / "kimi_linear_mxfp4_tiny", "kimi_linear_tiny", "mxfp4")
    total = sum(p.stat().st_size for p in args.out.rglob("*") if p.is_file())
    print(f"{args.out}: {total} bytes in all")


# ----------------------------------------------------------------------------------------------
# Package entry points


class _Stub:
    """What transformers' Fp8Quantize / Fp8Dequantize read of their hf_quantizer."""

    def __init__(self, block):
        from transformers.utils.quantization_config import FineGrainedFP8Config

        self.quantization_config = FineGrainedFP8Config(weight_block_size=tuple(block))


def fp8_quantize(w, block):
    """transformers' Fp8Quantize on a [out, in] weight; ceil grids (a dimension not a multiple of
    the block, which Fp8Quantize passes through unquantized) quantize the zero-padded weight, as
    DeepSeek-V3's checkpoints were made (the padding does not change a block's max |w|)."""
    import torch
    from transformers.integrations.finegrained_fp8 import Fp8Quantize

    op = Fp8Quantize(_Stub(block))
    rows, cols = w.shape
    pr, pc = -rows % block[0], -cols % block[1]
    padded = torch.nn.functional.pad(w, (0, pc, 0, pr))
    out = op._quantize_one("x.weight", padded)
    q, s = out["x.weight"], out["x.weight_scale_inv"]
    assert q.dtype == torch.float8_e4m3fn and s.dtype == torch.float32, (q.dtype, s.dtype)
    return q[:rows, :cols].contiguous(), s.contiguous()


def fp8_dequantize(q, s, block):
    """transformers' own dequantization of an FP8 weight (ceil grids included)."""
    import torch
    from transformers.integrations.finegrained_fp8 import Fp8Dequantize, _dequantize_fp8_weight

    w = _dequantize_fp8_weight(q, s, list(block), torch.float32)
    # The formula, independently: w[i, j] = q[i, j] * s[i // b0, j // b1] in float32.
    i = torch.arange(q.shape[0])[:, None] // block[0]
    j = torch.arange(q.shape[1])[None, :] // block[1]
    assert torch.equal(w, q.float() * s[i, j]), "fp8 dequantization differs from the formula"
    if q.shape[0] % block[0] == 0 and q.shape[1] % block[1] == 0:  # the load-time op agrees
        assert torch.equal(Fp8Dequantize(_Stub(block))._dequantize_one(q, s, torch.float32), w)
    return w


def ct_args(kind, **kw):
    import torch
    from compressed_tensors.quantization import QuantizationArgs

    if kind == "mxfp4":  # compressed-tensors' MXFP4A16 preset
        return QuantizationArgs(num_bits=4, type="float", strategy="group", symmetric=True, dynamic=False,
                                group_size=32, scale_dtype=torch.uint8, zp_dtype=torch.uint8)
    base = dict(num_bits=4, type="int", strategy="group", symmetric=True, dynamic=False, group_size=32)
    base.update(kw)
    return QuantizationArgs(**base)


def ct_compress(w, args, scale_dtype=None):
    """compressed-tensors' own compressor on one weight: {suffix: tensor} as checkpoints store it
    (weight_packed, weight_scale, weight_shape, weight_zero_point), and its decompressed weight."""
    import torch
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.quantization import QuantizationScheme
    from compressed_tensors.quantization.utils import calculate_qparams

    fmt = "mxfp4-pack-quantized" if args.type == "float" else "pack-quantized"
    scheme = QuantizationScheme(targets=["Linear"], weights=args)
    if args.strategy == "group":
        g = w.float().unflatten(-1, (w.shape[-1] // args.group_size, args.group_size))
        lo, hi = g.amin(-1), g.amax(-1)
    else:  # channel
        lo, hi = w.float().amin(-1, keepdim=True), w.float().amax(-1, keepdim=True)
    scale, zp = calculate_qparams(lo, hi, args)
    if scale_dtype is not None:
        scale = scale.to(scale_dtype)
    comp = BaseCompressor.load_from_registry(fmt)
    state = {"weight": w if args.type == "int" else w.to(torch.bfloat16), "weight_scale": scale,
             "weight_zero_point": zp.to(torch.int8)}
    packed = comp.compress(state, scheme)
    dense = comp.decompress(dict(packed), scheme)["weight"]
    return {k: v.contiguous() for k, v in packed.items()}, dense


def exact_dequant(packed, args):
    """The dequantized weight in float64 from the stored tensors by the formula (no package code):
    the reference the C++ side computes, before rounding to its dtype."""
    import torch

    p = packed["weight_packed"]
    if args.type == "float":  # mxfp4: low nibble first, e2m1, e8m0 scales
        lut = torch.tensor([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], dtype=torch.float64)
        v = torch.stack([lut[(p & 15).long()], lut[(p >> 4).long()]], -1).flatten(-2)
        s = torch.pow(2.0, packed["weight_scale"].double() - 127)
        return v * s.repeat_interleave(args.group_size, -1)
    rows, cols = packed["weight_shape"].tolist()
    nb = args.num_bits
    words = p.to(torch.int64) & 0xFFFFFFFF
    bits = ((words[:, :, None] >> torch.arange(32)) & 1).flatten(1)  # bit k of word w -> 32w+k

    def unpack(bitrows, n):
        idx = torch.arange(n)[:, None] * nb + torch.arange(nb)
        return (bitrows[:, idx] * (1 << torch.arange(nb))).sum(-1) - (1 << (nb - 1))

    q = unpack(bits, cols).double()
    s = packed["weight_scale"].double()
    if "weight_zero_point" in packed:  # packed along the output dimension (packed_dim=0)
        z = packed["weight_zero_point"].to(torch.int64) & 0xFFFFFFFF
        zbits = ((z.t()[:, :, None] >> torch.arange(32)) & 1).flatten(1)
        q = q - unpack(zbits, rows).t().double().repeat_interleave(cols // s.shape[1], -1)
    return q * s.repeat_interleave(cols // s.shape[1], -1)


# ----------------------------------------------------------------------------------------------
# Single-tensor cases


def write_tensor_cases(path):
    import torch
    from compressed_tensors.compressors.mx_utils import decompress_mx_scale
    from compressed_tensors.compressors.nvfp4.helpers import unpack_fp4_from_uint8
    from safetensors.torch import save_file

    t = {}
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    t["codes.u8"] = codes
    t["codes.f8_e4m3"] = codes.clone().view(torch.float8_e4m3fn)
    t["codes.f8_e5m2"] = codes.clone().view(torch.float8_e5m2)
    t["codes.e4m3_as_f32"] = codes.view(torch.float8_e4m3fn).float()
    t["codes.e5m2_as_f32"] = codes.view(torch.float8_e5m2).float()
    t["codes.fp4_as_f32"] = unpack_fp4_from_uint8(codes[None], 1, 512, torch.float32)[0]
    # e8m0: torch's float8_e8m0fnu (0xFF is NaN, as the OCP MX spec says) and compressed-tensors'
    # decompress_mx_scale (bf16 2^(e-127): 0xFF gives inf); they agree on 0..254.
    t["codes.e8m0_as_f32"] = codes.view(torch.float8_e8m0fnu).float()
    ct = decompress_mx_scale(codes).float()
    assert torch.equal(ct[:255], t["codes.e8m0_as_f32"][:255]) and torch.isinf(ct[255])

    gen = torch.Generator().manual_seed(7)
    w = torch.randn(20, 40, generator=gen) * 0.3
    w[3, 5] = 0.0
    q, s = fp8_quantize(w, [8, 16])  # grid [3, 3], ceil in both dimensions
    assert list(s.shape) == [3, 3]
    t["fp8.weight"], t["fp8.weight_scale_inv"] = q, s
    t["fp8.dense"] = fp8_dequantize(q, s, [8, 16])

    cases = {
        "int4g": (torch.randn(6, 64, generator=gen), ct_args("int4"), torch.bfloat16),
        "int4g_asym": (torch.randn(10, 64, generator=gen) + 0.4, ct_args("int4", symmetric=False), torch.bfloat16),
        "int4c": (torch.randn(5, 44, generator=gen), ct_args("int4", strategy="channel", group_size=None),
                  torch.float32),
        "int8c": (torch.randn(4, 40, generator=gen), ct_args("int4", num_bits=8, strategy="channel",
                                                              group_size=None), torch.float16),
        "mxfp4": (torch.randn(6, 64, generator=gen) * torch.logspace(-3, 2, 6)[:, None], ct_args("mxfp4"), None),
    }
    for name, (w, args, sdt) in cases.items():
        packed, dense = ct_compress(w, args, sdt)
        exact = exact_dequant(packed, args)
        # The package computes in the scale's dtype; the exact value rounds to the same.
        assert torch.equal(exact.to(dense.dtype), dense), f"{name}: decompress differs from the formula"
        for k, v in packed.items():
            t[f"{name}.{k}"] = v
        t[f"{name}.dense"] = dense  # the package's result (its dtype: the scale's, bf16 for mxfp4)
        # f32 of the exact value: exact itself, but for f32 scales (one rounding of q * s, as in f32)
        t[f"{name}.exact"] = exact.float()
        assert sdt == torch.float32 or torch.equal(t[f"{name}.exact"].double(), exact), name
    assert "int4g_asym.weight_zero_point" in t and t["int4c.weight_packed"].shape[1] == 6
    save_file(t, str(path), metadata={"fixture": versions()})
    print(f"{path}: {len(t)} tensors, {path.stat().st_size} bytes")


# ----------------------------------------------------------------------------------------------
# Whole models


def versions():
    import compressed_tensors
    import torch
    import transformers

    return (f"tools/reference/quant_fixtures.py transformers={transformers.__version__} "
            f"compressed-tensors={compressed_tensors.__version__} torch={torch.__version__}")


def load_base(base):
    from safetensors.torch import load_file

    d = BASE / base
    return d, json.loads((d / "config.json").read_text()), load_file(str(d / "model.safetensors"))


def dense_model(base_dir, state):
    """The base architecture with the given (dequantized) checkpoint tensors."""
    import tempfile

    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(base_dir / "config.json", tmp)
        save_file({k: v.float().contiguous() for k, v in state.items()}, f"{tmp}/model.safetensors")
        model = AutoModelForCausalLM.from_pretrained(tmp, attn_implementation="eager", dtype=torch.float32)
    return model.eval()


def run(model, ids):
    """logits, greedy continuation of row 0 and the smallest routing / greedy margins."""
    import torch
    from make_fixtures import RouterProbe

    probe = RouterProbe(model)
    with torch.no_grad():
        logits = model(input_ids=ids, use_cache=False).logits.float()
        model.generation_config.eos_token_id = None
        model.generation_config.pad_token_id = 0
        # An explicit mask: generate() would otherwise mask every input token equal to pad_token_id.
        gen = model.generate(ids[:1], attention_mask=torch.ones_like(ids[:1]), max_new_tokens=NEW_TOKENS,
                             do_sample=False, return_dict_in_generate=True, output_logits=True)
    probe.remove()
    greedy = gen.sequences[0, ids.shape[1]:].clone()
    greedy_logits = torch.cat(gen.logits, dim=0).float()
    # The cached decode agrees with the uncached forward over the growing prefix.
    with torch.no_grad():
        full = model(input_ids=torch.cat([ids[:1], greedy[None]], 1)[:, :-1], use_cache=False).logits[0]
    step_err = (full[ids.shape[1] - 1:] - greedy_logits).abs().max().item()
    assert step_err < 1e-4, f"cached greedy steps differ from uncached forwards by {step_err}"
    top2 = greedy_logits.topk(2, dim=-1)[0]
    return logits, greedy, greedy_logits, min(probe.min_margin, (top2[:, 0] - top2[:, 1]).min().item())


def write_model(out, base, cfg, qcfg, quantized, dense, note, package_dense=None):
    """Writes the quantized directory and the outputs of the dequantized model."""
    import torch
    from safetensors.torch import load_file, save_file

    base_dir = BASE / base
    base_ids = load_file(str(base_dir / "inputs.safetensors"))["input_ids"]
    model = dense_model(base_dir, dense)
    original_model = dense_model(base_dir, load_file(str(base_dir / "model.safetensors")))
    V = model.config.vocab_size
    # The base inputs, or the first seeded ones on which no routing or greedy choice of the
    # quantized model is close to a tie (rounding elsewhere must not flip a discrete choice).
    for seed in range(-1, 200):
        ids = base_ids if seed < 0 else torch.randint(0, V, base_ids.shape, generator=torch.Generator().manual_seed(seed))
        logits, greedy, greedy_logits, margin = run(model, ids)
        print(f"{out.name}: inputs {'base' if seed < 0 else f'seed {seed}'}: margin {margin:.2e}")
        if margin >= MARGIN:
            break
    else:
        sys.exit(f"{out.name}: no inputs with clear margins")
    with torch.no_grad():
        original = original_model(input_ids=ids, use_cache=False).logits.float()
    q_err = (logits - original).abs().max().item()
    q_med = (logits - original).abs().median().item()

    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    cfg = dict(cfg, quantization_config=qcfg)
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    save_file(quantized, str(out / "model.safetensors"))
    save_file({"input_ids": ids.contiguous()}, str(out / "inputs.safetensors"))
    meta = {"fixture": f"{versions()}; {note}; quantization error vs {base}: max |dlogit| {q_err:.4g}, median {q_med:.3g}"}
    save_file({"logits": logits.contiguous(), "greedy_ids": greedy.contiguous(),
               "greedy_logits": greedy_logits.contiguous()}, str(out / "outputs.safetensors"), metadata=meta)

    if package_dense:  # transformers' own loader of the quantized directory, dequantizing
        from transformers import AutoModelForCausalLM, CompressedTensorsConfig

        # (It keeps the dequantized fused experts in bf16, the scale dtype: .float() computes in f32.)
        again = AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager", dtype=torch.float32,
                                                     quantization_config=CompressedTensorsConfig(dequantize=True))
        with torch.no_grad():
            theirs = again.float().eval()(input_ids=ids, use_cache=False).logits.float()
        # compressed-tensors dequantizes in the scale's dtype (bf16 here): the same weights rounded.
        pkg = dense_model(base_dir, package_dense)
        with torch.no_grad():
            pkg_logits = pkg(input_ids=ids, use_cache=False).logits.float()
        d = (theirs - pkg_logits).abs().max().item()
        r = (pkg_logits - logits).abs().max().item()
        print(f"{out.name}: transformers' loader (dequantize=True) vs the package-dequantized weights: {d:.3g}; "
              f"those vs the exact dequantized weights: {r:.3g}")
        assert d < 1e-5, f"{out.name}: transformers' own dequantizing load differs by {d}"
    sizes = {p.name: p.stat().st_size for p in sorted(out.iterdir())}
    print(f"{out.name}: quantization error max {q_err:.4g} median {q_med:.3g} (max |logit| "
          f"{original.abs().max().item():.3g}), "
          f"margin {margin:.2e}, {sum(sizes.values())} bytes {sizes}")


def is_linear(name, t):
    """The Linear weights of the tiny models (not the embeddings, norms, router or conv)."""
    return (t.dim() == 2 and name.endswith(".weight") and "embed_tokens" not in name
            and not name.endswith((".gate.weight", "norm.weight")))


def make_fp8(out):
    import torch

    base = "deepseek_v3_tiny"
    base_dir, cfg, state = load_base(base)
    quantized, dense, grids = {}, {}, {}
    for name, w in state.items():
        if is_linear(name, w) and name != "lm_head.weight":
            q, s = fp8_quantize(w, FP8_BLOCK)
            quantized[name], quantized[name + "_scale_inv"] = q, s
            dense[name] = fp8_dequantize(q, s, FP8_BLOCK)
            grids[tuple(s.shape)] = name
        else:
            quantized[name] = dense[name] = w
    assert (3, 2) in grids, "expected a ceil-sized grid (kv_a_proj_with_mqa, 40 rows)"
    # DeepSeek-V3's quantization_config, with the tiny block.
    qcfg = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": FP8_BLOCK}
    n = sum(1 for k in quantized if k.endswith("_scale_inv"))
    write_model(out, base, cfg, qcfg, quantized, dense, f"fp8 e4m3 block {FP8_BLOCK}: {n} weights")


def make_compressed(out, base, kind):
    import torch
    from compressed_tensors.quantization import QuantizationConfig, QuantizationScheme
    from compressed_tensors.utils import is_match  # noqa: F401  (the matching semantics below)
    import re

    base_dir, cfg, state = load_base(base)
    args = ct_args(kind)
    if kind == "int4":  # Kimi K2 Thinking
        targets, ignore, fmt = ["Linear"], K2_THINKING_IGNORE, "pack-quantized"
    else:  # routed experts only (K3-style), by regex
        targets, ignore, fmt = ["re:.*block_sparse_moe\\.experts\\.\\d+\\.w[123]$"], ["lm_head"], "mxfp4-pack-quantized"

    def selected(module):  # compressed-tensors' match_name: re.match for "re:", equality otherwise
        def m(t):
            return re.match(t[3:], module) is not None if t.startswith("re:") else (t == module or t == "Linear")
        return any(m(t) for t in targets) and not any(m(t) for t in ignore if t != "Linear")

    quantized, dense, package_dense = {}, {}, {}
    for name, w in state.items():
        module = name[: -len(".weight")]
        if is_linear(name, w) and selected(module):
            packed, d = ct_compress(w, args, torch.bfloat16 if kind == "int4" else None)
            assert torch.equal(exact_dequant(packed, args).to(d.dtype), d), name
            for k, v in packed.items():
                quantized[f"{module}.{k}"] = v
            dense[name] = exact_dequant(packed, args).float()
            package_dense[name] = d
        else:
            quantized[name] = dense[name] = package_dense[name] = w
    scheme = QuantizationScheme(targets=targets, weights=args)
    qc = QuantizationConfig(config_groups={"group_0": scheme}, format=fmt, ignore=ignore,
                            quantization_status="compressed")
    qcfg = qc.model_dump(mode="json")
    qcfg["quant_method"] = "compressed-tensors"
    n = sum(1 for k in quantized if k.endswith("weight_packed"))
    # transformers 5.24 cannot load a quantized kimi_linear directory at all (its conversion of
    # the q/k/v conv1d weights fails: "Concatenate on tensors destined for ...conv1d.weight"), so
    # there the per-tensor check against compressed-tensors' decompress above is the package check.
    write_model(out, base, cfg, qcfg, quantized, dense, f"compressed-tensors {fmt}: {n} weights",
                package_dense=package_dense if base.startswith("deepseek") else None)


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    main()
