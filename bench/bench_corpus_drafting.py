"""Corpus-aware drafting: acceptance with and without a stale retrieval corpus against the
context bound, on repository-context completion traces, and the proposer's latency.

Sets (`corpora/make_corpus_completion_traces.py`): `dev` (corpus: 59 standard-library modules of
CPython 3.11.7; traces: the default model's greedy completions of functions of their 3.12.1
files) and `heldout` (other modules; corpus 3.12.1, functions of 3.13.0), never tuned on. The
corpus index is built here from the files that script names (a pyenv root: $PYENV_ROOT, else
~/.pyenv; one document per file, default tokenizer).

Per set and budget (16, 64), each replayed through a fresh proposer (traces in order, the cache
of past responses on): mean committed tokens per round without and with the corpus, the context
bound without and with it (`suffixspec.draft.simulate.context_bound_mean_accepted`: per round, the
longest prefix of the rest of the output that continues some source's longest match of the context,
in the request, earlier outputs or the corpus), the ratio to the bound, and the copy-oracle (the
same without the match: any occurrence anywhere). Also acceptance without a corpus on the shipped chat and code-edit
traces, and `Session.propose` latency at budgets 16 and 64 with the corpus (`--latency-sets`, default the first set): every
proposal, first ones of each request included, over `--repeats` warmed-up replays (p50 / p99 /
max, median over repeats with their range; and over each proposal's fastest repeat, the work without
the host's preemption; Python's collections while timed), plus `Proposer.start` (the per-request set-up).

Release pairs (`corpora/make_release_pairs.py`): sets `pairs-dev` and `pairs-heldout` (projects of
PyPI, the older release's `.py` files as the corpus, functions of the newer release as requests,
their real code as the output), tokenized here with `--tokenizer` (the default's, or a GGUF such
as the code model's); the sdists are fetched into bench/.cache/sdists and checked against the
manifest.

    python bench/bench_corpus_drafting.py [--data DIR] [--repeats 3] [--sets dev,heldout] [--record [PATH]]
    python bench/bench_corpus_drafting.py --sets pairs-dev,pairs-heldout --tokenizer path/to/model.gguf
    python bench/bench_corpus_drafting.py --sets pairs-heldout,dev --latency-only --latency-sets pairs-heldout,dev

`--data` names the directory of the trace files (default: this checkout's `corpora/`), so the
script can run from another checkout (e.g. a `git worktree` of an earlier revision) on the same
data. Prints a table, then one JSON line last (`--record`: also appended to
bench/results/corpus_drafting.jsonl with the date, host and git revision).
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import sys
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np
from replay_generate import proposer_knobs

from suffixspec import Proposer
from suffixspec.corpus import CorpusIndex, Document, build_index
from suffixspec.draft.simulate import Trace, load_traces, oracle_mean_accepted, replay
from suffixspec.tokenizer import load_tokenizer

import common

try:  # the context bound is newer than some revisions this script is run from (--data)
    from suffixspec.draft.simulate import context_bound_mean_accepted
except ImportError:
    context_bound_mean_accepted = None

CACHE = common.CACHE

BUDGETS = (16, 64)
OPTIONS: dict = {}  # proposer knobs of every proposer here (`--options`)


def _builder(data: Path, script: str = "make_corpus_completion_traces"):
    spec = importlib.util.spec_from_file_location(script, data / f"{script}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[script] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def corpus_tokens(builder, name: str, tok) -> list[tuple[str, np.ndarray]]:
    """(file name, token ids) of the set's corpus files; tokenized once, kept in bench/.cache."""
    files = builder.corpus_files(name)
    key = zlib.crc32(json.dumps([[str(p), p.stat().st_size] for p in files]).encode())
    cached = CACHE / f"corpus_{name}_{key:08x}.npz"
    if cached.exists():
        with np.load(cached) as z:
            return [(p.name, z[f"d{i}"]) for i, p in enumerate(files)]
    docs = [(p.name, np.asarray(tok.encode(p.read_text(encoding="utf-8", errors="replace")), np.int32)) for p in files]
    CACHE.mkdir(parents=True, exist_ok=True)
    np.savez(cached, **{f"d{i}": d for i, (_, d) in enumerate(docs)})
    return docs


def _encode_cached(key: str, texts: list[str], tok) -> list[np.ndarray]:
    """`tok.encode` of each text, kept in bench/.cache under `key` and the tokenizer's fingerprint."""
    crc = zlib.crc32(json.dumps([tok.fingerprint, texts]).encode())
    cached = CACHE / f"{key}_{crc:08x}.npz"
    if cached.exists():
        with np.load(cached) as z:
            return [z[f"d{i}"] for i in range(len(texts))]
    ids = [np.asarray(e, np.int32) for e in tok.encode_batch(texts)]
    CACHE.mkdir(parents=True, exist_ok=True)
    np.savez(cached, **{f"d{i}": d for i, d in enumerate(ids)})
    return ids


def pair_traces(data: Path, name: str, tok) -> list[Trace]:
    """The requests of release-pair set `name` ("pairs-dev"), tokenized; `Trace.id` is the record's id."""
    rows = [json.loads(line) for line in (data / f"release_pairs_{name[6:]}.jsonl").read_text("utf-8").splitlines()
            if line.strip()]
    ids = _encode_cached(f"pairs_{name}", [r["prompt"] for r in rows] + [r["output"] for r in rows], tok)
    return [Trace(ids[i], ids[len(rows) + i], r["id"]) for i, r in enumerate(rows)]


def pair_documents(data: Path, name: str, tok) -> list[tuple[str, np.ndarray]]:
    """(document id, token ids) of release-pair set `name`'s corpus (the older releases)."""
    builder = _builder(data, "make_release_pairs")
    docs = builder.corpus_documents(name[6:], CACHE / "sdists")
    ids = _encode_cached(f"pairs_corpus_{name}", [t for _, t in docs], tok)
    return [(n, d) for (n, _), d in zip(docs, ids)]


def set_traces(data: Path, name: str, tok) -> list[Trace]:
    if name.startswith("pairs-"):
        return pair_traces(data, name, tok)
    return load_traces(data / f"corpus_completion_{name}.jsonl")


def build_corpus(data: Path, name: str, tok, where: Path) -> CorpusIndex:
    """The corpus index of set `name`, built from the files `data`'s recipe names."""
    named = pair_documents(data, name, tok) if name.startswith("pairs-") else corpus_tokens(_builder(data), name, tok)
    docs = [Document(d, id=n) for n, d in named]
    path = where / f"{name}.idx"
    build_index(docs, path, tokenizer=tok)
    return CorpusIndex.open(path)


def shards(index) -> list:
    return [s.fa for s in index.shards]


def acceptance(traces, budget, corpus=None) -> float:
    return replay(traces, Proposer(corpus=corpus, **OPTIONS), budget)["mean_accepted_tokens"]


def timed_replay(traces, budget, corpus) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Microseconds of every `propose` (and which were a request's first), and of every `start`."""
    proposer = Proposer(corpus=corpus, **OPTIONS)
    ns, first, starts = [], [], []
    for t in traces:
        t0 = time.perf_counter_ns()
        s = proposer.start(t.prompt)
        starts.append(time.perf_counter_ns() - t0)
        pos, k = 0, 0
        out = t.output
        while pos < out.shape[0]:
            t0 = time.perf_counter_ns()
            tree = s.propose(budget)
            ns.append(time.perf_counter_ns() - t0)
            first.append(k == 0)
            node = tree.longest_accepted(out[pos : pos + budget + 1]) if len(tree) else -1
            a = int(tree.depths[node]) if node >= 0 else 0
            s.extend(out[pos : pos + a + 1])
            pos += a + 1
            k += 1
        s.close()
    return np.asarray(ns) / 1e3, np.asarray(first), np.asarray(starts) / 1e3


class _GcCount:
    """Python's collections started while it is installed in `gc.callbacks` (a p99 suspect)."""

    def __init__(self):
        self.n = 0

    def __call__(self, phase, _info):
        self.n += phase == "start"

    def __enter__(self):
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc):
        gc.callbacks.remove(self)


def latency(traces, corpus, repeats: int, budget: int = 64) -> dict:
    timed_replay(traces, budget, corpus)  # warm-up: compiled kernels, caches touched
    with _GcCount() as collections:
        runs = [timed_replay(traces, budget, corpus) for _ in range(repeats)]

    def summary(pick):
        rows = [(np.percentile(v, 50), np.percentile(v, 99), v.max()) for v in (pick(r) for r in runs)]
        med = np.median(np.asarray(rows), axis=0)
        lo, hi = np.min(rows, axis=0), np.max(rows, axis=0)
        return {k: round(float(med[i]), 1) for i, k in enumerate(("p50", "p99", "max"))} | {
            f"{k}_range": [round(float(lo[i]), 1), round(float(hi[i]), 1)] for i, k in enumerate(("p50", "p99", "max"))}

    out = {"all": summary(lambda r: r[0]), "first": summary(lambda r: r[0][r[1]]),
           "start": summary(lambda r: r[2]), "proposals": int(runs[0][0].shape[0]),
           "gc_collections": collections.n}
    if len({r[0].shape[0] for r in runs}) == 1:  # the same proposals in every repeat (drafts are deterministic)
        # each proposal's fastest repeat: the work without the host's preemption, which rarely
        # strikes the same proposal twice
        fastest = np.min(np.vstack([r[0] for r in runs]), axis=0)
        out["all_fastest"] = {k: round(float(f(fastest)), 1) for k, f in
                              (("p50", lambda v: np.percentile(v, 50)), ("p99", lambda v: np.percentile(v, 99)),
                               ("max", np.max))}
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(common.CORPORA), help="folder of the trace files (default corpora/)")
    ap.add_argument("--sets", default="dev,heldout")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-latency", action="store_true")
    ap.add_argument("--latency-sets", default=None, help="sets whose proposer latency is measured (default: the first)")
    ap.add_argument("--tokenizer", default="default", help="'default' or a tokenizer file (a GGUF); "
                                                           "other than the default: release-pair sets only")
    ap.add_argument("--no-others", action="store_true", help="skip the chat and code-edit traces without a corpus")
    ap.add_argument("--latency-only", action="store_true", help="only the latency (of --latency-sets, else the first set)")
    ap.add_argument("--options", type=proposer_knobs, default={}, help='proposer knobs as JSON, e.g. \'{"recover": 0.3}\'')
    common.add_record_flag(ap)
    args = ap.parse_args(argv)
    data = Path(args.data)
    tok = load_tokenizer(args.tokenizer)
    names = args.sets.split(",")
    if args.tokenizer != "default" and not all(n.startswith("pairs-") for n in names):
        ap.error("--tokenizer other than 'default': the single-snapshot sets hold default-tokenizer ids; "
                 "give release-pair sets only (pairs-dev, pairs-heldout)")
    OPTIONS.clear()
    OPTIONS.update(args.options)
    result = {"sets": {}, "no_corpus": {}, "tokenizer": tok.name, "options": dict(OPTIONS)}
    with tempfile.TemporaryDirectory() as tmp:
        indexes = {}
        for name in names:
            index = indexes[name] = build_corpus(data, name, tok, Path(tmp))
            if args.latency_only:
                continue
            traces = set_traces(data, name, tok)
            rows = {}
            for b in BUDGETS:
                without, with_ = acceptance(traces, b), acceptance(traces, b, index)
                copy0, copy1 = oracle_mean_accepted(traces, b), oracle_mean_accepted(traces, b, shards(index))
                r = rows[b] = {"without_corpus": round(without, 3), "with_corpus": round(with_, 3),
                               "copy_oracle_without": round(copy0, 3), "copy_oracle_with": round(copy1, 3)}
                if context_bound_mean_accepted is not None:
                    bound0 = context_bound_mean_accepted(traces, b)
                    bound1 = context_bound_mean_accepted(traces, b, shards(index))
                    r.update({"bound_without": round(bound0, 3), "bound_with": round(bound1, 3),
                              "ratio_without": round(without / bound0, 3), "ratio_with": round(with_ / bound1, 3)})
            result["sets"][name] = {"traces": len(traces), "corpus_tokens": index.n_tokens,
                                    "corpus_documents": index.n_documents, "budgets": rows}
        others = {} if args.no_others or args.latency_only or args.tokenizer != "default" else {
            "chat": load_traces(data / "chat_traces_smollm2.jsonl"),
            "code_edit": load_traces(data / "code_edit_traces.jsonl", tok)}
        for name, traces in others.items():
            result["no_corpus"][name] = {b: round(acceptance(traces, b), 3) for b in BUDGETS}
        if not args.no_latency:
            lat_sets = [n for n in (args.latency_sets or names[0]).split(",") if n in indexes]
            result["latency_us"] = {name: {b: latency(set_traces(data, name, tok), indexes[name], args.repeats, b)
                                           for b in BUDGETS} for name in lat_sets}
        for index in indexes.values():
            index.close()

    print(f"{'set':8} {'budget':>6} {'without':>8} {'with':>8} {'bound w/o -> with':>18} {'ratio w/o':>9} {'ratio with':>10}"
          f" {'copy-oracle w/o -> with':>24}")
    for name, st in result["sets"].items():
        for b, r in st["budgets"].items():
            bound = (f"{r['bound_without']:>8.2f} -> {r['bound_with']:<6.2f} {r['ratio_without']:>9.2f} {r['ratio_with']:>10.2f}"
                     if "bound_with" in r else f"{'-':>18} {'-':>9} {'-':>10}")
            print(f"{name:8} {b:>6} {r['without_corpus']:>8.2f} {r['with_corpus']:>8.2f} {bound} "
                  f"{r['copy_oracle_without']:>14.2f} -> {r['copy_oracle_with']:<6.2f}")
        print(f"{'':8} corpus: {st['corpus_tokens']} tokens, {st['corpus_documents']} documents, {st['traces']} traces")
    for name, r in result["no_corpus"].items():
        print(f"{name:8} no corpus: " + ", ".join(f"budget {b}: {v:.3f}" for b, v in r.items()))
    for name, per_budget in result.get("latency_us", {}).items():
        for b, lat in per_budget.items():
            for k in ("all", "first", "start"):
                v = lat[k]
                what = "propose, all" if k == "all" else ("propose, first of a request" if k == "first" else "start")
                print(f"latency {name} b{b} {what:28} p50 {v['p50']:7.1f} us {v['p50_range']}  p99 {v['p99']:7.1f} us "
                      f"{v['p99_range']}  max {v['max']:8.1f} us {v['max_range']}")
            if "all_fastest" in lat:
                v = lat["all_fastest"]
                print(f"latency {name} b{b} {'propose, fastest repeat':28} p50 {v['p50']:7.1f} us  p99 {v['p99']:7.1f} us  "
                      f"max {v['max']:8.1f} us  (gc collections while timed: {lat['gc_collections']})")
    common.emit(result, args, "corpus_drafting")


if __name__ == "__main__":
    main()
