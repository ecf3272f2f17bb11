#!/usr/bin/env bash
# Fetch and build llama.cpp (the peer engine) for the K3 cross-check, from the source vendored in
# the PyPI sdist of llama-cpp-python (the only route to llama.cpp from this machine).
#
#   scripts/peers/llama_cpp.sh            # idempotent; prints where things are
#
# Everything lands in build/peers/ (git-ignored). Nothing from llama.cpp is copied into the repo.
#   build/peers/llama.cpp        -> the vendored llama.cpp source (symlink into the unpacked sdist)
#   build/peers/llama-build      -> CMake build: libllama + ggml (CPU, Release, GGML_NATIVE)
#   build/peers/bin/llama_logits -> our tools/peers/llama_logits.cpp linked against libllama
#   build/peers/bin/llama_speed  -> our tools/peers/llama_speed.cpp (timing for bench_vs_llamacpp.sh)
#   build/peers/venv             -> python for convert_hf_to_gguf.py (the sdist's gguf-py on PYTHONPATH)
# Environment: LLAMA_CPP_PYTHON_VERSION (0.3.36), JOBS (1), PEERS_DIR (build/peers).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
JOBS="${JOBS:-1}"
PEERS="${PEERS_DIR:-$ROOT/build/peers}"
SDIST="$PEERS/llama_cpp_python-$VERSION.tar.gz"
SRCROOT="$PEERS/llama_cpp_python-$VERSION"
LLAMA="$PEERS/llama.cpp"
BUILD="$PEERS/llama-build"
BIN="$PEERS/bin"
VENV="$PEERS/venv"
REFVENV="$ROOT/tools/reference/.venv"

mkdir -p "$PEERS" "$BIN"
log() { printf '[llama_cpp.sh] %s\n' "$*" >&2; }

# 1. Source: the sdist vendors llama.cpp under vendor/llama.cpp.
if [[ ! -f "$SDIST" ]]; then
  log "downloading llama-cpp-python==$VERSION sdist"
  python3 -m pip download --quiet --no-deps --no-binary :all: \
    "llama-cpp-python==$VERSION" -d "$PEERS"
fi
if [[ ! -f "$SRCROOT/vendor/llama.cpp/CMakeLists.txt" ]]; then
  log "unpacking $SDIST"
  tar -xzf "$SDIST" -C "$PEERS"
fi
ln -sfn "$SRCROOT/vendor/llama.cpp" "$LLAMA"
for f in src/models/kimi-k3.cpp conversion/kimi_k3.py; do
  [[ -f "$LLAMA/$f" ]] || { log "llama-cpp-python $VERSION has no $f (no kimi-k3 support)"; exit 1; }
done

# 2. libllama + ggml, CPU only. Only the llama target (tools, tests, server, common off).
if [[ ! -f "$BUILD/CMakeCache.txt" ]]; then
  cmake -S "$LLAMA" -B "$BUILD" -G Ninja \
    -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
    -DGGML_NATIVE=ON -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DGGML_BACKEND_DL=OFF \
    -DLLAMA_BUILD_COMMON=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
    -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF >/dev/null
fi
t0=$(date +%s)
cmake --build "$BUILD" --target llama -j "$JOBS"
log "libllama build step: $(( $(date +%s) - t0 )) s (0 when up to date)"

LIBDIR="$BUILD/bin"
[[ -f "$LIBDIR/libllama.so" ]] || LIBDIR="$(dirname "$(find "$BUILD" -name 'libllama.so*' | head -1)")"

# 3. Our tools (tools/peers/*.cpp), rebuilt when the source is newer: llama_logits (logits on
#    token ids, for the K3 cross-check), llama_speed (prefill/decode timing) and llama_quantize
#    (a GGUF to q4_0 by libllama's llama_model_quantize), for scripts/bench_vs_llamacpp.sh.
for tool in llama_logits llama_speed llama_quantize; do
  TOOL_SRC="$ROOT/tools/peers/$tool.cpp"
  if [[ ! -x "$BIN/$tool" || "$TOOL_SRC" -nt "$BIN/$tool" || "$LIBDIR/libllama.so" -nt "$BIN/$tool" ]]; then
    log "compiling $tool"
    g++ -std=c++17 -O2 -o "$BIN/$tool" "$TOOL_SRC" \
      -I"$LLAMA/include" -I"$LLAMA/ggml/include" \
      -L"$LIBDIR" -Wl,-rpath,"$LIBDIR" -lllama -lggml -lggml-base
  fi
done

# 4. Python for the converter (it imports torch, transformers, numpy, sentencepiece; our driver
#    also safetensors). Reuse the reference venv (torch 2.15, transformers 5.24, safetensors)
#    through a venv that sees its site-packages; add what is missing beyond that.
if [[ ! -x "$VENV/bin/python" ]]; then
  if [[ -x "$REFVENV/bin/python" ]]; then
    base="$("$REFVENV/bin/python" -c 'import sys; print(sys.base_prefix)')"
    "$base/bin/python3" -m venv --system-site-packages "$VENV" 2>/dev/null || python3 -m venv "$VENV"
    site="$("$REFVENV/bin/python" -c 'import site; print(site.getsitepackages()[0])')"
    vsite="$("$VENV/bin/python" -c 'import site; print(site.getsitepackages()[0])')"
    echo "$site" > "$vsite/myriad-reference-venv.pth"
  else
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --index-url https://download.pytorch.org/whl/cpu torch ||
      "$VENV/bin/pip" install --quiet torch
  fi
fi
need=()
for mod in numpy torch safetensors transformers sentencepiece yaml tqdm; do
  "$VENV/bin/python" -c "import $mod" 2>/dev/null || need+=("$mod")
done
if (( ${#need[@]} )); then
  pkgs=(); for m in "${need[@]}"; do [[ $m == yaml ]] && pkgs+=(pyyaml) || pkgs+=("$m"); done
  log "pip install ${pkgs[*]} into $VENV"
  "$VENV/bin/pip" install --quiet "${pkgs[@]}"
fi
# The converter must use the sdist's gguf-py (it knows the KIMI_K3 arch), not a PyPI gguf.
vsite="$("$VENV/bin/python" -c 'import site; print(site.getsitepackages()[0])')"
echo "$LLAMA/gguf-py" > "$vsite/llama-cpp-gguf-py.pth"
"$VENV/bin/python" -c "import gguf; assert hasattr(gguf.MODEL_ARCH, 'KIMI_K3'), gguf.__file__"

cat <<EOF
llama-cpp-python $VERSION (vendored llama.cpp)
LLAMA_CPP_DIR=$LLAMA
LLAMA_CPP_CONVERT=$LLAMA/convert_hf_to_gguf.py
LLAMA_CPP_LIBDIR=$LIBDIR
LLAMA_LOGITS=$BIN/llama_logits
LLAMA_SPEED=$BIN/llama_speed
LLAMA_QUANTIZE=$BIN/llama_quantize
LLAMA_CPP_PYTHON=$VENV/bin/python
K3_TEMPLATE=$LLAMA/models/templates/Kimi-K3.jinja
EOF
