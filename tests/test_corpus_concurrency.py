"""Concurrent writers and killed writers of one corpus index, as separate processes.

2 and 4 writers at once (appends through the Python API, `suffixspec delete` and `suffixspec merge`
into the index itself through the CLI), repeated, while a reader (a thread of the test) reopens and
queries the index in a loop: no append or deletion is lost, every writer succeeds (waiting for the lock), the index
always opens, the reader never sees an error. A writer killed with SIGKILL at a random moment
leaves the previous index intact, and the next write removes what it left.
"""

import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np

from suffixspec.corpus import CorpusIndex, Document, append_documents, build_index

TOK = {"name": "toy", "vocab_size": 16, "fingerprint": "c" * 64}
ENV = {**os.environ, "PYTHONFAULTHANDLER": "1"}

APPEND = textwrap.dedent('''
    import sys, numpy as np
    from suffixspec.corpus import Document, append_documents
    tok = {"name": "toy", "vocab_size": 16, "fingerprint": "c" * 64}
    path, tag, n, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    rng = np.random.default_rng(sum(tag.encode()))
    docs = [Document(rng.integers(0, 16, size).astype(np.int32), f"{tag}-{j}") for j in range(n)]
    append_documents(path, docs, tokenizer=tok, shard_tokens=max(size, 1), wait=120)
''')

def reader_loop(path, stop, result):
    """Reopen and query the index until `stop` is set (and at least once): counts opens, errors."""
    opens = errors = 0
    while not stop.is_set() or opens == 0:
        try:
            ix = CorpusIndex.open(path)
            ix.query([1, 2, 3])
            ix.document_ids
            opens += 1
        except Exception as exc:  # any error at all is a failure of the test
            errors += 1
            result.setdefault("first", repr(exc))
        time.sleep(0.005)  # leave the writers some CPU
    result.update(opens=opens, errors=errors)


def docs(prefix, n, rng, size=40):
    return [Document(rng.integers(0, 16, size).astype(np.int32), f"{prefix}{i}") for i in range(n)]


def live_ids(path):
    ix = CorpusIndex.open(path, verify=True)
    return {d.id for d in ix.iter_documents()}


def leftovers(path: Path):
    inside = [p.name for p in path.iterdir() if p.name.startswith(".") or p.name.endswith(".tmp")]
    beside = [p.name for p in path.parent.iterdir() if p.name.startswith(f".{path.name}.")]
    return inside + beside


def test_concurrent_writers_lose_nothing_and_readers_never_fail(tmp_path):
    rng = np.random.default_rng(7)
    path = tmp_path / "ix"
    build_index(docs("base", 12, rng), path, tokenizer=TOK, shard_tokens=200)
    expected = {f"base{i}" for i in range(12)}
    cli = [sys.executable, "-m", "suffixspec.cli"]
    rounds = [["append", "delete"], ["append", "append", "delete", "merge"], ["merge", "append"],
              ["delete", "append", "merge", "delete"]]
    victims = iter(sorted(expected))
    for r, kinds in enumerate(rounds):
        stop, seen = threading.Event(), {}
        reader = threading.Thread(target=reader_loop, args=(path, stop, seen))
        reader.start()
        procs = []
        for w, kind in enumerate(kinds):
            if kind == "append":
                tag = f"r{r}w{w}"
                cmd = [sys.executable, "-c", APPEND, str(path), tag, "3", "50"]
                expected |= {f"{tag}-{j}" for j in range(3)}
            elif kind == "delete":
                victim = next(victims)
                cmd = cli + ["delete", str(path), "--id", victim, "--wait", "120"]
                expected.discard(victim)
            else:
                cmd = cli + ["merge", str(path), "-o", str(path), "--wait", "120"]
            procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV))
        for p in procs:
            out, err = p.communicate(timeout=300)
            assert p.returncode == 0, (p.args[-6:], err[-2000:])
        stop.set()
        reader.join(timeout=120)
        assert seen["errors"] == 0 and seen["opens"] > 0, seen
        assert live_ids(path) == expected, r
        assert leftovers(path) == []


def test_second_writer_fails_clearly_without_wait(tmp_path):
    from suffixspec.corpus import IndexLockedError
    from suffixspec.corpus.lock import WriterLock

    rng = np.random.default_rng(3)
    path = tmp_path / "ix"
    build_index(docs("d", 4, rng), path, tokenizer=TOK)
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent('''
        import sys, time
        from suffixspec.corpus.lock import WriterLock
        with WriterLock(sys.argv[1]):
            print("held", flush=True)
            time.sleep(60)
    '''), str(path)], stdout=subprocess.PIPE, text=True, env=ENV)
    try:
        assert holder.stdout.readline().strip() == "held"
        t = time.monotonic()
        try:
            append_documents(path, docs("x", 1, rng), tokenizer=TOK, wait=0.3)
            raise AssertionError("a second writer got in")
        except IndexLockedError as exc:
            assert f"pid {holder.pid}" in str(exc) and "--wait" in str(exc)
        assert 0.25 < time.monotonic() - t < 5
        res = subprocess.run([sys.executable, "-m", "suffixspec.cli", "delete", str(path), "--id", "d0"],
                             capture_output=True, text=True, env=ENV, timeout=120)
        assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr
        assert "another writer" in res.stderr
    finally:
        holder.kill()
        holder.wait()
    # the kill released the lock: the next writer gets in at once
    with WriterLock(path, wait=5):
        pass
    assert {d.id for d in CorpusIndex.open(path).iter_documents()} == {f"d{i}" for i in range(4)}


KILLED_APPENDS = textwrap.dedent('''
    import sys, numpy as np
    from suffixspec.corpus import Document, append_documents
    tok = {"name": "toy", "vocab_size": 16, "fingerprint": "c" * 64}
    path = sys.argv[1]
    rng = np.random.default_rng(1)
    for k in range(1000):
        docs = [Document(rng.integers(0, 16, 60000).astype(np.int32), f"k{k}-{j}") for j in range(2)]
        append_documents(path, docs, tokenizer=tok, shard_tokens=60000, wait=60)
        print(k, flush=True)
''')

KILLED_BUILD = textwrap.dedent('''
    import sys, numpy as np
    from suffixspec.corpus import Document, build_index
    tok = {"name": "toy", "vocab_size": 16, "fingerprint": "c" * 64}
    rng = np.random.default_rng(2)
    def gen():
        for j in range(10000):
            yield Document(rng.integers(0, 16, 60000).astype(np.int32), f"b{j}")
    build_index(gen(), sys.argv[1], tokenizer=tok, shard_tokens=60000)
''')


def test_writer_killed_at_random_moments(tmp_path):
    rnd = random.Random(11)
    rng = np.random.default_rng(5)
    path = tmp_path / "ix"
    build_index(docs("base", 5, rng), path, tokenizer=TOK)
    for trial in range(3):
        before = CorpusIndex.open(path, verify=True)
        n_before = before.n_documents
        p = subprocess.Popen([sys.executable, "-c", KILLED_APPENDS, str(path)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=ENV)
        assert p.stdout.readline() != ""  # one append committed: the writer is in its loop
        time.sleep(rnd.uniform(0.0, 0.6))
        p.send_signal(signal.SIGKILL)
        p.wait()
        ix = CorpusIndex.open(path, verify=True)  # intact: some whole number of appends committed
        assert ix.n_documents >= n_before + 2 and (ix.n_documents - n_before) % 2 == 0
        ids = ix.document_ids
        assert ids[:n_before] == before.document_ids
        assert all(ids[n_before + 2 * j] == f"k{j}-0" and ids[n_before + 2 * j + 1] == f"k{j}-1"
                   for j in range((ix.n_documents - n_before) // 2))
        # the next write cleans what the killed writer left inside the index
        append_documents(path, docs(f"after{trial}-", 1, rng), tokenizer=TOK, wait=30)
        named = {s["file"] for s in CorpusIndex.open(path).manifest["shards"]}
        assert leftovers(path) == []
        assert {q.name for q in path.iterdir() if q.name.startswith("shard-")} == named
    # a build killed while writing a new index leaves a temporary folder beside it; the next build
    # of that path removes it (its writer is provably gone) and succeeds
    target = tmp_path / "fresh"
    p = subprocess.Popen([sys.executable, "-c", KILLED_BUILD, str(target)], env=ENV, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not any(q.name.startswith(".fresh.") for q in tmp_path.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert not target.exists() and [q.name for q in tmp_path.iterdir() if q.name.startswith(".fresh.")]
    build_index(docs("new", 2, rng), target, tokenizer=TOK)
    assert leftovers(target) == [] and CorpusIndex.open(target, verify=True).n_documents == 2


def test_open_rides_out_a_swap_between_manifest_and_shards(tmp_path, monkeypatch):
    """A reader that read the manifest, then finds its shards removed by a writer's swap (here a
    merge into the index, run right after the manifest was read), opens the new manifest instead
    of reporting a missing file; damage with no swap is still reported."""
    from suffixspec.corpus import merge_indexes, snapshot
    from suffixspec.errors import IndexFormatError

    rng = np.random.default_rng(9)
    path = tmp_path / "ix"
    build_index(docs("d", 6, rng), path, tokenizer=TOK, shard_tokens=100)
    old_files = {s["file"] for s in CorpusIndex.open(path).manifest["shards"]}
    real = snapshot.Shard
    calls = []

    def racing_shard(*args, **kwargs):
        if not calls:
            calls.append(1)
            merge_indexes([path], path)  # removes every file the manifest being opened names
        return real(*args, **kwargs)

    monkeypatch.setattr(snapshot, "Shard", racing_shard)
    ix = CorpusIndex.open(path)
    assert calls and ix.n_shards == 1 and not old_files & {s["file"] for s in ix.manifest["shards"]}
    assert [d.id for d in ix.iter_documents()] == [f"d{i}" for i in range(6)]
    monkeypatch.setattr(snapshot, "Shard", real)
    (path / ix.manifest["shards"][0]["file"]).unlink()  # no writer: a real missing file
    try:
        CorpusIndex.open(path)
        raise AssertionError("a missing shard was not reported")
    except IndexFormatError as exc:
        assert "missing file" in str(exc)
