#!/usr/bin/env bash
# Installs every Debian package Myriad needs to build, test and benchmark. Idempotent: installs
# only what is missing, so a second run costs a few dpkg queries.
set -euo pipefail
PKGS=(cmake ninja-build g++ ccache clang-format pkg-config
      libdnnl-dev ocl-icd-opencl-dev  # oneDNN's CMake config asks for OpenCL (only a Recommends)
      libgtest-dev libbenchmark-dev libcli11-dev nlohmann-json3-dev
      libsentencepiece-dev libtomlplusplus-dev zlib1g-dev libcpp-httplib-dev curl
      libpcre2-dev  # the split regexes of tiktoken and tokenizer.json BPE tokenizers
      wordnet-base dict-gcide  # the built-in training text, read at run time
      dataset-fashion-mnist libstb-dev  # the built-in images (read at run time) and the image decoder
      clang libclang-rt-14-dev libomp-dev  # the libFuzzer targets
      libopenmpi-dev openmpi-bin  # distributed training: the MPI plugin and mpirun
      python3 python3-venv)  # the test command's checks with the openai and tensorboard packages
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "install-deps: all ${#PKGS[@]} packages present"
fi
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  echo "install-deps: CUDA toolkit found; the CUDA backend will be built"
else
  echo "install-deps: no CUDA toolkit; building the CPU backend only"
fi
