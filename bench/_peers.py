"""Drivers for the peers suffixspec is benchmarked against.

Contract
--------
- ``arctic_python(python=None) -> str | None``: the interpreter with arctic-inference installed:
  ``python`` (a script's ``--arctic-python PATH``), else ``$SUFFIXSPEC_ARCTIC_PYTHON``, else None
  (no default: the peer is skipped). ``add_arctic_flag(parser)`` adds ``--arctic-python``.
- ``arctic_available(python=None) -> (bool, reason)``: whether that python exists and can
  import ``arctic_inference.suffix_decoding``; the reason names the flag and the variable.
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
- ``arctic_replay_bench(traces, budgets, modes=("path", "tree"), timeout=1800) -> dict | None``:
  replays (prompt_ids, output_ids) traces in order through one ``SuffixDecodingCache(64, -1)``
  per (mode, budget), server style (start_request / speculate / add_active_response(accepted + bonus)
  / stop_request), same rules as ``suffixspec.draft.simulate.replay``; returns ``{..., mode: {str(budget):
  {"mean_accepted_tokens", "acceptance_rate", "drafted_per_round", "rounds", "speculate_us_p50",
  "speculate_us_p99", ...}}}`` or ``None``. Draft tree convention: ``parents[i] == -1`` for a child of
  the root (the context's last token), else the index ``< i`` of its parent. With max_spec_factor=1
  and max_tree_depth=64 an arctic draft is at most min(budget, match_len, 64 - match_len) <= 32
  tokens (a suffix is stored only 64 deep), so budgets above 32 change nothing.
  ``_selfcheck_arctic_replay()`` checks it against hand-computed replays.
- ``vllm_ngram_propose`` and ``prompt_lookup_propose``: the vLLM n-gram and transformers
  prompt-lookup rules, re-exported from ``suffixspec.bench.peers`` (their contract is there).

Every arctic function takes ``python=None`` (see ``arctic_python``).

arctic-inference build (arctic-inference 0.3.0, Linux x86_64, CPython 3.11.7, no CUDA)
--------------------------------------------------------------------------------------
arctic-inference 0.3.0 is sdist-only; its ``setup.py`` does ``import torch`` at top level (used
only for ``torch.utils.cmake_prefix_path`` and a CUDA check, neither needed by the
``suffix_decoding._C`` nanobind extension) and its build requirements ask for torch>=2.10.
Instead of installing torch, a 7-line stand-in module is put on PYTHONPATH for the build
(``$ARCTIC`` is any folder of yours)::

    python -m venv $ARCTIC/venv
    $ARCTIC/venv/bin/pip install numpy setuptools wheel ninja cmake nanobind==2.9.2 \\
        protobuf==5.29.6 grpcio-tools
    mkdir -p $ARCTIC/torchshim/torch && cat > $ARCTIC/torchshim/torch/__init__.py <<'EOF'
    import types
    utils = types.SimpleNamespace(cmake_prefix_path="")
    cuda = types.SimpleNamespace(is_available=lambda: False)
    __version__ = "0.0.0+shim"
    EOF
    export PATH=$ARCTIC/venv/bin:$PATH
    PYTHONPATH=$ARCTIC/torchshim \\
    CMAKE_ARGS=-DPython_EXECUTABLE=$ARCTIC/venv/bin/python \\
        pip install --no-build-isolation --no-deps arctic-inference==0.3.0
    export SUFFIXSPEC_ARCTIC_PYTHON=$ARCTIC/venv/bin/python   # or --arctic-python on each script

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

from suffixspec.bench.peers import prompt_lookup_propose, vllm_ngram_propose

__all__ = ["add_arctic_flag", "arctic_available", "arctic_build_bench", "arctic_python", "arctic_replay_bench",
           "prompt_lookup_propose", "vllm_ngram_propose"]

ARCTIC_ENV = "SUFFIXSPEC_ARCTIC_PYTHON"


def add_arctic_flag(parser) -> None:
    parser.add_argument("--arctic-python", default=None, metavar="PATH",
                        help=f"a python with arctic-inference installed (default: ${ARCTIC_ENV}; "
                             "neither: the arctic peer is skipped; bench/_peers.py tells how to build one)")


def arctic_python(python: str | None = None) -> str | None:
    return python or os.environ.get(ARCTIC_ENV) or None


def arctic_available(python: str | None = None) -> tuple[bool, str]:
    py = arctic_python(python)
    if py is None:
        return False, f"no arctic-inference python: pass --arctic-python PATH or set {ARCTIC_ENV}"
    if not Path(py).is_file():
        return False, f"arctic python not found at {py} (from --arctic-python or {ARCTIC_ENV})"
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
                       timeout: float = 1800, python: str | None = None) -> dict | None:
    ok, reason = arctic_available(python)
    if not ok:
        warnings.warn(f"arctic_build_bench skipped: {reason}", RuntimeWarning, stacklevel=2)
        return None
    with tempfile.TemporaryDirectory(prefix="suffixspec-arctic-") as d:
        for i, a in enumerate(token_arrays):
            np.save(os.path.join(d, f"{i}.npy"), np.ascontiguousarray(a, dtype=np.int32))
        script = os.path.join(d, "bench.py")
        Path(script).write_text(_ARCTIC_BUILD_SCRIPT)
        r = subprocess.run([arctic_python(python), script, d, str(len(token_arrays)), str(int(repeats)),
                            str(int(max_tree_depth))], capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"arctic bench failed (rc={r.returncode}): {r.stderr.strip()[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


# Runs inside the arctic venv: argv = npz path (p0, o0, p1, o1, ...), JSON params.
# Replays the traces in order through one SuffixDecodingCache per (mode, budget), like a server.
_ARCTIC_REPLAY_SCRIPT = r"""
import json, sys, time
import importlib.metadata as md
import numpy as np
from arctic_inference.suffix_decoding import SuffixDecodingCache

npz, params = sys.argv[1], json.loads(sys.argv[2])
data = np.load(npz)
n = params["n"]
traces = [(np.ascontiguousarray(data[f"p{i}"], dtype=np.int32),
           np.ascontiguousarray(data[f"o{i}"], dtype=np.int32)) for i in range(n)]
depth, record = params["max_tree_depth"], params["record_rounds"]
kw = dict(max_spec_factor=params["max_spec_factor"], min_token_prob=params["min_token_prob"])

def accepted_len(token_ids, parents, target):
    # Longest root path of the draft tree equal to target. parents[i] == -1: child of the root
    # (the context's last token); else the index (< i) of the parent in token_ids.
    children = {}
    for i, (t, p) in enumerate(zip(token_ids, parents)):
        children.setdefault(p, {})[t] = i
    cur, a = -1, 0
    while a < len(target):
        nxt = children.get(cur, {}).get(int(target[a]))
        if nxt is None:
            break
        cur, a = nxt, a + 1
    return a

out = dict(peer="arctic-inference", version=md.version("arctic_inference"), max_tree_depth=depth,
           max_cached_requests=-1, params=kw)
for mode in params["modes"]:
    out[mode] = {}
    for budget in params["budgets"]:
        cache = SuffixDecodingCache(max_tree_depth=depth, max_cached_requests=-1)
        rounds = drafted = accepted = total = 0
        by_position = np.zeros(budget + 1, np.int64)
        ns, log = [], []
        for rid, (prompt, output) in enumerate(traces):
            full = np.concatenate([prompt, output]).astype(np.int32)
            plen, olen, pos = len(prompt), len(output), 0
            cache.start_request(rid, prompt)
            tlog = []
            while pos < olen:
                ctx = full[:plen + pos]
                t0 = time.perf_counter_ns()
                draft = cache.speculate(rid, ctx, max_spec_tokens=budget, use_tree_spec=(mode == "tree"), **kw)
                ns.append(time.perf_counter_ns() - t0)
                ids, par = list(draft.token_ids), list(draft.parents)
                assert len(ids) <= budget and all(-1 <= p < i for i, p in enumerate(par)), (ids, par)
                a = accepted_len(ids, par, output[pos:pos + budget + 1])
                commit = output[pos:pos + a + 1]
                cache.add_active_response(rid, commit)
                by_position[1:a + 1] += 1
                drafted += len(ids); accepted += a; rounds += 1; pos += len(commit)
                if record:
                    tlog.append(dict(draft=[int(t) for t in ids], parents=[int(p) for p in par],
                                     accepted=a, committed=len(commit)))
            cache.stop_request(rid)
            total += olen
            if record:
                log.append(tlog)
        us = np.asarray(ns, dtype=np.float64) / 1e3
        last = int(np.max(np.nonzero(by_position)[0])) if by_position.any() else 0
        res = dict(mean_accepted_tokens=total / rounds if rounds else 0.0,
                   acceptance_rate=accepted / drafted if drafted else 0.0,
                   drafted_per_round=drafted / rounds if rounds else 0.0,
                   accepted_by_position=[round(float(c) / rounds, 4) for c in by_position[1:last + 1]] if rounds else [],
                   rounds=rounds, output_tokens=total, drafted_tokens=drafted, accepted_tokens=accepted,
                   speculate_us_p50=float(np.percentile(us, 50)) if len(us) else 0.0,
                   speculate_us_p99=float(np.percentile(us, 99)) if len(us) else 0.0)
        if record:
            res["rounds_log"] = log
        out[mode][str(budget)] = res
print(json.dumps(out))
"""


def arctic_replay_bench(traces: list[tuple[np.ndarray, np.ndarray]], budgets, modes=("path", "tree"),
                        timeout: float = 1800, *, max_tree_depth: int = 64, max_spec_factor: float = 1.0,
                        min_token_prob: float = 0.1, record_rounds: bool = False,
                        python: str | None = None) -> dict | None:
    """Replay (prompt_ids, output_ids) traces through arctic's SuffixDecodingCache, as a server would.

    For each mode in ``modes`` ("path" or "tree") and each budget, one
    ``SuffixDecodingCache(max_tree_depth, max_cached_requests=-1)`` (global cache on, outputs of
    finished requests stay cached) sees the traces in order: ``start_request(i, prompt)``, then
    rounds of ``speculate(i, prompt + output so far, max_spec_tokens=budget, max_spec_factor,
    min_token_prob, use_tree_spec=(mode == "tree"))``; the accepted length is the longest root path
    of the draft tree equal to the next output tokens (arctic's ``parents[i]`` is -1 for a child of
    the root, i.e. of the context's last token, else the index ``< i`` of the parent draft token; a
    path draft is the chain -1, 0, 1, ...); ``add_active_response(i, accepted + 1 bonus token)``
    (fewer at the end of the output); ``stop_request(i)`` once the output is consumed. Same rules
    as ``suffixspec.draft.simulate.replay``.

    Returns ``{"peer", "version", "max_tree_depth", "max_cached_requests", "params", mode: {str(budget):
    {"mean_accepted_tokens" (output tokens / rounds), "acceptance_rate" (accepted / drafted tokens),
    "drafted_per_round", "accepted_by_position", "rounds", "output_tokens", "drafted_tokens",
    "accepted_tokens", "speculate_us_p50", "speculate_us_p99" (one ``cache.speculate`` call, Python
    wrapper included, perf_counter_ns), ["rounds_log" per trace per round when record_rounds]}}}``,
    or ``None`` (with a ``RuntimeWarning`` giving the reason) when arctic is unavailable. ``python``:
    see ``arctic_python``.
    """
    ok, reason = arctic_available(python)
    if not ok:
        warnings.warn(f"arctic_replay_bench skipped: {reason}", RuntimeWarning, stacklevel=2)
        return None
    budgets = [int(b) for b in budgets]
    if any(b < 1 for b in budgets):
        raise ValueError(f"budgets must be positive integers, got {budgets}")
    modes = list(modes)
    if any(m not in ("path", "tree") for m in modes):
        raise ValueError(f"modes must be 'path' or 'tree', got {modes}")
    arrays = {}
    for i, (p, o) in enumerate(traces):
        arrays[f"p{i}"] = np.ascontiguousarray(p, dtype=np.int32).ravel()
        arrays[f"o{i}"] = np.ascontiguousarray(o, dtype=np.int32).ravel()
    params = dict(n=len(traces), budgets=budgets, modes=modes, max_tree_depth=int(max_tree_depth),
                  max_spec_factor=float(max_spec_factor), min_token_prob=float(min_token_prob),
                  record_rounds=bool(record_rounds))
    with tempfile.TemporaryDirectory(prefix="suffixspec-arctic-") as d:
        npz = os.path.join(d, "traces.npz")
        np.savez(npz, **arrays)
        script = os.path.join(d, "replay.py")
        Path(script).write_text(_ARCTIC_REPLAY_SCRIPT)
        r = subprocess.run([arctic_python(python), script, npz, json.dumps(params)], capture_output=True, text=True,
                           timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"arctic replay failed (rc={r.returncode}): {r.stderr.strip()[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def _selfcheck_arctic_replay(python: str | None = None) -> dict | None:
    """Check ``arctic_replay_bench`` against hand-computed replays; returns what arctic gave (None if
    arctic is unavailable). Raises AssertionError on a mismatch.

    Case 1 (both modes; no node has two children above min_token_prob, so tree == path):
    trace A = prompt [1..9], output [1..9, 1, 2, 3]; then trace B = prompt [100, 101, 102], same
    output (reached only through the global cache). The draft length is capped by
    max_spec_factor * match_len, and a match whose occurrences all end the text gives nothing.
      budget 8: A: [] (acc 0), [2] (1), [4,5,6] (3), [8,9,1,2,3,4,5] (5: the rest of the output,
                no bonus); B: [], [2] (prob 2/3 from the global tree), [4,5,6], [8,9,1,2,3]
                -> 8 rounds, 24 tokens: 3.0 per round; 20 drafted, 18 accepted.
      budget 2: A and B: [] (0), [2] (1), [4,5] (2), [7,8] (2), [1,2] (2)
                -> 10 rounds: 2.4 per round; 14 drafted, 14 accepted.
    Case 2 (tree mode, budget 3): prompt = [1..6,10,30] [1..6,10,31] [1..6,10,32] [1..6,20,21,40]
    [1..6,20,21,41] [0] [1..6], output [20, 21, 41, 7]. After [1..6] (count 6): 10 at 3/6, 20 at
    2/6; after 10 three children at 1/6 each; 20 is followed by 21 (2/6). The tree pops 10 (.5),
    20 (.33), 21 (.33): draft [10, 20, 21], parents [-1, -1, 1]; accepted 2 along the second root
    child, commit [20, 21, 41]. Then [0, 1, 2] (after ...20 21 41 came 0 in the prompt), accepted 0,
    commit [7]: 2 rounds. Path mode follows the most frequent child: its first draft starts with 10,
    accepted 0 (later rounds hinge on tie order among equal-count children, not checked).
    """
    one_to_9 = list(range(1, 10))
    out = np.array(one_to_9 + [1, 2, 3], np.int32)
    case1 = [(np.array(one_to_9, np.int32), out), (np.array([100, 101, 102], np.int32), out)]
    r1 = arctic_replay_bench(case1, [2, 8], record_rounds=True, python=python)
    if r1 is None:
        return None
    expect = {
        8: ([[[], [2], [4, 5, 6], [8, 9, 1, 2, 3, 4, 5]], [[], [2], [4, 5, 6], [8, 9, 1, 2, 3]]],
            [[0, 1, 3, 5], [0, 1, 3, 5]], dict(rounds=8, drafted_tokens=20, accepted_tokens=18)),
        2: ([[[], [2], [4, 5], [7, 8], [1, 2]]] * 2, [[0, 1, 2, 2, 2]] * 2,
            dict(rounds=10, drafted_tokens=14, accepted_tokens=14)),
    }
    for mode in ("path", "tree"):
        for b, (drafts, acc, totals) in expect.items():
            res = r1[mode][str(b)]
            log = res["rounds_log"]
            got_drafts = [[rd["draft"] for rd in t] for t in log]
            got_acc = [[rd["accepted"] for rd in t] for t in log]
            assert got_drafts == drafts, (mode, b, got_drafts)
            assert got_acc == acc, (mode, b, got_acc)
            for t in log:
                for rd in t:
                    assert rd["parents"] == list(range(-1, len(rd["draft"]) - 1)), (mode, b, rd)
            for k, v in totals.items():
                assert res[k] == v, (mode, b, k, res[k])
            assert res["output_tokens"] == 24
            assert abs(res["mean_accepted_tokens"] - 24 / totals["rounds"]) < 1e-12
            assert abs(res["acceptance_rate"] - totals["accepted_tokens"] / totals["drafted_tokens"]) < 1e-12
    u = list(range(1, 7))
    prompt = np.array(u + [10, 30] + u + [10, 31] + u + [10, 32] + u + [20, 21, 40] + u + [20, 21, 41] + [0] + u,
                      np.int32)
    r2 = arctic_replay_bench([(prompt, np.array([20, 21, 41, 7], np.int32))], [3], record_rounds=True, python=python)
    tree = r2["tree"]["3"]["rounds_log"][0]
    assert [(rd["draft"], rd["parents"], rd["accepted"], rd["committed"]) for rd in tree] == [
        ([10, 20, 21], [-1, -1, 1], 2, 3), ([0, 1, 2], [-1, 0, 1], 0, 1)], tree
    path = r2["path"]["3"]["rounds_log"][0]
    assert path[0]["draft"][0] == 10 and path[0]["parents"] == [-1, 0, 1] and path[0]["accepted"] == 0, path
    return {"case1": r1, "case2": r2}
