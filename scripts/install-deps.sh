#!/usr/bin/env bash
# Installs everything dayzero needs to build and test, from Debian's packages and the npm registry.
# Idempotent and non-interactive: installs only what is missing; uses sudo only when not root.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  build-essential cmake ninja-build pkg-config git ca-certificates clang clang-format
  curl  # python/tests/test_server.py drives the server with it (it fails without it under ctest)
  libclang-rt-14-dev libfuzzer-14-dev libomp-14-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libdnnl-dev ocl-icd-opencl-dev libfmt-dev libspdlog-dev nlohmann-json3-dev libcli11-dev libcpp-httplib-dev
  libpcre2-dev libstb-dev libxxhash-dev
  libjpeg62-turbo-dev  # JPEG images (formats/jpeg_decode); the decoder Pillow uses too
  # Multi-rank runs (dist/). mpirun refuses to start, even for ranks on this one machine, unless it
  # finds an rsh agent (ssh), which openmpi-bin only recommends.
  libopenmpi-dev openmpi-bin openssh-client
  python3 python3-torch python3-numpy
  python3-pil  # the vision reference resizes with Pillow, as the published processors do
  nodejs npm
)

sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi

missing=()
for package in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$package")
  fi
done
# A machine that already has node and npm from elsewhere keeps them.
if command -v node >/dev/null && command -v npm >/dev/null; then
  missing=("${missing[@]/#nodejs/}")
  missing=("${missing[@]/#npm/}")
fi
read -r -a missing <<<"${missing[*]}"

if [ "${#missing[@]}" -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Independent tokenizer implementations the tests compare against (tests/npm/package.json).
if [ -f tests/npm/package.json ] && [ ! -d tests/npm/node_modules ]; then
  echo "install-deps: npm packages for the tokenizer comparison"
  (cd tests/npm && npm ci --no-audit --no-fund --loglevel=error)
fi
# The Jinja renderer the chat-template test compares against (tools/jinja-check/package.json).
if [ -f tools/jinja-check/package.json ] && [ ! -d tools/jinja-check/node_modules/@huggingface/jinja ]; then
  echo "install-deps: npm packages for the chat-template comparison"
  (cd tools/jinja-check && npm ci --no-audit --no-fund --loglevel=error)
fi
echo "install-deps: all dependencies present"
