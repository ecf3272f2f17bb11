#!/usr/bin/env python3
"""Golden fixtures of transformers' kimi_k25 (Kimi K2.5) vision path (MODEL.md §10,
docs/REFERENCE_NOTES.md "kimi_k25 vision").

  kimi_k25_fixtures.py [--out DIR]        (default DIR: tests/fixtures/models/kimi_k25_tiny)

Builds a tiny float32 Kimi_K25ForConditionalGeneration (a MoonViT tower, the projector and a
DeepSeek-V3 text model; fixed seed), two synthetic RGB PNGs of different sizes, runs transformers'
Kimi_K25ImageProcessor on them and the model on one packed batch with text around both images,
and writes DIR/:
  config.json, model.safetensors   exactly as save_pretrained writes them (checkpoint names)
  image0.png (84 wide, 56 high), image1.png (42 x 42; the processor pads it to 56 x 56)
  inputs.safetensors    pixel_values f32 [Σ h·w, 3·14·14] (the processor's [N, 3, 14, 14]
                        flattened per patch), grid_thws i64 [2, 3], input_ids i64 [1, T]
                        (<media_start> N × <media_pad> <media_end> per image, text around);
                        video_pixel_values f32 [2·4·4, 588], video_grid_thws i64 [1, 3]
                        (a random two-frame chunk for the temporal path)
  outputs.safetensors   tower_out f32 [Σ merged, 4, d_v] (the tower's pooled output, before the
                        projector), projector_out f32 [Σ merged, d] (what replaces the
                        placeholders), logits f32 [1, T, V], greedy_ids i64 [8] and greedy_logits
                        f32 [8, V] (generate(do_sample=False) with the images), video_tower_out,
                        video_projector_out. Metadata key "fixture" records seed and versions.

The script checks its own output: the saved checkpoint reloads into identical outputs; each image
alone gives the rows of the packed batch; routing and greedy choices win by a clear margin; and an
independent float64 forward of the tower and projector written from docs/REFERENCE_NOTES.md (plain
torch ops on the saved checkpoint tensors: fused wqkv, interleaved-pair RoPE, bicubic weights
from the formula) reproduces transformers' outputs.
"""
import argparse
import math
import pathlib
import shutil
import sys

import refenv  # tools/reference/refenv.py: the venv these scripts run in

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]

IMAGE_PAD, MEDIA_START, MEDIA_END = 299, 297, 298  # <|media_pad|>, <|media_begin|>, <|media_end|>
TEXT = dict(
    vocab_size=300, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
    num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2, rms_norm_eps=1e-6,
    # q_lora_rank must be set: with a plain q_proj, transformers 5.24's save_pretrained renames it
    # through the vision tower's wqkv rule and the checkpoint no longer loads.
    q_lora_rank=16, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8,
    n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1, routed_scaling_factor=2.5,
    n_group=2, topk_group=1, norm_topk_prob=True, first_k_dense_replace=1, num_mtp_layers=0,
    tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=None,
    max_position_embeddings=64, rope_interleave=True, model_type="deepseek_v3",
    rope_parameters=dict(rope_type="yarn", rope_theta=10.0, factor=4.0, original_max_position_embeddings=16,
                         beta_fast=32.0, beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0),
)
# A 5 x 5 position table, so both images (4 x 6 and 4 x 4 patches) resample it, one axis up and
# one down; rope_theta 100 so the few RoPE frequencies of a 16-wide head turn visibly.
VISION = dict(
    patch_size=14, pos_emb_height=5, pos_emb_width=5, pos_emb_time=4, num_attention_heads=2,
    num_hidden_layers=2, hidden_size=32, intermediate_size=64, merge_kernel_size=[2, 2],
    rope_parameters=dict(rope_type="axial", rope_theta=100.0),
)
SEED0, NEW_TOKENS, MARGIN = 2500, 8, 2e-3
VIDEO_GRID = (2, 4, 4)


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
    ap.add_argument("--out", type=pathlib.Path, default=ROOT / "tests/fixtures/models/kimi_k25_tiny")
    make(ap.parse_args().out)


def images():
    """Two deterministic RGB patterns (numpy uint8 [H, W, 3]): gradients, stripes, a disc."""
    import numpy as np

    def pattern(h, w, k):
        y, x = np.mgrid[0:h, 0:w]
        r = (x * 255 // max(w - 1, 1) + 40 * k) % 256
        g = (y * 255 // max(h - 1, 1) + 97 * ((x // 7 + y // 5) % 2)) % 256
        b = np.where((x - w / 2) ** 2 + (y - h / 3) ** 2 < (min(h, w) / 3) ** 2, 230 - 60 * k, 20 + 3 * x)
        return np.stack([r, g, b % 256], -1).astype(np.uint8)

    return [pattern(56, 84, 0), pattern(42, 42, 1)]


def build(seed):
    import torch
    import make_fixtures
    from transformers import Kimi_K25Config, Kimi_K25ForConditionalGeneration

    torch.manual_seed(seed)
    cfg = Kimi_K25Config(text_config=dict(TEXT), vision_config=dict(VISION), projection_hidden_size=VISION["hidden_size"],
                         projection_layer_norm_eps=1e-5, image_token_id=IMAGE_PAD, vision_start_token_id=MEDIA_START,
                         vision_end_token_id=MEDIA_END, tie_word_embeddings=False)
    model = Kimi_K25ForConditionalGeneration._from_config(cfg, attn_implementation="eager").float().eval()
    make_fixtures.randomise(model, seed)  # the text model as make_fixtures draws it
    pe = model.model.vision_tower.patch_embed.pos_emb
    pe.time_position_embeddings.copy_(pe.compute_pos_embed())  # a fixed buffer, not a parameter
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # the tower and projector: O(1) activations, every tensor visible
        for name, p in model.named_parameters():
            if "vision_tower" not in name and "mm_projector" not in name:
                continue
            if "norm" in name and name.endswith("weight"):
                new = torch.rand(p.shape, generator=gen) + 0.5
            elif name.endswith("bias"):
                new = torch.randn(p.shape, generator=gen) * 0.2
            elif name.endswith("position_embeddings"):
                new = torch.randn(p.shape, generator=gen) * 0.5
            else:  # weights [out, in] or the patch conv [out, 3, p, p]
                new = torch.randn(p.shape, generator=gen) * (p[0].numel() ** -0.5)
            p.copy_(new)
    return model


def processed(out):
    """The PNGs as written, through the processor: pixel_values [N, 588], grid_thws [n, 3]."""
    from PIL import Image
    from transformers import Kimi_K25ImageProcessor

    proc = Kimi_K25ImageProcessor(patch_size=VISION["patch_size"], merge_size=2)
    pics = [Image.open(out / f"image{i}.png").convert("RGB") for i in range(2)]
    res = proc(images=pics, return_tensors="pt")
    pv, grids = res["pixel_values"], res["image_grid_thw"]
    return pv.reshape(pv.shape[0], -1).contiguous(), grids


def prompt(grids, seed):
    import torch

    g = torch.Generator().manual_seed(seed)

    def text(n):
        return torch.randint(3, MEDIA_START, (n,), generator=g).tolist()

    ids = [1] + text(3)
    for i, (t, h, w) in enumerate(grids.tolist()):
        ids += [MEDIA_START] + [IMAGE_PAD] * (t * h * w // 4) + [MEDIA_END] + text(3 + i)
    return torch.tensor([ids])


def make(out):
    import torch
    import transformers
    from PIL import Image
    from safetensors.torch import load_file, save_file
    from make_fixtures import RouterProbe

    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    for i, img in enumerate(images()):
        Image.fromarray(img).save(out / f"image{i}.png", optimize=True)
    pv, grids = processed(out)
    assert grids.tolist() == [[1, 4, 6], [1, 4, 4]], grids
    video_grids = torch.tensor([VIDEO_GRID])
    video_pv = torch.rand(math.prod(VIDEO_GRID), pv.shape[1], generator=torch.Generator().manual_seed(7)) * 2 - 1

    for seed in range(SEED0, SEED0 + 200):
        model = build(seed)
        ids = prompt(grids, seed)
        T = ids.shape[1]
        probe = RouterProbe(model)
        with torch.no_grad():
            projector_out = torch.cat(model.model.get_image_features(pv.view(-1, 3, 14, 14), grids).pooler_output)
            tower_out = model.model.vision_tower(pv.view(-1, 3, 14, 14), grid_thw=grids).pooler_output
            res = model(input_ids=ids, pixel_values=pv.view(-1, 3, 14, 14), image_grid_thw=grids, use_cache=False)
            logits = res.logits
            model.generation_config.eos_token_id = None
            model.generation_config.pad_token_id = 0
            gen = model.generate(ids, pixel_values=pv.view(-1, 3, 14, 14), image_grid_thw=grids,
                                 max_new_tokens=NEW_TOKENS, do_sample=False, return_dict_in_generate=True,
                                 output_logits=True)
        probe.remove()
        greedy = gen.sequences[0, T:].clone()
        greedy_logits = torch.cat(gen.logits, 0).float()
        top2 = greedy_logits.topk(2, -1)[0]
        margin = (top2[:, 0] - top2[:, 1]).min().item()
        ok = (probe.min_margin >= MARGIN and margin >= MARGIN and len(greedy) == NEW_TOKENS
              and IMAGE_PAD not in greedy.tolist())
        print(f"seed {seed}: routing margin {probe.min_margin:.2e}, greedy margin {margin:.2e} -> "
              f"{'ok' if ok else 'retry'}")
        if ok:
            break
    else:
        sys.exit("kimi_k25_tiny: no seed with clear margins")

    with torch.no_grad():
        # Packing must not change results: each image alone gives its rows of the batch.
        row = 0
        for i in range(len(grids)):
            n = int(grids[i].prod())
            one = model.model.vision_tower(pv[row:row + n].view(-1, 3, 14, 14), grid_thw=grids[i:i + 1]).pooler_output
            part = tower_out[sum(int(g.prod()) // 4 for g in grids[:i]):][: n // 4]
            assert (one - part).abs().max().item() < 1e-5, f"image {i} alone differs from the packed batch"
            row += n
        video_tower_out = model.model.vision_tower(video_pv.view(-1, 3, 14, 14), grid_thw=video_grids).pooler_output
        video_projector_out = model.model.mm_projector(video_tower_out).squeeze(1)
        # The greedy tokens with the cache equal uncached argmaxes.
        seq = torch.cat([ids, greedy[None]], 1)
        full = model(input_ids=seq[:, :-1], pixel_values=pv.view(-1, 3, 14, 14), image_grid_thw=grids).logits[0, T - 1:]
        assert torch.equal(full.argmax(-1), greedy), "cached greedy differs from uncached argmax"

    model.save_pretrained(out)
    (out / "generation_config.json").unlink(missing_ok=True)
    again = type(model).from_pretrained(out, attn_implementation="eager").float().eval()
    with torch.no_grad():
        re = again(input_ids=ids, pixel_values=pv.view(-1, 3, 14, 14), image_grid_thw=grids).logits
    assert torch.equal(re, logits), "the saved checkpoint reloads into different logits"

    import json

    cfg = json.loads((out / "config.json").read_text())
    ckpt = load_file(out / "model.safetensors")
    for name, (x, g, want_tower, want_proj) in {
        "images": (pv, grids, tower_out, projector_out),
        "video chunk": (video_pv, video_grids, video_tower_out, video_projector_out),
    }.items():
        t_ref, p_ref = independent_vision(cfg, ckpt, x, g)
        terr = (t_ref - want_tower.double()).abs().max().item()
        perr = (p_ref - want_proj.double()).abs().max().item()
        print(f"{name}: independent float64 tower vs transformers: tower {terr:.2e}, projector {perr:.2e}")
        assert max(terr, perr) < 1e-5, f"{name}: independent forward differs"

    meta = {"fixture": f"tools/reference/kimi_k25_fixtures.py seed={seed} transformers={transformers.__version__} "
                       f"torch={torch.__version__}"}
    save_file({"pixel_values": pv, "grid_thws": grids.contiguous(), "input_ids": ids.contiguous(),
               "video_pixel_values": video_pv.contiguous(), "video_grid_thws": video_grids.contiguous()},
              out / "inputs.safetensors", metadata=meta)
    save_file({"tower_out": tower_out.contiguous(), "projector_out": projector_out.contiguous(),
               "logits": logits.contiguous(), "greedy_ids": greedy.contiguous(),
               "greedy_logits": greedy_logits.contiguous(), "video_tower_out": video_tower_out.contiguous(),
               "video_projector_out": video_projector_out.contiguous()},
              out / "outputs.safetensors", metadata=meta)
    sizes = {p.name: p.stat().st_size for p in sorted(out.iterdir())}
    print(f"kimi_k25_tiny: wrote {out} ({sum(sizes.values())} bytes: {sizes})")


# ----------------------------------------------------------------------------------------------
# Independent float64 tower and projector (docs/REFERENCE_NOTES.md), from checkpoint tensors only


def bicubic_matrix(size, side):
    """[size, side]: F.interpolate(mode="bicubic", align_corners=False) along one axis (Keys
    kernel a = -0.75, half-pixel centres, taps clamped to the border)."""
    import torch

    m = torch.zeros(size, side, dtype=torch.float64)
    a = -0.75
    for i in range(size):
        src = (i + 0.5) * side / size - 0.5
        fl = math.floor(src)
        for off in (-1, 0, 1, 2):
            d = abs(src - (fl + off))
            wt = ((a + 2) * d - (a + 3)) * d * d + 1 if d <= 1 else ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
            m[i, min(max(fl + off, 0), side - 1)] += wt
    return m


def independent_vision(cfg, ck, pixel_values, grids):
    """-> (tower output [M, 4, d_v], projector output [M, d]) in float64."""
    import torch

    vc = cfg["vision_config"]
    W = {k: v.double() for k, v in ck.items()}
    f = torch.nn.functional
    D, H, p = vc["hidden_size"], vc["num_attention_heads"], vc["patch_size"]
    hd = D // H
    side = vc["pos_emb_height"]
    kh, kw = vc["merge_kernel_size"]
    theta = vc["rope_parameters"]["rope_theta"]

    def ln(x, pre, eps=1e-5):
        return f.layer_norm(x, (x.shape[-1],), W[pre + ".weight"], W[pre + ".bias"], eps)

    def lin(x, pre):
        return x @ W[pre + ".weight"].t() + W[pre + ".bias"]

    x = pixel_values.double() @ W["vision_tower.encoder.patch_embed.proj.weight"].reshape(D, -1).t()
    x = x + W["vision_tower.encoder.patch_embed.proj.bias"]
    table = W["vision_tower.patch_embed.pos_emb.weight"]  # [side, side, D]
    inv = theta ** (-torch.arange(0, hd // 2, 2, dtype=torch.float64) / (hd // 2))  # hd/4 frequencies
    pos, rows, cols, segs = [], [], [], []
    for t, h, w in grids.tolist():
        sp = torch.einsum("ia,jb,abd->ijd", bicubic_matrix(h, side), bicubic_matrix(w, side), table).reshape(h * w, D)
        if t > 1:  # per-frame sinusoid, concat(sin, cos) over D/2 frequencies
            fr = torch.arange(t, dtype=torch.float64)[:, None] * 10000 ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
            sp = sp[None] + torch.cat([fr.sin(), fr.cos()], 1)[:, None]
        pos.append(sp.reshape(-1, D))
        r, c = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
        rows.append(r.flatten().repeat(t))
        cols.append(c.flatten().repeat(t))
        segs.append(t * h * w)
    x = x + torch.cat(pos)
    rows, cols = torch.cat(rows).double(), torch.cat(cols).double()
    # Complex pair j = (2j, 2j+1) of each head turns by col·inv[j/2] (j even) or row·inv[j/2] (odd).
    ang = torch.stack([cols[:, None] * inv, rows[:, None] * inv], -1).flatten(1)  # [N, hd/2]
    cos, sin = ang.cos()[:, None], ang.sin()[:, None]

    def rope(u):  # u [N, H, hd]
        a, b = u[..., 0::2], u[..., 1::2]
        return torch.stack([a * cos - b * sin, a * sin + b * cos], -1).flatten(-2)

    N = x.shape[0]
    for i in range(vc["num_hidden_layers"]):
        pre = f"vision_tower.encoder.blocks.{i}."
        q, k, v = lin(ln(x, pre + "norm0"), pre + "wqkv").view(N, 3, H, hd).unbind(1)
        q, k = rope(q), rope(k)
        outs = []
        for qs, ks, vs in zip(q.split(segs), k.split(segs), v.split(segs)):
            s = torch.einsum("ihd,jhd->hij", qs, ks) * hd**-0.5
            outs.append(torch.einsum("hij,jhd->ihd", s.softmax(-1), vs).reshape(-1, D))
        x = x + lin(torch.cat(outs), pre + "wo")
        y = ln(x, pre + "norm1")
        x = x + lin(f.gelu(lin(y, pre + "mlp.fc0"), approximate="tanh"), pre + "mlp.fc1")
    x = ln(x, "vision_tower.encoder.final_layernorm")
    merged = []
    for (t, h, w), part in zip(grids.tolist(), x.split(segs)):
        part = part.view(t, h // kh, kh, w // kw, kw, D).permute(1, 3, 0, 2, 4, 5)
        merged.append(part.reshape(h // kh * (w // kw), t, kh * kw, D).mean(1))
    tower = torch.cat(merged)
    y = ln(tower, "model.mm_projector.pre_norm", cfg["projection_layer_norm_eps"]).reshape(tower.shape[0], -1)
    y = lin(f.gelu(lin(y, "mm_projector.proj.0")), "mm_projector.proj.2")
    return tower, y


if __name__ == "__main__":
    main()
