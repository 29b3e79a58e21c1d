"""Proposer trees against a brute-force proposer; the simulator against a hand-computed replay."""

import json
import random
import time

import numpy as np
import pytest

from suffixspec import BadInputError, DraftTree, Proposer, ResponseCache, SuffixAutomaton
from suffixspec.cli import main as cli_main
from suffixspec.draft.simulate import Trace, load_traces, oracle_mean_accepted, simulate
from suffixspec.errors import InternalError

from support.trees import check_tree_invariants, corpus_rule, naive_part_candidates, tree_paths


def _naive_self_candidates(text, budget, match_prior, recency, max_depth=12, levels=3):
    """All draft paths from the request's own text with their probabilities (exhaustive), from
    `levels` matched suffixes (the proposer's default `match_levels` is 3)."""
    return naive_part_candidates([text], text, 2, levels, match_prior, recency, max_depth)


@pytest.mark.parametrize("alphabet", [2, 3, 4])
def test_trees_equal_brute_force_on_small_cases(alphabet):
    rng = random.Random(alphabet)
    for trial in range(40):
        text = [rng.randrange(alphabet) for _ in range(rng.randrange(2, 30))]
        budget = rng.randrange(1, 12)
        prop = Proposer(global_cache=False, max_children=64, max_depth=12, match_prior=1.0, recency=0.5, learn=False)
        session = prop.start(text[: len(text) // 2])
        session.extend(text[len(text) // 2 :])
        tree = session.propose(budget)
        check_tree_invariants(tree)
        ref = _naive_self_candidates(text, budget, 1.0, 0.5)
        got = tree_paths(tree)
        for path, score in got.items():
            assert path in ref and score == pytest.approx(ref[path]), (text, path)
        best = sorted(ref.values(), reverse=True)[:budget]
        assert sorted(got.values(), reverse=True) == pytest.approx(best), text


@pytest.mark.parametrize("alphabet", [1, 2, 3])
def test_trees_equal_brute_force_while_the_session_grows(alphabet):
    """Counts read during online growth (link-cut tags summed without splaying, or a splay past
    a long path) equal the brute force after every committed token."""
    rng = random.Random(100 + alphabet)
    depth = {1: 8, 2: 6, 3: 4}[alphabet]
    for trial in range(4):
        text = [rng.randrange(alphabet) for _ in range(rng.randrange(40, 120))]
        prop = Proposer(global_cache=False, max_children=64, max_depth=depth, match_prior=1.0, recency=0.5, learn=False)
        session = prop.start(text[:4])
        for i in range(4, len(text)):
            session.extend([text[i]])
            budget = rng.randrange(1, 10)
            got = tree_paths(session.propose(budget))
            ref = _naive_self_candidates(text[: i + 1], budget, 1.0, 0.5, max_depth=depth)
            for path, score in got.items():
                assert path in ref and score == pytest.approx(ref[path]), (text[: i + 1], path)
            best = sorted(ref.values(), reverse=True)[:budget]
            assert sorted(got.values(), reverse=True) == pytest.approx(best)


def test_a_spare_arena_is_taken_again_only_once_no_tree_views_it():
    """Arenas take turns: the replaced one is taken again only when no tree views it (a view of
    a tree's arrays counts) and no session holds it as the tree to judge; else a new one is made."""
    rng = np.random.default_rng(5)
    prop = Proposer(global_cache=False)
    s = prop.start(rng.integers(0, 4, 400))
    tree = s.propose(64)
    ws = prop._local.ws
    first = ws.arena
    kept = tree.tokens[1:]  # a view of the tree's view
    tokens0 = kept.copy()
    del tree
    ws.new_arena()
    second = ws.arena
    s.extend(rng.integers(0, 4, 2))  # judges the tree: the session lets go of the first arena's blocks
    held = s.propose(64)
    assert held.tokens.base is second.i32
    ws.new_arena()  # the first arena is still viewed (kept): a new one
    third = ws.arena
    assert third is not first and third is not second
    s.propose(64)  # the session holds the third's blocks until it judges that tree
    ws.new_arena()  # the spare (the second) is viewed by `held`
    assert ws.arena not in (first, second, third)
    assert kept.tolist() == tokens0.tolist()
    del held
    s.extend(rng.integers(0, 4, 1))
    fourth = ws.arena
    ws.new_arena()  # the spare (the third) is free now
    assert ws.arena is third and ws.spare is fourth
    ws.new_arena()
    assert ws.arena is fourth
    for _ in range(300):  # trees written into reused arenas are the trees proposed
        t = s.propose(64)
        toks = t.tokens.copy()
        ws.new_arena()
        assert t.tokens.tolist() == toks.tolist()
        s.extend(rng.integers(0, 4, 1))


def test_trees_stay_intact_while_later_proposals_fill_and_replace_the_arena():
    """Trees are views into the thread's output arena: a thousand later proposals (from several
    sessions whose cache sources grow, arenas filled and replaced, the workspace regrown for
    larger budgets) must not change a tree already handed out; the empty tree is shared and
    read-only, and so are the knobs the sessions' frames name."""
    from suffixspec._kernels import draft as dk
    from suffixspec._kernels import propose as pk

    rng = np.random.default_rng(21)
    prop = Proposer(global_cache=True, cache_tokens=2000)
    sessions = [prop.start(rng.integers(0, 5, 200)) for _ in range(3)]
    kept = []
    for step in range(1500):
        s = sessions[step % 3]
        tree = s.propose(int(rng.choice([1, 8, 40, 64])) if step < 1000 or step % 7 else 100 + step // 2)
        kept.append((tree, tree.tokens.copy(), tree.parents.copy(), tree.depths.copy(), tree.scores.copy()))
        s.extend(rng.integers(0, 5, int(rng.integers(1, 4))))
        if step % 50 == 49:
            s.close()
            sessions[step % 3] = prop.start(rng.integers(0, 5, 100))
    arenas = {id(t.tokens.base) for t, *_ in kept if len(t)}
    assert len(arenas) > 5  # the arena was replaced several times
    for tree, toks, pars, depths, scores in kept:
        assert tree.tokens.tolist() == toks.tolist() and tree.parents.tolist() == pars.tolist()
        assert tree.depths.tolist() == depths.tolist() and tree.scores.tolist() == scores.tolist()
        check_tree_invariants(tree)
    assert prop._local.ws.budget >= 100 + 1499 // 2  # regrown while earlier trees were held ...
    assert prop._local.ws.n_sources > 4  # ... and for sessions with more parts (the kernel refused it)
    empty = DraftTree.empty()
    assert empty is DraftTree.empty() and len(empty) == 0 and prop.propose_batch([sessions[0]], 0)[0] is empty
    with pytest.raises(ValueError):
        prop.params[0] = 5.0
    for knob in ("min_match", "match_levels", "min_prob"):
        with pytest.raises(AttributeError):
            setattr(prop, knob, 2)
    with pytest.raises(ValueError):
        empty.tokens[...] = 1  # read-only, even though zero-sized
    with pytest.raises(InternalError, match="int32"):
        pk.set_arena(np.zeros(dk.WS_FRAME_LEN, np.int64), np.zeros(30, np.int64), np.zeros(10))
    with pytest.raises(InternalError, match="beside"):
        pk.set_arena(np.zeros(dk.WS_FRAME_LEN, np.int64), np.zeros(20, np.int32), np.zeros(10))


def test_long_repeated_block_is_proposed_in_full():
    rng = np.random.default_rng(0)
    block = rng.integers(0, 50_000, 500).tolist()
    prop = Proposer(global_cache=False)
    session = prop.start([7] + block + [8, 9])
    session.extend(block[:3])
    tree = session.propose(600)
    assert tree.max_depth >= 497
    best = int(np.argmax(tree.depths))
    path = tree.tokens[tree.path_to(best)].tolist()
    assert path[:497] == block[3:]


def test_budget_respected_and_empty_tree_when_nothing_matches():
    prop = Proposer(global_cache=False)
    session = prop.start([1, 2, 3, 4])
    assert len(session.propose(8)) == 0
    session.extend([1, 2])
    tree = session.propose(1)
    assert len(tree) == 1 and tree.tokens[0] == 3
    assert len(session.propose(0)) == 0


def test_global_cache_teaches_later_requests_and_round_trips(tmp_path):
    prop = Proposer()
    answer = list(range(100, 140))
    s = prop.start([1, 2, 3])
    s.extend(answer)
    s.close()
    s2 = prop.start([5, 6] + answer[:4])
    tree = s2.propose(64)
    best = int(np.argmax(tree.depths))
    assert tree.tokens[tree.path_to(best)].tolist()[:36] == answer[4:40]
    path = tmp_path / "cache.bin"
    prop.cache.save(path)
    loaded = ResponseCache.load(path)
    prop2 = Proposer()
    prop2.cache = loaded
    s3 = prop2.start(answer[:4])
    assert s3.propose(8).tokens[0] == answer[4]
    (tmp_path / "junk").write_bytes(b"not a cache")
    with pytest.raises(Exception, match="junk"):
        ResponseCache.load(tmp_path / "junk")


def test_global_cache_memory_is_bounded():
    cache = ResponseCache(max_tokens=4000, generations=4)
    rng = np.random.default_rng(1)
    for _ in range(200):
        cache.add(rng.integers(0, 1000, 100))
    assert len(cache) <= 4000 + 1000
    version, sources = cache.sources()
    assert len(sources) <= 4


def test_corpus_source_and_merge_of_sources():
    corpus = SuffixAutomaton()
    corpus.add_document([10, 11, 12, 13, 14])
    prop = Proposer(corpus=corpus.freeze(), global_cache=False)
    s = prop.start([1, 10, 11, 20, 21, 1, 10])
    tree = s.propose(16)
    check_tree_invariants(tree)
    paths = tree_paths(tree)
    assert (11, 12, 13, 14) in paths  # from the corpus
    assert (11, 20, 21) in paths      # from the request itself, sharing the first node
    assert sum(1 for p in paths if len(p) == 1) == 1


@pytest.mark.parametrize("batched", [False, True])
def test_draft_tokens_are_counted_by_source(batched):
    """Each judged node counts for the source whose part drafted it; accepted: on the committed path."""
    corpus = SuffixAutomaton()
    corpus.add_document([10, 11, 12, 13, 14])
    prop = Proposer(corpus=corpus.freeze(), global_cache=False)
    s = prop.start([1, 10, 11, 20, 21, 1, 10])
    tree = prop.propose_batch([s], 16)[0] if batched else s.propose(16)
    paths = tree_paths(tree)
    assert (11, 12, 13, 14) in paths and (11, 20, 21) in paths
    s.extend([11, 12, 13])  # the corpus's path: 12 and 13 only the corpus drafted (11 both did)
    got = prop.source_tokens()
    assert got["corpus"]["drafted"] + got["other"]["drafted"] == len(tree)
    assert got["corpus"]["drafted"] >= 3 and got["other"]["drafted"] >= 2  # 12, 13, 14 and 20, 21
    assert got["corpus"]["accepted"] + got["other"]["accepted"] == 3
    assert got["corpus"]["accepted"] >= 2
    s.extend([99])  # no tree since the last extension: nothing more counted
    assert prop.source_tokens() == got

    plain = Proposer(global_cache=False)  # without corpora nothing is counted (no cost per round)
    t = plain.start([1, 10, 11, 20, 21, 1, 10])
    assert len(t.propose(16))
    t.extend([11, 20])
    assert plain.source_tokens() == {"corpus": {"drafted": 0, "accepted": 0}, "other": {"drafted": 0, "accepted": 0}}


@pytest.mark.parametrize("alphabet", [2, 3, 5])
def test_tree_over_several_sources_keeps_the_best_paths_of_their_union(alphabet):
    """With corpora the kernel skips, after a source filled the budget, candidates of later sources
    below its least probable node. The result must still be the budget best paths of the union of
    every source's own tree (a shared path scoring the max over sources). Each source's own tree is
    obtained from a proposer over the request and that source alone (the request's tree is part of
    every one of them)."""
    rng = random.Random(7 + alphabet)
    for trial in range(25):
        corpora = []
        for _ in range(rng.randrange(1, 4)):
            sam = SuffixAutomaton()
            for _ in range(rng.randrange(1, 4)):
                sam.add_document([rng.randrange(alphabet) for _ in range(rng.randrange(3, 60))])
            corpora.append(sam.freeze())
        text = [rng.randrange(alphabet) for _ in range(rng.randrange(3, 40))]
        budget = rng.randrange(1, 24)
        opts = dict(global_cache=False, max_children=rng.choice([2, 4, 64]), max_depth=rng.choice([0, 6]))
        tree = Proposer(corpus=corpora, **opts).start(text).propose(budget)
        check_tree_invariants(tree)
        union = {}
        for c in corpora:
            for path, score in tree_paths(Proposer(corpus=c, **opts).start(text).propose(budget)).items():
                union[path] = max(union.get(path, 0.0), score)
        got = tree_paths(tree)
        for path, score in got.items():
            assert path in union and score == pytest.approx(union[path]), (trial, path)
        assert sorted(got.values(), reverse=True) == pytest.approx(sorted(union.values(), reverse=True)[:budget]), trial


@pytest.mark.parametrize("match_levels", [1, 2, 3])
def test_tree_over_several_sources_equals_brute_force_union(match_levels):
    """The one-heap expansion over all parts (request, corpora; several match levels) gives the
    `budget` best paths of the union of every part's exhaustive candidates, a path shared by
    parts scoring its best, computed here by brute force over the documents."""
    rng = random.Random(31 + match_levels)
    for trial in range(60):
        alphabet = rng.choice([2, 3, 4])
        corpora, corpus_docs = [], []
        for _ in range(rng.randrange(1, 4)):
            sam = SuffixAutomaton()
            docs = [[rng.randrange(alphabet) for _ in range(rng.randrange(2, 25))] for _ in range(rng.randrange(1, 3))]
            for d in docs:
                sam.add_document(d)
            corpora.append(sam.freeze())
            corpus_docs.append(docs)
        text = [rng.randrange(alphabet) for _ in range(rng.randrange(2, 25))]
        budget = rng.randrange(1, 20)
        prop = Proposer(corpus=corpora, global_cache=False, max_children=64, max_depth=5, match_prior=1.0,
                        recency=0.5, match_levels=match_levels, learn=False)
        session = prop.start(text[: len(text) // 2])
        session.extend(text[len(text) // 2 :])
        tree = session.propose(budget)
        check_tree_invariants(tree)
        union = naive_part_candidates([text], text, 2, match_levels, 1.0, 0.5, 5)
        for j, docs in enumerate(corpus_docs):
            rule = corpus_rule(session, j)
            for path, score in naive_part_candidates(docs, text, 1, match_levels, 1.0, 0.5, 5, corpus=rule).items():
                union[path] = max(union.get(path, 0.0), score)
        got = tree_paths(tree)
        for path, score in got.items():
            assert path in union and score == pytest.approx(union[path]), (trial, path)
        best = sorted(union.values(), reverse=True)[:budget]
        assert sorted(got.values(), reverse=True) == pytest.approx(best), trial


def test_source_table_reads_the_arrays_it_names_and_rejects_others():
    """The kernels read frozen sources through a table of addresses: each row must give back the
    very arrays (contents and lengths) it was built from, lens, counts and the text through
    `source_len`, `source_count` and `source_token` whether int32 or uint16 (read in place), and only
    1-D C arrays of those dtypes are taken."""
    from suffixspec._kernels import frozen as fk

    rng = np.random.default_rng(3)
    n = fk.N_SOURCE_ARRAYS
    sources = []
    for j in range(6):
        arrs = [rng.integers(0 if k in fk.SOURCE_NARROW else -5, 1000, int(rng.integers(0, 40))).astype(np.int32)
                for k in range(n)]
        if j % 2:  # a corpus shard's: token ids and lengths as uint16
            for k in fk.SOURCE_NARROW:
                arrs[k] = arrs[k].astype(np.uint16)
        sources.append(tuple(arrs))
    table = fk.source_table(sources)
    assert table.shape == (6, fk.SOURCE_COLS)
    for j, arrs in enumerate(sources):
        offsets, lasts, links, records, plink, narrow = _read_source(table, j, 45)
        for k, got in ((fk.SRC_OFFSETS, offsets), (fk.SRC_LASTS, lasts), (fk.SRC_LINKS, links),
                       (fk.SRC_RECORDS, records), (fk.SRC_PLINK, plink)):
            assert got.tolist() == arrs[k].tolist()
        for i, k in enumerate((fk.SRC_LENS, fk.SRC_COUNTS, fk.SRC_TOKENS)):
            m = arrs[k].shape[0]
            assert narrow[i].tolist() == arrs[k].tolist() + [-1] * (45 - m)  # -1: outside the array
        assert table[j, fk.SRC_LENS] == arrs[fk.SRC_LENS].__array_interface__["data"][0]  # no copy
    with pytest.raises(InternalError, match="int32"):
        fk.source_table([tuple(np.zeros(3, np.int64) for _ in range(n))])
    with pytest.raises(InternalError, match="int32"):
        fk.source_table([tuple(np.zeros(3, np.uint16) for _ in range(n))])  # uint16 only for the narrow slots
    with pytest.raises(InternalError, match="C-contiguous"):
        fk.source_table([tuple(np.zeros(6, np.int32)[::2] for _ in range(n))])
    with pytest.raises(InternalError, match=f"{n} arrays"):
        fk.source_table([(np.zeros(3, np.int32),)])


def test_edge_records_pack_each_edge_with_its_target():
    """`frozen.edge_records` against a loop over the edges: token, target, the target's count and
    last end side by side (an implicit state's: count 1, last end its position); a target outside the
    states is kept with count and last 0."""
    from suffixspec._kernels import frozen as fk

    rng = np.random.default_rng(11)
    for trial in range(20):
        n, m = int(rng.integers(1, 30)), int(rng.integers(0, 60))
        etok = rng.integers(0, 50, m).astype(np.int32)
        eto = rng.integers(-3, n + 3, m).astype(np.int32)
        counts = rng.integers(0, 100, n).astype(np.int32)
        lasts = rng.integers(-1, 100, n).astype(np.int32)
        n_imp = int(rng.integers(0, 3))
        big = np.array([], np.int32)
        if trial % 2 and n > 2:  # uint16 counts, one escaped
            counts[1] = 65535
            big = np.array([1, 70000], np.int32)
        got = fk.edge_records(etok, eto, counts.astype(np.uint16) if big.size else counts, big, lasts, n_imp)
        got = got.reshape(-1, fk.REC_COLS)
        assert got.shape == (m, fk.REC_COLS)
        for e in range(m):
            w = int(eto[e])
            ok = 0 <= w < n
            imp = n <= w < n + n_imp
            c = (70000 if big.size and w == 1 else int(counts[w])) if ok else int(imp)
            want = [int(etok[e]), w, c, int(lasts[w]) if ok else (w - n if imp else 0)]
            assert [int(got[e, c]) for c in (fk.REC_TOK, fk.REC_TO, fk.REC_COUNT, fk.REC_LAST)] == want
    # the automaton's records are its kernel arrays', read-only, built once
    sam = SuffixAutomaton([1, 2, 3, 1, 2, 4, 1, 2, 3])
    fa = sam.freeze()
    rec = fa.edge_records().reshape(-1, fk.REC_COLS)
    assert rec[:, fk.REC_TOK].tolist() == fa.etok.tolist() and rec[:, fk.REC_TO].tolist() == fa.eto.tolist()
    assert rec[:, fk.REC_COUNT].tolist() == fa.counts[fa.eto].tolist()
    assert rec[:, fk.REC_LAST].tolist() == fa.lasts[fa.eto].tolist()
    assert not fa.edge_records().flags.writeable and fa.edge_records() is fa.edge_records()


def test_prefetch_is_only_a_hint():
    """`address.prefetch` changes nothing and never faults, at any index (outside: nothing)."""
    from numba import njit

    from suffixspec._kernels.address import prefetch

    @njit
    def touch(a, idx):
        for i in idx:
            prefetch(a, i)
        return a.sum()

    a = np.arange(1000, dtype=np.int32)
    assert touch(a, np.array([-5, 0, 3, 999, 1000, 1 << 40], np.int64)) == a.sum()
    assert a.tolist() == list(range(1000))


def _read_source(table, j, n_lens):
    from numba import njit

    from suffixspec._kernels import frozen as fk

    @njit
    def read(table, j, n_lens):
        offsets, lasts, links, records = fk.source_arrays(table, j)
        narrow = np.empty((3, n_lens), np.int64)
        for v in range(n_lens):
            narrow[0, v] = fk.source_len(table, j, v)
            narrow[1, v] = fk.source_count(table, j, v)
            narrow[2, v] = fk.source_token(table, j, v)
        return offsets.copy(), lasts.copy(), links.copy(), records.copy(), fk.source_plink(table, j).copy(), narrow

    return read(table, j, n_lens)


def _same_tree(a, b):
    assert a.tokens.tolist() == b.tokens.tolist()
    assert a.parents.tolist() == b.parents.tolist()
    assert a.depths.tolist() == b.depths.tolist()
    assert np.array_equal(a.scores, b.scores)


def _random_index(tmp_path, rng, name):
    from suffixspec import CorpusIndex, Document, build_index

    tok = {"name": "tiny", "vocab_size": 100, "fingerprint": "0" * 64}
    docs = [Document(rng.integers(0, 6, int(rng.integers(5, 80))), f"d{i}", {"repo": "ab"[i % 2]}) for i in range(30)]
    build_index(docs, tmp_path / name, tokenizer=tok, shard_tokens=400)
    return CorpusIndex.open(tmp_path / name)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("match_levels", [1, 2, 3])
def test_batch_kernel_equals_one_by_one(tmp_path, threads, match_levels):
    """propose_batch (one parallel kernel call) gives exactly the trees of single proposals, with
    every kind of source: the request, a corpus automaton, a sharded index (restricted sessions
    mixed in), the global cache changing between rounds, sessions rebuilt at their token cap,
    closed sessions and slots reused by new sessions."""
    rng = np.random.default_rng(threads * 10 + match_levels)
    index = _random_index(tmp_path, rng, "ix")
    assert len(index.shards) > 1
    corpus = SuffixAutomaton(rng.integers(0, 6, 300)).freeze()
    twins = []
    for _ in range(2):  # identical proposers: one proposes in batches, the other one by one
        twins.append(Proposer(corpus=[corpus, index], threads=threads, match_levels=match_levels,
                              max_session_tokens=150, cache_tokens=600, cache_generations=3))
    batched, single = twins
    texts = [rng.integers(0, 6, int(rng.integers(1, 90))).tolist() for _ in range(40)]
    filters = [{"repo": "a"} if i % 7 == 3 else None for i in range(40)]
    open_b, open_s = {}, {}
    for step in range(12):
        for i in rng.choice(40, 6, replace=False).tolist():  # new requests
            if i not in open_b:
                open_b[i] = batched.start(texts[i], filter=filters[i])
                open_s[i] = single.start(texts[i], filter=filters[i])
        keys = sorted(open_b)
        budgets = [int(b) for b in rng.choice([0, 1, 5, 16, 40], len(keys))]
        got = batched.propose_batch([open_b[k] for k in keys], budgets)
        want = [open_s[k].propose(b) for k, b in zip(keys, budgets)]
        for a, b in zip(got, want):
            _same_tree(a, b)
            check_tree_invariants(a)
        for k in keys:
            toks = rng.integers(0, 6, int(rng.integers(1, 12)))
            open_b[k].extend(toks)
            open_s[k].extend(toks)
        for k in rng.choice(keys, min(3, len(keys)), replace=False).tolist():  # finished requests
            open_b.pop(k).close()
            open_s.pop(k).close()
    assert len(batched.cache) == len(single.cache) > 0
    closed = batched.start([1, 2, 3])
    closed.close()
    assert len(batched.propose_batch([closed], 8)[0]) == 0
    s = batched.start([1, 2, 1, 2])
    with pytest.raises(BadInputError, match="more than once"):
        batched.propose_batch([s, s], 8)
    with pytest.raises(BadInputError, match="another proposer"):
        batched.propose_batch([single.start([1])], 8)
    with pytest.raises(BadInputError, match="one per session"):
        batched.propose_batch([s], [1, 2])


def test_sessions_proposed_from_several_threads_at_once():
    """Server threads proposing (one by one and in batches) and closing their own sessions
    concurrently get the trees a sequential run gets."""
    import threading

    rng = np.random.default_rng(9)
    corpus = SuffixAutomaton(rng.integers(0, 5, 400)).freeze()
    texts = [rng.integers(0, 5, 50).tolist() for _ in range(24)]
    steps = [rng.integers(0, 5, 4).tolist() for _ in range(10)]

    def work(prop, mine, out):
        sessions = [prop.start(texts[i]) for i in mine]
        for step in steps:
            out.extend(t.tokens.tolist() for t in prop.propose_batch(sessions, 12))
            out.extend(s.propose(7).tokens.tolist() for s in sessions)
            for s in sessions:
                s.extend(step)
        for s in sessions:
            s.close()

    groups = [list(range(k, 24, 4)) for k in range(4)]
    want = []
    for g in groups:
        out = []
        work(Proposer(corpus=corpus, global_cache=False, threads=2, learn=False), g, out)
        want.append(out)
    prop = Proposer(corpus=corpus, global_cache=False, threads=2, learn=False)  # learned counts are shared
    got = [[] for _ in groups]
    threads = [threading.Thread(target=work, args=(prop, g, o)) for g, o in zip(groups, got)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == want


def test_one_session_used_from_several_threads_waits_for_itself():
    """One session proposed (alone and in batches), extended and closed from different threads at
    once: its calls wait for each other, so no kernel reads an automaton being grown or freed.
    Every tree is well formed, no extension is lost or doubled, a closed session proposes nothing
    and refuses tokens, and its output reaches the cache."""
    import threading

    rng = np.random.default_rng(12)
    prop = Proposer(cache_tokens=1 << 16)
    for trial in range(12):
        text = rng.integers(0, 6, 400).tolist()
        s = prop.start(text[:40])
        bad = []

        def proposing():
            try:
                k = 0
                while not s._closed or k < 3:
                    k += 1
                    t = prop.propose_batch([s], 24)[0] if k % 2 else s.propose(24)
                    DraftTree(t.tokens, t.parents, t.scores)  # validates the structure
                    assert len(t) <= 24 and np.all((t.scores >= 0) & (t.scores <= 1))
                    assert set(t.tokens.tolist()) <= set(range(6))
            except BaseException as exc:  # noqa: BLE001 - any failure in the thread fails the test
                bad.append(exc)

        def extending():
            try:
                for a in range(40, 400, 3):
                    try:
                        s.extend(text[a : a + 3])
                    except BadInputError as exc:
                        assert "closed" in str(exc)
                        return
            except BaseException as exc:  # noqa: BLE001
                bad.append(exc)

        cached = len(prop.cache)
        workers = [threading.Thread(target=proposing), threading.Thread(target=extending)]
        for w in workers:
            w.start()
        time.sleep(0.002 * trial)
        s.close()
        for w in workers:
            w.join()
        assert not bad, bad
        out = s.output
        assert out == text[40 : 40 + len(out)] and len(out) % 3 == 0  # whole extensions, in order
        assert len(s.propose(8)) == 0 and len(prop.propose_batch([s], 8)[0]) == 0
        with pytest.raises(BadInputError, match="closed"):
            s.extend([1])
        assert len(prop.cache) == cached + len(out)  # the output, and nothing else, joined the cache


def test_cache_cursors_stay_valid_matches_while_the_cache_changes():
    """Sessions open while others close keep cursors into the past-response generations that
    are real matches of their context: carried over a re-frozen generation (normalised past
    clones), kept for an unchanged one, re-found for a new one."""
    rng = np.random.default_rng(11)
    prop = Proposer(cache_tokens=900, cache_generations=3)
    sessions = [prop.start(rng.integers(0, 4, 30)) for _ in range(10)]
    carried = 0
    for step in range(60):
        for s in sessions:
            s.extend(rng.integers(0, 4, int(rng.integers(1, 8))))
        prop.propose_batch(sessions, 8)
        src = prop._current_sources()
        for s in sessions:
            assert s._src is src
            context = s._sam.tokens
            for fa, (state, length, _anchor) in zip(s._automata[src.n_static :], s._cur[src.n_static :].tolist()):
                assert 0 <= length <= min(len(context), prop.resync_tokens + 60 * 8)
                assert fa.locate(context[len(context) - length :]) == state
                carried += length > 0
        k = int(rng.integers(len(sessions)))
        sessions.pop(k).close()
        sessions.append(prop.start(rng.integers(0, 4, 30)))
    assert carried > 0 and len(prop.cache._frozen) >= 1


def test_one_thread_batches_launch_no_parallel_region():
    """The default batch (threads=1) must leave numba's threading layer unstarted: an OpenMP
    region of numba's slows torch's later passes, so the model would pay for the proposer."""
    import os
    import subprocess
    import sys

    code = (
        "import numpy as np\n"
        "from numba.np.ufunc import parallel\n"
        "from suffixspec import Proposer\n"
        "p = Proposer()\n"
        "ss = [p.start(np.arange(40) % 7) for _ in range(8)]\n"
        "assert all(len(t) for t in p.propose_batch(ss, 8))\n"
        "print(parallel._is_initialized)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    # more threads: a parallel region, on numba's own pool rather than the OpenMP torch uses
    code = code.replace("Proposer()", "Proposer(threads=2)").replace(
        "print(parallel._is_initialized)", "import numba; print(parallel._is_initialized, numba.threading_layer())")
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_THREADING_LAYER"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert out.stdout.strip() == "True workqueue"


def test_bad_options_rejected():
    with pytest.raises(BadInputError, match="max_nodes"):
        Proposer(max_nodes=0)
    with pytest.raises(BadInputError, match="corpus"):
        Proposer(corpus="not an index")


def test_simulator_hand_computed_replay(tmp_path):
    traces = [
        Trace(np.array([1, 2, 3, 4, 5, 6, 7, 8, 9]), np.array([1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3])),
        Trace(np.array([9, 9]), np.array([1, 2, 3, 4, 5, 6, 7, 8, 9])),
    ]
    # Trace 1: round 1 no match, commit 1; round 2 "1" matched: draft 2..9, accept 8 + bonus 1;
    # round 3 accepts 2 3 (output ends). Trace 2: the cache holds trace 1's output: round 1
    # drafts 1 2 3 (cache document ends), accepts 3 + bonus 4; round 2 copies 5..9.
    stats = simulate(traces, Proposer(), budget=8)
    assert stats["rounds"] == 5
    assert stats["mean_accepted_tokens"] == pytest.approx(21 / 5)
    assert stats["accepted_by_position"] == [0.8, 0.8, 0.6, 0.4, 0.4, 0.2, 0.2, 0.2]
    # oracle: trace 1 copies 8 + 1 then 3; trace 2 copies 8 + 1 from history: 21 / 3
    assert stats["oracle_mean_accepted_tokens"] == pytest.approx(7.0)
    # without history trace 2 finds nothing to copy: 9 one-token rounds
    assert oracle_mean_accepted(traces, 8, use_history=False) == pytest.approx(21 / 11)
    # the same through the CLI, JSON last
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(json.dumps({"prompt_ids": t.prompt.tolist(), "output_ids": t.output.tolist()}) for t in traces))
    assert len(load_traces(path)) == 2


def test_simulate_cli_json_and_bad_lines(tmp_path, capsys):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"prompt_ids": [1, 2, 3, 1, 2], "output_ids": [3, 1, 2, 3], "id": "a"}) + "\n")
    assert cli_main(["simulate", str(path), "--budget", "4", "--json"]) == 0
    stats = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for key in ("mean_accepted_tokens", "acceptance_rate", "drafted_per_round", "accepted_by_position",
                "rounds", "propose_us_p50", "propose_us_p99", "oracle_mean_accepted_tokens"):
        assert key in stats
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt_ids": [1]}\n{not json\n')
    assert cli_main(["simulate", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "bad.jsonl:1" in err and "output_ids" in err


def _tiny_index(tmp_path):
    from suffixspec import CorpusIndex, Document, build_index

    tok = {"name": "tiny", "vocab_size": 100, "fingerprint": "0" * 64}
    docs = [
        Document(np.array([1, 2, 3, 4, 5, 6]), "a1", {"repo": "a"}),
        Document(np.array([1, 2, 3, 40, 50, 60]), "b1", {"repo": "b"}),
        Document(np.array([7, 8, 9]), "b2", {"repo": "b"}),
    ]
    build_index(docs, tmp_path / "idx", tokenizer=tok)
    return CorpusIndex.open(tmp_path / "idx")


def test_corpus_index_source_unrestricted_and_filtered(tmp_path):
    index = _tiny_index(tmp_path)
    prop = Proposer(corpus=index, global_cache=False)
    paths = tree_paths(prop.start([9, 1, 2, 3]).propose(16))
    assert (4, 5, 6) in paths and (40, 50, 60) in paths
    only_a = tree_paths(prop.start([9, 1, 2, 3], filter={"repo": "a"}).propose(16))
    assert (4, 5, 6) in only_a and not any(p[0] == 40 for p in only_a)
    only_b = tree_paths(prop.start([9, 1, 2, 3], filter={"repo": "b"}).propose(16))
    assert (40, 50, 60) in only_b and not any(p[0] == 4 for p in only_b)
    with pytest.raises(BadInputError, match="filter"):
        Proposer(global_cache=False).start([1], filter={"repo": "a"})


def test_long_prompt_and_session_memory_cap():
    rng = np.random.default_rng(4)
    prompt = rng.integers(0, 30_000, 150_000)
    prop = Proposer(global_cache=False, max_session_tokens=200_000)
    s = prop.start(prompt)
    s.extend(prompt[1000:1010])
    tree = s.propose(32)
    assert tree.tokens[tree.path_to(int(np.argmax(tree.depths)))].tolist()[:20] == prompt[1010:1030].tolist()
    s.extend(rng.integers(0, 30_000, 60_000))  # past the cap: rebuilt over the most recent half
    assert len(s._sam) <= 200_000
    s.extend(prompt[-5000:-4990])  # older than the kept half: no longer matched from the request
    s.extend(s._sam.tokens[-40_000:-39_990].tolist())  # still held: proposed
    tree = s.propose(8)
    assert len(tree) > 0


def test_token_ids_are_checked_at_the_boundary():
    """start/extend refuse ids outside [0, vocab_size) naming the parameter, range and value;
    a refused extension changes nothing."""
    from suffixspec import BadInputTypeError

    prop = Proposer(vocab_size=100, global_cache=False)
    with pytest.raises(BadInputError, match=r"prompt_ids: expected token ids in \[0, 99\].*got 100 at index 2"):
        prop.start([1, 2, 100])
    s = prop.start([1, 2, 3, 1, 2])
    with pytest.raises(BadInputError, match=r"tokens: expected token ids in \[0, 99\].*got 150 at index 1"):
        s.extend(np.array([5, 150, 7]))
    assert len(s) == 5 and s.output == []
    assert s.propose(4).tokens.tolist()[:1] == [3]
    with pytest.raises(BadInputError, match=r"prompt_ids: .*got -1"):
        prop.start([1, -1])
    with pytest.raises(BadInputTypeError, match="prompt_ids"):
        prop.start([1.5, 2.0])
    with pytest.raises(BadInputTypeError, match="tokens"):
        s.extend("12")
    for bad in (0, -5, True, 2.5, 2**31 + 1):
        with pytest.raises(BadInputError, match="vocab_size"):
            Proposer(vocab_size=bad)
    s.extend([99])
    assert s.output == [99]
    # without vocab_size any id in [0, 2**31 - 1] is fine
    assert len(Proposer(global_cache=False).start([2**31 - 1, 0])) == 2
