"""Corruption fuzzer over the corpus index: every damaged copy either is refused with a suffixspec
error or answers exactly as the intact index does; nothing crashes or hangs.

Seeded and bounded. Damage: truncations at many offsets, byte flips in headers, array tables,
meta blocks, array payloads and tails, zeroed blocks, appended junk, files swapped between shards
and between two indexes, and a FIFO, a directory, a symlink loop, an empty file or nothing in
place of a file. The cases run in worker subprocesses (a crash or hang fails the test, naming the
case), each case opened twice: with `verify=True` (every checksum) and with the default cheap
checks. Under the default open, a flip or zeroed block inside the payload of a large shard array
(automaton, text) can only be found by a checksum (or, for the counts and suffix links, when a
restricted query computes the occurrence layout); those cases must still
refuse or answer without crashing, and the test counts how many answered differently.
"""

import json
import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from suffixspec.corpus import CorpusIndex, Document, build_index, delete_documents
from suffixspec.corpus.format import ENTRY, HEADER, KIND_SHARD, SHARD_DTYPES, Container
from suffixspec.corpus.snapshot import SMALL_ARRAYS

TOK = {"name": "toy", "vocab_size": 8, "fingerprint": "f" * 64}
SEED = 20261201

WORKER = textwrap.dedent(r'''
    import json, os, shutil, signal, sys
    from pathlib import Path
    import numpy as np
    from suffixspec.corpus import CorpusIndex
    from suffixspec.errors import SuffixSpecError

    PATTERNS = json.loads(sys.argv[2])

    def answers(ix):
        out = {"n": [ix.n_tokens, ix.n_documents, ix.n_shards, len(ix.deleted)],
               "ids": ix.document_ids, "tags": ix.document_tags,
               "docs": [d.tokens.tolist() for d in ix.iter_documents(include_deleted=True)]}
        sub = ix.subset(tags={"parity": "0"})
        for i, p in enumerate(PATTERNS):
            for name, s in (("all", None), ("sub", sub)):
                m = ix.query(p, s)
                out[f"q{i}{name}"] = [m.length, m.count, m.estimated, m.tokens.tolist(), m.counts.tolist(), m.last_ends.tolist()]
            out[f"l{i}"] = sorted(ix.continuations(p).items())
        out["follow"] = [ix.following(e, 4).tolist() for e in range(0, ix.n_tokens, 7)]
        out["docof"] = [ix.document_of(e) for e in range(0, ix.n_tokens, 5)]
        return json.loads(json.dumps(out))

    def timeout(*_):
        raise TimeoutError("case took too long (hang?)")

    signal.signal(signal.SIGALRM, timeout)

    def outcome(path, verify, want):
        try:
            got = answers(CorpusIndex.open(path, verify=verify))
        except SuffixSpecError as exc:
            return "refused", f"{type(exc).__name__}: {str(exc)[-120:]}"
        return ("exact" if got == want else "different"), ""

    def damage(case, work, roots):
        src = Path(roots[case["index"]])
        dst = work / "ix"
        shutil.copytree(src, dst, symlinks=True)
        f = dst / case["file"]
        op = case["op"]
        if op == "truncate":
            with open(f, "r+b") as h:
                h.truncate(case["at"])
        elif op in ("flip", "zero"):
            with open(f, "r+b") as h:
                h.seek(case["at"])
                old = h.read(case.get("n", 1))
                h.seek(case["at"])
                h.write(bytes(b ^ case["mask"] for b in old) if op == "flip" else bytes(len(old)))
        elif op == "append":
            with open(f, "ab") as h:
                h.write(bytes(range(256))[: case["n"]] * (1 + case["n"] // 256))
        elif op == "replace_with":
            shutil.copyfile(Path(roots[case["from_index"]]) / case["from_file"], f)
        elif op == "swap":
            g = dst / case["other"]
            tmp = dst / "swap.tmp"
            os.rename(f, tmp); os.rename(g, f); os.rename(tmp, g)
        elif op == "fifo":
            f.unlink(); os.mkfifo(f)
        elif op == "dir":
            f.unlink(); f.mkdir()
        elif op == "loop":
            f.unlink(); os.symlink(f.name, f)
        elif op == "empty":
            f.write_bytes(b"")
        elif op == "missing":
            f.unlink()
        else:
            raise AssertionError(op)
        return dst

    cases = json.loads(Path(sys.argv[1]).read_text())
    roots = cases["roots"]
    want = {k: answers(CorpusIndex.open(v, verify=True)) for k, v in roots.items()}
    base = Path(cases["work"])
    for case in cases["cases"]:
        work = base / f"case{case['id']}"
        work.mkdir()
        signal.alarm(20)
        path = damage(case, work, roots)
        res = {"id": case["id"]}
        for verify in (True, False):
            res["verify" if verify else "default"] = outcome(path, verify, want[case["index"]])
        signal.alarm(0)
        shutil.rmtree(work)
        print(json.dumps(res), flush=True)
    print("done", flush=True)
''')


def build_two(tmp_path):
    rng = np.random.default_rng(SEED)
    roots = {}
    for name, n_docs, deleted in (("A", 12, False), ("B", 10, True)):
        docs = [Document(rng.integers(0, 6, int(rng.integers(6, 60))).astype(np.int32), f"{name}{i}", {"parity": str(i % 2)})
                for i in range(n_docs)]
        build_index(docs, tmp_path / name, tokenizer=TOK, shard_tokens=160)
        if deleted:
            delete_documents(tmp_path / name, ids=[f"{name}1", f"{name}4"])
        roots[name] = str(tmp_path / name)
    return roots


def payload_ranges(path: Path):
    """Byte ranges of a shard file's large arrays (only a checksum finds damage inside them)."""
    c = Container(path, KIND_SHARD, SHARD_DTYPES)
    out = []
    for name, (code, off, count, _) in c.entries.items():
        if name not in SMALL_ARRAYS:
            out.append((off, off + count * np.dtype(code).itemsize))
    return out


def make_cases(roots):
    rnd = random.Random(SEED)
    cases = []

    def add(**case):
        case["id"] = len(cases)
        cases.append(case)

    for index, root in roots.items():
        files = sorted(p.name for p in Path(root).iterdir() if p.suffix == ".ssx")
        shards = [f for f in files if f.startswith("shard-")]
        for f in files:
            size = (Path(root) / f).stat().st_size
            ranges = payload_ranges(Path(root) / f) if f.startswith("shard-") else []
            table_end = HEADER.size + ENTRY.size * (len(ranges) + 2 if ranges else 1)

            def kind(at, n=1):
                return "payload" if any(at < hi and lo < at + n for lo, hi in ranges) else "structural"

            for at in sorted({0, 1, 8, 63, 64, 65, table_end, size // 2, size - 64, size - 1,
                              *(rnd.randrange(size) for _ in range(4))}):
                if 0 <= at < size:
                    add(index=index, file=f, op="truncate", at=at, kind="structural")
            spots = [rnd.randrange(0, 64) for _ in range(4)] + [rnd.randrange(64, min(size, table_end + 256)) for _ in range(4)]
            spots += [rnd.randrange(size) for _ in range(8)] + [size - 1, size - 2]
            for at in spots:
                add(index=index, file=f, op="flip", at=at, mask=1 << rnd.randrange(8), kind=kind(at))
            for _ in range(3):
                n = rnd.choice([8, 64, 256])
                at = rnd.randrange(0, max(1, size - n))
                add(index=index, file=f, op="zero", at=at, n=n, kind=kind(at, n))
            for n in (1, 64):
                add(index=index, file=f, op="append", n=n, kind="structural")
            for op in ("fifo", "dir", "loop", "empty", "missing"):
                add(index=index, file=f, op=op, kind="structural")
        if len(shards) > 1:
            add(index=index, file=shards[0], op="swap", other=shards[1], kind="structural")
        other = "B" if index == "A" else "A"
        other_files = sorted(p.name for p in Path(roots[other]).iterdir() if p.suffix == ".ssx")
        add(index=index, file="manifest.ssx", op="replace_with", from_index=other, from_file="manifest.ssx", kind="structural")
        add(index=index, file=shards[0], op="replace_with", from_index=other,
            from_file=[f for f in other_files if f.startswith("shard-")][0], kind="structural")
    return cases


def test_corruption_fuzzer_refuses_or_answers_exactly(tmp_path):
    roots = build_two(tmp_path)
    intact = {k: CorpusIndex.open(v, verify=True) for k, v in roots.items()}
    assert intact["A"].n_shards >= 3 and intact["B"].n_shards >= 2 and len(intact["B"].deleted) == 2
    cases = make_cases(roots)
    work = tmp_path / "work"
    work.mkdir()
    spec = tmp_path / "cases.json"
    spec.write_text(json.dumps({"roots": roots, "work": str(work), "cases": cases}))
    patterns = [[0, 1], [2, 3, 4], [5], [], [1, 1, 2, 0, 3, 5, 4, 2]]
    res = subprocess.run([sys.executable, "-c", WORKER, str(spec), json.dumps(patterns)], capture_output=True,
                         text=True, timeout=400, env={**os.environ, "PYTHONFAULTHANDLER": "1"})
    lines = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
    if res.returncode != 0 or not res.stdout.rstrip().endswith("done"):
        crashed = cases[len(lines)] if len(lines) < len(cases) else None
        pytest.fail(f"worker died (exit {res.returncode}) on case {crashed}: {res.stderr[-3000:]}")
    assert [r["id"] for r in lines] == [c["id"] for c in cases]
    tally = {}
    for case, r in zip(cases, lines):
        for mode in ("verify", "default"):
            got, why = r[mode]
            tally[(mode, case["kind"], got)] = tally.get((mode, case["kind"], got), 0) + 1
            allowed = {"refused", "exact"}
            if mode == "default" and case["kind"] == "payload":
                allowed.add("different")  # only a checksum can see it: counted below
            assert got in allowed, (mode, json.dumps(case), why)
        # the checksums see every change of bytes that matter: verify refuses all but harmless ones
        if r["verify"][0] == "exact":
            assert case["op"] in ("flip", "zero"), case
    structural = sum(v for (m, k, _), v in tally.items() if m == "verify" and k == "structural")
    payload = sum(v for (m, k, _), v in tally.items() if m == "verify" and k == "payload")
    different = tally.get(("default", "payload", "different"), 0)
    print(f"\ncorpus fuzzer: {len(cases)} cases ({structural} structural, {payload} inside large-array payloads); "
          f"verify=True: all refused or exact; default open: structural all refused or exact, payload "
          f"{tally.get(('default', 'payload', 'refused'), 0)} refused, {tally.get(('default', 'payload', 'exact'), 0)} exact, "
          f"{different} answered differently (checksums only)")
    assert len(cases) >= 250
    assert payload >= 20 and structural >= 200
