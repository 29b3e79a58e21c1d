"""The corpus index's encoding, before vs after, paired: bytes per token, build, `suffixspec index`
end to end, open, queries, and the proposer's drafts and latency with the index as its corpus.

    python bench/bench_corpus_compact.py --base DIR [--new DIR] [--labels BASE,NEW] [--repeats 3]
                                         [--stdlib DIR] [--traces 40] [--no-e2e] [--record [PATH]]

Arms: `base`, the `suffixspec` package under `--base DIR` (e.g. `git archive REV suffixspec | tar -x
-C DIR`), and `new`, the one under `--new DIR` (default: this checkout's). Each measurement runs in a fresh process per arm, the arms
interleaved (their order alternating between repeats) on the same data; figures are medians over
the repeats with their range. Data: one standard library (`--stdlibs`, default: the running
Python's), its `*.py` files as in `bench_corpus.py` (one document each, default tokenizer, cached
under bench/.cache/), indexed with one job into one shard (the issue's measure). Per arm:
- `bytes_per_token`, `build_tokens_per_s` (build_index from token ids: the build alone) and its
  phases, `open_ms_first` / `open_ms_median` (7 opens in one process); states and edges per token,
  and those of states occurring once (`structure`);
- `e2e_tokens_per_s`: `suffixspec index DIR --glob '*.py' --jobs 1 --skip-bad` as a subprocess, wall
  time, DIR a copy of the same files (site-packages left out, as above; made once under bench/.cache/);
- the proposer over `--traces` requests cut from the next standard library found beside it (its
  files of the same names; else the same one's): prompt = a file's first 512 tokens, then
  `Session.propose` at budgets 16 and 64, greedy acceptance against the file's next 256 tokens;
  p50 / p99 microseconds of every proposal, `Proposer(corpus=...)` seconds, and a sha256 over
  every draft tree (tokens, parents, scores): equal digests, identical drafts; `drafting_private_mb`,
  the anonymous memory the proposer and its drafting added to the process. Also the same at
  budget 64 with `filter={"repo": <version>}` (every document selected: the restricted path) and
  the first restricted query's milliseconds (the new format computes the occurrence layout then).
Prints a table; the JSON line last (`--record`: appended to bench/results/corpus_compact.jsonl).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import common

HERE = Path(__file__).resolve().parent


def worker(args) -> dict:
    """One arm's measurements, in this process (its `suffixspec` is whatever PYTHONPATH gives)."""
    sys.path.insert(0, str(HERE))
    import bench_corpus as bc

    from suffixspec import Proposer
    from suffixspec.corpus import CorpusIndex, Document, build_index
    from suffixspec.tokenizer import load_tokenizer

    tok = load_tokenizer()
    tokens, offsets, meta = bc.stdlib_corpus(tok, 10**12, [args.stdlib])
    docs = [Document(tokens[offsets[i]:offsets[i + 1]], meta[i][0], {"repo": meta[i][1], "pkg": meta[i][2]})
            for i in range(len(meta))]
    out = {}
    with tempfile.TemporaryDirectory(dir=common.CACHE) as work:
        warm = Path(work) / "warm"  # kernels compiled or loaded before anything is timed
        build_index(docs[:40], warm, tokenizer=tok, jobs=1)
        wix = CorpusIndex.open(warm)
        wix.query(tokens[:32], wix.subset(tags={"repo": meta[0][1]}))
        s = Proposer(corpus=wix).start(tokens[:64], filter={"repo": meta[0][1]})
        s.propose(16)
        s.close()
        path = Path(work) / "ix"
        t = time.perf_counter()
        stats = build_index(docs, path, tokenizer=tok, jobs=1, shard_tokens=10**9)
        build_s = time.perf_counter() - t
        out.update(n_tokens=stats.n_tokens, bytes_on_disk=stats.bytes_on_disk,
                   bytes_per_token=round(stats.bytes_on_disk / stats.n_tokens, 2),
                   build_tokens_per_s=round(stats.n_tokens / build_s))
        out.update({f"build_{k}_s": round(v, 3) for k, v in stats.phases.items()})
        opens = []
        for _ in range(7):
            t = time.perf_counter()
            ix = CorpusIndex.open(path, tokenizer=tok)
            opens.append((time.perf_counter() - t) * 1e3)
        out.update(open_ms_first=round(opens[0], 2), open_ms_median=round(float(np.median(opens)), 3))
        out.update(structure(ix))
        if args.traces:
            out.update(proposer(args, tok, ix, meta, Proposer))
        if args.e2e:
            t = time.perf_counter()
            r = subprocess.run([sys.executable, "-m", "suffixspec.cli", "index", args.e2e_src, "--glob", "*.py", "--jobs",
                                "1", "--skip-bad", "-o", str(Path(work) / "e2e"), "--tokenizer", "default"],
                               capture_output=True, text=True)
            e2e_s = time.perf_counter() - t
            if r.returncode != 0:
                raise SystemExit(f"suffixspec index failed: {r.stderr[-2000:]}")
            n = CorpusIndex.open(Path(work) / "e2e").n_tokens
            out.update(e2e_tokens=n, e2e_s=round(e2e_s, 2), e2e_tokens_per_s=round(n / e2e_s))
    return out


def structure(ix) -> dict:
    """States and edges per token, those stored (format 4: all but the implicit states) and those
    an implicit-state encoding drops: states occurring once (count 1, stored or implicit)."""
    n, states, edges, stored, stored_edges, once = ix.n_tokens, 0, 0, 0, 0, 0
    for s in ix.shards:
        fa = s.fa
        imp = int(getattr(s, "n_implicit", 0))
        n_stored = int(fa.links.shape[0])
        one = np.asarray(fa.counts) == 1
        states += n_stored + imp
        stored += n_stored
        stored_edges += int(fa.etok.shape[0])
        edges += int(fa.etok.shape[0]) + imp
        once += int(one.sum()) + imp
    return {"states_per_token": round(states / n, 4), "stored_states_per_token": round(stored / n, 4),
            "stored_edges_per_token": round(stored_edges / n, 4), "edges_per_token_at_most": round(edges / n, 4),
            "count1_states_per_token": round(once / n, 4)}


def e2e_source(stdlib: str) -> Path:
    """A copy of the standard library's `*.py` files outside site-packages and __pycache__ (the
    files `bench_corpus.stdlib_corpus` reads), made once."""
    import shutil
    import zlib

    out = common.CACHE / f"stdlib_src_{zlib.crc32(stdlib.encode()):08x}"
    if out.is_dir():
        return out
    tmp = out.with_name(out.name + f".{os.getpid()}.tmp")
    root = Path(stdlib)
    for f in sorted(root.rglob("*.py")):
        if "site-packages" in f.parts or "__pycache__" in f.parts or not f.is_file():
            continue
        dst = tmp / f.relative_to(root)
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(f, dst)
    os.replace(tmp, out)
    return out


def traces(args, tok, meta):
    """(prompt, continuation) token arrays from the files of the next standard library."""
    here = Path(args.stdlib)
    minor = int(here.name.rsplit(".", 1)[1]) if here.name.startswith("python3.") else -1
    newer = sorted(here.parent.parent.parent.glob(f"*/lib/python3.{minor + 1}"))
    src = newer[0] if newer else here
    names = sorted({m[0].split("/", 1)[1] for m in meta})
    rng = np.random.default_rng(0)
    out = []
    for i in rng.permutation(len(names)):
        f = src / names[i]
        try:
            ids = np.asarray(tok.encode(f.read_text(encoding="utf-8")), np.int32)
        except (OSError, UnicodeDecodeError):
            continue
        if ids.shape[0] >= 768:
            out.append((ids[:512], ids[512:768]))
        if len(out) >= args.traces:
            break
    return out


def replay(proposer, reqs, budget, digest, filt=None) -> np.ndarray:
    us = []
    for prompt, cont in reqs:
        s = proposer.start(prompt, filter=filt) if filt else proposer.start(prompt)
        pos = 0
        while pos < cont.shape[0]:
            t = time.perf_counter_ns()
            tree = s.propose(budget)
            us.append((time.perf_counter_ns() - t) / 1e3)
            if digest is not None:
                for a in (tree.tokens, tree.parents, tree.scores):
                    digest.update(np.ascontiguousarray(a).tobytes())
            node = tree.longest_accepted(cont[pos:pos + budget + 1]) if len(tree) else -1
            a = int(tree.depths[node]) if node >= 0 else 0
            s.extend(cont[pos:pos + a + 1])
            pos += a + 1
        s.close()
    return np.asarray(us)


def anon_mb() -> float:
    """This process's anonymous (private, not file-backed) memory in MB (Linux; 0 elsewhere)."""
    try:
        for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
            if line.startswith("Anonymous:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def proposer(args, tok, ix, meta, Proposer) -> dict:
    reqs = traces(args, tok, meta)
    out = {"traces": len(reqs)}
    before = anon_mb()
    t = time.perf_counter()
    p = Proposer(corpus=ix)
    out["proposer_build_s"] = round(time.perf_counter() - t, 3)
    digest = hashlib.sha256()
    for budget in (16, 64):
        replay(p, reqs[:4], budget, None)  # warm-up
        us = replay(p, reqs, budget, digest)
        out[f"b{budget}_p50_us"] = round(float(np.percentile(us, 50)), 2)
        out[f"b{budget}_p99_us"] = round(float(np.percentile(us, 99)), 2)
    out["drafts_sha256"] = digest.hexdigest()[:16]
    out["drafting_private_mb"] = round(anon_mb() - before, 1)
    repo = meta[0][1]
    t = time.perf_counter()
    ix.query(reqs[0][0][-32:], ix.subset(tags={"repo": repo}))
    out["first_restricted_query_ms"] = round((time.perf_counter() - t) * 1e3, 1)
    filt = {"repo": repo}
    replay(p, reqs[:4], 64, None, filt)
    fd = hashlib.sha256()
    us = replay(p, reqs, 64, fd, filt)
    out.update(filtered_b64_p50_us=round(float(np.percentile(us, 50)), 2),
               filtered_b64_p99_us=round(float(np.percentile(us, 99)), 2), filtered_drafts_sha256=fd.hexdigest()[:16])
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=False, metavar="DIR", help="folder holding the baseline's suffixspec package")
    ap.add_argument("--new", default=str(common.ROOT), metavar="DIR", help="folder holding the measured suffixspec package")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--stdlib", default=str(Path(os.__file__).parent), metavar="DIR")
    ap.add_argument("--traces", type=int, default=40)
    ap.add_argument("--no-e2e", dest="e2e", action="store_false")
    ap.add_argument("--labels", default="", metavar="BASE,NEW", help="names recorded for the arms (e.g. their git revisions)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--e2e-src", default=None, help=argparse.SUPPRESS)
    common.add_record_flag(ap)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args)))
        return
    if not args.base or not (Path(args.base) / "suffixspec" / "__init__.py").is_file():
        raise SystemExit("bench_corpus_compact: --base DIR must hold a suffixspec package (the baseline)")
    arms = {"base": str(Path(args.base).resolve()), "new": str(Path(args.new).resolve())}
    runs = {a: [] for a in arms}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--stdlib", args.stdlib, "--traces", str(args.traces)]
    cmd += ["--e2e-src", str(e2e_source(args.stdlib))] if args.e2e else ["--no-e2e"]
    for r in range(args.repeats):
        for arm in (list(arms) if r % 2 == 0 else list(arms)[::-1]):
            env = dict(os.environ, PYTHONPATH=arms[arm])
            got = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=arms[arm])
            if got.returncode != 0:
                raise SystemExit(f"{arm} arm failed:\n{got.stderr[-3000:]}")
            runs[arm].append(json.loads(got.stdout.strip().splitlines()[-1]))
            print(f"repeat {r} {arm}: {runs[arm][-1]}", file=sys.stderr, flush=True)
    result = {"stdlib": args.stdlib, "repeats": args.repeats, "base": args.base, "new": args.new, "labels": args.labels}
    keys = [k for k in runs["new"][0] if k in runs["base"][0]] + [k for k in runs["new"][0] if k not in runs["base"][0]]
    print(f"{'metric':<32} {'base':>14} {'new':>14} {'new/base':>9}   range base | new")
    for k in keys:
        vals = {a: [x[k] for x in runs[a] if k in x] for a in arms}
        if isinstance(runs["new"][0][k], str):
            result[k] = {a: sorted(set(v)) for a, v in vals.items()}
            print(f"{k:<32} {','.join(result[k]['base']):>14} {','.join(result[k]['new']):>14}")
            continue
        med = {a: float(np.median(v)) if v else None for a, v in vals.items()}
        rng = {a: [min(v), max(v)] if v else None for a, v in vals.items()}
        ratio = round(med["new"] / med["base"], 3) if med["base"] else None
        result[k] = {"base": med["base"], "new": med["new"], "ratio": ratio, "base_range": rng["base"], "new_range": rng["new"]}
        print(f"{k:<32} {med['base'] if med['base'] is not None else '-':>14} {med['new']:>14} {ratio if ratio else '-':>9}"
              f"   {rng['base']} | {rng['new']}")
    common.emit(result, args, "corpus_compact")


if __name__ == "__main__":
    main()
