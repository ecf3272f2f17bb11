"""The Python environment of the reference scripts (imported by each of them).

Each script calls one of these first thing. When the running interpreter lacks what the script
needs, they create the virtualenv tools/reference/.venv (or $MYRIAD_REF_VENV), install into it
and re-execute the script there, once.
"""
import importlib.metadata
import importlib.util
import os
import pathlib
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
REQUIREMENTS = HERE / "requirements.txt"
_REEXEC = "MYRIAD_REF_REEXEC"


def pinned():
    """{package: version} of requirements.txt."""
    req = {}
    for line in REQUIREMENTS.read_text().splitlines():
        if "==" in line and not line.lstrip().startswith("#"):
            name, ver = line.strip().split("==")
            req[name] = ver
    return req


def _venv():
    venv = pathlib.Path(os.environ.get("MYRIAD_REF_VENV", HERE / ".venv"))
    return venv, venv / "bin" / "python"


def _reexec(script, py):
    os.execve(str(py), [str(py), script, *sys.argv[1:]], {**os.environ, _REEXEC: "1"})


def ensure_pinned(script):
    """torch / transformers / safetensors as requirements.txt pins them (transformers exactly).
    An existing virtualenv is used as it is, never modified."""
    req = pinned()
    try:
        ok = all(importlib.metadata.version(n) for n in req)
        ok = ok and importlib.metadata.version("transformers") == req["transformers"]
    except importlib.metadata.PackageNotFoundError:
        ok = False
    if ok:
        return
    venv, py = _venv()
    if os.environ.get(_REEXEC):
        want = ", ".join(f"{n}=={v}" for n, v in req.items())
        sys.exit(f"{pathlib.Path(script).name}: {venv} lacks {want} (remove it to have it recreated)")
    if not py.exists():
        subprocess.check_call([sys.executable, "-m", "venv", str(venv)])
        subprocess.check_call([str(py), "-m", "pip", "install", "--quiet", "--upgrade", "pip"])
        subprocess.check_call([str(py), "-m", "pip", "install", "--quiet", "-r", str(REQUIREMENTS)])
    _reexec(script, py)


def ensure_package(script, package):
    """An unpinned package (e.g. tensorboard, openai), installed into the virtualenv if missing."""
    ensure_packages(script, [package])


def ensure_packages(script, packages):
    """Unpinned packages, the missing ones installed into the virtualenv in one go (then the
    script runs again there, once)."""
    missing = [p for p in packages if importlib.util.find_spec(p) is None]
    if not missing:
        return
    venv, py = _venv()
    if os.environ.get(_REEXEC):
        sys.exit(f"{pathlib.Path(script).name}: {', '.join(missing)} still missing after installing")
    if not py.exists():
        subprocess.check_call([sys.executable, "-m", "venv", str(venv)])
    subprocess.check_call([str(py), "-m", "pip", "install", "-q", *missing])
    _reexec(script, py)
