#!/usr/bin/env python3
"""Image preprocessing fixtures from transformers' Kimi K2.5 image processor (issue 14).

  image_fixtures.py [--out DIR]      (default DIR: tests/fixtures/images)

Writes small synthetic images (deterministic content: gradients, stripes, a disc and seeded
noise) as PNG / JPEG files, and DIR/processor.safetensors with, for each case NAME:
  NAME.pixel_values  f32 [N, 3*p*p]  Kimi_K25ImageProcessor's pixel_values, one row per patch
                                     (the processor returns [N, 3, p, p]; same order)
  NAME.grid          i64 [3]         image_grid_thw (t, h, w) in patches
  NAME.options       i64 [4]         patch_size, merge_size, max_patches, size["max_height"]
                                     the processor was called with
  NAME.rgb           u8  [H, W, 3]   the RGB pixels the processor started from (PIL's decode,
                                     alpha composited on white as convert_to_rgb does)
and resize.* cases for the resampler alone (the processor never upscales):
  resize.input u8 [3, 17, 23]; resize_up.output u8 [3, 41, 57], resize_down.output u8 [3, 7, 10]:
  torchvision's resize(uint8 CHW, BICUBIC, antialias=True), the call the processor makes.

The processor is the torchvision backend (the only one kimi_k25 ships): images are PIL images
opened from the written files, as a caller would pass them. Runs are deterministic.

Dependencies: refenv.ensure_pinned (torch, transformers, safetensors as requirements.txt pins
them) plus torchvision, which the processor needs; ensure_package installs it into the same
virtualenv when missing (0.29.2 was used, matching torch 2.15).
"""
import argparse
import io
import pathlib

import refenv  # tools/reference/refenv.py: the venv these scripts run in

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]

# name, file, size (w, h), PIL mode, processor options (patch, merge, max_patches, max_side)
DEFAULT = (14, 2, 16384, 512)  # the processor's defaults
CASES = [
    ("rgb_pad", "rgb_pad.png", (40, 30), "RGB", DEFAULT),  # no resize, padding only
    ("rgb_down", "rgb_down.png", (96, 72), "RGB", (8, 2, 16, 512)),  # patch budget downscale
    ("rgb_side", "rgb_side.png", (120, 24), "RGB", (8, 2, 16384, 4)),  # per-side downscale
    ("gray", "gray.png", (50, 37), "L", (4, 2, 64, 512)),
    ("rgba", "rgba.png", (36, 28), "RGBA", DEFAULT),
    ("la", "la.png", (20, 20), "LA", (4, 2, 16, 512)),
    ("palette", "palette.png", (20, 20), "P", (4, 2, 16, 512)),  # palette with tRNS
    ("gray16", "gray16.png", (16, 16), "I;16", (4, 2, 16384, 512)),
    ("photo", "photo.jpg", (48, 40), "RGB", (8, 2, 16384, 512)),  # JPEG 4:2:0, quality 90
]


def content(w, h, seed):
    """Deterministic test picture [h, w, 3] uint8: gradients, stripes, a disc, noise."""
    import numpy as np

    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    r = 255 * x / max(w - 1, 1)
    g = 255 * y / max(h - 1, 1)
    b = 127.5 + 127.5 * np.sin(x * 0.9) * np.cos(y * 0.45)
    disc = (x - w * 0.6) ** 2 + (y - h * 0.4) ** 2 < (min(w, h) * 0.25) ** 2
    img = np.stack([r, g, b], -1)
    img[disc] = [250, 20, 60]
    img[:, ::7] = 255 - img[:, ::7]  # sharp stripes: ringing and overshoot in the filters
    rng = np.random.default_rng(seed)
    img += rng.normal(0, 12, img.shape)
    return np.clip(np.round(img), 0, 255).astype(np.uint8)


def make_image(name, size, mode, seed):
    import numpy as np
    from PIL import Image

    w, h = size
    rgb = content(w, h, seed)
    if mode == "RGB":
        return Image.fromarray(rgb, "RGB")
    if mode == "L":
        return Image.fromarray(rgb, "RGB").convert("L")
    alpha = np.clip(np.round(255 * np.linspace(0, 1, w)[None, :] * np.ones((h, 1))), 0, 255)
    alpha = alpha.astype(np.uint8)
    alpha[: h // 3] = 255  # opaque, translucent and fully transparent pixels
    alpha[:, : w // 5] = 0
    if mode == "RGBA":
        return Image.fromarray(np.dstack([rgb, alpha]), "RGBA")
    if mode == "LA":
        gray = np.array(Image.fromarray(rgb, "RGB").convert("L"))
        return Image.fromarray(np.dstack([gray, alpha]), "LA")
    if mode == "P":
        p = Image.fromarray(rgb, "RGB").quantize(colors=16, dither=Image.Dither.NONE)
        p.info["transparency"] = 3  # palette entry 3 transparent (tRNS)
        return p
    if mode == "I;16":
        v = (np.arange(w * h, dtype=np.uint32).reshape(h, w) * 997 % 1024).astype(np.uint16)
        v[: h // 2] //= 8  # half the values below 256: I;16 -> L clips the rest to 255
        return Image.fromarray(v)  # uint16 -> I;16
    raise ValueError(mode)


def save(img, path):
    if path.suffix == ".jpg":
        img.save(path, "JPEG", quality=90, subsampling=2)  # 4:2:0
    elif img.mode == "P":
        img.save(path, "PNG", transparency=img.info["transparency"], optimize=False)
    else:
        img.save(path, "PNG", optimize=False)


def main():
    refenv.ensure_pinned(__file__)
    import importlib.util

    if importlib.util.find_spec("torchvision") is None:
        refenv.ensure_package(__file__, "torchvision")

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(ROOT / "tests/fixtures/images"))
    args = ap.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    import numpy as np
    import torch
    import torchvision
    import transformers
    from PIL import Image
    from safetensors.torch import save_file
    from torchvision.transforms.v2 import functional as tvF
    from transformers.image_transforms import convert_to_rgb
    from transformers.models.kimi_k25.image_processing_kimi_k25 import Kimi_K25ImageProcessor

    tensors = {}
    for seed, (name, fname, size, mode, (patch, merge, max_patches, max_side)) in enumerate(CASES):
        path = out / fname
        save(make_image(name, size, mode, seed), path)
        with Image.open(path) as im:  # what a caller passes: the decoded file
            im.load()
            proc = Kimi_K25ImageProcessor(
                patch_size=patch, merge_size=merge, max_patches=max_patches,
                size={"max_height": max_side, "max_width": max_side})
            res = proc(images=[im], return_tensors="pt")
            rgb = convert_to_rgb(im, return_numpy=True)
        pv = res["pixel_values"].to(torch.float32)
        assert pv.dim() == 4 and pv.shape[1:] == (3, patch, patch), pv.shape
        grid = res["image_grid_thw"][0].to(torch.int64)
        assert int(grid.prod()) == pv.shape[0]
        tensors[f"{name}.pixel_values"] = pv.reshape(pv.shape[0], -1).contiguous()
        tensors[f"{name}.grid"] = grid.contiguous()
        tensors[f"{name}.options"] = torch.tensor([patch, merge, max_patches, max_side])
        tensors[f"{name}.rgb"] = torch.from_numpy(np.ascontiguousarray(rgb, dtype=np.uint8))
        print(f"{name:10s} {mode:5s} {size[0]}x{size[1]} -> grid {grid.tolist()}, "
              f"{path.stat().st_size} bytes")

    # The resampler alone: an upscale (the processor never upscales) and an uneven downscale.
    base = torch.from_numpy(content(23, 17, 100)).permute(2, 0, 1).contiguous()
    for name, hw in [("resize_up", (41, 57)), ("resize_down", (7, 10))]:
        res = tvF.resize(base, list(hw), interpolation=tvF.InterpolationMode.BICUBIC,
                         antialias=True)
        tensors[f"{name}.output"] = res.contiguous()
    tensors["resize.input"] = base

    # Formats the decoder must refuse.
    small = make_image("x", (4, 3), "RGB", 7)
    small.save(out / "tiny.gif", "GIF")
    small.save(out / "tiny.bmp", "BMP")

    meta = {"fixture": f"image_fixtures.py; transformers {transformers.__version__}, torch "
                       f"{torch.__version__.split('+')[0]}, torchvision "
                       f"{torchvision.__version__.split('+')[0]}, pillow {Image.__version__}"}
    save_file(tensors, out / "processor.safetensors", metadata=meta)
    total = sum(p.stat().st_size for p in out.iterdir())
    print(f"wrote {out} ({total} bytes)")


if __name__ == "__main__":
    main()
