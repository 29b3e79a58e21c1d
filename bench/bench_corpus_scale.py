"""Corpus indexes at scale: build, append, merge, open and draft from 1M, 10M and 100M tokens with the CLI.

    python bench/bench_corpus_scale.py --data DIR [--sizes 1000000,10000000,100000000] [--jobs 2]
                                       [--shard-tokens N] [--budgets 16,64] [--serve] [--lock FILE]
                                       [--reuse] [--keep] [--record [PATH]]

Data: the `*.py` files of every Python standard library under a pyenv root ($PYENV_ROOT, else ~/.pyenv:
versions/*/lib/python[23].*, newest version first, site-packages excluded), then the site-packages of
`--site-packages` (default: this interpreter's pyenv 3.11's, if present), each folder walked in sorted
order; files identical byte for byte to one already taken, empty or not UTF-8 are left out. Each size
takes the prefix of that list whose estimated token count (bytes over the default tokenizer's bytes per
token on the first files) reaches it, hard-linked (else copied) under DIR/src-SIZE/{a,b}: its first and
second halves by bytes. Everything this script writes goes under `--data` (the indexes take about 40
bytes per token); without `--keep` the indexes and sources are removed at the end.

Per size, as a user runs it: `suffixspec index DIR/src-SIZE/a -o I --jobs J`, then `suffixspec index
DIR/src-SIZE/b -o I --append --jobs J` (together: the build), then `suffixspec merge I -o M
--shard-tokens S --jobs J` (the merge: one index of S-token shards). Each command runs as a child
process: its wall time, its CPU seconds (user + sys of it and its workers, from wait4: robust to
other load on a shared machine, unlike wall time) and its peak resident memory (the largest of its
processes). Disk: the merged index's bytes (`suffixspec info --json`). Then, under `--lock` (an
exclusive flock held only for this part), one fresh drafting process per size opens the merged index
(first open, which checks every token id's range, then the median of 7 reopens), builds
`Proposer(corpus=index)` and replays the shipped code-edit traces (corpora/code_edit_traces.jsonl:
prompts from one CPython version, outputs from the next, greedy acceptance as in
`suffixspec simulate`) at each budget after a warm-up: one proposal's p50 / p99 and tokens per round;
its resident memory after (VmRSS, of which file-backed: the mapped index pages it touched, and
anonymous) and before opening. `--serve`: resident memory of `suffixspec serve --corpus M` (default
model) once healthy and after its background occurrence layouts are done, against one without a corpus.
`--reuse`: keep an index (and its build figures) left by an earlier run with `--keep`.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import gc
import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import common

SAMPLE_BYTES = 4 << 20
WARM_BYTES = 200_000


def _version_key(path: str):
    return [int(p) for p in Path(path).name[len("python"):].split(".")]


def source_roots(site_packages: str | None) -> list[tuple[str, Path]]:
    pyenv = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    libs = sorted(glob.glob(str(pyenv / "*" / "lib" / "python[23].*")), key=_version_key, reverse=True)
    roots = [(Path(p).name, Path(p)) for p in libs if Path(p).is_dir()]
    if site_packages is None:
        cand = sorted(glob.glob(str(pyenv / "3.11*" / "lib" / "python3.11" / "site-packages")))
        site_packages = cand[0] if cand else None
    if site_packages:
        roots.append(("site-packages", Path(site_packages)))
    if not roots:
        raise SystemExit(f"bench_corpus_scale: no Python standard library under {pyenv}: set PYENV_ROOT")
    return roots


def source_files(roots) -> list[tuple[str, Path, int]]:
    """(id, path, bytes) of every distinct non-empty UTF-8 `*.py` file, in the documented order."""
    seen, out = set(), []
    for label, root in roots:
        for dirpath, dirs, names in os.walk(root):
            dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "__pycache__"
                             and not (label != "site-packages" and d == "site-packages"))
            for name in sorted(names):
                if not name.endswith(".py"):
                    continue
                path = Path(dirpath) / name
                try:
                    data = path.read_bytes()
                    data.decode("utf-8")
                except (OSError, UnicodeDecodeError):
                    continue
                digest = hashlib.sha1(data).digest()
                if not data.strip() or digest in seen:
                    continue
                seen.add(digest)
                out.append((f"{label}/{path.relative_to(root)}", path, len(data)))
    return out


def bytes_per_token(tok, files) -> float:
    texts, n = [], 0
    for _, path, size in files:
        texts.append(path.read_text(encoding="utf-8"))
        n += size
        if n >= SAMPLE_BYTES:
            break
    return n / sum(len(ids) for ids in tok.encode_batch(texts))


def stage(files, target_bytes: float, out: Path) -> dict:
    """Hard-link (else copy) the prefix of `files` reaching `target_bytes` into out/a and out/b."""
    chosen, total = [], 0
    for f in files:
        if total >= target_bytes:
            break
        chosen.append(f)
        total += f[2]
    if total < target_bytes * 0.9 and target_bytes > WARM_BYTES:
        raise SystemExit(f"bench_corpus_scale: the sources hold {total / 1e6:.0f} MB, {target_bytes / 1e6:.0f} MB wanted")
    shutil.rmtree(out, ignore_errors=True)
    half, run = total / 2, 0
    for ident, path, size in chosen:
        dst = out / ("a" if run < half else "b") / ident
        run += size
        dst.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(path, dst)
        except OSError:
            shutil.copyfile(path, dst)
    return {"files": len(chosen), "source_bytes": total}


def timed(cmd) -> dict:
    """Run `cmd`; its wall seconds, CPU seconds (with its reaped workers) and peak RSS in MB."""
    import tempfile

    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err)
        _, status, ru = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        text, error = out.read().decode(), err.read().decode()
    if proc.returncode != 0:
        raise SystemExit(f"bench_corpus_scale: {' '.join(map(str, cmd))} failed:\n{error[-2000:]}")
    return {"wall_s": round(wall, 2), "cpu_s": round(ru.ru_utime + ru.ru_stime, 2),
            "peak_rss_mb": round(ru.ru_maxrss / 1024, 1), "stdout": text}


def suffixspec(*args) -> list[str]:
    """The `suffixspec` command of this interpreter (its console script), as a user runs it."""
    script = Path(sys.executable).with_name("suffixspec")
    head = [str(script)] if script.exists() else [sys.executable, "-c", "import sys; from suffixspec.cli import main; sys.exit(main())"]
    return [*head, *map(str, args)]


def build(args, size: int, files, bpt: float) -> dict:
    """Stage, index, append and merge one size; the figures, saved beside the index."""
    work = Path(args.data) / f"scale-{size}"
    saved = work / "build.json"
    merged = work / "merged.idx"
    if args.reuse and saved.exists() and merged.exists():
        return json.loads(saved.read_text())
    work.mkdir(parents=True, exist_ok=True)
    out = stage(files, size * bpt, work / "src")
    idx = work / "built.idx"
    shutil.rmtree(idx, ignore_errors=True)
    shutil.rmtree(merged, ignore_errors=True)
    jobs = ["--jobs", args.jobs] + (["--shard-tokens", args.shard_tokens] if args.shard_tokens else [])
    out["index"] = timed(suffixspec("index", work / "src" / "a", "-o", idx, "--tokenizer", "default", *jobs))
    out["append"] = timed(suffixspec("index", work / "src" / "b", "-o", idx, "--append", "--tokenizer", "default", *jobs))
    out["built"] = info(idx)
    out["merge"] = timed(suffixspec("merge", idx, "-o", merged, "--shard-tokens", args.shard_tokens or 16_000_000,
                                    "--jobs", args.jobs))
    out["merged"] = info(merged)
    for k in ("index", "append", "merge"):
        out[k].pop("stdout")
    shutil.rmtree(idx, ignore_errors=True)
    shutil.rmtree(work / "src", ignore_errors=True)
    saved.write_text(json.dumps(out))
    return out


def info(path) -> dict:
    got = json.loads(timed(suffixspec("info", path, "--json", "--no-verify"))["stdout"].strip().splitlines()[-1])
    return {k: got[k] for k in ("n_tokens", "n_documents", "n_shards", "bytes_on_disk", "bytes_per_token") if k in got}


def proc_status() -> dict:
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, v = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
            out[key] = round(int(v.split()[0]) / 1024, 1)
    return out


def replay(proposer, traces, budget):
    us, rounds, tokens = [], 0, 0
    for prompt, cont in traces:
        s = proposer.start(prompt)
        pos = 0
        while pos < cont.shape[0]:
            t = time.perf_counter_ns()
            tree = s.propose(budget)
            us.append((time.perf_counter_ns() - t) / 1e3)
            node = tree.longest_accepted(cont[pos:pos + budget + 1]) if len(tree) else -1
            a = int(tree.depths[node]) if node >= 0 else 0
            s.extend(cont[pos:pos + a + 1])
            pos += a + 1
            rounds += 1
            tokens += a + 1
        s.close()
    return np.asarray(us), tokens / rounds


def draft_worker(path: str, warm: str, budgets) -> dict:
    """In a fresh process: draft from the small `warm` index (numba's kernels loaded), then open the
    index, draft from it, report latency and memory (before it and after)."""
    from suffixspec import Proposer
    from suffixspec.corpus import CorpusIndex
    from suffixspec.tokenizer import load_tokenizer

    tok = load_tokenizer()
    traces = []
    with open(common.CORPORA / "code_edit_traces.jsonl", encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            traces.append((np.asarray(tok.encode(r["prompt"]), np.int32), np.asarray(tok.encode(r["output"]), np.int32)))
    small = Proposer(corpus=CorpusIndex.open(warm, tokenizer=tok))
    for budget in budgets:
        replay(small, traces[:4], budget)
    del small
    gc.collect()
    out = {"traces": len(traces), "before_open": proc_status()}
    opens = []
    for _ in range(8):
        t = time.perf_counter()
        ix = CorpusIndex.open(path, tokenizer=tok)
        opens.append((time.perf_counter() - t) * 1e3)
    out.update(open_ms_first=round(opens[0], 2), open_ms_median=round(float(np.median(opens[1:])), 3))
    t = time.perf_counter()
    p = Proposer(corpus=ix)
    out["proposer_build_s"] = round(time.perf_counter() - t, 3)
    for budget in budgets:
        replay(p, traces[:4], budget)  # warm-up (numba's kernels load)
        us, tpr = replay(p, traces, budget)
        out[f"b{budget}"] = {"p50_us": round(float(np.percentile(us, 50)), 2), "p99_us": round(float(np.percentile(us, 99)), 2),
                             "tokens_per_round": round(tpr, 3), "proposals": int(us.shape[0])}
    out["after_drafting"] = proc_status()
    return out


def serve_rss(index: Path | None, log: Path) -> dict:
    """Resident memory (MB) of `suffixspec serve` (default model) once healthy, and once it holds
    still (its background occurrence layouts built: two samples 5 s apart within 1%, at most 180 s)."""
    extra = ["--corpus", str(index)] if index else []
    t = time.perf_counter()
    proc, _url = common.spawn_server(None, 1, log, extra=extra)
    try:
        def rss():
            for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return round(int(line.split()[1]) / 1024, 1)
        out = {"healthy_s": round(time.perf_counter() - t, 1), "rss_healthy_mb": rss()}
        last, start = out["rss_healthy_mb"], time.perf_counter()
        while time.perf_counter() - start < 180:
            time.sleep(5)
            now = rss()
            if abs(now - last) <= 0.01 * last:
                break
            last = now
        out["rss_settled_mb"] = now
        return out
    finally:
        proc.terminate()
        proc.wait(timeout=60)


@contextlib.contextmanager
def held(lock: str | None):
    if not lock:
        yield
        return
    with open(lock, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def summary(size, b, d, budgets) -> dict:
    m = b["merged"]
    n = m["n_tokens"]
    built_cpu = b["index"]["cpu_s"] + b["append"]["cpu_s"]
    row = {"target_tokens": size, "n_tokens": n, "n_documents": m["n_documents"], "n_shards": m["n_shards"],
           "source_bytes": b["source_bytes"],
           "build_wall_s": round(b["index"]["wall_s"] + b["append"]["wall_s"], 2), "build_cpu_s": round(built_cpu, 2),
           "build_cpu_s_per_m_tokens": round(built_cpu / n * 1e6, 3),
           "build_tokens_per_cpu_s": round(n / built_cpu),
           "build_peak_rss_mb": max(b["index"]["peak_rss_mb"], b["append"]["peak_rss_mb"]),
           "built_shards": b["built"]["n_shards"], "built_bytes_per_token": b["built"]["bytes_per_token"],
           "merge_wall_s": b["merge"]["wall_s"], "merge_cpu_s": b["merge"]["cpu_s"],
           "merge_cpu_s_per_m_tokens": round(b["merge"]["cpu_s"] / n * 1e6, 3), "merge_peak_rss_mb": b["merge"]["peak_rss_mb"],
           "bytes_on_disk": m["bytes_on_disk"], "bytes_per_token": m["bytes_per_token"],
           "open_ms_first": d["open_ms_first"], "open_ms_median": d["open_ms_median"],
           "proposer_build_s": d["proposer_build_s"], "traces": d["traces"],
           "rss_warm_mb": d["before_open"]["VmRSS"], "rss_drafting_mb": d["after_drafting"]["VmRSS"],
           "rss_drafting_file_mb": d["after_drafting"]["RssFile"], "rss_drafting_anon_mb": d["after_drafting"]["RssAnon"]}
    for budget in budgets:
        for k, v in d[f"b{budget}"].items():
            row[f"b{budget}_{k}"] = v
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=False, metavar="DIR", help="folder for the staged sources and indexes (required)")
    ap.add_argument("--sizes", default="1000000,10000000,100000000", help="target token counts, comma-separated")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--shard-tokens", type=int, default=None, help="shard size of the builds (default: index's) and the merge (16M)")
    ap.add_argument("--budgets", default="16,64")
    ap.add_argument("--site-packages", default=None, metavar="DIR")
    ap.add_argument("--serve", action="store_true", help="also the resident memory of suffixspec serve --corpus")
    ap.add_argument("--lock", default=None, metavar="FILE", help="flock this file around the timed drafting")
    ap.add_argument("--reuse", action="store_true", help="reuse indexes an earlier run kept")
    ap.add_argument("--keep", action="store_true", help="keep the indexes under --data")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--warm", default=None, help=argparse.SUPPRESS)
    common.add_record_flag(ap)
    args = ap.parse_args()
    budgets = [int(b) for b in args.budgets.split(",")]
    if args.worker:
        print(json.dumps(draft_worker(args.worker, args.warm, budgets)))
        return
    if not args.data:
        raise SystemExit("bench_corpus_scale: --data DIR is required (the indexes take about 40 bytes per token)")
    sizes = [int(float(s)) for s in args.sizes.split(",")]
    from suffixspec.tokenizer import load_tokenizer

    files = source_files(source_roots(args.site_packages))
    bpt = bytes_per_token(load_tokenizer(), files)
    print(f"{len(files)} distinct files, {sum(f[2] for f in files) / 1e6:.0f} MB; {bpt:.2f} bytes per token", flush=True)
    result = {"sources_files": len(files), "sources_bytes": sum(f[2] for f in files), "jobs": args.jobs,
              "sample_bytes_per_token": round(bpt, 3), "rows": []}
    warm = Path(args.data) / "warm"
    if not (args.reuse and (warm / "warm.idx").exists()):
        shutil.rmtree(warm, ignore_errors=True)
        stage(files, WARM_BYTES, warm / "src")
        result["warmup_index"] = timed(suffixspec("index", warm / "src", "-o", warm / "warm.idx", "--tokenizer", "default",
                                                  "--jobs", args.jobs))
        result["warmup_index"].pop("stdout")
    builds = {}
    for size in sizes:
        builds[size] = build(args, size, files, bpt)
        print(f"built {size}: {json.dumps(builds[size])}", flush=True)
    drafted = {}
    with held(args.lock):  # one hold for every size's drafting process, none for the rest
        for size in sizes:
            merged = Path(args.data) / f"scale-{size}" / "merged.idx"
            got = subprocess.run([sys.executable, __file__, "--worker", str(merged), "--warm", str(warm / "warm.idx"),
                                  "--budgets", args.budgets], check=True, capture_output=True, text=True)
            drafted[size] = json.loads(got.stdout.strip().splitlines()[-1])
    for size in sizes:
        row = summary(size, builds[size], drafted[size], budgets)
        if args.serve:
            row["serve"] = serve_rss(Path(args.data) / f"scale-{size}" / "merged.idx", Path(args.data) / f"serve-{size}.log")
        result["rows"].append(row)
        print(json.dumps(row), flush=True)
    if args.serve:
        result["serve_without_corpus"] = serve_rss(None, Path(args.data) / "serve-none.log")
    if not args.keep:
        for size in sizes:
            shutil.rmtree(Path(args.data) / f"scale-{size}", ignore_errors=True)
        shutil.rmtree(warm, ignore_errors=True)
    cols = ("n_tokens", "build_cpu_s_per_m_tokens", "build_wall_s", "merge_cpu_s", "bytes_per_token", "open_ms_median",
            "rss_drafting_mb", *(f"b{b}_p{q}_us" for b in budgets for q in (50, 99)))
    print(" ".join(f"{c:>14}" for c in cols))
    for row in result["rows"]:
        print(" ".join(f"{row[c]:>14}" for c in cols))
    common.emit(result, args, "corpus_scale")


if __name__ == "__main__":
    main()
