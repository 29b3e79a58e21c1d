"""The corpus shard's row automaton (_kernels/bulk_sam.py) and its freeze (_kernels/bulk_freeze.py):
the same states, numbering, links, lengths, edges and prefix states as the automaton's own construction
(`build.documents_automaton`, itself checked against `SuffixAutomaton` and brute force in
test_corpus.py), and shard files byte for byte those of the reference freeze (`sam_freeze`), on random
corpora over small and large alphabets, several documents (repeated ones, prefixes of earlier ones,
single tokens), huge token ids (no dense root) and forced regrowth of both tables."""

import json

import numpy as np
import pytest

from suffixspec._kernels import build as bk
from suffixspec._kernels import bulk_freeze as bfk
from suffixspec._kernels import bulk_sam as bsk
from suffixspec._kernels import corpus_build as cbk
from suffixspec._kernels import sam as sk
from suffixspec._kernels import sam_freeze as sfk
from suffixspec._kernels.frozen import COUNT_ESCAPED, LEN_SATURATED
from suffixspec._kernels.pages import Scratch
from suffixspec.corpus import format as F
from suffixspec.corpus import shards as C

from support.implicit import link_target_max_len


def _flat(docs):
    tokens = np.concatenate([np.asarray(d, np.int32) for d in docs])
    starts = np.zeros(len(docs), np.int64)
    np.cumsum([len(d) for d in docs[:-1]], out=starts[1:])
    return tokens, starts


def _row_edges(ra, v):
    """State v's edges [(token, target)] sorted, read from the rows as stored (inline, overflow chain, dense root)."""
    S2 = ra.S2
    if v == 0 and ra.R0.shape[0] > 0:
        return [(int(t), int(ra.R0[t])) for t in np.nonzero(ra.R0 != -1)[0]]
    deg = int(S2[v, bsk.DEG])
    out = [(int(S2[v, bsk.EDGE0 + 2 * i]), int(S2[v, bsk.EDGE0 + 2 * i + 1])) for i in range(min(deg, bsk.INLINE))]
    f = int(S2[v, bsk.OVF])
    while f != -1:
        assert ra.O[f, bsk.O_SRC] == v
        out.append((int(ra.O[f, bsk.O_TOK]), int(ra.O[f, bsk.O_TO])))
        f = int(ra.O[f, bsk.O_NEXT])
    assert len(out) == deg
    return sorted(out)


def _assert_rows_equal_reference(docs, **sizes):
    tokens, starts = _flat(docs)
    P_ref = np.full(len(tokens), -7, np.int32)
    S, E, M = bk.documents_automaton(tokens, starts, P_ref)
    P = np.full(len(tokens), -7, np.int32)
    ra = bsk.build_rows(tokens, starts, P, **sizes)
    ns = int(M[sk.N_STATES])
    assert ra.n_states == ns and ra.n_edges == int(M[sk.N_EDGES]) and int(ra.M[bsk.N_TOKENS]) == len(tokens)
    assert np.array_equal(P, P_ref)
    assert np.array_equal(ra.S2[:ns, bsk.LINK], S[:ns, sk.LINK])
    assert np.array_equal(ra.S2[:ns, bsk.LEN], S[:ns, sk.LEN])
    assert np.array_equal(ra.S2[:ns, bsk.DEG], S[:ns, sk.DEG])
    offsets, etok, eto = sfk.to_csr(S, E, M)
    for v in range(ns):
        lo, hi = offsets[v], offsets[v + 1]
        assert _row_edges(ra, v) == list(zip(etok[lo:hi].tolist(), eto[lo:hi].tolist())), v
    return ra


def _random_docs(rng, alphabet, n_docs, max_len):
    docs = [rng.integers(0, alphabet, int(rng.integers(1, max_len))) for _ in range(n_docs)]
    # repeats: whole documents, prefixes of earlier ones, one token (the generalized automaton's cases)
    docs += [docs[0], docs[0][: max(1, len(docs[0]) // 2)], np.concatenate([docs[1], docs[0]]), docs[2][:1]]
    if len(docs) > 6:
        docs += [np.tile(docs[3][:5], 12)]
    order = rng.permutation(len(docs))
    return [docs[i] for i in order]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("alphabet", [2, 3, 7, 300, 70_000])
def test_rows_equal_the_automaton_random(seed, alphabet):
    rng = np.random.default_rng(seed * 1000 + alphabet)
    _assert_rows_equal_reference(_random_docs(rng, alphabet, 12, 150))


@pytest.mark.parametrize("alphabet", [3, 40])
def test_rows_regrow_both_tables(alphabet):
    """Starting from one state row and a two-slot overflow table: every regrowth path, same automaton."""
    rng = np.random.default_rng(alphabet)
    docs = _random_docs(rng, alphabet, 30, 400)
    ra = _assert_rows_equal_reference(docs, state_rows=1, table_slots=2)
    assert int(ra.M[bsk.N_OVER]) > 0


@pytest.mark.parametrize("slots", [1021, 1536])
def test_rows_in_a_table_of_any_size_nearly_half_full(slots):
    """Tables of a size that is no power of two (odd, or even), never regrown and nearly half full:
    the same automaton, until one of them has probes that ran past its last slot and wrapped."""
    wrapped = False
    for seed in range(30):
        rng = np.random.default_rng(seed * 7919 + slots)
        docs = []
        while True:  # as many short documents as keep the overflow edges within half the slots
            nxt = docs + [rng.integers(0, 40, 25)]
            tokens, starts = _flat(nxt)
            probe = bsk.build_rows(tokens, starts, np.empty(len(tokens), np.int32), table_slots=1 << 20)
            if int(probe.M[bsk.N_OVER]) > slots // 2:
                break
            docs = nxt
        ra = _assert_rows_equal_reference(docs, table_slots=slots)
        assert ra.O.shape[0] == slots and int(ra.M[bsk.N_OVER]) > slots // 2 - 40  # not regrown, nearly half full
        placed = np.flatnonzero(ra.O[:, bsk.O_SRC] != -1)
        home = np.array([bsk._slot(int(ra.O[i, bsk.O_SRC]), int(ra.O[i, bsk.O_TOK]), slots) for i in placed])
        # every stored edge is found where it lies, those past the wrap included
        assert [bsk._find(ra.S, ra.O, ra.R0, int(ra.O[i, bsk.O_SRC]), int(ra.O[i, bsk.O_TOK])) for i in placed] == \
            [-2 - int(i) for i in placed]
        if (placed < home).any():  # an edge stored before its first slot: its probe wrapped
            wrapped = True
            break
    assert wrapped


def test_rows_huge_token_ids_sparse_root():
    """Token ids too large for a dense root: the root's edges are stored as any state's."""
    rng = np.random.default_rng(9)
    docs = [(1 << 30) + rng.integers(0, 20, int(rng.integers(1, 60))) * 1_000_003 for _ in range(20)]
    ra = _assert_rows_equal_reference([d.astype(np.int32) for d in docs])
    assert ra.R0.shape[0] == 0


def test_rows_single_token_and_hub_clones():
    """One document of one token; a text whose hubs (many edges, overflow) get cloned."""
    _assert_rows_equal_reference([[5]])
    rng = np.random.default_rng(4)
    base = rng.integers(0, 30, 2000)
    docs = [np.concatenate([base[i * 40 : i * 40 + 25], rng.integers(0, 30, 15)]) for i in range(45)]
    _assert_rows_equal_reference(docs + [np.arange(300) % 11, np.full(40, 3)])


def _reference_shard_arrays(docs):
    """The shard arrays the reference kernels (documents_automaton, sam_freeze's implicit freeze) write."""
    tokens, starts = _flat(docs)
    P = np.empty(len(tokens), np.int32)
    S, E, M = bk.documents_automaton(tokens, starts, P)
    ns = int(M[sk.N_STATES])
    cols = S[:ns]
    ids = np.empty(ns, np.int32)
    assert cbk.count_ends(cols[:, sk.LINK], cols[:, sk.LEN], P, cols[:, sk.CNT], cols[:, sk.LAST],
                          cols[:, sk.CNT : sk.CNT + cbk.W_COLS])
    n_stored, m, n_big = (int(x) for x in sfk.implicit_ids(S, E, M, tokens, P, starts, ids, np.empty(ns, np.uint8),
                                                            COUNT_ESCAPED))
    lens_wide = link_target_max_len(S, M, sk.LINK, sk.LEN) >= LEN_SATURATED
    a = {"links": np.empty(n_stored, np.int32), "lens": np.empty(n_stored, np.int32 if lens_wide else np.uint16),
         "counts": np.empty(n_stored, np.uint16), "count_escapes": np.empty(2 * n_big, np.int32),
         "lasts": np.empty(n_stored, np.int32), "offsets": np.empty(n_stored + 1, np.int32),
         "etok": np.empty(m, C.token_dtype(tokens)), "eto": np.empty(m, np.int32), "plink": np.empty(len(tokens), np.int32)}
    assert sfk.freeze_implicit_into(S, E, M, ids, n_stored, P, starts, a["offsets"], a["etok"], a["eto"], a["links"],
                                    a["lens"], a["counts"], a["lasts"], a["plink"], a["count_escapes"],
                                    2**31 - 1 if lens_wide else LEN_SATURATED, COUNT_ESCAPED)
    return a, tokens, starts, {"n_states": n_stored, "n_edges": m, "n_implicit": ns - n_stored}


@pytest.mark.parametrize("case", ["small", "large", "counts", "long"])
def test_shard_file_bytes_equal_reference_freeze(tmp_path, case):
    """build_shard_file (rows, bulk_freeze) writes the bytes of the reference freeze."""
    rng = np.random.default_rng(len(case))
    if case == "small":
        docs = _random_docs(rng, 3, 25, 120)
    elif case == "large":
        docs = _random_docs(rng, 5000, 25, 200) + _random_docs(rng, 9, 10, 80)
    elif case == "counts":  # counts past the uint16 escape
        docs = [np.full(70_000, 4), rng.integers(0, 3, 500), np.tile([1, 2], 400)]
    else:  # a document over 65535 tokens with long repeats: int32 lengths
        docs = [np.tile(rng.integers(0, 50, 700), 100)[:70_000], rng.integers(0, 50, 300)]
    docs = [np.asarray(d, np.int32) for d in docs]
    ref, tokens, starts, counts_meta = _reference_shard_arrays(docs)
    ids, tags = [f"d{i}" for i in range(len(docs))], [{} for _ in docs]
    got = C.build_shard_file(str(tmp_path / "rows.ssx"), tokens, np.diff(np.append(starts, len(tokens))), ids, tags)
    arrays = dict(ref)
    arrays["tokens"] = tokens.astype(ref["etok"].dtype)
    arrays["doc_starts"] = starts
    arrays["doc_info"] = np.frombuffer(json.dumps({"ids": ids, "tags": tags}).encode(), np.uint8)
    arrays = {k: arrays[k] for k in C.SHARD_ARRAYS}
    meta = {"n_tokens": len(tokens), "n_documents": len(docs), **counts_meta}
    plain = F.write_container(tmp_path / "ref.ssx", F.KIND_SHARD, meta, arrays)
    assert got["payload_crc"] == plain["payload_crc"]
    assert (tmp_path / "rows.ssx").read_bytes() == (tmp_path / "ref.ssx").read_bytes()
    if case == "counts":
        assert len(ref["count_escapes"]) > 0
    if case == "long":
        assert ref["lens"].dtype == np.int32


def _poison(scratch):
    """Every byte of the scratch's buffers set to 0xA5 (whatever a build reads before writing shows)."""
    for buf in scratch._buffers.values():  # (the buffers themselves: a take would hand out views of a prefix)
        np.frombuffer(buf, np.uint8)[:] = 0xA5


def test_shard_files_from_reused_scratch_equal_fresh_ones(tmp_path):
    """Shards built one after another from one Scratch (its buffers left dirty by the last shard, and
    poisoned besides), smaller and larger than the last (its buffers grow), are the bytes of shards built
    on fresh pages."""
    rng = np.random.default_rng(5)
    scratch = Scratch()
    sizes = [(40, 150), (3, 40), (400, 300), (60, 100), (400, 300)]
    for k, (n_docs, max_len) in enumerate(sizes):
        docs = [np.asarray(d, np.int32) for d in _random_docs(rng, 30 if k % 2 else 5000, n_docs, max_len)]
        tokens, starts = _flat(docs)
        lens = np.diff(np.append(starts, len(tokens)))
        ids, tags = [f"d{i}" for i in range(len(docs))], [{} for _ in docs]
        fresh = C.build_shard_file(str(tmp_path / f"fresh{k}.ssx"), tokens, lens, ids, tags)
        before = scratch.nbytes
        _poison(scratch)
        reused = C.build_shard_file(str(tmp_path / f"reused{k}.ssx"), tokens, lens, ids, tags, scratch)
        assert reused["payload_crc"] == fresh["payload_crc"]
        assert (tmp_path / f"reused{k}.ssx").read_bytes() == (tmp_path / f"fresh{k}.ssx").read_bytes()
        assert scratch.nbytes >= before  # (buffers are only ever replaced by larger ones)
    assert scratch.nbytes > 0
    scratch.release()
    assert scratch.nbytes == 0


def test_scratch_reuses_a_buffer_that_fits_and_replaces_one_that_does_not():
    scratch = Scratch()
    a = scratch.take("x", 1000, np.int32)
    a[:] = 7
    b = scratch.take("x", 500, np.int64)  # the same bytes, another view
    assert b.ctypes.data == a.ctypes.data and b.shape == (500,) and b.dtype == np.int64
    c = scratch.take("x", 2000, np.int32)  # larger: a new buffer; the old views keep theirs
    assert c.ctypes.data != a.ctypes.data and (a == 7).all()
    assert scratch.take("y", 0, np.uint8).shape == (0,)
    assert scratch.nbytes == 8000 + 1
    with pytest.raises(ValueError, match=r"Scratch.take\('x'\): expected a count >= 0, got -1"):
        scratch.take("x", -1, np.int32)
    scratch.release()
    assert scratch.nbytes == 0 and (a == 7).all()


def test_rows_regrown_in_a_scratch_equal_reference():
    """State rows regrown inside a Scratch: a new, larger buffer (the old rows kept while copied), or the
    scratch's own buffer when it already has room (the rows then copied onto themselves)."""
    rng = np.random.default_rng(8)
    docs = _random_docs(rng, 7, 12, 90)
    scratch = Scratch()
    _assert_rows_equal_reference(docs, state_rows=3, table_slots=1024, scratch=scratch)  # grows from 3 rows
    _assert_rows_equal_reference(_random_docs(rng, 7, 60, 90), scratch=scratch)  # a roomy rows buffer
    _poison(scratch)
    _assert_rows_equal_reference(docs, state_rows=3, table_slots=1024, scratch=scratch)  # regrows in place


def test_freeze_refuses_rows_that_disagree():
    """A state whose edges do not fill its row, or an escape table of the wrong size: False."""
    docs = [np.asarray(d, np.int32) for d in _random_docs(np.random.default_rng(2), 4, 8, 60)]
    tokens, starts = _flat(docs)

    def run(mutate):
        P = np.empty(len(tokens), np.int32)
        ra = bsk.build_rows(tokens, starts, P)
        ns = ra.n_states
        W = np.empty((ns, cbk.W_COLS), np.int32)
        ids = np.empty(ns, np.int32)
        assert cbk.count_ends(bfk.link_column(ra.S, ns), bfk.len_column(ra.S, ns), P, W[:, 0], W[:, 1], W)
        n_stored, m, n_big, link_len = (int(x) for x in bfk.implicit_ids_rows(ra.S, ra.M, tokens, P, starts, W[:, 0], ids,
                                                                     np.empty(ns, np.uint8), COUNT_ESCAPED))
        assert link_len == link_target_max_len(ra.S2, ra.M, bsk.LINK, bsk.LEN)
        out = [np.empty(n_stored + 1, np.int32), np.empty(m, np.int32), np.empty(m, np.int32)]
        out += [np.empty(n_stored, np.int32) for _ in range(4)] + [np.empty(len(tokens), np.int32)]
        big = np.empty(2 * n_big + (2 if mutate == "big" else 0), np.int32)
        if mutate == "deg":
            hub = int(np.argmax(ra.S2[1:ns, bsk.DEG])) + 1
            ra.S2[hub, bsk.DEG] += 1
        return bfk.freeze_rows_into(ra.S, ra.O, ra.R0, ra.M, ids, n_stored, W[:, 0], W[:, 1], P, starts, *out, big,
                                    2**31 - 1, COUNT_ESCAPED)

    assert run(None)
    assert not run("big")
    assert not run("deg")


def test_rows_of_no_tokens_and_an_index_with_empty_documents(tmp_path):
    """No tokens: the root alone. Empty documents between others (the shard writer skips them): the
    index counts as the automaton over the non-empty ones."""
    P = np.empty(0, np.int32)
    ra = bsk.build_rows(np.empty(0, np.int32), np.zeros(1, np.int64), P)
    assert ra.n_states == 1 and ra.n_edges == 0
    from suffixspec import SuffixAutomaton
    from suffixspec.corpus import CorpusIndex, Document, build_index

    rng = np.random.default_rng(1)
    docs = [rng.integers(0, 4, int(rng.integers(0, 30))) for _ in range(30)] + [np.empty(0, np.int64)]
    tok = {"name": "test", "vocab_size": 10, "fingerprint": "0" * 64}
    build_index([Document(np.asarray(d, np.int32)) for d in docs], tmp_path / "ix", tokenizer=tok)
    ix = CorpusIndex.open(tmp_path / "ix")
    sa = SuffixAutomaton()
    for d in docs:
        if len(d):
            sa.add_document(d)
    assert ix.n_tokens == sum(len(d) for d in docs)
    for d in docs:
        for q in (d[:3], d[-2:], d[1:5]):
            if len(q):
                assert ix.count(q) == sa.count(q)


def _brute_counts(links, pstate):
    """counts and last ends by walking every position's suffix-link chain."""
    counts, lasts = np.zeros(len(links), np.int64), np.full(len(links), -1, np.int64)
    for p, v in enumerate(pstate.tolist()):
        while v != -1:
            counts[v] += 1
            lasts[v] = max(lasts[v], p)
            v = int(links[v])
    return counts, lasts


@pytest.mark.parametrize("seed", range(6))
def test_count_ends_any_link_tree(seed):
    """count_ends on random link trees whose parents are as often numbered after their children as
    before (chains of them: a clone's case), against a walk of every chain; a cycle, a self-link
    and a link out of range are refused."""
    rng = np.random.default_rng(seed)
    ns = int(rng.integers(2, 400))
    perm = np.concatenate([[0], 1 + rng.permutation(ns - 1)])  # tree order -> state id, the root stays 0
    links = np.full(ns, -1, np.int32)
    for i in range(1, ns):
        links[perm[i]] = perm[int(rng.integers(max(0, i - 5) if seed % 2 else 0, i))]
    lens = np.zeros(ns, np.int32)
    lens[1:] = 1
    pstate = rng.integers(0, ns, int(rng.integers(1, 3 * ns))).astype(np.int32)
    W = np.full((ns, cbk.W_COLS), 9, np.int32)
    counts, lasts = np.empty(ns, np.int32), np.empty(ns, np.int32)
    assert cbk.count_ends(links, lens, pstate, counts, lasts, W)
    want_c, want_l = _brute_counts(links, pstate)
    assert np.array_equal(counts, want_c) and np.array_equal(lasts, want_l)
    assert cbk.count_ends(links, lens, pstate, W[:, 0], W[:, 1], W)  # the outputs as the scratch's columns
    assert np.array_equal(W[:, 0], want_c) and np.array_equal(W[:, 1], want_l)
    if ns >= 4:
        a, b = 1 + rng.choice(ns - 1, 2, replace=False)
        for bad in ({a: b, b: a}, {a: a}, {a: ns}, {a: -1}):
            broken = links.copy()
            for k, v in bad.items():
                broken[k] = v
            assert not cbk.count_ends(broken, lens, pstate, counts, lasts, W), bad
