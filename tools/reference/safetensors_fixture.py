#!/usr/bin/env python3
"""safetensors cross-check between Myriad and the official `safetensors` package.

  safetensors_fixture.py [OUT]        writes the tiny reference file that tests/io reads
                                      (default tests/fixtures/io/reference.safetensors)
  safetensors_fixture.py --verify F   checks a file written by Myriad's test
                                      (IoCrossCheck.WritesFileForPython, exported with
                                      MYRIAD_IO_EXPORT=F) against what that test writes

Installs torch and safetensors with pip when they are missing.
"""
import argparse
import importlib.util
import pathlib
import subprocess
import sys

for mod, pkg in (("torch", "torch"), ("safetensors", "safetensors")):
    if importlib.util.find_spec(mod) is None:
        subprocess.check_call([sys.executable, "-m", "pip", "install", "--quiet", pkg])

import torch  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]


def reference_tensors():
    """What tests/io/test_safetensors.cpp (IoFixture.*) expects to read."""
    return {
        "weight.f32": torch.tensor([[0.5, -1.25, 3.0], [1e-3, -0.0, 65504.0]], dtype=torch.float32),
        "weight.bf16": torch.tensor([1.0, -2.5, 0.0078125, 3.140625], dtype=torch.bfloat16),
        "ids.i64": torch.tensor([0, -7, 2**40 + 3], dtype=torch.int64),
        "empty.f32": torch.zeros((0, 4), dtype=torch.float32),
    }


REFERENCE_METADATA = {"format": "pt", "source": "myriad fixture"}


def cpp_written_tensors():
    """What IoCrossCheck.WritesFileForPython writes."""
    return {
        "a": (torch.arange(6, dtype=torch.float32) / 4).reshape(2, 3),
        "b": torch.tensor([-1.5, 0.25, 3.0], dtype=torch.bfloat16),
        "c": torch.tensor([1, -2, 2**40], dtype=torch.int64),
    }


CPP_METADATA = {"format": "pt", "writer": "myriad"}


def verify(path):
    got = load_file(path)
    want = cpp_written_tensors()
    assert sorted(got) == sorted(want), (sorted(got), sorted(want))
    for name, t in want.items():
        assert got[name].dtype == t.dtype and got[name].shape == t.shape, name
        assert torch.equal(got[name], t), name
    with safe_open(path, framework="pt") as f:
        assert f.metadata() == CPP_METADATA, f.metadata()
    print(f"{path}: OK ({len(got)} tensors, metadata {CPP_METADATA})")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("out", nargs="?", default=str(ROOT / "tests/fixtures/io/reference.safetensors"))
    ap.add_argument("--verify", metavar="FILE")
    args = ap.parse_args()
    if args.verify:
        verify(args.verify)
        return
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    save_file(reference_tensors(), str(out), metadata=REFERENCE_METADATA)
    back = load_file(str(out))
    for name, t in reference_tensors().items():
        assert torch.equal(back[name], t), name
    print(f"wrote {out} ({out.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
