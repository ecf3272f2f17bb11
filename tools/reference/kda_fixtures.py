#!/usr/bin/env python3
"""Golden KDA fixtures from fla's reference implementations (MODEL.md §4).

  kda_fixtures.py [OUT_DIR]     (default tests/fixtures/kda)

For each case it draws inputs with a fixed seed, computes the gate with fla's
naive_kda_lowerbound_gate / naive_kda_gate, runs naive_recurrent_kda or naive_chunk_kda
(fla/ops/kda/naive.py, pure torch, runs on the CPU), and back-propagates
loss = sum(o * w_o) + sum(final_state * w_ht) with torch autograd. Each case is written as
<name>.bin (little-endian f32, tensors back to back) and <name>.txt, whose lines are
  tensor <name> <offset in floats> <dims...>
  scalar <name> <value>
cases.txt lists the case names. tests/ops/test_kda.cpp (Kda.MatchesFlaGoldenFixtures) reads them.

Installs torch and flash-linear-attention with pip when they are missing.
"""
import importlib.util
import pathlib
import subprocess
import sys

for mod, pkg in (("torch", "torch"), ("einops", "einops"), ("fla", "flash-linear-attention")):
    if importlib.util.find_spec(mod) is None:
        subprocess.check_call([sys.executable, "-m", "pip", "install", "--quiet", pkg])

import warnings  # noqa: E402

import torch  # noqa: E402

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # fla warns that triton falls back to the CPU
    from fla.ops.kda.gate import naive_kda_gate, naive_kda_lowerbound_gate  # noqa: E402
    from fla.ops.kda.naive import naive_chunk_kda, naive_recurrent_kda  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]

# name, B, T, H, K, V, gate (1 = lower bound, 2 = softplus), form, chunk, with h0, scale
CASES = [
    ("recurrent_bounded", 1, 13, 2, 8, 6, 1, "recurrent", 4, True, None),
    ("recurrent_softplus", 2, 21, 2, 4, 5, 2, "recurrent", 8, False, 0.7),
    ("chunk_bounded", 1, 32, 2, 16, 8, 1, "chunk", 16, True, None),
    ("chunk_softplus", 1, 32, 1, 16, 16, 2, "chunk", 16, True, None),
]


def l2norm(x):
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def make_case(name, B, T, H, K, V, gate, form, chunk, with_h0, scale, seed):
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape, std=1.0):
        return torch.randn(*shape, generator=gen, dtype=torch.float32) * std

    q = l2norm(randn(B, T, H, K))
    k = l2norm(randn(B, T, H, K))
    v = randn(B, T, H, V)
    z = randn(B, T, H * K, std=3.0 if gate == 2 else 1.0)
    dt_bias = randn(H * K, std=0.5)
    if gate == 1:
        A_log = torch.zeros(H)  # the K3 lower-bounded gate's init
        g = naive_kda_lowerbound_gate(z.view(B, T, H, K), A_log, dt_bias, lower_bound=-5.0)
    else:
        A_log = torch.log(torch.empty(H).uniform_(1.0, 16.0, generator=gen))
        g = naive_kda_gate(z.view(B, T, H, K), A_log, dt_bias)
    beta = torch.sigmoid(randn(B, T, H))
    h0 = randn(B, H, K, V, std=0.5) if with_h0 else None
    w_o = randn(B, T, H, V)
    w_ht = randn(B, H, K, V)
    scale_v = scale if scale is not None else K**-0.5

    leaves = {"q": q, "k": k, "v": v, "g": g, "beta": beta}
    if with_h0:
        leaves["h0"] = h0
    def run(form):
        xs = {n: t.clone().requires_grad_() for n, t in leaves.items()}
        fn = naive_recurrent_kda if form == "recurrent" else naive_chunk_kda
        kw = {"chunk_size": chunk} if form == "chunk" else {}
        o, ht = fn(xs["q"], xs["k"], xs["v"], xs["g"], xs["beta"], scale=scale_v,
                   initial_state=xs.get("h0"), output_final_state=True, **kw)
        ((o * w_o).sum() + (ht * w_ht).sum()).backward()
        return o, ht, xs

    o, ht, xs = run(form)
    if not all(torch.isfinite(x.grad).all() for x in xs.values()):
        # naive_chunk_kda exponentiates the unmasked upper triangle of the in-chunk decay
        # differences; with a strongly negative gate that overflows and its autograd gives NaN
        # (MODEL.md §4.7). Its forward stays finite; take the gradients from the recurrent form.
        o_r, ht_r, xs = run("recurrent")
        assert torch.allclose(o, o_r, rtol=1e-4, atol=1e-5), name
        assert torch.allclose(ht, ht_r, rtol=1e-4, atol=1e-5), name
        print(f"{name}: gradients from naive_recurrent_kda (naive_chunk_kda's are not finite)")

    tensors = dict(leaves)
    tensors.update(z=z, A_log=A_log, dt_bias=dt_bias, o=o.detach(), ht=ht.detach(), w_o=w_o,
                   w_ht=w_ht)
    for n, x in xs.items():
        tensors["d" + n] = x.grad
    scalars = {"chunk": chunk, "scale": scale_v, "gate": gate}
    return tensors, scalars


def write_case(out, name, tensors, scalars):
    lines, blobs, offset = [], [], 0
    for n, t in tensors.items():
        t = t.detach().to(torch.float32).contiguous()
        lines.append(f"tensor {n} {offset} " + " ".join(str(d) for d in t.shape))
        blobs.append(t.numpy().astype("<f4").tobytes())
        offset += t.numel()
    for n, s in scalars.items():
        lines.append(f"scalar {n} {float(s)!r}")
    (out / f"{name}.txt").write_text("\n".join(lines) + "\n")
    (out / f"{name}.bin").write_bytes(b"".join(blobs))


def main():
    out = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "tests/fixtures/kda"
    out.mkdir(parents=True, exist_ok=True)
    for i, case in enumerate(CASES):
        tensors, scalars = make_case(*case, seed=1234 + i)
        write_case(out, case[0], tensors, scalars)
    (out / "cases.txt").write_text("\n".join(c[0] for c in CASES) + "\n")
    total = sum(p.stat().st_size for p in out.iterdir())
    print(f"wrote {len(CASES)} cases to {out} ({total} bytes)")


if __name__ == "__main__":
    main()
