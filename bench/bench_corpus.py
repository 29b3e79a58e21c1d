"""Corpus index benchmark: build throughput, bytes per token, open time, query latency.

    python bench/bench_corpus.py [--tokens 12000000] [--jobs 2] [--shard-tokens 6000000] [--queries 2000]
                                 [--single-core-tokens 2000000] [--repeats 3] [--build-only] [--no-peers] [--keep DIR]
                                 [--stdlibs DIR,DIR,...] [--arctic-python PATH] [--record [PATH]]

Data: the `*.py` files of Python standard libraries (site-packages excluded; sorted paths, until
--tokens): the folders given by `--stdlibs` or $SUFFIXSPEC_BENCH_STDLIBS (comma-separated, in that
order), else those of a pyenv root ($PYENV_ROOT, else ~/.pyenv: versions/3.1*/lib/python3.1*,
newest version first); with none found the script stops and says so. One document per
file tagged repo=python3.X and pkg=<top-level module>, tokenized with the default tokenizer
and cached under bench/.cache/. Queries: 32-token contexts cut at random positions of random
documents (so the match is long and rare, as when a model repeats its corpus) and 32-token
contexts whose last token is replaced (a broken match); restricted to one Python version
(large subset) and to one package of one version (small subset: contexts from its own
documents, as for a completion request filtered to its repository, and "foreign" contexts
from random documents, which make the restricted match walk up many suffix links). With a python that
has arctic-inference (`--arctic-python PATH` or $SUFFIXSPEC_ARCTIC_PYTHON, bench/_peers.py), its insert
throughput and estimate_memory() on a prefix of the same tokens; without one the JSON line's `arctic`
says why. The one-core build also reports seconds per build phase (`single_core_<phase>_s`:
automaton, freeze, counts, checksums, write (unmapping, the writeback started), sync (the fsync of each
shard when the build finishes); `other` is the rest of its wall time).
Build figures time `build_index` from token ids (Documents) to index files written and fsynced;
tokenizing is not part of them (the corpus is tokenized once and cached: `tokenize_or_load_s`).
The first one-core build in the process loads the compiled kernels from numba's cache (or
compiles them), a once-per-process cost that does not grow with the corpus: it is reported apart
(`single_core_first_tokens_per_s`, and `single_core_first_extra_s`, its wall time over the median
build's). Then the multi-job build and the one-core build run `--repeats` times each, warm (the
workers fork from the warm process): medians, with their ranges. The per-core figure divides by
the workers that built a shard (`workers`: at most one per shard), so it counts a worker left
idle by the last shard; `build_tokens_per_worker_s` divides by the seconds the workers spent
building their shards (summed), which does not.
Open figures: `open_ms_first` is the first open of the index in this process (it checks that every
token id of the text and edges is inside the vocabulary, one pass over those arrays); the median and
maximum are over 7 opens, where files already checked and unchanged are not checked again.
`first_restricted_query_ms`: the first document-restricted query, which computes each shard's
occurrence layout (format 2 does not store it); the restricted latencies come after it.
Prints a table, then one JSON line last (`--record`: also appended to bench/results/corpus.jsonl
with the date, host and git revision).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import tempfile
import time
import zlib
from pathlib import Path

import _peers
import numpy as np

import common

CACHE = common.CACHE
STDLIBS_ENV = "SUFFIXSPEC_BENCH_STDLIBS"


def stdlib_roots(flag: str | None) -> list[str]:
    """The standard-library folders to read: `--stdlibs`, else $SUFFIXSPEC_BENCH_STDLIBS, else a pyenv root's."""
    given = common.given(flag, STDLIBS_ENV)
    if given:
        roots = [r for r in given.split(",") if r]
    else:
        pyenv = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
        roots = sorted(glob.glob(str(pyenv / "3.1*" / "lib" / "python3.1*")), key=lambda p: int(p.rsplit(".", 1)[1]),
                       reverse=True)
    missing = [r for r in roots if not Path(r).is_dir()]
    if not roots or missing:
        raise SystemExit(f"bench_corpus: no standard library folders{' at ' + ', '.join(missing) if missing else ''}: "
                         f"pass --stdlibs DIR,DIR,... or set {STDLIBS_ENV} (default: $PYENV_ROOT or ~/.pyenv "
                         "versions/3.1*/lib/python3.1*)")
    return roots


def stdlib_corpus(tokenizer, limit, roots):
    fp = tokenizer.fingerprint[:16]
    key = zlib.crc32("\n".join(roots).encode())
    path = CACHE / f"corpus_pythons_{fp}_{limit}_{key:08x}.npz"
    if path.exists():
        z = np.load(path, allow_pickle=False)
        return z["tokens"], z["offsets"], json.loads(str(z["meta"]))
    parts, meta, n = [], [], 0
    for root in roots:
        version = Path(root).name
        files = sorted(p for p in Path(root).rglob("*.py") if "site-packages" not in p.parts and "__pycache__" not in p.parts)
        for i in range(0, len(files), 256):
            batch = files[i:i + 256]
            texts = []
            for f in batch:
                try:
                    texts.append(f.read_text(encoding="utf-8"))
                except (UnicodeDecodeError, OSError):
                    texts.append("")
            for f, ids in zip(batch, tokenizer.encode_batch(texts)):
                if ids:
                    rel = f.relative_to(root)
                    parts.append(np.asarray(ids, np.int32))
                    meta.append([f"{version}/{rel}", version, rel.parts[0].removesuffix(".py")])
                    n += len(ids)
            if n >= limit:
                break
        if n >= limit:
            break
    offsets = np.zeros(len(parts) + 1, np.int64)
    np.cumsum([len(p) for p in parts], out=offsets[1:])
    tokens = np.concatenate(parts)
    CACHE.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp.npz")
    np.savez(tmp, tokens=tokens, offsets=offsets, meta=np.array(json.dumps(meta)))
    os.replace(tmp, path)
    return tokens, offsets, meta


class _Done(Exception):
    pass


def pct(xs, q):
    return float(np.percentile(np.asarray(xs), q))


def time_queries(ix, contexts, subset, k):
    ix.query(contexts[0], subset, k=k)  # compile / warm
    out = []
    for c in contexts:
        t = time.perf_counter()
        ix.query(c, subset, k=k)
        out.append((time.perf_counter() - t) * 1e6)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=12_000_000)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--shard-tokens", type=int, default=6_000_000)
    ap.add_argument("--queries", type=int, default=2000)
    ap.add_argument("--k", type=int, default=4096)
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--single-core-tokens", type=int, default=2_000_000, help="tokens of the one-shard, one-core build")
    ap.add_argument("--repeats", type=int, default=3, help="timed builds of each kind, after the first (median and range)")
    ap.add_argument("--build-only", action="store_true", help="skip the query latencies (build, size and open figures only)")
    ap.add_argument("--keep", default=None, metavar="DIR", help="keep the built index at DIR/stdlib.idx")
    ap.add_argument("--stdlibs", default=None, metavar="DIR,DIR,...",
                    help=f"standard-library folders to index (default: ${STDLIBS_ENV}, else the pyenv root's)")
    _peers.add_arctic_flag(ap)
    common.add_record_flag(ap)
    args = ap.parse_args()
    if args.repeats < 1:
        ap.error(f"--repeats must be at least 1, got {args.repeats}")
    roots = stdlib_roots(args.stdlibs)

    from suffixspec.corpus import CorpusIndex, Document, build_index
    from suffixspec.tokenizer import load_tokenizer

    tok = load_tokenizer()
    t = time.perf_counter()
    tokens, offsets, meta = stdlib_corpus(tok, args.tokens, roots)
    t_data = time.perf_counter() - t
    n_docs = len(meta)
    docs = [Document(tokens[offsets[i]:offsets[i + 1]], meta[i][0], {"repo": meta[i][1], "pkg": meta[i][2]}) for i in range(n_docs)]
    work = Path(tempfile.mkdtemp(prefix="bench_corpus_", dir=CACHE if CACHE.exists() else None))
    try:
        out = work / "stdlib.idx"
        # one shard on one core, for the per-core figure
        sub_docs, m = [], 0
        for d in docs:
            if m >= args.single_core_tokens:
                break
            sub_docs.append(d)
            m += len(d.tokens)

        def one_core(i):
            t = time.perf_counter()
            s = build_index(sub_docs, work / f"one{i}.idx", tokenizer=tok, shard_tokens=10**9, jobs=1)
            wall = time.perf_counter() - t
            shutil.rmtree(work / f"one{i}.idx")
            return wall, s

        # the first build in this process loads (or compiles) the kernels: reported apart, then every
        # timed build runs warm (the multi-job build's workers fork from this warm process)
        first_s, _ = one_core(0)
        builds = []
        for i in range(args.repeats):
            if out.exists():
                shutil.rmtree(out)
            t = time.perf_counter()
            stats = build_index(docs, out, tokenizer=tok, shard_tokens=args.shard_tokens, jobs=args.jobs)
            builds.append((time.perf_counter() - t, sum(stats.phases.values())))
        ones = sorted((one_core(i + 1) for i in range(args.repeats)), key=lambda r: r[0])
        one_s, s1 = ones[len(ones) // 2]  # the median build, with its phases
        build_s = float(np.median([b[0] for b in builds]))
        busy_s = float(np.median([b[1] for b in builds]))  # the workers' own build seconds, summed over shards
        n = stats.n_tokens
        workers = min(args.jobs, stats.n_shards)  # a shard is built by one worker: more jobs than shards idle

        opens = []
        for _ in range(7):
            t = time.perf_counter()
            ix = CorpusIndex.open(out, tokenizer=tok)
            opens.append((time.perf_counter() - t) * 1e3)
        t = time.perf_counter()
        ix.verify()
        verify_s = time.perf_counter() - t

        result = {
            "n_tokens": n, "n_documents": stats.n_documents, "n_shards": stats.n_shards, "jobs": args.jobs,
            "tokenize_or_load_s": round(t_data, 2),
            "repeats": args.repeats, "workers": workers,
            "build_s": round(build_s, 2), "build_s_range": [round(min(b[0] for b in builds), 2), round(max(b[0] for b in builds), 2)],
            "build_tokens_per_s": round(n / build_s), "build_tokens_per_s_per_core": round(n / build_s / workers),
            "build_worker_s": round(busy_s, 2), "build_tokens_per_worker_s": round(n / busy_s),
            "single_shard_tokens": s1.n_tokens, "single_core_tokens_per_s": round(s1.n_tokens / one_s),
            "single_core_tokens_per_s_range": [round(s1.n_tokens / ones[-1][0]), round(s1.n_tokens / ones[0][0])],
            "single_core_first_tokens_per_s": round(s1.n_tokens / first_s),
            "single_core_first_extra_s": round(first_s - one_s, 3),
            "bytes_on_disk": stats.bytes_on_disk, "bytes_per_token": round(stats.bytes_on_disk / n, 2),
            "open_ms_first": round(opens[0], 3),  # the first open in a process checks every token id's range
            "open_ms_median": round(float(np.median(opens)), 3), "open_ms_max": round(max(opens), 3),
            "verify_s": round(verify_s, 2),
        }
        # seconds per build phase of the one-core build, and its remainder (input cutting, pool, rename, manifest)
        for name, v in s1.phases.items():
            result[f"single_core_{name}_s"] = round(v, 3)
        result["single_core_other_s"] = round(one_s - sum(s1.phases.values()), 3)
        if args.build_only:
            raise _Done
        versions = sorted({m_[1] for m_ in meta})
        big = ix.subset(tags={"repo": versions[-1]})
        t = time.perf_counter()
        ix.query(tokens[:32], big, k=args.k)
        result["first_restricted_query_ms"] = round((time.perf_counter() - t) * 1e3, 1)
        small = ix.subset(tags={"repo": versions[-1], "pkg": "asyncio"})
        rng = np.random.default_rng(0)

        def sample_contexts(doc_ids, broken=None):
            out = []
            while len(out) < args.queries:
                d = int(doc_ids[int(rng.integers(len(doc_ids)))])
                lo, hi = int(offsets[d]), int(offsets[d + 1])
                if hi - lo < 40:
                    continue
                i = int(rng.integers(lo + 32, hi))
                out.append(np.array(tokens[i - 32:i]))
            return out

        own = sample_contexts(np.asarray(small.bitmap.to_array()))
        contexts, broken = [], []
        while len(contexts) < args.queries:
            d = int(rng.integers(n_docs))
            lo, hi = int(offsets[d]), int(offsets[d + 1])
            if hi - lo < 40:
                continue
            i = int(rng.integers(lo + 32, hi))
            c = np.array(tokens[i - 32:i])
            contexts.append(c)
            b = c.copy()
            b[-1] = int(rng.integers(tok.vocab_size))
            broken.append(b)
        lat = {
            "unrestricted": time_queries(ix, contexts, None, args.k),
            "unrestricted_broken": time_queries(ix, broken, None, args.k),
            "restricted_version": time_queries(ix, contexts, big, args.k),
            "restricted_package": time_queries(ix, own, small, args.k),
            "restricted_package_foreign": time_queries(ix, contexts, small, args.k),
            "restricted_package_broken": time_queries(ix, broken, small, args.k),
        }
        t = time.perf_counter()
        ix.subset(tags={"repo": versions[-1], "pkg": "json"})
        subset_ms = (time.perf_counter() - t) * 1e3
        est = sum(ix.query(c, small, k=args.k).estimated for c in own[:500]) / 5
        mlen = float(np.mean([ix.query(c).length for c in contexts[:500]]))
        result.update({
            "sources": versions, "subset_compile_ms": round(subset_ms, 2),
            "subset_version_docs": len(big), "subset_package_docs": len(small), "k": args.k,
            "restricted_package_estimated_pct": est, "mean_match_length": round(mlen, 1),
        })
        for name, xs in lat.items():
            result[f"{name}_p50_us"] = round(pct(xs, 50), 1)
            result[f"{name}_p99_us"] = round(pct(xs, 99), 1)
        del ix
    except _Done:
        pass
    finally:
        if args.keep:
            Path(args.keep).mkdir(parents=True, exist_ok=True)
            shutil.rmtree(Path(args.keep) / "stdlib.idx", ignore_errors=True)
            if (work / "stdlib.idx").exists():
                shutil.move(str(work / "stdlib.idx"), str(Path(args.keep) / "stdlib.idx"))
        shutil.rmtree(work, ignore_errors=True)

    if not args.no_peers and not args.build_only:
        try:
            ok, why = _peers.arctic_available(args.arctic_python)
            if ok:
                pr = _peers.arctic_build_bench([np.ascontiguousarray(tokens[:2_000_000])], repeats=1,
                                               python=args.arctic_python)
                r = pr["results"][0]
                result.update(arctic_tokens=r["n_tokens"], arctic_insert_tokens_per_s=round(r["tokens_per_s"]),
                              arctic_bytes_per_token=round(r["bytes_per_token"], 1))
            else:
                result["arctic"] = f"unavailable: {why}"
        except Exception as exc:  # optional peer
            result["arctic"] = f"failed: {exc}"

    print(f"{'metric':<40} {'value':>16}   target")
    targets = {"build_tokens_per_s_per_core": ">= 3,000,000", "single_core_tokens_per_s": ">= 3,000,000",
               "bytes_per_token": "<= 20", "open_ms_median": "<= 50 (10M tokens)",
               "restricted_package_p50_us": "<= 100", "restricted_version_p50_us": "<= 100",
               "restricted_package_foreign_p50_us": "<= 100"}
    for key, v in result.items():
        if isinstance(v, (list, dict)):
            continue
        print(f"{key:<40} {v:>16,}   {targets.get(key, '')}" if isinstance(v, (int, float)) else f"{key:<40} {v:>16}")
    common.emit(result, args, "corpus")


if __name__ == "__main__":
    main()
