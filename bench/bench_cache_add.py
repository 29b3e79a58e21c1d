"""`ResponseCache.add` in steady state: microseconds per added document, before and after.

A default cache (`max_tokens` 2**20 in 4 generations) is filled with `--prefill` documents of
real text (standard library modules through the default BPE tokenizer, `bench/_data.py`; each
document 40-130 tokens, consecutive slices of the stream), saved with `to_bytes`; then every
repeat loads that state afresh (`from_bytes`) once per variant and times `add` of the same
`--window` next documents. Variants, in rotating order per repeat:

- "per-document": the cache as it was (its module code, replicated here): the new document built as
  a level of its own, then merged with the level before it two by two, every level built by a fresh
  `SuffixAutomaton` one `add_document` at a time, frozen, then its kernel arrays and edge records made;
- "current": `suffixspec.draft.response_cache.ResponseCache` (merges decided on sizes, one build per add, one kernel
  call over all its documents: `FrozenAutomaton.from_documents`);
- "together": the same cache given `--batch` documents at a time (`add_many`, what a server round
  whose requests finish together does), timed per call and reported per document.

The first two hold the same sources afterwards, and "together" the same documents in the same
generations (both checked). Reports per variant the median over repeats of the
mean us per add and the spread (min-max of those means), the p50 / p90 / max of single adds, and
the cost of building one document alone (`_build` of each window document). A warm-up round of
each variant runs first (kernels compiled or loaded). Prints a table, then one JSON line last.

    python bench/bench_cache_add.py [--prefill 2000] [--window 550] [--repeats 7] [--batch 16] [--record [PATH]]

`--record`: the JSON line also appended to bench/results/cache_add.jsonl with the date, host and git revision.
"""

from __future__ import annotations

import argparse
import gc
import time

import numpy as np

from suffixspec import ResponseCache, SuffixAutomaton
from suffixspec.draft import response_cache as cache_mod
from suffixspec.tokenids import as_tokens

import common


def _per_document_build(tokens, starts):
    """The cache's `_build` as it was: one `add_document` per document."""
    sam = SuffixAutomaton()
    bounds = starts.tolist() + [int(tokens.shape[0])]
    for a, b in zip(bounds[:-1], bounds[1:]):
        sam.add_document(tokens[a:b])
    fa = sam.freeze()
    fa.kernel_arrays()
    fa.edge_records()
    return fa


def _per_document_merge(levels):
    tokens = np.concatenate([fa.tokens for _, fa in levels])
    starts, base = [], 0
    for _, fa in levels:
        starts.append(np.asarray(fa.doc_starts, np.int64) + base)
        base += len(fa)
    return _per_document_build(tokens, np.concatenate(starts))


class PerDocumentCache(ResponseCache):
    """`ResponseCache.add` as it was (state, ids and file format are the current class's)."""

    def add(self, tokens) -> None:
        toks = as_tokens(tokens)
        if toks.shape[0] == 0:
            return
        with self._add_lock:
            levels = list(self._levels)
            frozen = list(self._frozen)
            levels.append((self._new_id(), _per_document_build(toks, np.zeros(1, np.int64))))
            if sum(len(fa) for _, fa in levels) >= self.generation_tokens:
                whole = levels[0][1] if len(levels) == 1 else _per_document_merge(levels)
                frozen.append((self._new_id(), whole))
                levels = []
                del frozen[: max(0, len(frozen) - (self.generations - 1))]
            else:
                while len(levels) >= 2 and len(levels[-2][1]) <= cache_mod.MERGE_RATIO * len(levels[-1][1]):
                    merged = _per_document_merge(levels[-2:])
                    levels[-2:] = [(self._new_id(), merged)]
            with self._lock:
                self._frozen, self._levels = frozen, levels
                self._version = next(cache_mod._versions)


VARIANTS = {"per-document": (PerDocumentCache, _per_document_build), "current": (ResponseCache, cache_mod._build),
            "together": (ResponseCache, cache_mod._build)}


def _documents(text, count, pos, rng):
    out = []
    for _ in range(count):
        n = int(rng.integers(40, 131))
        if pos + n > len(text):
            pos = 0
        out.append(np.ascontiguousarray(text[pos : pos + n]))
        pos += n
    return out, pos


def _time_adds(cls, blob, docs, batch=1):
    """Seconds per document: each `add`, or (`batch` > 1) each `add_many` of `batch` documents shared
    among them."""
    cache = cls.from_bytes(blob)
    gc.collect()
    times = np.empty(len(docs))
    for i in range(0, len(docs), batch):
        t0 = time.perf_counter()
        if batch == 1:
            cache.add(docs[i])
        else:
            cache.add_many(docs[i : i + batch])
        n = len(docs[i : i + batch])
        times[i : i + n] = (time.perf_counter() - t0) / n
    return times, cache


def _time_single_builds(build, docs):
    zero = np.zeros(1, np.int64)
    times = np.empty(len(docs))
    for i, d in enumerate(docs):
        t0 = time.perf_counter()
        build(d, zero)
        times[i] = time.perf_counter() - t0
    return times


def _same_sources(a, b) -> bool:
    sa, sb = a.sources()[1], b.sources()[1]
    return [g for g, _ in sa] == [g for g, _ in sb] and all(
        all(np.array_equal(x, y) for x, y in zip(fa.arrays().values(), fb.arrays().values()))
        for (_, fa), (_, fb) in zip(sa, sb))


def _same_documents(a, b) -> bool:
    """The same documents in the same generations (frozen ones each, the live one whole)."""
    def listed(cache):
        return [[d.tolist() for d in g] for g in cache.documents()]

    return listed(a) == listed(b)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prefill", type=int, default=2000, help="documents added before timing")
    ap.add_argument("--window", type=int, default=550, help="documents timed per repeat")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--max-tokens", type=int, default=1 << 20)
    ap.add_argument("--generations", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch", type=int, default=16, help="documents per add_many in the \"together\" variant")
    common.add_record_flag(ap)
    args = ap.parse_args(argv)

    from _data import stdlib_token_stream

    text = stdlib_token_stream()
    rng = np.random.default_rng(args.seed)
    prefill, pos = _documents(text, args.prefill, 0, rng)
    window, _ = _documents(text, args.window, pos, rng)
    base = ResponseCache(args.max_tokens, args.generations)
    for d in prefill:
        base.add(d)
    blob = base.to_bytes()
    state = repr(base)

    batches = {"per-document": 1, "current": 1, "together": args.batch}
    for name, (cls, build) in VARIANTS.items():  # warm-up: kernels compiled or loaded, caches touched
        _time_adds(cls, blob, window[:50], batches[name])
        _time_single_builds(build, window[:50])

    runs = {name: [] for name in VARIANTS}
    singles = {name: [] for name in VARIANTS}
    final = {}
    order = list(VARIANTS)
    for r in range(args.repeats):
        for name in order[r % len(order) :] + order[: r % len(order)]:
            cls, build = VARIANTS[name]
            times, final[name] = _time_adds(cls, blob, window, batches[name])
            runs[name].append(times)
            singles[name].append(_time_single_builds(build, window))
    same = _same_sources(final["per-document"], final["current"]) and _same_documents(final["current"], final["together"])

    rows = []
    for name in VARIANTS:
        means = np.array([t.mean() for t in runs[name]]) * 1e6
        every = np.concatenate(runs[name]) * 1e6
        single = np.array([np.median(t) for t in singles[name]]) * 1e6
        rows.append({"variant": name, "mean_us_per_add": float(np.median(means)), "spread_min_us": float(means.min()),
                     "spread_max_us": float(means.max()), "p50_us": float(np.median(every)),
                     "p90_us": float(np.percentile(every, 90)), "max_us": float(every.max()),
                     "single_build_p50_us": float(np.median(single))})
    speedup = rows[0]["mean_us_per_add"] / rows[1]["mean_us_per_add"]
    print(f"cache after prefill: {state}; {args.window} documents timed x {args.repeats} repeats; same sources: {same}")
    print(f"{'variant':>13} {'us/add (median of means)':>25} {'spread':>17} {'p50':>8} {'p90':>8} {'max':>9} "
          f"{'1-doc build p50':>16}")
    for r in rows:
        print(f"{r['variant']:>13} {r['mean_us_per_add']:>25.1f} {r['spread_min_us']:>8.1f}-{r['spread_max_us']:<8.1f} "
              f"{r['p50_us']:>8.1f} {r['p90_us']:>8.1f} {r['max_us']:>9.1f} {r['single_build_p50_us']:>16.1f}")
    together = rows[1]["mean_us_per_add"] / rows[2]["mean_us_per_add"]
    print(f"speed-up (per-document / current, mean per add): {speedup:.2f}x; "
          f"{args.batch} documents together / one by one, per document: {together:.2f}x")
    common.emit({"bench": "cache_add", "prefill": args.prefill, "window": args.window, "repeats": args.repeats,
                 "max_tokens": args.max_tokens, "generations": args.generations, "same_sources": same,
                 "speedup": speedup, "batch": args.batch, "together_speedup": together,
                 "rows": rows}, args, "cache_add")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
