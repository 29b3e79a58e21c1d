"""The response cache: geometric upkeep against brute force and against the old single-automaton
cache, and its file format against a corruption fuzzer (each batch of cases in a subprocess,
so that a crash fails the test instead of killing the run)."""

import json
import math
import os
import pickle
import struct
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path

import numpy as np
import pytest

import suffixspec.draft.response_cache as cache_mod
from suffixspec import IndexFormatError, Proposer, ResponseCache, SuffixAutomaton
from suffixspec.draft.simulate import load_traces, simulate
from suffixspec.errors import BadInputTypeError

ROOT = Path(__file__).resolve().parents[1]

# the documented layout (suffixspec/draft/response_cache.py, above `_HEADER`), declared here independently
HEADER = struct.Struct("<8sIIQQIIQ8sII")
ENTRY = struct.Struct("<QIIQQQQII8s")


def _docs_of(fa):
    return [d.tolist() for d in fa.documents()]


def _old_policy(docs, max_tokens, generations):
    """The documents the cache holds after `docs`, as the single-automaton cache kept them:
    a live generation rotated once it holds max_tokens // generations tokens, generations - 1
    frozen ones kept."""
    gen = max(1, max_tokens // generations)
    frozen, live = [], []
    for d in docs:
        live.append(d)
        if sum(map(len, live)) >= gen:
            frozen.append(live)
            live = []
            del frozen[: max(0, len(frozen) - (generations - 1))]
    return frozen, live


def _naive_count(docs, pattern):
    k = len(pattern)
    return sum(1 for d in docs for i in range(len(d) - k + 1) if d[i : i + k] == pattern)


def test_levels_hold_the_old_documents_exactly_and_cost_logarithmic_work(monkeypatch):
    """After every add: the documents held (frozen generations, then live levels) are exactly
    the old cache's; each level is exactly the automaton a fresh build gives over its documents;
    counts summed over the sources equal brute force; levels shrink geometrically; and the
    tokens rebuilt per token added stay within a logarithmic bound."""
    built = []
    real_build = cache_mod._build
    monkeypatch.setattr(cache_mod, "_build", lambda t, s: built.append(len(t)) or real_build(t, s))
    rng = np.random.default_rng(3)
    max_tokens, generations = 6000, 3
    cache = ResponseCache(max_tokens, generations)
    docs = []
    for step in range(160):
        doc = rng.integers(0, 5, int(rng.integers(1, 90))).tolist()
        docs.append(doc)
        version = cache.version
        cache.add(doc)
        assert cache.version != version
        frozen, live = _old_policy(docs, max_tokens, generations)
        assert [[d.tolist() for d in g] for g in cache.documents()] == frozen + [live]
        sizes = [len(fa) for _, fa in cache._levels]
        assert all(a > cache_mod.MERGE_RATIO * b for a, b in zip(sizes, sizes[1:]))
        ids = [g for g, _ in cache.sources()[1]]
        assert len(set(ids)) == len(ids)
        if step % 20 == 0:
            held = [d for f in frozen for d in f] + live
            for _, fa in cache.sources()[1]:
                fresh = SuffixAutomaton()
                for d in _docs_of(fa):
                    fresh.add_document(d)
                ref = fresh.freeze()
                for name, a in fa.arrays().items():
                    assert np.array_equal(a, getattr(ref, name)), name
            for pattern in ([0], [1, 2], [0, 0, 0], [4, 3, 2, 1], rng.integers(0, 5, 3).tolist()):
                got = sum(fa.count(pattern) for _, fa in cache.sources()[1])
                assert got == _naive_count(held, pattern)
    gen = max_tokens // generations
    added = sum(map(len, docs))
    # every token is rebuilt at most once per level it climbs, plus once on rotation
    bound = added * (2 + math.log(gen, 1 + 1 / cache_mod.MERGE_RATIO))
    assert sum(built) - added <= bound
    assert sum(built) < 12 * added  # in practice: a handful of rebuilds per token


class _OldCache(ResponseCache):
    """The cache as it was: one live automaton per generation, re-frozen on every add."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self._live = SuffixAutomaton()
        self._live_id = 10**9

    def add(self, tokens):
        self._live.add_document(tokens)
        snap = self._live.freeze()
        snap.kernel_arrays()
        if len(self._live) >= self.generation_tokens:
            self._frozen.append((self._live_id, snap))
            self._live = SuffixAutomaton()
            self._live_id += 1
            self._levels = []
            del self._frozen[: max(0, len(self._frozen) - (self.generations - 1))]
        else:
            self._levels = [(self._live_id, snap)]
        self._touch()


@pytest.mark.parametrize("cache_tokens", [1 << 20, 6000])
def test_acceptance_on_real_traces_matches_the_old_cache(cache_tokens):
    """Replaying the shipped chat traces (in order, so later requests draft from earlier answers
    through the cache) accepts as many tokens per round as with the old single-automaton cache;
    the small cache also rotates generations."""
    traces = load_traces(ROOT / "corpora" / "chat_traces_smollm2.jsonl")
    stats = {}
    for name in ("old", "new"):
        prop = Proposer(cache_tokens=cache_tokens, cache_generations=4)
        if name == "old":
            prop.cache = _OldCache(cache_tokens, 4)
        stats[name] = simulate(traces, prop, budget=16)
    old, new = stats["old"]["mean_accepted_tokens"], stats["new"]["mean_accepted_tokens"]
    assert abs(new - old) <= 0.01 * old, (old, new)


def test_assigning_a_cache_resyncs_open_sessions(tmp_path):
    prop = Proposer()
    s = prop.start([7, 8, 9])
    assert len(s.propose(8)) == 0  # nothing to draft from yet (the hot path is now primed)
    other = ResponseCache()
    other.add([7, 8, 9, 1, 2, 3])
    prop.cache = other
    assert s.propose(8).tokens.tolist()[:3] == [1, 2, 3]
    prop.cache = None
    assert len(s.propose(8)) == 0
    with pytest.raises(BadInputTypeError, match="ResponseCache"):
        prop.cache = "cache.bin"


# -- file format ------------------------------------------------------------------------------

def _sample_cache():
    """A cache with frozen generations and several live levels."""
    rng = np.random.default_rng(5)
    cache = ResponseCache(max_tokens=1500, generations=3)
    for _ in range(38):
        cache.add(rng.integers(0, 6, int(rng.integers(5, 70))))
    assert len(cache._frozen) == 2 and len(cache._levels) == 3
    return cache


def _trees(cache, contexts):
    prop = Proposer()
    prop.cache = cache
    out = []
    for ctx in contexts:
        t = prop.start(ctx).propose(16)
        out.append((t.tokens.tolist(), t.parents.tolist(), t.scores.tolist()))
    return out


def test_round_trip_is_exact(tmp_path):
    cache = _sample_cache()
    path = tmp_path / "c.rcache"
    cache.save(path)
    loaded = ResponseCache.load(path)
    assert (loaded.max_tokens, loaded.generations, loaded._next_id) == (cache.max_tokens, cache.generations, cache._next_id)
    for (g1, a), (g2, b) in zip(cache.sources()[1], loaded.sources()[1], strict=True):
        assert g1 == g2
        for name, x in a.arrays().items():
            assert np.array_equal(x, getattr(b, name)), name
    rng = np.random.default_rng(0)
    contexts = [rng.integers(0, 6, 12).tolist() for _ in range(20)]
    assert _trees(cache, contexts) == _trees(loaded, contexts)
    assert loaded.to_bytes() == path.read_bytes()
    # an empty cache, and a loaded cache keeps growing like the original
    ResponseCache().save(tmp_path / "empty")
    assert len(ResponseCache.load(tmp_path / "empty")) == 0
    assert ResponseCache.load(tmp_path / "empty").documents() == [[]]
    listed = [[d.tolist() for d in g] for g in cache.documents()]
    assert [[d.tolist() for d in g] for g in loaded.documents()] == listed and len(listed) >= 2
    cache.add([1, 2, 3, 4])
    loaded.add([1, 2, 3, 4])
    assert cache.to_bytes() == loaded.to_bytes()


def _fix_crcs(data: bytearray) -> bytearray:
    """Recompute every checksum after a deliberate edit (a crafted file, not random damage)."""
    n = min(HEADER.unpack_from(data, 0)[2], (len(data) - HEADER.size) // ENTRY.size)
    for i in range(n):
        off = HEADER.size + i * ENTRY.size
        f = list(ENTRY.unpack_from(data, off))
        if max(f[5] + 4 * f[3], f[6] + 8 * f[4]) > len(data):
            continue
        n_tok, n_docs, tok_off, st_off = f[3], f[4], f[5], f[6]
        f[7] = zlib.crc32(bytes(data[tok_off : tok_off + 4 * n_tok]))
        f[8] = zlib.crc32(bytes(data[st_off : st_off + 8 * n_docs]))
        ENTRY.pack_into(data, off, *f)
    h = list(HEADER.unpack_from(data, 0))
    h[9] = zlib.crc32(bytes(data[HEADER.size : HEADER.size + n * ENTRY.size]))
    HEADER.pack_into(data, 0, *h)
    struct.pack_into("<I", data, 60, zlib.crc32(bytes(data[:60])))
    return data


def _crafted(data: bytes) -> dict:
    """Files with valid checksums whose content breaks one rule each."""
    out = {}
    n = HEADER.unpack_from(data, 0)[2]
    e0 = HEADER.size
    last = HEADER.size + (n - 1) * ENTRY.size
    first_tok = ENTRY.unpack_from(data, e0)[5]
    first_st = ENTRY.unpack_from(data, e0)[6]

    def edit(name, fn):
        d = bytearray(data)
        fn(d)
        out[name] = bytes(_fix_crcs(d))

    edit("negative token", lambda d: struct.pack_into("<i", d, first_tok, -5))
    edit("token 2**31-1", lambda d: struct.pack_into("<i", d, first_tok, 2**31 - 1))
    edit("first doc start 3", lambda d: struct.pack_into("<q", d, first_st, 3))
    edit("doc starts past the tokens", lambda d: struct.pack_into("<q", d, first_st + 8, 1 << 40))
    edit("doc starts decreasing", lambda d: struct.pack_into("<q", d, first_st + 8, -1))
    edit("more docs than tokens", lambda d: struct.pack_into("<Q", d, e0 + 24, 1 << 50))
    edit("huge token count", lambda d: struct.pack_into("<Q", d, e0 + 16, 1 << 60))
    edit("zero tokens", lambda d: struct.pack_into("<Q", d, e0 + 16, 0))
    edit("offset overlaps the table", lambda d: struct.pack_into("<Q", d, e0 + 32, 8))
    edit("kind 7", lambda d: struct.pack_into("<I", d, last + 8, 7))
    edit("live before frozen", lambda d: struct.pack_into("<I", d, e0 + 8, 1))
    edit("repeated id", lambda d: struct.pack_into("<Q", d, last, ENTRY.unpack_from(data, e0)[0]))
    edit("id past next id", lambda d: struct.pack_into("<Q", d, last, 1 << 62))
    edit("entry count 0", lambda d: struct.pack_into("<I", d, 12, 0))
    edit("entry count huge", lambda d: struct.pack_into("<I", d, 12, 1 << 31))
    edit("generations 0", lambda d: struct.pack_into("<I", d, 32, 0))
    edit("generations 1 (too many frozen)", lambda d: struct.pack_into("<I", d, 32, 1))
    edit("max_tokens 0", lambda d: struct.pack_into("<Q", d, 24, 0))
    edit("max_tokens larger (valid)", lambda d: struct.pack_into("<Q", d, 24, 1502))
    edit("max_tokens tiny (live too long)", lambda d: struct.pack_into("<Q", d, 24, 6))
    edit("version 1", lambda d: struct.pack_into("<I", d, 8, 1))
    edit("file length", lambda d: struct.pack_into("<Q", d, 16, len(data) + 8))
    return out


_WORKER = textwrap.dedent("""
    import json, sys
    from suffixspec import Proposer, ResponseCache
    from suffixspec.errors import SuffixSpecError
    contexts = json.loads(sys.argv[1])
    def trees(cache):
        prop = Proposer()
        prop.cache = cache
        out = []
        for ctx in contexts:
            t = prop.start(ctx).propose(16)
            out.append([t.tokens.tolist(), t.parents.tolist(), t.scores.tolist()])
        return out
    intact = trees(ResponseCache.load(sys.argv[2]))
    for line in sys.stdin:
        case = json.loads(line)
        print(json.dumps({"case": case["name"], "status": "started"}), flush=True)
        try:
            cache = ResponseCache.load(case["path"])
        except SuffixSpecError as exc:
            status = "refused"
            detail = str(exc)
        except BaseException as exc:
            status, detail = "unexpected " + type(exc).__name__, repr(exc)
        else:
            status = "exact" if trees(cache) == intact else "DIFFERENT"
            detail = ""
        print(json.dumps({"case": case["name"], "status": status, "detail": detail}), flush=True)
""")


def test_corruption_fuzzer(tmp_path):
    """Truncations, byte flips (header, table, middle, tail), zeroed blocks, appended junk, files
    crafted with valid checksums, a pickle that would run code, and non-files: every case is
    refused with a suffixspec error or loads a cache that proposes exactly as the intact one."""
    cache = _sample_cache()
    good = tmp_path / "good.rcache"
    cache.save(good)
    data = good.read_bytes()
    size = len(data)
    n_entries = HEADER.unpack_from(data, 0)[2]
    table_end = HEADER.size + ENTRY.size * n_entries
    rng = np.random.default_rng(1234)
    cases: dict[str, bytes | str] = {}
    for off in sorted({0, 1, 8, 63, 64, table_end - 1, table_end, size - 1, *rng.integers(0, size, 36).tolist()}):
        cases[f"truncated at {off}"] = data[:off]

    def flip(where, pos, bit):
        d = bytearray(data)
        d[pos] ^= 1 << bit
        cases[f"flip {where} byte {pos} bit {bit}"] = bytes(d)

    for pos in rng.integers(0, HEADER.size, 16).tolist():
        flip("header", pos, int(rng.integers(8)))
    for pos in rng.integers(HEADER.size, table_end, 16).tolist():
        flip("table", pos, int(rng.integers(8)))
    for pos in rng.integers(table_end, size, 20).tolist():
        flip("middle", pos, int(rng.integers(8)))
    for pos in range(size - 8, size):
        flip("tail", pos, int(rng.integers(8)))
    for k in range(10):
        a = int(rng.integers(0, size - 1))
        d = bytearray(data)
        b = min(size, a + int(rng.integers(1, 256)))
        d[a:b] = bytes(b - a)
        cases[f"zeroed block at {a}"] = bytes(d)
    cases["appended junk"] = data + b"junk"
    cases["appended zeros"] = data + bytes(64)
    cases["doubled"] = data + data
    cases["empty"] = b""
    cases["another magic"] = b"SFXSPIDX" + data[8:]
    cases.update({f"crafted: {k}": v for k, v in _crafted(data).items()})
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    cases["crafted pickle"] = pickle.dumps(Evil())
    cases["crafted pickle after our header"] = data[:64] + pickle.dumps(Evil())
    lines = []
    for i, (name, blob) in enumerate(cases.items()):
        p = tmp_path / f"case{i}.rcache"
        p.write_bytes(blob)
        lines.append({"name": name, "path": str(p)})
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    (tmp_path / "a_dir").mkdir()
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    for name, p in (("fifo", fifo), ("directory", tmp_path / "a_dir"), ("symlink loop", tmp_path / "loop"),
                    ("missing", tmp_path / "missing")):
        lines.append({"name": name, "path": str(p)})
    contexts = [rng.integers(0, 6, 12).tolist() for _ in range(12)]
    results = {}
    n_workers = 2
    for w in range(n_workers):
        batch = lines[w::n_workers]
        proc = subprocess.run([sys.executable, "-c", _WORKER, json.dumps(contexts), str(good)],
                              input="".join(json.dumps(c) + "\n" for c in batch), capture_output=True, text=True,
                              timeout=900)  # generous: a first run may compile the kernels
        started = None
        for line in proc.stdout.splitlines():
            rec = json.loads(line)
            if rec["status"] == "started":
                started = rec["case"]
            else:
                results[rec["case"]] = rec
                started = None
        assert proc.returncode == 0 and started is None, (
            f"worker died (rc {proc.returncode}) on case {started!r}: {proc.stderr[-2000:]}")
    assert len(results) == len(lines)
    bad = {k: r for k, r in results.items() if r["status"] not in ("refused", "exact")}
    assert not bad, bad
    assert not marker.exists(), "loading ran code from the file"
    refused = [r for r in results.values() if r["status"] == "refused"]
    assert all("IndexFormatError" in r["detail"] or "response cache" in r["detail"] for r in refused)
    assert results["crafted: max_tokens larger (valid)"]["status"] == "exact"
    assert results["fifo"]["status"] == "refused" and "regular file" in results["fifo"]["detail"]
    print(f"\ncache corruption fuzzer: {len(results)} cases, {len(refused)} refused, exact: "
          f"{sorted(k for k, r in results.items() if r['status'] == 'exact')}, "
          f"{len(results) - len(refused)} exact")


def test_load_errors_name_the_file_and_the_damage(tmp_path):
    cache = _sample_cache()
    p = tmp_path / "x.rcache"
    cache.save(p)
    data = bytearray(p.read_bytes())
    data[-3] ^= 1
    p.write_bytes(bytes(data))
    with pytest.raises(IndexFormatError, match=r"x\.rcache.*checksum"):
        ResponseCache.load(p)
    with pytest.raises(IndexFormatError, match="regular file"):
        ResponseCache.load(tmp_path)


def test_resynced_cursors_are_the_longest_matches():
    """After the cache changes, a session's cursor into every new level is exactly the longest
    suffix of its last `resync_tokens` tokens found there, as a match from scratch over all of
    them finds it (the resync re-reads only the level's longest document's length of them)."""
    rng = np.random.default_rng(8)
    prop = Proposer(cache_tokens=4000, cache_generations=2, resync_tokens=64)
    sessions = [prop.start(rng.integers(0, 3, 40)) for _ in range(6)]
    checked = shorter = 0
    for step in range(40):
        for s in sessions:
            before = {id(fa) for fa in s._automata}
            s.extend(rng.integers(0, 3, int(rng.integers(1, 6))))
            s.propose(4)
            tail = s._sam.tokens[-prop.resync_tokens :]
            for fa, row in zip(s._automata, s._cur.tolist()):
                if id(fa) not in before:
                    assert tuple(row[:2]) == fa.match(tail)  # (state, length); row[2]: the anchor
                    checked += 1
                    shorter += fa.longest_document < len(tail)
        sessions.pop(int(rng.integers(len(sessions)))).close()
        sessions.append(prop.start(rng.integers(0, 3, int(rng.integers(5, 120)))))
    assert checked > 50 and shorter > 10
