#!/usr/bin/env bash
# Builds llama.cpp's `llama-server` from the source tree vendored in the llama-cpp-python sdist,
# once: the binary is cached outside the repository and reused while the version is the same.
# Prints the binary's path. The upstream-engine tests start it as a real OpenAI-compatible server.
set -euo pipefail

VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
# The flavour is in the folder's name: a binary built with other CPU flags is another build.
FLAVOUR=avx2
CACHE="${BASTION_LLAMA_SERVER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/bastion/llama-server-$VERSION-$FLAVOUR}"
BINARY="$CACHE/bin/llama-server"

if [[ -x "$BINARY" ]] && "$BINARY" --version >/dev/null 2>&1; then
    echo "$BINARY"
    exit 0
fi

PIP="${PIP:-pip}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
echo "building llama-server $VERSION into $CACHE (a few minutes, once)" >&2
"$PIP" download --quiet --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$WORK" >&2
tar -xzf "$WORK"/llama_cpp_python-"$VERSION".tar.gz -C "$WORK"
SOURCE="$WORK/llama_cpp_python-$VERSION/vendor/llama.cpp"
# AVX2, not -march=native: on a CPU with AMX, a native build takes ggml's AMX kernels,
# which crash (SIGSEGV in ggml_backend_amx_mul_mat) on SmolLM2's Q4_1 file at the first
# decode. AVX2 runs on every x86-64 CPU these machines have.
cmake -S "$SOURCE" -B "$WORK/build" -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
    -DGGML_OPENMP=OFF >&2
cmake --build "$WORK/build" --target llama-server -j "$(nproc)" >&2
mkdir -p "$CACHE/bin"
install -m 0755 "$WORK/build/bin/llama-server" "$BINARY.partial"
mv "$BINARY.partial" "$BINARY"
echo "$BINARY"
