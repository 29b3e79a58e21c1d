"""A brute-force reference of a corpus shard's layout with implicit states (format 4).

`to_implicit(fa)` converts an in-memory `FrozenAutomaton` (every state stored) by the rule's
definition: a state is implicit when its count is 1 (and it is not the root); it gets id
n_stored + p, p its one end position; the other states keep their order. Python loops over small
automata, no kernel. `link_target_max_len`: the greatest length of a state that is some state's
suffix link (the only lengths a query reads), over the growable layout (sam.py) or the corpus
build's rows (bulk_sam.py)."""

import numpy as np

HOLE = -(2**31)


def prefix_states(fa) -> list[int]:
    """The state of each position's whole document prefix, by following edges from the root."""
    offsets, etok, eto = (np.asarray(a) for a in (fa.offsets, fa.etok, fa.eto))
    tokens = np.asarray(fa.tokens)
    starts = set(int(s) for s in fa.doc_starts)
    out, state = [], 0
    for p, t in enumerate(tokens.tolist()):
        if p in starts:
            state = 0
        lo, hi = int(offsets[state]), int(offsets[state + 1])
        hit = [k for k in range(lo, hi) if int(etok[k]) == t]
        assert len(hit) == 1
        state = int(eto[hit[0]])
        out.append(state)
    return out


def to_implicit(fa) -> tuple[dict, np.ndarray]:
    """(arrays, newid): the shard arrays links, lens, counts, count_escapes, lasts, offsets, etok, eto,
    plink of `fa` with implicit states (int32 but counts, uint16 with counts of 65535 or more in
    count_escapes; lens uncapped), and each old state's new id."""
    links, lens, counts, lasts = (np.asarray(a, np.int64) for a in (fa.links, fa.lens, fa.counts, fa.lasts))
    offsets, etok, eto = (np.asarray(a, np.int64) for a in (fa.offsets, fa.etok, fa.eto))
    n, n_tok = len(links), len(fa.tokens)
    pstate = prefix_states(fa)
    ends = {int(s) - 1 for s in fa.doc_starts[1:]} | {n_tok - 1}
    implicit = {v: int(lasts[v]) for v in range(1, n) if counts[v] == 1}
    stored = [v for v in range(n) if v not in implicit]
    n_stored = len(stored)
    newid = np.empty(n, np.int64)
    newid[stored] = np.arange(n_stored)
    for v, p in implicit.items():
        assert pstate[p] == v  # a count-1 state is its one position's prefix state
        newid[v] = n_stored + p
    out = {"links": [], "lens": [], "counts": [], "lasts": [], "offsets": [0], "etok": [], "eto": []}
    for v in stored:
        out["links"].append(-1 if v == 0 else int(newid[links[v]]))
        out["lens"].append(int(lens[v]))
        out["counts"].append(int(counts[v]))
        out["lasts"].append(int(lasts[v]))
        for k in range(offsets[v], offsets[v + 1]):
            out["etok"].append(int(etok[k]))
            out["eto"].append(int(newid[eto[k]]))
        out["offsets"].append(len(out["etok"]))
    plink = np.full(n_tok, HOLE, np.int64)
    for v, p in implicit.items():
        w = int(newid[links[v]])
        assert w < n_stored  # an implicit state's suffix link is stored
        plink[p] = ~w if p in ends else w
    arrays = {k: np.asarray(a, np.int32) for k, a in out.items()}
    arrays["plink"] = plink.astype(np.int32)
    big = [(v, c) for v, c in enumerate(out["counts"]) if c >= 65535]
    arrays["count_escapes"] = np.asarray([x for pair in big for x in pair], np.int32)
    arrays["counts"] = np.minimum(arrays["counts"], 65535).astype(np.uint16)
    return arrays, newid


def link_target_max_len(S, M, link_col: int, len_col: int) -> int:
    """The greatest LEN of a state that some state v >= 1 links to (0 when none but the root), over
    state rows S[v, :] (the first M[0] of them: N_STATES is M's first field in both layouts) with the given LINK and LEN columns."""
    ns = int(M[0])
    links = np.asarray(S[1:ns, link_col], np.int64)
    targets = links[links > 0]
    return int(np.asarray(S[targets, len_col]).max()) if len(targets) else 0
