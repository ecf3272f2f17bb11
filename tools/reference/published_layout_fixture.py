#!/usr/bin/env python3
"""A tiny model directory laid out exactly like a published Kimi checkpoint (scripts/check_published_layout.sh).

  published_layout_fixture.py [--out DIR]     (default DIR: tests/fixtures/published/kimi_fp8_tiny)

Writes DIR/ with the files a Kimi repository on the hub ships (the remote-code .py files aside):
  tiktoken.model           Kimi's tiktoken rank file (tests/fixtures/tokenizers/kimi_tiktoken:
                           3,500 ranks, tokenizer_fixtures.py), as is
  tokenizer_config.json    the same tokenizer's (added_tokens_decoder with Kimi's special tokens,
                           bos_token "[BOS]", eos_token "[EOS]" as an AddedToken object, auto_map
                           to tokenization_kimi.TikTokenTokenizer) plus `chat_template`: the
                           Kimi-K2-style Jinja template tests/fixtures/jinja/kimi_k2.jinja
                           (tool_declare, <|tool_calls_section_begin|> / <|tool_call_begin|> ...)
  config.json              a 4-layer kimi_linear (transformers' KimiLinearConfig as save_pretrained
                           writes it: KDA layers 1-3, an MLA layer 4, a dense FFN then MoE layers
                           of 8 routed experts + 1 shared) with Kimi's published extras (auto_map,
                           bos/eos/pad ids of the tokenizer, dtype bfloat16, mla_use_nope) and a
                           quantization_config as Kimi K2 / DeepSeek-V3 publish it: fine-grained
                           FP8, e4m3, dynamic activations, weight_block_size [16, 16] (128 in the
                           real checkpoints; the tiny widths are below that)
  model.safetensors        every Linear weight but lm_head and the routers as F8_E4M3 `X.weight` +
                           F32 `X.weight_scale_inv` (quant_fixtures.fp8_quantize: transformers' own
                           Fp8Quantize; ceil grids where a width is not a multiple of 16, e.g. the
                           24-row kv_a_proj_with_mqa and the 2-row b_proj); embeddings, lm_head,
                           norms and short convolutions BF16; A_log, dt_bias and the routers'
                           e_score_correction_bias F32
  generation_config.json   eos_token_id = <|im_end|>'s id (Kimi K2's ends a turn there), a default
                           temperature 0.6, bos_token_id

The vocabulary is the tokenizer's full size (3,500 ranks + 256 reserved special ids = 3,756). The
weights are random (make_fixtures.build / randomise, fixed seed): the fixture is for the layout and
the serving protocol, not for what the model says. The run is deterministic (the files are
bit-identical from run to run) and checks itself: every FP8 weight dequantizes (transformers'
_dequantize_fp8_weight) to within e4m3 rounding of the original.
"""
import argparse
import json
import pathlib
import shutil
import sys

import refenv  # tools/reference/refenv.py: the venv these scripts run in

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
TOKENIZER = ROOT / "tests/fixtures/tokenizers/kimi_tiktoken"
TEMPLATE = ROOT / "tests/fixtures/jinja/kimi_k2.jinja"
SEED = 4242
BLOCK = [16, 16]
MAX_BYTES = 1_500_000

# Kimi's published special-token ids, relative to the first one after the ranks (Kimi K2:
# [BOS] 163584, [EOS] 163585, <|im_end|> 163586, [PAD] 163839 over 163,584 ranks).
N_RANKS = 3500
VOCAB = N_RANKS + 256
BOS, EOS, IM_END, PAD = N_RANKS, N_RANKS + 1, N_RANKS + 2, N_RANKS + 255

CONFIG = dict(
    vocab_size=VOCAB, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
    num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=2, rms_norm_eps=1e-5,
    q_lora_rank=None, kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
    num_experts=8, num_experts_per_token=2, num_shared_experts=1, routed_scaling_factor=2.446,
    moe_renormalize=True, moe_router_activation_func="sigmoid", use_grouped_topk=False,
    num_expert_group=1, topk_group=1, first_k_dense_replace=1, moe_layer_freq=1,
    num_nextn_predict_layers=0, tie_word_embeddings=False,
    bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD,
    linear_attn_config=dict(num_heads=2, head_dim=16, short_conv_kernel_size=4,
                            kda_layers=[1, 2, 3], full_attn_layers=[4]),
)

# Kimi-Linear-48B-A3B's config.json keys that transformers' own config does not write.
PUBLISHED_EXTRAS = {
    "auto_map": {
        "AutoConfig": "configuration_kimi.KimiLinearConfig",
        "AutoModel": "modeling_kimi.KimiLinearModel",
        "AutoModelForCausalLM": "modeling_kimi.KimiLinearForCausalLM",
    },
    "dtype": "bfloat16",
    "mla_use_nope": True,
}
# Kimi K2's quantization_config (config.json on the hub), with the tiny block.
QUANTIZATION = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                "weight_block_size": BLOCK}


def main():
    refenv.ensure_pinned(__file__)
    for mod in ("fla", "causal_conv1d"):  # as make_fixtures.py: transformers' torch paths only
        sys.modules[mod] = None
    import warnings

    warnings.filterwarnings("ignore")
    import torch
    import transformers
    from safetensors.torch import load_file, save_file

    from make_fixtures import build
    from quant_fixtures import fp8_dequantize, fp8_quantize, is_linear

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    torch.set_num_threads(1)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=pathlib.Path, default=ROOT / "tests/fixtures/published/kimi_fp8_tiny")
    args = ap.parse_args()
    out = args.out

    # The tokenizer: Kimi's files, the template added to tokenizer_config.json.
    tok_cfg = json.loads((TOKENIZER / "tokenizer_config.json").read_text())
    added = {int(k): v["content"] for k, v in tok_cfg["added_tokens_decoder"].items()}
    assert added[BOS] == "[BOS]" and added[EOS] == "[EOS]" and added[IM_END] == "<|im_end|>", added
    assert added[PAD] == "[PAD]" and max(added) == VOCAB - 1, added
    n_ranks = sum(1 for line in (TOKENIZER / "tiktoken.model").read_text().splitlines() if line.strip())
    assert n_ranks == N_RANKS, n_ranks
    template = TEMPLATE.read_text()
    for marker in ("<|tool_calls_section_begin|>", "<|tool_call_begin|>", "<|tool_call_argument_begin|>",
                   "<|tool_call_end|>", "<|tool_calls_section_end|>", "tool_declare", "<|im_end|>"):
        assert marker in template, f"{TEMPLATE} lacks {marker}"
    tok_cfg["chat_template"] = template

    # The model: transformers' kimi_linear, save_pretrained's checkpoint names.
    model = build("kimi", CONFIG, SEED)
    with __import__("tempfile").TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        state = load_file(f"{tmp}/model.safetensors")
        cfg = json.loads(pathlib.Path(tmp, "config.json").read_text())
    assert cfg["model_type"] == "kimi_linear" and cfg["vocab_size"] == VOCAB, cfg
    cfg.update(PUBLISHED_EXTRAS)
    cfg["quantization_config"] = QUANTIZATION

    tensors, n_fp8, grids, worst = {}, 0, set(), 0.0
    for name in sorted(state):
        w = state[name].float()
        if is_linear(name, w) and name != "lm_head.weight":
            q, s = fp8_quantize(w, BLOCK)
            d = fp8_dequantize(q, s, BLOCK)
            # e4m3 keeps 3 mantissa bits: within 2^-4 of each value, relative to its block's max.
            scale = s.repeat_interleave(BLOCK[0], 0)[: w.shape[0]].repeat_interleave(BLOCK[1], 1)[:, : w.shape[1]]
            err = ((d - w).abs() / (scale * 448)).max().item()
            assert err <= 2 ** -4, f"{name}: fp8 round trip error {err}"
            worst = max(worst, err)
            tensors[name], tensors[name + "_scale_inv"] = q, s
            n_fp8 += 1
            grids.add((tuple(w.shape), tuple(s.shape)))
        elif name.endswith(("A_log", "dt_bias", "e_score_correction_bias")):
            tensors[name] = w.contiguous()
        else:
            tensors[name] = w.to(torch.bfloat16).contiguous()
    assert any(w[0] % BLOCK[0] for w, _ in grids), "expected a ceil-sized grid"
    kinds = {("kda" if ".q_conv1d." in n else "mla" if ".kv_b_proj." in n else "moe" if ".experts." in n
              else None) for n in tensors}
    assert {"kda", "mla", "moe"} <= kinds, kinds

    generation = {"bos_token_id": BOS, "eos_token_id": IM_END, "do_sample": True, "temperature": 0.6,
                  "transformers_version": transformers.__version__}

    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    shutil.copy(TOKENIZER / "tiktoken.model", out / "tiktoken.model")
    (out / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2, ensure_ascii=False) + "\n")
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "model.safetensors").chmod(0o644)  # (safetensors creates it 0600)

    # Reload: what was written is what was meant.
    def raw(t):
        return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t

    again = load_file(str(out / "model.safetensors"))
    assert again.keys() == tensors.keys(), "the reloaded checkpoint has other tensors"
    assert all(again[k].dtype == t.dtype and torch.equal(raw(again[k]), raw(t)) for k, t in tensors.items())
    dtypes = {}
    for t in tensors.values():
        key = str(t.dtype).replace("torch.", "")
        dtypes[key] = dtypes.get(key, 0) + 1
    sizes = {p.name: p.stat().st_size for p in sorted(out.iterdir())}
    total = sum(sizes.values())
    print(f"{out}: {n_fp8} fp8 weights (block {BLOCK}, worst round trip {worst:.3g} of a block's range), "
          f"tensors by dtype {dtypes}; {total} bytes {sizes}")
    assert total < MAX_BYTES, f"{out}: {total} bytes, over {MAX_BYTES}"


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    main()
