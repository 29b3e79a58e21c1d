"""CorpusIndex against the dynamic automaton and the brute-force reference (tests/naive.py)."""

import os
import struct
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path

import numpy as np
import pytest
from pyroaring import BitMap

from suffixspec import SuffixAutomaton
from suffixspec._kernels import frozen as fk
from suffixspec.corpus import (
    CorpusIndex,
    Document,
    append_documents,
    build_index,
    delete_documents,
    merge_indexes,
)
from suffixspec.errors import BadInputError, IndexFormatError, TokenizerMismatchError

from support import naive
from support.implicit import to_implicit

TOK = {"name": "toy", "vocab_size": 65536, "fingerprint": "f" * 64}
OTHER_TOK = {"name": "other", "vocab_size": 65536, "fingerprint": "0" * 64}


def random_docs(seed, n_docs=14, max_len=40, alphabet=3):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, alphabet, int(rng.integers(0, max_len))).tolist() for _ in range(n_docs)]


def build(tmp_path, docs, name="ix", **kw):
    kw.setdefault("tokenizer", TOK)
    documents = [Document(np.asarray(d, np.int32), id=f"d{i}", tags={"parity": str(i % 2)}) for i, d in enumerate(docs)]
    build_index(documents, tmp_path / name, **kw)
    return CorpusIndex.open(tmp_path / name)


# -- restricted brute force ---------------------------------------------------------------------


def doc_of(docs, pos):
    base = 0
    for i, d in enumerate(docs):
        if pos < base + len(d):
            return i
        base += len(d)
    raise AssertionError


def r_ends(docs, keep, pattern):
    return [e for e in naive.end_positions(docs, pattern) if doc_of(docs, e) in keep]


def r_match_length(docs, keep, context):
    best = 0
    for length in range(1, len(context) + 1):
        if r_ends(docs, keep, context[len(context) - length:]):
            best = length
        else:
            break
    return best


def r_continuations(docs, keep, pattern):
    out = {}
    for tok in sorted({t for d in docs for t in d}):
        ends = r_ends(docs, keep, list(pattern) + [tok])
        if ends:
            out[tok] = (len(ends), max(ends))
    return out


def patterns(docs, rng, n=60):
    """Substrings of the documents (so they occur) plus random ones (so some do not)."""
    out = [[]]
    flat = [d for d in docs if d]
    for _ in range(n):
        d = flat[int(rng.integers(len(flat)))]
        i = int(rng.integers(len(d)))
        out.append(d[i:i + int(rng.integers(1, 6))])
        out.append(rng.integers(0, 3, int(rng.integers(1, 5))).tolist())
    return out


# -- equivalence ------------------------------------------------------------------------------


@pytest.mark.parametrize("shard_tokens", [10**6, 50, 7])
@pytest.mark.parametrize("seed", [0, 1])
def test_unrestricted_equals_automaton_and_naive(tmp_path, seed, shard_tokens):
    docs = random_docs(seed)
    ix = build(tmp_path, docs, shard_tokens=shard_tokens)
    live = [d for d in docs if d]  # empty documents are skipped
    assert ix.n_documents == len(live) and ix.n_tokens == sum(map(len, live))
    if shard_tokens == 7:
        assert ix.n_shards > 3
    sa = SuffixAutomaton()
    for d in docs:
        sa.add_document(d)
    rng = np.random.default_rng(seed)
    for p in patterns(live, rng):
        assert ix.count(p) == naive.count(live, p) == sa.count(p)
        want = naive.continuations(live, p)
        assert ix.continuations(p) == want
        state = sa.locate(p)
        if state >= 0:
            assert sa.continuations(state).as_dict() == want
        assert ix.match_length(p) == naive.match_length(live, p) == sa.match_length(p)
        m = ix.query(p)
        assert m.length == naive.match_length(live, p) and not m.estimated
        assert m.count == naive.count(live, p[len(p) - m.length:])
        assert m.as_dict() == naive.continuations(live, p[len(p) - m.length:])


@pytest.mark.parametrize("shard_tokens", [10**6, 40])
def test_restricted_subsets_equal_naive(tmp_path, shard_tokens):
    docs = [d for d in random_docs(3, n_docs=16) if d]
    ix = build(tmp_path, docs, shard_tokens=shard_tokens)
    rng = np.random.default_rng(5)
    for trial in range(4):
        keep = {i for i in range(len(docs)) if rng.random() < 0.4}
        sub = ix.subset(BitMap(keep))
        for p in patterns(docs, rng, n=25):
            m = ix.lookup(p, sub, k=10**6)
            assert not m.estimated
            assert m.count == len(r_ends(docs, keep, p)), (keep, p)
            assert m.as_dict() == r_continuations(docs, keep, p)
            assert ix.match_length(p, sub) == r_match_length(docs, keep, p)
            q = ix.query(p, sub)
            assert q.length == r_match_length(docs, keep, p)
            assert q.as_dict() == r_continuations(docs, keep, p[len(p) - q.length:])


def test_subset_by_tags_and_ids(tmp_path):
    docs = [d for d in random_docs(4) if d]
    ix = build(tmp_path, docs, shard_tokens=30)
    odd = ix.subset(tags={"parity": "1"})
    assert set(odd.bitmap) == {i for i in range(len(docs)) if i % 2}
    assert set(ix.subset(ids=["d0", "d3"]).bitmap) == {0, 3}
    keep = set(odd.bitmap)
    for p in patterns(docs, np.random.default_rng(0), n=20):
        assert ix.count(p, odd) == len(r_ends(docs, keep, p))
    assert ix.subset(tags={"parity": "7"}).mask.sum() == 0
    assert ix.match_length(docs[0], ix.subset(tags={"parity": "7"})) == 0


def test_estimate_beyond_k(tmp_path):
    docs = [[0, 1] * 50 for _ in range(10)]
    ix = build(tmp_path, docs)
    keep = {0, 1, 2}
    sub = ix.subset(BitMap(keep))
    exact = ix.lookup([0, 1], sub, k=10**6)
    assert exact.count == 150 and not exact.estimated
    # beyond k the estimate comes from the k most recent occurrences (all in document 9 here)
    est = ix.lookup([0, 1], sub, k=64)
    assert est.estimated and est.count == 0 and est.length == 2
    recent = ix.lookup([0, 1], ix.subset(BitMap({8, 9})), k=64)
    assert recent.estimated and recent.count == 500 and recent.as_dict()[0][1] == 998
    assert ix.match_length([0, 1], sub) == 2  # lengths stay exact
    small = ix.lookup([0, 1], sub, k=500)  # 500 occurrences <= k: exact
    assert small.count == 150 and not small.estimated


def recent_estimate(docs, keep, pattern, k):
    """Brute-force restricted count estimated from the k most recent end positions."""
    ends = sorted(naive.end_positions(docs, pattern))
    if len(ends) <= k:
        return len(r_ends(docs, keep, pattern)), False
    recent = ends[-k:]
    hits = sum(doc_of(docs, e) in keep for e in recent)
    return int(round(hits * len(ends) / k)), True


@pytest.mark.parametrize("deleted", [False, True])
def test_work_cap_against_brute_force(tmp_path, deleted):
    """Restricted queries with a small k: exact (and equal to brute force) whenever the matched
    string occurs at most k times, estimated from the k most recent occurrences up to 8k, flagged
    beyond; a capped walk never claims a suffix absent from the subset."""
    rng = np.random.default_rng(21)
    docs = [rng.integers(0, 3, int(rng.integers(20, 60))).tolist() for _ in range(24)]
    build(tmp_path, docs, shard_tokens=10**6)
    keep = {i for i in range(len(docs)) if rng.random() < 0.3}
    if deleted:
        delete_documents(tmp_path / "ix", sorted(set(range(len(docs))) - keep))
    ix = CorpusIndex.open(tmp_path / "ix")
    sub = None if deleted else ix.subset(BitMap(keep))
    n_est = n_exact_big = 0
    for k in (1, 3, 8, 40):
        for p in patterns(docs, rng, n=40):
            c = naive.count(docs, p)
            m = ix.lookup(p, sub, k=k)
            if c <= 8 * k:
                want, est = recent_estimate(docs, keep, p, k)
                assert (m.count, m.estimated) == (want, est), (k, p)
                n_exact_big += c > k
            else:
                assert m.estimated and 0 <= m.count <= c
            if not m.estimated:
                assert m.as_dict() == r_continuations(docs, keep, p)
            q = ix.query(p, sub, k=k)
            true_len = r_match_length(docs, keep, p)
            assert q.length <= true_len
            if q.length:
                assert r_ends(docs, keep, p[len(p) - q.length:])  # the match does occur in the subset
            if not q.estimated:
                assert q.length == true_len
                assert q.count == len(r_ends(docs, keep, p[len(p) - q.length:]))
                assert q.as_dict() == r_continuations(docs, keep, p[len(p) - q.length:])
            else:
                n_est += 1
            big = ix.query(p, sub, k=10**6)
            assert not big.estimated and big.length == true_len
    assert n_est > 20 and n_exact_big > 5  # both regimes were exercised


def test_real_text_multi_shard(tmp_path, real_streams):
    docs = [list(s[i:i + 700]) for s in real_streams for i in range(0, 2100, 700) if len(s[i:i + 700]) > 10]
    ix = build(tmp_path, docs, shard_tokens=5000)
    sa = SuffixAutomaton()
    for d in docs:
        sa.add_document(d)
    assert ix.n_shards >= 3
    rng = np.random.default_rng(1)
    keep = set(range(0, len(docs), 3))
    sub = ix.subset(BitMap(keep))
    for _ in range(40):
        d = docs[int(rng.integers(len(docs)))]
        i = int(rng.integers(len(d) - 8))
        ctx = d[i:i + int(rng.integers(1, 8))]
        assert ix.match_length(ctx) == sa.match_length(ctx)
        assert ix.count(ctx) == sa.count(ctx)
        st = sa.locate(ctx)
        assert ix.continuations(ctx) == sa.continuations(st).as_dict()
        m = ix.lookup(ctx, sub, k=10**6)
        assert m.count == len(r_ends(docs, keep, ctx))
    # following and document spans use global positions
    m = ix.query(docs[5][:6])
    end = int(m.last_ends[0]) if len(m) else 0
    assert np.array_equal(ix.following(end, 4), sa.following(end, 4))
    for doc in (0, 4, len(docs) - 1):
        assert ix.document_tokens(doc).tolist() == list(docs[doc])


def test_deletions(tmp_path):
    docs = [d for d in random_docs(6) if d]
    build(tmp_path, docs, shard_tokens=60)
    gone = {1, 4, 5}
    assert delete_documents(tmp_path / "ix", gone) == 3
    ix = CorpusIndex.open(tmp_path / "ix", verify=True)
    assert set(ix.deleted) == gone
    keep = set(range(len(docs))) - gone
    for p in patterns(docs, np.random.default_rng(2), n=25):
        assert ix.count(p, k=10**6) == len(r_ends(docs, keep, p))
        assert ix.match_length(p) == r_match_length(docs, keep, p)
        assert ix.continuations(p, k=10**6) == r_continuations(docs, keep, p)
        sub = ix.subset(BitMap({0, 1, 2}))  # deleted documents stay excluded from subsets
        assert ix.count(p, sub, k=10**6) == len(r_ends(docs, {0, 2}, p))
    merged = merge_indexes([tmp_path / "ix"], tmp_path / "merged")
    assert merged.n_documents == len(keep)
    mix = CorpusIndex.open(tmp_path / "merged")
    assert len(mix.deleted) == 0 and mix.n_shards == 1
    kept_docs = [docs[i] for i in sorted(keep)]
    for p in patterns(kept_docs, np.random.default_rng(3), n=20):
        assert mix.count(p) == naive.count(kept_docs, p)
    with pytest.raises(BadInputError):
        delete_documents(tmp_path / "ix", [len(docs)])


def check_live(ix, docs, keep):
    """Every query of `ix` equals brute force over the documents in `keep` (positions stay global)."""
    for p in patterns(docs, np.random.default_rng(len(keep)), n=20):
        assert ix.count(p, k=10**6) == len(r_ends(docs, keep, p))
        assert ix.continuations(p, k=10**6) == r_continuations(docs, keep, p)
        assert ix.match_length(p) == r_match_length(docs, keep, p)
        q = ix.query(p, k=10**6)
        assert q.length == r_match_length(docs, keep, p) and not q.estimated
        assert q.as_dict() == r_continuations(docs, keep, p[len(p) - q.length:])


@pytest.mark.parametrize("shard_tokens", [10**6, 45])
def test_deletions_by_id_and_tags_mirror_a_set(tmp_path, shard_tokens):
    """Stateful: each deletion is mirrored on a plain set; queries equal brute force after each."""
    docs = [d for d in random_docs(15, n_docs=18) if d]
    build(tmp_path, docs, shard_tokens=shard_tokens)
    path = tmp_path / "ix"
    gone = set()
    steps = [dict(ids=["d3"]), dict(ids=["d0", "d7", "d3"]), dict(tags={"parity": "1"}, ids=["d5", "d6"]),
             dict(documents=[len(docs) - 1]), dict(tags={"parity": "0"}), dict(tags={"parity": "1"})]
    for step in steps:
        chosen = set(CorpusIndex.open(path).select_documents(**step))
        want = {i for i in range(len(docs))
                if ("ids" not in step or f"d{i}" in step["ids"])
                and ("tags" not in step or str(i % 2) == step["tags"]["parity"])
                and ("documents" not in step or i in step["documents"])}
        assert chosen == want
        gone |= want
        assert delete_documents(path, **step) == len(gone)
        ix = CorpusIndex.open(path, verify=True)
        assert set(ix.deleted) == gone
        check_live(ix, docs, set(range(len(docs))) - gone)
        assert [d.id for d in ix.iter_documents()] == [f"d{i}" for i in range(len(docs)) if i not in gone]
    # every document is deleted now: queries find nothing, merging has nothing to keep
    ix = CorpusIndex.open(path)
    assert ix.query(docs[0]).length == 0 and ix.count([]) == 0
    with pytest.raises(BadInputError, match="every document"):
        merge_indexes([path], tmp_path / "m")
    assert sorted(p.name for p in path.iterdir() if p.name.startswith("deleted")) == [ix.manifest["deleted"]["file"]]


def test_delete_rejects_bad_selections_and_changes_nothing(tmp_path):
    docs = [d for d in random_docs(16) if d]
    build(tmp_path, docs, shard_tokens=60)
    path = tmp_path / "ix"
    delete_documents(path, ids=["d1"])
    before = {p.name: p.read_bytes() for p in path.iterdir()}
    bad = [dict(ids=["d1", "nope"]), dict(tags={"parity": "9"}), dict(), dict(documents=[len(docs)]),
           dict(documents=[-1]), dict(ids=["d0"], tags={"parity": "1"})]
    for kw in bad:
        with pytest.raises(BadInputError):
            delete_documents(path, **kw)
    with pytest.raises(BadInputError, match="no document with id 'nope'"):
        delete_documents(path, ids=["nope"])
    assert delete_documents(path, ids=["d1"]) == 1  # already deleted: nothing is rewritten
    assert {p.name: p.read_bytes() for p in path.iterdir()} == before
    with pytest.raises(IndexFormatError, match="no such index"):
        delete_documents(tmp_path / "missing", ids=["d1"])


def test_round_trip_append_merge(tmp_path):
    docs = [d for d in random_docs(7, n_docs=20) if d]
    ix = build(tmp_path, docs[:12], shard_tokens=80)
    docs_back = list(ix.iter_documents())
    assert [d.tokens.tolist() for d in docs_back] == docs[:12]
    assert [d.id for d in docs_back] == [f"d{i}" for i in range(12)]
    assert docs_back[3].tags == {"parity": "1"}
    append_documents(tmp_path / "ix", [Document(np.asarray(d, np.int32), id=f"d{12 + i}") for i, d in enumerate(docs[12:])],
                     tokenizer=TOK, shard_tokens=80)
    ix = CorpusIndex.open(tmp_path / "ix", verify=True)
    assert ix.n_documents == len(docs) and ix.document_ids[-1] == f"d{len(docs) - 1}"
    build(tmp_path, docs[:5], name="other")
    merge_indexes([tmp_path / "ix", tmp_path / "other"], tmp_path / "m")
    m = CorpusIndex.open(tmp_path / "m", verify=True)
    all_docs = docs + docs[:5]
    assert m.n_shards == 1 and m.n_documents == len(all_docs)
    for p in patterns(all_docs, np.random.default_rng(8), n=25):
        assert m.count(p) == naive.count(all_docs, p)
        assert m.continuations(p) == naive.continuations(all_docs, p)
    with pytest.raises(TokenizerMismatchError):
        append_documents(tmp_path / "ix", [[1, 2]], tokenizer=OTHER_TOK)
    build(tmp_path, docs[:3], name="foreign", tokenizer=OTHER_TOK)
    with pytest.raises(TokenizerMismatchError):
        merge_indexes([tmp_path / "ix", tmp_path / "foreign"], tmp_path / "m2")


def test_atomic_write(tmp_path):
    docs = random_docs(9)
    build(tmp_path, docs)
    build(tmp_path, docs[:3])  # an existing index is replaced
    ix = CorpusIndex.open(tmp_path / "ix", verify=True)
    assert ix.n_documents == len([d for d in docs[:3] if d])
    # the old generation's files are gone: the folder holds what the manifest names, and the lock
    assert {p.name for p in (tmp_path / "ix").iterdir()} == {"lock", "manifest.ssx", *(s["file"] for s in ix.manifest["shards"])}

    def failing():
        yield Document(np.array([1, 2, 3], np.int32))
        raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError):  # an interrupted rebuild leaves the index as it was
        build_index(failing(), tmp_path / "ix", tokenizer=TOK)
    assert CorpusIndex.open(tmp_path / "ix", verify=True).document_ids == ix.document_ids
    with pytest.raises(RuntimeError):
        build_index(failing(), tmp_path / "new", tokenizer=TOK)
    assert not (tmp_path / "new").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ix"]  # no temporary left behind
    (tmp_path / "file.txt").write_text("hello")
    with pytest.raises(BadInputError, match="not a suffixspec index"):
        build_index([[1, 2]], tmp_path / "file.txt", tokenizer=TOK)
    with pytest.raises(BadInputError, match="empty corpus"):
        build_index([[], []], tmp_path / "empty", tokenizer=TOK)
    assert not (tmp_path / "empty").exists()


def test_parallel_build_equals_serial(tmp_path):
    docs = [d for d in random_docs(11, n_docs=30) if d]
    a = build(tmp_path, docs, name="a", shard_tokens=100, jobs=1)
    b = build(tmp_path, docs, name="b", shard_tokens=100, jobs=2)
    assert a.n_shards == b.n_shards > 2
    for s, t in zip(a.shards, b.shards):
        assert s.file.payload_crc == t.file.payload_crc


def test_shard_of_huge_token_ids_answers_like_the_automaton(tmp_path):
    """A shard over really huge token ids (the automaton hashes its edges, no dense row) opens and
    answers like the automaton."""
    docs = [d for d in random_docs(23, n_docs=25, max_len=90) if d]
    big = [[(1 << 30) + t for t in d] for d in docs]
    ix = build(tmp_path, big, name="big", shard_tokens=10_000, tokenizer={**TOK, "vocab_size": 1 << 31})
    sa = SuffixAutomaton()
    for d in big:
        sa.add_document(d)
    for d in big[:5]:
        p = d[: max(1, len(d) // 3)]
        assert ix.count(p) == sa.count(p) == naive.count(big, p)


@pytest.mark.parametrize("big_ids", [False, True])
def test_mapped_shard_file_equals_in_memory_write(tmp_path, big_ids):
    """A shard written in place through its file mapping has the bytes of the frozen automaton
    written from memory, its count-1 states made implicit by the reference conversion: token ids as
    uint16 when they all fit, else int32; no occurrence layout."""
    import json

    from suffixspec.corpus import shards as C

    docs = [d for d in random_docs(17, n_docs=20, max_len=80) if d]
    if big_ids:
        docs = [np.asarray(d, np.int64) + 65534 for d in docs]  # ids around uint16's range
    lens = np.array([len(d) for d in docs], np.int64)
    tokens = np.concatenate([np.asarray(d, np.int32) for d in docs])
    ids, tags = [f"d{i}" for i in range(len(docs))], [{"n": str(i)} for i in range(len(docs))]
    mapped = C.build_shard_file(str(tmp_path / "mapped.ssx"), tokens, lens, ids, tags)
    sa = SuffixAutomaton()
    for d in docs:
        sa.add_document(d)
    fa = sa.freeze()
    conv, _ = to_implicit(fa)
    narrow = np.int32 if big_ids else np.uint16
    assert C.token_dtype(tokens) == narrow
    arrays = {k: conv[k] for k in ("links", "lens", "counts", "count_escapes", "lasts", "offsets", "etok", "eto")}
    arrays["etok"], arrays["tokens"] = arrays["etok"].astype(narrow), np.asarray(fa.tokens).astype(narrow)
    arrays["lens"] = arrays["lens"].astype(np.uint16)
    arrays["plink"], arrays["doc_starts"] = conv["plink"], np.asarray(fa.doc_starts, np.int64)
    arrays["doc_info"] = np.frombuffer(json.dumps({"ids": ids, "tags": tags}).encode(), np.uint8)
    n_stored = len(conv["links"])
    assert n_stored < fa.n_states // 2  # most states are implicit
    meta = {"n_tokens": fa.tokens.shape[0], "n_documents": len(docs), "n_states": n_stored,
            "n_edges": len(conv["etok"]), "n_implicit": fa.n_states - n_stored}
    from suffixspec.corpus import format as F

    plain = F.write_container(tmp_path / "plain.ssx", F.KIND_SHARD, meta, arrays)
    assert mapped["payload_crc"] == plain["payload_crc"] and mapped["bytes"] == plain["bytes"]
    assert (tmp_path / "mapped.ssx").read_bytes() == (tmp_path / "plain.ssx").read_bytes()
    assert set(mapped["phases"]) == {"automaton", "freeze", "counts", "checksums", "write"}


def test_long_document_int32_lengths_and_uint16_elsewhere(tmp_path):
    """A shard whose longest document is over 65535 tokens keeps int32 state lengths (and answers as
    the automaton does); the other shards of the index take uint16 ones."""
    rng = np.random.default_rng(5)
    long_doc = np.tile(rng.integers(0, 50, 700), 100)[:70000]  # repeats: matches longer than 65535 tokens
    docs = [rng.integers(0, 50, 300), long_doc, rng.integers(0, 50, 200)]
    ix = build(tmp_path, docs, shard_tokens=1000)
    assert [s.fa.lens.dtype for s in ix.shards] == [np.uint16, np.int32, np.uint16]
    assert [s.fa.tokens.dtype for s in ix.shards] == [np.uint16] * 3
    sa = SuffixAutomaton()
    for d in docs:
        sa.add_document(d)
    for q in (long_doc[100:69900], long_doc[-300:], docs[0][5:40], np.concatenate([docs[2][:9], long_doc[:5]])):
        m = ix.query(q)
        assert m.length == sa.match_length(q) and m.count == sa.count(q[len(q) - m.length:])
        assert sorted(ix.continuations(q[-3:]).items()) == sorted(sa.continuations(sa.locate(q[-3:])).as_dict().items())
    assert ix.match_length(long_doc) == 70000
    assert ix.query(long_doc[1:], ix.subset(ids=["d1"])).length == 69999


def test_long_document_saturated_uint16_lengths(tmp_path):
    """A shard with documents over 65535 tokens but no repeat that long stores uint16 state lengths,
    those over 65535 saturated (stored states that are no suffix link, here a repeated document's
    prefix states: no query reads them; the other long states are implicit); it answers as
    the automaton does, `state_length` gives every state's true length, and it drafts the same trees."""
    from suffixspec import FrozenAutomaton, Proposer
    from suffixspec._kernels.frozen import LEN_SATURATED

    rng = np.random.default_rng(8)
    long_docs = [rng.integers(0, 30000, 70000), rng.integers(0, 30000, 66000)]
    long_docs[1][40000:40300] = long_docs[0][100:400]  # a shared stretch inside the long documents
    # the second copy of long_docs[0]: its prefix states end twice, so they are stored (not implicit)
    docs = [rng.integers(0, 30000, 300), long_docs[0], rng.integers(0, 30000, 50), long_docs[1], long_docs[0]]
    ix = build(tmp_path, docs, shard_tokens=10**6)
    fa = ix.shards[0].fa
    assert fa.lens.dtype == np.uint16 and int((np.asarray(fa.lens) == LEN_SATURATED).sum()) > 4000
    starts = np.cumsum([0] + [len(d) for d in docs[:-1]])
    ref = FrozenAutomaton.from_documents(np.concatenate(docs).astype(np.int32), starts)
    conv, newid = to_implicit(ref)
    assert np.array_equal(np.minimum(conv["lens"], LEN_SATURATED), fa.lens) and np.array_equal(conv["links"], fa.links)
    assert np.array_equal(conv["plink"], fa.plink)
    want = np.asarray(ref.lens)
    saturated = set(np.flatnonzero(np.asarray(fa.lens) == LEN_SATURATED).tolist())
    for v in [v for v in range(ref.n_states) if newid[v] in saturated] + list(range(0, ref.n_states, 997)):
        assert fa.state_length(int(newid[v])) == int(want[v])  # stored (saturated or not) and implicit
    for v in range(1, ref.n_states, 331):  # every state's own values, stored or implicit, under its new id
        w = int(newid[v])
        assert fa.state_link(w) == int(newid[ref.links[v]]) if ref.links[v] > 0 else fa.state_link(w) == 0
        assert fa.state_count(w) == int(ref.counts[v]) and fa.state_last_end(w) == int(ref.lasts[v])
        assert fa.continuations(w).as_dict() == {int(t): (int(c), int(e)) for t, c, e in zip(
            *(getattr(ref.continuations(v), k) for k in ("tokens", "counts", "last_ends")))}
    hole = int(np.flatnonzero(np.asarray(fa.plink) == fk.HOLE)[0])  # a position whose prefix state is stored
    with pytest.raises(BadInputError, match="no state"):
        fa.state_count(fa.n_stored + hole)
    assert int(np.asarray(fa.lens)[np.asarray(fa.links)[1:]].max()) < LEN_SATURATED  # no suffix link saturated
    for q in (long_docs[0][100:69900], long_docs[1][39990:40310], long_docs[1][-70:], docs[2][3:40]):
        m = ix.query(q)
        assert m.length == ref.match_length(q) and m.count == ref.count(q[len(q) - m.length:])
        assert ix.continuations(q[-3:]) == ref.continuations(ref.locate(q[-3:])).as_dict()
    assert ix.query(long_docs[0][1:], ix.subset(ids=["d1"])).length == 69999
    # and against a brute-force scan of the text (vectorised: the documents are long)
    text = np.concatenate(docs)
    doc_id = np.repeat(np.arange(len(docs)), [len(d) for d in docs])

    def ends(pattern):
        m = len(pattern)
        win = np.lib.stride_tricks.sliding_window_view(text, m)
        hit = np.all(win == np.asarray(pattern), axis=1) & (doc_id[: len(text) - m + 1] == doc_id[m - 1 :])
        return np.flatnonzero(hit) + m - 1

    for pattern in (long_docs[0][150:153], long_docs[1][40100:40104], docs[2][3:5], long_docs[1][-2:], docs[0][:1]):
        e = ends(pattern)
        nxt = e[(e + 1 < len(text)) & (doc_id[np.minimum(e + 1, len(text) - 1)] == doc_id[e])] + 1
        want = {int(t): (int((text[nxt] == t).sum()), int(nxt[text[nxt] == t].max())) for t in np.unique(text[nxt])}
        assert ix.count(pattern) == len(e) and ix.continuations(pattern) == want
    for ctx in (np.concatenate([rng.integers(0, 30000, 3), long_docs[1][40250:40290]]), long_docs[0][-45:]):
        length = next(ln for ln in range(len(ctx), -1, -1) if ln == 0 or len(ends(ctx[len(ctx) - ln :])))
        assert ix.match_length(ctx) == length
    a, b = Proposer(corpus=ix), Proposer(corpus=ref)
    for prompt in (long_docs[1][39000:40100], long_docs[0][60000:66000], long_docs[0][-600:]):
        ta, tb = a.start(prompt.astype(np.int32)).propose(32), b.start(prompt.astype(np.int32)).propose(32)
        assert len(ta) > 0 and np.array_equal(ta.tokens, tb.tokens) and np.array_equal(ta.scores, tb.scores)


def test_reader_layout_equals_reference(tmp_path):
    """The occurrence layout a reader computes for a shard (on its first restricted query) is the
    reference's: every position under its prefix state, in suffix-link-tree preorder."""
    from suffixspec._kernels import corpus_build as cbk

    docs = [d for d in random_docs(23, n_docs=30, max_len=90) if d]
    ix = build(tmp_path, docs, shard_tokens=400)
    assert ix.n_shards > 1
    for s in ix.shards:
        assert s._layout is None  # not computed on open
        fa = s.fa
        pstate = cbk.prefix_states(fa.offsets, fa.etok, fa.eto, fa.tokens, fa.plink, fa.doc_starts)
        # every state id, implicit ones (and holes: no positions) included
        links, counts = fk.all_ids_columns(fa.links, fa.counts, fa.count_escapes, fa.plink)
        assert (pstate >= fa.n_stored).mean() > 0.5  # most positions' prefix states are implicit
        occ, occ_start = naive.occurrence_layout(links, pstate)
        got = s.layout()
        assert np.array_equal(got[0], occ) and np.array_equal(got[1], occ_start)
        assert s.layout() is got  # computed once
        # damaged counts or links: refused, never an out-of-range write
        W = np.empty((fa.n_states, cbk.W_COLS), np.int32)
        out = (np.empty(len(fa), np.int32), np.empty(fa.n_states, np.int32))
        assert cbk.place_occurrences(links, counts, pstate, *out, W)
        for v in range(1, min(fa.n_stored, 40)):
            bad = np.array(counts)
            bad[v] += 1
            assert not cbk.place_occurrences(links, bad, pstate, *out, W)
            bad[v] = 2**31 - 1
            assert not cbk.place_occurrences(links, bad, pstate, *out, W)
        bad_links = np.array(links)
        bad_links[1] = 1
        assert not cbk.place_occurrences(bad_links, counts, pstate, *out, W)
        # a damaged implicit suffix link: no layout
        bad_plink = np.array(fa.plink)
        bad_plink[int(np.flatnonzero(bad_plink != fk.HOLE)[0])] = fa.n_stored + 3
        assert fk.all_ids_columns(fa.links, fa.counts, fa.count_escapes, bad_plink)[0].min() == -1


def test_frozen_layout_kernel_equals_the_one_over_every_id(tmp_path):
    """`place_occurrences_frozen` (scratch rows for stored states only, the layout the reader keeps)
    gives exactly what `place_occurrences` gives over every state id (`all_ids_columns`: implicit
    states and holes as rows), on random corpora, documents of one token and escaped counts; the
    damage either refuses, it refuses too (and a prefix state that is not its position's own)."""
    from suffixspec._kernels import corpus_build as cbk

    rng = np.random.default_rng(5)
    cases = [random_docs(s, n_docs=int(rng.integers(1, 40)), max_len=int(rng.integers(2, 300)), alphabet=a)
             for s, a in zip(range(8), (2, 3, 5, 9, 40, 2, 300, 4))]
    cases.append([[7], [7], [1, 7], [7, 7, 7]])
    cases.append([np.zeros(66000, np.int64), rng.integers(1, 4, 500)])
    for i, docs in enumerate(cases):
        ix = build(tmp_path, [d for d in docs if len(d)], name=f"ix{i}", shard_tokens=2000)
        for s in ix.shards:
            fa = s.fa
            n, ns = len(fa), fa.n_stored
            pstate = cbk.prefix_states(fa.offsets, fa.etok, fa.eto, fa.tokens, fa.plink, fa.doc_starts)
            links, counts = fk.all_ids_columns(fa.links, fa.counts, fa.count_escapes, fa.plink)
            want = (np.empty(n, np.int32), np.empty(ns + n, np.int32))
            assert cbk.place_occurrences(links, counts, pstate, *want, np.empty((ns + n, cbk.P_COLS), np.int32))

            def frozen(links=fa.links, counts=fa.counts, plink=fa.plink, pstate=pstate, rows=ns, starts=ns + n):
                got = (np.full(n, -7, np.int32), np.full(starts, -7, np.int32))
                ok = cbk.place_occurrences_frozen(links, counts, fa.count_escapes, plink, pstate, *got,
                                                  np.empty((rows, cbk.P_COLS), np.int32))
                return ok, got

            ok, got = frozen()
            assert ok and np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
            assert np.array_equal(s.layout()[0], want[0]) and np.array_equal(s.layout()[1], want[1])
            assert not frozen(rows=ns - 1)[0] and not frozen(starts=ns + n - 1)[0]
            for v in range(1, min(ns, 12)):
                bad = np.array(fa.counts)
                bad[v] = int(bad[v]) + (1 if int(bad[v]) < 65534 else -1)
                assert not frozen(counts=bad)[0]
            if ns > 1:
                bad_links = np.array(fa.links)
                bad_links[1] = 1
                assert not frozen(links=bad_links)[0]
            implicit = np.flatnonzero(np.asarray(fa.plink) != fk.HOLE)
            holes = np.flatnonzero(np.asarray(fa.plink) == fk.HOLE)
            if implicit.shape[0] >= 2:
                bad_plink = np.array(fa.plink)
                bad_plink[implicit[0]] = ns + 3
                assert not frozen(plink=bad_plink)[0]
                swapped = np.array(pstate)
                swapped[implicit[:2]] = swapped[implicit[:2][::-1]]
                assert not frozen(pstate=swapped)[0]
            if holes.shape[0] and implicit.shape[0]:
                bad_p = np.array(pstate)
                bad_p[holes[0]] = ns + implicit[0]
                assert not frozen(pstate=bad_p)[0]
        ix.close()


# -- damage -----------------------------------------------------------------------------------


def index_files(path):
    return sorted(p for p in Path(path).iterdir() if p.suffix == ".ssx")


def open_and_verify(path):
    CorpusIndex.open(path, verify=True)


@pytest.fixture
def damaged_setup(tmp_path):
    docs = [d for d in random_docs(12) if d]
    build(tmp_path, docs, shard_tokens=120)
    delete_documents(tmp_path / "ix", [2])
    return tmp_path / "ix"


def test_damage_truncate_flip_zero(damaged_setup, tmp_path):
    files = index_files(damaged_setup)
    assert len(files) >= 4  # manifest, shards, deleted bitmap
    pristine = {f: f.read_bytes() for f in files}
    for f, data in pristine.items():
        for cut in (0, 10, 64, len(data) // 2, len(data) - 1):
            f.write_bytes(data[:cut])
            with pytest.raises(IndexFormatError, match=f.name):
                open_and_verify(damaged_setup)
        for where in (3, 20, 70, len(data) // 3, len(data) - 2):
            bad = bytearray(data)
            bad[where] ^= 0x5A
            f.write_bytes(bytes(bad))
            with pytest.raises(IndexFormatError, match=f.name):
                open_and_verify(damaged_setup)
        f.write_bytes(b"\0" * len(data))
        with pytest.raises(IndexFormatError, match=f"{f.name}.*bad magic"):
            open_and_verify(damaged_setup)
        f.write_bytes(data)
    open_and_verify(damaged_setup)
    (damaged_setup / files[-1].name).unlink()
    with pytest.raises(IndexFormatError, match="missing"):
        CorpusIndex.open(damaged_setup)


def rewrite_header(f, **fields):
    data = bytearray(f.read_bytes())
    if "magic" in fields:
        data[0:8] = fields["magic"]
    if "version" in fields:
        data[8:12] = struct.pack("<I", fields["version"])
    data[60:64] = struct.pack("<I", zlib.crc32(bytes(data[:60])))
    f.write_bytes(bytes(data))


def test_wrong_magic_version_tokenizer(damaged_setup):
    manifest = damaged_setup / "manifest.ssx"
    good = manifest.read_bytes()
    rewrite_header(manifest, version=5)
    with pytest.raises(IndexFormatError, match=r"manifest.ssx: format version 5, this suffixspec reads version 4 \(a newer"):
        CorpusIndex.open(damaged_setup)
    manifest.write_bytes(good)
    rewrite_header(manifest, magic=b"GGUF\0\0\0\0")
    with pytest.raises(IndexFormatError, match="bad magic"):
        CorpusIndex.open(damaged_setup)
    manifest.write_bytes(good)
    with pytest.raises(TokenizerMismatchError, match="toy.*other"):
        CorpusIndex.open(damaged_setup, tokenizer=OTHER_TOK)
    CorpusIndex.open(damaged_setup, tokenizer=TOK).check_tokenizer(TOK)
    with pytest.raises(IndexFormatError, match="not a suffixspec index"):
        CorpusIndex.open(manifest)
    # a shard from another index is rejected even though it is a valid file
    shard = damaged_setup / "shard-00000.ssx"
    other = damaged_setup / "shard-00001.ssx"
    shard.write_bytes(other.read_bytes())
    with pytest.raises(IndexFormatError, match="shard-00000.ssx"):
        CorpusIndex.open(damaged_setup)


@pytest.mark.parametrize("old", [1, 2, 3])
def test_older_version_index_refused_with_how_to_rebuild(damaged_setup, old):
    """An index of a previous format (every file's header says version 1, 2 or 3) is refused, the
    message saying how to rebuild it; so is one shard of that version under a current manifest."""
    files = sorted(damaged_setup.glob("*.ssx"))
    shard = damaged_setup / "shard-00000.ssx"
    good = shard.read_bytes()
    rewrite_header(shard, version=old)
    with pytest.raises(IndexFormatError, match=rf"shard-00000.ssx: format version {old}, from an older suffixspec.*rebuild"):
        CorpusIndex.open(damaged_setup)
    shard.write_bytes(good)
    for f in files:
        rewrite_header(f, version=old)
    with pytest.raises(IndexFormatError, match=rf"manifest.ssx: format version {old}, from an older suffixspec; this "
                                               r"suffixspec reads version 4.*`suffixspec index`"):
        CorpusIndex.open(damaged_setup)


FUZZ = textwrap.dedent("""
    import sys, numpy as np
    from pathlib import Path
    from suffixspec.corpus import CorpusIndex
    from suffixspec.errors import IndexFormatError
    from pyroaring import BitMap
    path = Path(sys.argv[1]); rng = np.random.default_rng(int(sys.argv[2]))
    shards = sorted(path.glob("shard-*.ssx"))
    pristine = {f: f.read_bytes() for f in shards}
    survived = raised = 0
    for trial in range(60):
        for f, data in pristine.items():
            f.write_bytes(data)
        f = shards[trial % len(shards)]
        bad = bytearray(pristine[f])
        lo = 64 * 14  # past header and array table: the damage opening cannot see
        for _ in range(int(rng.integers(1, 40))):
            i = int(rng.integers(lo, len(bad)))
            bad[i] = int(rng.integers(0, 256)) if trial % 3 else 0xFF
        f.write_bytes(bytes(bad))
        try:
            ix = CorpusIndex.open(path)
            sub = ix.subset(BitMap(range(0, ix.n_documents, 2)))
            for _ in range(30):
                ctx = rng.integers(0, 3, int(rng.integers(0, 8))).tolist()
                for s in (None, sub):
                    m = ix.query(ctx, s); ix.lookup(ctx, s); ix.match_length(ctx, s); m.top(3)
                    if len(m):
                        ix.following(int(m.last_ends[0]) % ix.n_tokens, 3)
            survived += 1
        except IndexFormatError:
            raised += 1
    print("ok", survived, raised)
""")


def test_queries_on_damaged_arrays_never_crash(tmp_path):
    build(tmp_path, [d for d in random_docs(13) if d], shard_tokens=150)
    res = subprocess.run([sys.executable, "-c", FUZZ, str(tmp_path / "ix"), "0"], capture_output=True, text=True,
                         timeout=240, env={**os.environ, "PYTHONFAULTHANDLER": "1"})
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.startswith("ok")


def test_bad_arguments(tmp_path):
    ix = build(tmp_path, [[1, 2, 3]])
    with pytest.raises(BadInputError):
        ix.following(5, 1)
    with pytest.raises(BadInputError):
        ix.subset([7])
    with pytest.raises(BadInputError):
        ix.lookup([1], ix.subset([0]), k=0)
    with pytest.raises(IndexFormatError, match="no such index"):
        CorpusIndex.open(tmp_path / "nope")
    with pytest.raises(BadInputError, match="missing fingerprint"):
        build_index([[1]], tmp_path / "x", tokenizer={"name": "a", "vocab_size": 3})
    with pytest.raises(BadInputError, match="token id 7 outside the tokenizer's vocabulary"):
        build_index([[1, 7]], tmp_path / "x", tokenizer={**TOK, "vocab_size": 7})
    for bad in (0, -1, 2.5, True):
        with pytest.raises(BadInputError, match="shard_tokens: expected a positive integer"):
            build_index([[1]], tmp_path / "x", tokenizer=TOK, shard_tokens=bad)
    with pytest.raises(BadInputError, match="wait: expected a number of seconds"):
        delete_documents(tmp_path / "ix", [0], wait=-1)
    from suffixspec.corpus import IndexWriteError

    with pytest.raises(IndexWriteError, match="cannot write the index: No such file or directory") as info:
        build_index([[1]], tmp_path / "no" / "dir" / "x", tokenizer=TOK)
    assert isinstance(info.value, OSError)
    assert not (tmp_path / "x").exists()


def test_interrupted_append_leaves_index_unchanged(tmp_path):
    docs = [d for d in random_docs(14) if d]
    build(tmp_path, docs, shard_tokens=50)
    before = sorted(p.name for p in (tmp_path / "ix").iterdir())

    def failing():
        for i in range(40):
            yield Document(np.array([1, 2, 0, 1] * 10, np.int32))
        raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError):
        append_documents(tmp_path / "ix", failing(), tokenizer=TOK, shard_tokens=50)
    assert sorted(p.name for p in (tmp_path / "ix").iterdir()) == before
    ix = CorpusIndex.open(tmp_path / "ix", verify=True)
    assert ix.n_documents == len(docs)


# -- bulk shard builder -------------------------------------------------------------------------


def _bulk_frozen(docs):
    """Frozen arrays of the shard builder's automaton (build.documents_automaton frozen by the
    sam_freeze kernels, then the occurrence kernels), as build_shard_file writes them."""
    from suffixspec._kernels import build as bk
    from suffixspec._kernels import corpus_build as cbk
    from suffixspec._kernels import sam as sk
    from suffixspec._kernels import sam_freeze as sfk

    tokens = np.concatenate([np.asarray(d, np.int32) for d in docs])
    starts = np.zeros(len(docs), np.int64)
    np.cumsum([len(d) for d in docs[:-1]], out=starts[1:])
    P = np.full(len(tokens), -7, np.int32)
    S, E, M = bk.documents_automaton(tokens, starts, P)
    ns, m = int(M[sk.N_STATES]), int(M[sk.N_EDGES])
    out = {k: np.empty(ns, np.int32) for k in ("links", "lens", "counts", "lasts")}
    out.update(offsets=np.empty(ns + 1, np.int32), etok=np.empty(m, np.int32), eto=np.empty(m, np.int32))
    sfk.freeze_into(S, E, M, out["offsets"], out["etok"], out["eto"], out["links"], out["lens"], 2**31 - 1)
    # the recorded prefix states are those of a walk of the frozen automaton
    assert np.array_equal(P, cbk.prefix_states(out["offsets"], out["etok"], out["eto"], tokens, np.empty(0, np.int32),
                                               starts))
    assert cbk.build_occurrences(out["links"], out["lens"], P, out["counts"], out["lasts"], np.empty(len(tokens), np.int32),
                                 np.empty(ns, np.int32), np.empty((ns, 4), np.int32))
    return out, P


def _assert_bulk_equals_automaton(docs):
    got, pstate = _bulk_frozen(docs)
    sa = SuffixAutomaton()
    for d in docs:
        sa.add_document(d)
    fa = sa.freeze()
    for name, a in got.items():
        assert np.array_equal(a, getattr(fa, name)), name
    from suffixspec._kernels import corpus_build as cbk

    assert np.array_equal(pstate, cbk.prefix_states(fa.offsets, fa.etok, fa.eto, fa.tokens, fa.plink, fa.doc_starts))
    # the occurrence kernel gives the automaton's counts and last ends, and the layout of the reference
    occ, occ_start = naive.occurrence_layout(fa.links, pstate)
    ns, n = fa.n_states, len(fa)
    got = [np.empty(ns, np.int32), np.empty(ns, np.int32), np.empty(n, np.int32), np.empty(ns, np.int32)]
    scratch = np.full((ns, 4), 7, np.int32)
    assert cbk.build_occurrences(fa.links, fa.lens, pstate, *got, scratch)
    for a, b in zip(got, (fa.counts, fa.lasts, occ, occ_start)):
        assert np.array_equal(a, np.asarray(b, np.int32))
    bad = pstate.copy()
    bad[len(bad) // 2] = ns  # no such state
    assert not cbk.build_occurrences(fa.links, fa.lens, bad, *got, scratch)
    bad_links = fa.links.copy()
    bad_links[1] = 1  # a state its own suffix link
    assert not cbk.build_occurrences(bad_links, fa.lens, pstate, *got, scratch)
    assert not cbk.build_occurrences(fa.links, fa.lens, pstate, *got, scratch[:-1])  # scratch too small


def _real_docs():
    """Byte-level token ids of this project's source files: real, repetitive text."""
    root = Path(__file__).resolve().parent.parent / "suffixspec"
    return [np.frombuffer(p.read_bytes(), np.uint8).astype(np.int32) for p in sorted(root.rglob("*.py"))[:12]]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("alphabet", [2, 5, 300])
def test_bulk_builder_equals_automaton_random(seed, alphabet):
    """Same states (numbering included), edges, links, lengths, counts and last ends as the
    growable automaton, and the document-prefix state of every position."""
    rng = np.random.default_rng(seed)
    docs = [d for d in random_docs(seed, n_docs=30, max_len=120, alphabet=alphabet) if d]
    docs += [docs[0], docs[0][: len(docs[0]) // 2], docs[1] + docs[0]]  # repeated prefixes: the generalized cases
    rng.shuffle(docs)
    _assert_bulk_equals_automaton(docs)


def test_bulk_builder_equals_automaton_real_text():
    docs = _real_docs()
    _assert_bulk_equals_automaton(docs)
    _assert_bulk_equals_automaton(docs + docs[:3])


def test_bulk_builder_hubs_and_sparse_root():
    """States with many edges (hashed overflow), hub clones, and a root row over sparse large ids."""
    rng = np.random.default_rng(5)
    base = rng.integers(0, 40, 3000)
    docs = [np.concatenate([base[i * 50 : i * 50 + 30], rng.integers(0, 40, 20)]) * 99991 % 5_000_000 for i in range(60)]
    docs += [np.full(50, 7), np.arange(400) % 9, np.arange(400)[::-1].copy()]
    _assert_bulk_equals_automaton([d.astype(np.int32) for d in docs])


def test_bulk_builder_long_suffix_walk():
    """A token whose suffix-link walk is longer than sam.WALK_LIMIT (the bulk loop hands it to the
    general one): its prefix state is recorded too."""
    from suffixspec._kernels import sam as sk

    run = sk.WALK_LIMIT + 100
    docs = [[3] * run + [4, 3, 3, 4], [5, 3, 3], [3] * 10 + [6]]
    _assert_bulk_equals_automaton(docs)


def test_shard_file_large_token_ids_fallback(tmp_path):
    """The largest int32 token ids: same queries as the automaton."""
    big = 2**31 - 1
    docs = [[big, 3, big, 3, 5], [3, big, 3], [big - 7, big]]
    ix = build(tmp_path, docs, tokenizer={**TOK, "vocab_size": big + 1})
    sa = SuffixAutomaton()
    for d in docs:
        sa.add_document(d)
    for pat in ([big, 3], [3], [big], [big - 7, big], [5, 3]):
        assert ix.count(pat) == sa.count(pat)
    assert ix.match_length([9, big, 3, big]) == sa.match_length([9, big, 3, big])


def test_crc32_combine_equals_crc_of_concatenation():
    """The payload checksum of a mapped shard is combined from its arrays' checksums."""
    import zlib

    from suffixspec.corpus.format import crc32_combine

    rng = np.random.default_rng(3)
    cases = [(0, 0), (0, 9), (9, 0), (1, 1), (64, 1 << 16)] + [tuple(rng.integers(0, 5000, 2)) for _ in range(40)]
    for n1, n2 in cases:
        a, b = rng.bytes(int(n1)), rng.bytes(int(n2))
        assert crc32_combine(zlib.crc32(a), zlib.crc32(b), len(b)) == zlib.crc32(a + b)


def test_compact_shards_draft_as_the_automaton_in_memory(tmp_path):
    """The proposer drafts the same trees from a corpus index (uint16 ids and lengths on disk) as from
    the in-memory automaton of the same documents (int32 arrays); a filtered session drafts through the
    reader's occurrence layout (its answers are checked against brute force above)."""
    from suffixspec import FrozenAutomaton, Proposer

    rng = np.random.default_rng(11)
    base = [rng.integers(0, 40000, int(rng.integers(50, 400))) for _ in range(12)]
    docs = base + [np.where(rng.random(b.shape[0]) < 0.05, rng.integers(0, 40000, b.shape[0]), b) for b in base]
    ix = build(tmp_path, docs)
    assert ix.n_shards == 1 and ix.shards[0].fa.etok.dtype == np.uint16 and ix.shards[0].fa.lens.dtype == np.uint16
    starts = np.cumsum([0] + [len(d) for d in docs[:-1]])
    fa = FrozenAutomaton.from_documents(np.concatenate(docs).astype(np.int32), starts)
    assert fa.etok.dtype == np.int32
    parity = {"parity": "0"}, {"parity": "1"}
    for budget in (8, 32):
        a, b = Proposer(corpus=ix), Proposer(corpus=fa)
        shard = ix.shards[0].fa
        # the drafting process reads the mapped uint16 token ids and lengths in place: no int32 copies
        held = shard.kernel_arrays()
        assert held[1] is not None and np.shares_memory(held[1], shard.etok) and held[1].dtype == np.uint16
        assert np.shares_memory(held[6], shard.lens) and held[6].dtype == np.uint16
        text, plink, _escapes = shard.implicit_arrays()  # the implicit states' text and suffix links too
        assert np.shares_memory(text, shard.tokens) and text.dtype == np.uint16 and np.shares_memory(plink, shard.plink)
        assert shard.edge_records().shape[0] == 4 * shard.n_edges  # records of the stored edges only
        for i, d in enumerate(docs[::5]):
            prompt = np.concatenate([rng.integers(0, 40000, 5), d[: len(d) // 2]]).astype(np.int32)
            sa, sb = a.start(prompt), b.start(prompt)
            for step in range(3):  # then the output goes on along the document (cursors advance, learning counts)
                ta, tb = sa.propose(budget), sb.propose(budget)
                assert len(ta) > 0 or step > 0
                for x, y in ((ta.tokens, tb.tokens), (ta.parents, tb.parents), (ta.scores, tb.scores)):
                    assert np.array_equal(x, y)
                more = d[len(d) // 2 + 4 * step : len(d) // 2 + 4 * step + 4].astype(np.int32)
                sa.extend(more)
                sb.extend(more)
            sa.close()
            sb.close()
            sr = a.start(prompt, filter=parity[i % 2])
            assert len(sr.propose(budget)) > 0
            sr.close()


@pytest.mark.parametrize("alphabet", [3, 50])
def test_implicit_states_draft_as_the_automaton_in_memory(tmp_path, alphabet):
    """Drafts from a several-shard index whose states are mostly implicit equal those of the in-memory
    automata of the same shards' documents, for prompts ending anywhere in a document (so cursors
    cross from stored into implicit states, reach documents' ends and fall back along suffix links),
    cursors advancing with learning on, at small and large budgets."""
    from suffixspec import FrozenAutomaton, Proposer

    rng = np.random.default_rng(alphabet)
    docs = [rng.integers(0, alphabet, int(rng.integers(5, 200))) for _ in range(40)]
    docs += [np.concatenate([d[: len(d) // 2], rng.integers(0, alphabet, 30)]) for d in docs[:10]]  # shared heads
    ix = build(tmp_path, docs, shard_tokens=1500)
    assert ix.n_shards > 2
    mem = []
    for s in ix.shards:
        assert (np.asarray(s.fa.plink) != fk.HOLE).sum() > 0.5 * len(s.fa)  # most positions implicit
        mem.append(FrozenAutomaton.from_documents(np.asarray(s.fa.tokens, np.int32), np.asarray(s.fa.doc_starts)))
    for budget in (8, 64):
        a, b = Proposer(corpus=ix), Proposer(corpus=mem)
        for _ in range(12):
            d = docs[int(rng.integers(len(docs)))]
            cut = int(rng.integers(1, len(d) + 1))
            prompt = np.concatenate([rng.integers(0, alphabet, 3), d[:cut]]).astype(np.int32)
            sa, sb = a.start(prompt), b.start(prompt)
            for step in range(4):
                ta, tb = sa.propose(budget), sb.propose(budget)
                for x, y in ((ta.tokens, tb.tokens), (ta.parents, tb.parents), (ta.scores, tb.scores)):
                    assert np.array_equal(x, y)
                more = np.concatenate([d[cut + 3 * step : cut + 3 * step + 3], rng.integers(0, alphabet, step % 2)])
                sa.extend(more.astype(np.int32))
                sb.extend(more.astype(np.int32))
            sa.close()
            sb.close()


def test_counts_past_uint16_are_escaped(tmp_path):
    """Counts of 65535 or more (a long run of one token: thousands of states that frequent) are stored
    as 65535 with the true count among the shard's escapes; counts, continuations and drafts are
    exact (brute force, the in-memory automaton), and a damaged escape table is refused on open."""
    from suffixspec import FrozenAutomaton, Proposer

    rng = np.random.default_rng(2)
    docs = [np.zeros(70000, np.int64), np.tile([1, 2], 34000), rng.integers(3, 8, 400)]
    ix = build(tmp_path, docs)
    fa = ix.shards[0].fa
    esc = np.asarray(fa.count_escapes).reshape(-1, 2)
    assert fa.counts.dtype == np.uint16 and esc.shape[0] > 4000 and esc[0, 0] == 0 and esc[0, 1] == ix.n_tokens
    text = np.concatenate(docs)
    starts = np.cumsum([0] + [len(d) for d in docs[:-1]])
    ref = FrozenAutomaton.from_documents(text.astype(np.int32), starts)
    conv, _ = to_implicit(ref)
    assert np.array_equal(conv["counts"], fa.counts) and np.array_equal(conv["count_escapes"], fa.count_escapes)
    for k in (1, 3, 2000, 4465, 4466, 69999, 70000):
        assert ix.count([0] * k) == 70000 - k + 1 == ref.count([0] * k)
        assert ix.continuations([0] * k) == ({0: (70000 - k, 69999)} if k < 70000 else {})
    assert ix.count([1, 2] * 3) == 34000 - 2 and ix.count([2, 1]) == 33999
    assert ix.continuations([1, 2] * 10) == ref.continuations(ref.locate([1, 2] * 10)).as_dict()
    a, b = Proposer(corpus=ix), Proposer(corpus=ref)
    for prompt in ([0] * 50, [3, 1, 2, 1, 2], docs[2][:100].tolist()):
        ta, tb = a.start(prompt).propose(16), b.start(prompt).propose(16)
        assert np.array_equal(ta.tokens, tb.tokens) and np.array_equal(ta.scores, tb.scores)
    ix.close()
    shard = next((tmp_path / "ix").glob("shard-*.ssx"))
    assert CorpusIndex.open(tmp_path / "ix", verify=True).count([0]) == 70000
    data = bytearray(shard.read_bytes())
    from suffixspec.corpus.format import KIND_SHARD, Container

    _, off, _, _ = Container(shard, KIND_SHARD).entries["count_escapes"]
    data[off + 8] ^= 1  # the second escape's state: a checksum mismatch on open (the table is small)
    shard.write_bytes(bytes(data))
    with pytest.raises(IndexFormatError, match="count_escapes is damaged"):
        CorpusIndex.open(tmp_path / "ix")
