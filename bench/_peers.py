"""Drivers for the peers suffixspec is benchmarked against.

Contract
--------
- ``arctic_available() -> (bool, reason)``: whether the arctic-inference python
  (``$SUFFIXSPEC_ARCTIC_PYTHON``, default ``/work/arctic/venv/bin/python``) exists and can
  import ``arctic_inference.suffix_decoding``.
- ``arctic_build_bench(token_arrays, repeats=3, max_tree_depth=64, timeout=1800) -> dict | None``:
  in the arctic python (a subprocess; arrays passed as .npy files in a temp dir, results as JSON
  on stdout) times ``SuffixDecodingCache(max_tree_depth).start_request(0, arr)`` for each int32
  array, a fresh cache per repeat, best of ``repeats``. Returns ``{"peer", "version",
  "max_tree_depth", "repeats", "results": [{"n_tokens", "seconds" (all repeats),
  "best_seconds", "tokens_per_s", "estimate_memory_bytes", "bytes_per_token",
  "rss_delta_bytes"}, ...]}``, or ``None`` (with a ``RuntimeWarning`` giving the reason) when
  arctic is unavailable. ``estimate_memory_bytes`` is arctic's own ``SuffixTree.estimate_memory()``
  summed over the request's local tree and the (empty) global tree; ``rss_delta_bytes`` is the
  resident-set growth over the first repeat (after ``malloc_trim``), a rough cross-check.
- ``vllm_ngram_propose(context, budget, nmin=2, nmax=5) -> int32 array`` and
  ``prompt_lookup_propose(context, budget, max_ngram=3) -> int32 array``: pure-numpy
  re-implementations (written from reading the sources, not copied) of vLLM's v1
  ``NgramProposer`` and transformers' ``PromptLookupCandidateGenerator``. Empty array = no draft.

Both n-gram rules reduce to one: take the largest n in [nmin, nmax] such that the last n tokens
of ``context`` also occur ending strictly before the last position (overlap with the suffix
allowed); take the EARLIEST such occurrence; propose up to ``budget`` tokens that follow it.
- vLLM (``vllm/v1/spec_decode/ngram_proposer.py``, KMP over the reversed context, keeping the
  latest reversed position on ties = earliest original one): nmin=prompt_lookup_min,
  nmax=prompt_lookup_max; the ``max_model_len`` clamp of k is not modelled.
- transformers 5.24 (``generation/candidate_generator.py``): ngram sizes from
  ``min(max_matching_ngram_size, len-1)`` down to 1, ``unfold`` sliding windows, the first
  window (left to right) with at least one token after it; so nmin=1, nmax=max_ngram
  (HF's own default is 2). Its ``max_length`` clamp, logits-processor filtering and EOS
  truncation are not modelled.
Each call costs O(len(context)) (one vectorised comparison plus filtering of candidates).

arctic-inference build (worked on 2025-11-30, Linux x86_64, CPython 3.11.7, no CUDA, ~12 s)
--------------------------------------------------------------------------------------------
arctic-inference 0.3.0 is sdist-only; its ``setup.py`` does ``import torch`` at top level (used
only for ``torch.utils.cmake_prefix_path`` and a CUDA check, neither needed by the
``suffix_decoding._C`` nanobind extension) and its build requirements ask for torch>=2.10.
Instead of installing torch, a 7-line stand-in module is put on PYTHONPATH for the build::

    python -m venv /work/arctic/venv
    /work/arctic/venv/bin/pip install numpy setuptools wheel ninja cmake nanobind==2.9.2 \\
        protobuf==5.29.6 grpcio-tools
    mkdir -p /work/arctic/torchshim/torch && cat > /work/arctic/torchshim/torch/__init__.py <<'EOF'
    import types
    utils = types.SimpleNamespace(cmake_prefix_path="")
    cuda = types.SimpleNamespace(is_available=lambda: False)
    __version__ = "0.0.0+shim"
    EOF
    export PATH=/work/arctic/venv/bin:$PATH
    PYTHONPATH=/work/arctic/torchshim \\
    CMAKE_ARGS=-DPython_EXECUTABLE=/work/arctic/venv/bin/python \\
        pip install --no-build-isolation --no-deps arctic-inference==0.3.0

At run time ``arctic_inference.suffix_decoding`` needs only numpy (no torch); the stand-in is
not on the runtime path. Native API: ``_C.SuffixTree(max_depth)`` with ``extend(seq_id, list)``,
``extend_ndarray(seq_id, int32 array)``, ``speculate[_ndarray](context, max_spec_tokens,
max_spec_factor, max_spec_offset, min_token_prob, use_tree_spec) -> Draft``, ``remove(seq_id)``,
``num_seqs()``, ``check_integrity()``, ``estimate_memory()``. Python wrapper
``SuffixDecodingCache(max_tree_depth=64, max_cached_requests=-1)`` with
``start_request(req_id, prompt_token_ids)`` (builds a per-request local tree over the prompt),
``add_active_response(req_id, token_ids)`` (extends local tree and the global response tree),
``stop_request(req_id)``, ``evict_cached_response(req_id)``, ``speculate(req_id, context,
max_spec_tokens=None, max_spec_factor=1.0, max_spec_offset=0.0, min_token_prob=0.1,
use_tree_spec=False) -> SuffixDecodingDraft(token_ids, parents, probs, score, match_len)``; the
cache itself has no ``estimate_memory`` (use ``cache._local_trees[id]`` / ``cache._global_tree``).
Quirks in 0.3.0: ``speculate`` with ``max_spec_tokens=None`` raises AttributeError (it reads a
nonexistent ``self.max_depth``), so always pass it; ``estimate_memory()`` counts each stored
token as ``sizeof(std::vector<int32_t>)`` = 24 bytes instead of 4, overstating by ~20 B/token,
hence the RSS cross-check.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import warnings
from pathlib import Path

import numpy as np

ARCTIC_PYTHON_DEFAULT = "/work/arctic/venv/bin/python"


def arctic_python() -> str:
    return os.environ.get("SUFFIXSPEC_ARCTIC_PYTHON", ARCTIC_PYTHON_DEFAULT)


def arctic_available() -> tuple[bool, str]:
    py = arctic_python()
    if not Path(py).is_file():
        return False, f"arctic python not found at {py} (set SUFFIXSPEC_ARCTIC_PYTHON)"
    r = subprocess.run([py, "-c", "import arctic_inference.suffix_decoding"], capture_output=True, text=True)
    if r.returncode != 0:
        return False, f"{py} cannot import arctic_inference.suffix_decoding: {r.stderr.strip()[-300:]}"
    return True, "ok"


# Runs inside the arctic venv: argv = dir with 0.npy..k.npy, n arrays, repeats, max_tree_depth.
_ARCTIC_BUILD_SCRIPT = r"""
import ctypes, gc, json, os, sys, time
import importlib.metadata as md
import numpy as np
from arctic_inference.suffix_decoding import SuffixDecodingCache

d, n, repeats, depth = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
page = os.sysconf("SC_PAGE_SIZE")
try:
    trim = ctypes.CDLL("libc.so.6").malloc_trim
except OSError:
    trim = lambda _: 0

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * page

results = []
for i in range(n):
    arr = np.ascontiguousarray(np.load(os.path.join(d, f"{i}.npy")), dtype=np.int32)
    secs, mem, rss_delta = [], None, None
    for r in range(repeats):
        gc.collect(); trim(0)
        before = rss()
        cache = SuffixDecodingCache(max_tree_depth=depth)
        t0 = time.perf_counter()
        cache.start_request(0, arr)
        secs.append(time.perf_counter() - t0)
        if r == 0:
            rss_delta = rss() - before
            mem = cache._local_trees[0].estimate_memory() + cache._global_tree.estimate_memory()
        cache.stop_request(0)
        del cache
    best = min(secs)
    results.append(dict(n_tokens=len(arr), seconds=secs, best_seconds=best,
                        tokens_per_s=len(arr) / best if best > 0 else None,
                        estimate_memory_bytes=mem, bytes_per_token=mem / max(len(arr), 1),
                        rss_delta_bytes=rss_delta))
print(json.dumps(dict(peer="arctic-inference", version=md.version("arctic_inference"),
                      max_tree_depth=depth, repeats=repeats, results=results)))
"""


def arctic_build_bench(token_arrays: list[np.ndarray], repeats: int = 3, max_tree_depth: int = 64,
                       timeout: float = 1800) -> dict | None:
    ok, reason = arctic_available()
    if not ok:
        warnings.warn(f"arctic_build_bench skipped: {reason}", RuntimeWarning, stacklevel=2)
        return None
    with tempfile.TemporaryDirectory(prefix="suffixspec-arctic-") as d:
        for i, a in enumerate(token_arrays):
            np.save(os.path.join(d, f"{i}.npy"), np.ascontiguousarray(a, dtype=np.int32))
        script = os.path.join(d, "bench.py")
        Path(script).write_text(_ARCTIC_BUILD_SCRIPT)
        r = subprocess.run([arctic_python(), script, d, str(len(token_arrays)), str(int(repeats)),
                            str(int(max_tree_depth))], capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"arctic bench failed (rc={r.returncode}): {r.stderr.strip()[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def _earliest_longest_suffix_match(ctx: np.ndarray, nmin: int, nmax: int) -> int:
    """End index e (< len-1) of the earliest occurrence of the longest n-suffix, n in [nmin, nmax]; -1 if none."""
    L = len(ctx)
    if L < 2 or nmax < 1 or nmax < nmin:
        return -1
    ends = np.flatnonzero(ctx[:-1] == ctx[-1])  # ascending, candidate end positions
    lens = np.ones(len(ends), dtype=np.int64)
    alive = np.arange(len(ends))
    for j in range(1, nmax):
        pos = ends[alive] - j
        ok = pos >= 0
        ok[ok] = ctx[pos[ok]] == ctx[L - 1 - j]
        alive = alive[ok]
        if alive.size == 0:
            break
        lens[alive] += 1
    if lens.size == 0:
        return -1
    best = int(lens.max())
    if best < max(nmin, 1):
        return -1
    return int(ends[int(np.argmax(lens == best))])


def _propose(context, budget: int, nmin: int, nmax: int) -> np.ndarray:
    ctx = np.ascontiguousarray(context, dtype=np.int32)
    if budget <= 0:
        return np.zeros(0, dtype=np.int32)
    e = _earliest_longest_suffix_match(ctx, nmin, nmax)
    if e < 0:
        return np.zeros(0, dtype=np.int32)
    return ctx[e + 1:e + 1 + budget].copy()


def vllm_ngram_propose(context: np.ndarray, budget: int, nmin: int = 2, nmax: int = 5) -> np.ndarray:
    """vLLM v1 NgramProposer rule (prompt_lookup_min=nmin, prompt_lookup_max=nmax, k=budget)."""
    return _propose(context, budget, nmin, nmax)


def prompt_lookup_propose(context: np.ndarray, budget: int, max_ngram: int = 3) -> np.ndarray:
    """transformers PromptLookupCandidateGenerator rule (max_matching_ngram_size=max_ngram,
    num_output_tokens=budget)."""
    return _propose(context, budget, 1, max_ngram)
