"""Draft-tree checks shared by the proposer tests: a tree's paths with their scores, the structural
invariants every proposed tree keeps, and the exhaustive (brute-force) draft paths of one source."""

import numpy as np

from support import naive


def tree_paths(tree):
    return {tuple(int(tree.tokens[i]) for i in tree.path_to(n)): float(tree.scores[n]) for n in range(len(tree))}


def check_tree_invariants(tree):
    n = len(tree)
    seen = set()
    for i in range(n):
        p = int(tree.parents[i])
        assert p < i
        assert tree.depths[i] == (1 if p < 0 else tree.depths[p] + 1)
        if p >= 0:
            assert tree.scores[i] <= tree.scores[p] + 1e-12
        assert (p, int(tree.tokens[i])) not in seen
        seen.add((p, int(tree.tokens[i])))
    for parent in [-1] + list(range(n)):
        kids = tree.children(parent)
        assert np.all(np.diff(tree.scores[kids]) <= 1e-12)


def naive_part_candidates(docs, text, min_count, levels, match_prior, recency, max_depth, conf_of=None, corpus=None):
    """Every draft path of one source with its probability (exhaustive): from the longest suffix
    of `text` occurring at least `min_count` times in `docs` (2 for the request's own text, whose
    last occurrence is the text itself), then `levels - 1` shorter matches along suffix links
    (the longest shorter suffix occurring more often); a path keeps its best score over them.
    `conf_of(L)` is the confidence of a step at matched length L (default L / (L + match_prior)).
    `corpus`: (anchor, locality, near_back, near_ahead) of a corpus source, whose bonus goes to
    the continuation nearest the anchor instead of the most recent one (`naive.near_anchor`)."""
    n = max([0] + [k for k in range(1, len(text) + 1) if naive.count(docs, text[len(text) - k :]) >= min_count])
    out = {}

    def expand(ctx, path, prob, depth):
        if depth >= max_depth:
            return
        cont = naive.continuations(docs, ctx)
        if not cont:
            return
        total = sum(c for c, _ in cont.values())
        recent, rec = max(cont, key=lambda t: cont[t][1]), recency
        if corpus is not None:
            anchor, locality, back, ahead = corpus
            kids = [(t, None, c, last) for t, (c, last) in cont.items()]
            near, rec = naive.near_anchor(kids, anchor + depth + 1, dict(locality=locality, near_back=back,
                                                                          near_ahead=ahead))
            recent = next((t for t, (_, last) in cont.items() if last == near), None)
        conf = len(ctx) / (len(ctx) + match_prior) if conf_of is None else conf_of(len(ctx))
        for tok, (c, _) in cont.items():
            p = prob * conf * (c + (rec * total if tok == recent else 0)) / (total * (1 + rec))
            key = tuple(path + [tok])
            out[key] = max(out.get(key, 0.0), p)
            expand(ctx + [tok], path + [tok], p, depth + 1)

    for _ in range(levels):
        if n < 1:
            break
        expand(text[len(text) - n :], [], 1.0, 0)
        here = naive.count(docs, text[len(text) - n :])
        n = max([0] + [k for k in range(1, n) if naive.count(docs, text[len(text) - k :]) > here])
    return out


def corpus_rule(session, row):
    """`naive_part_candidates`' `corpus` argument for a session's corpus row `row`: its anchor and
    the proposer's locality knobs."""
    from suffixspec._kernels import draft as dk

    params = session.proposer.params
    return (int(session._cur[row, dk.CUR_ANCHOR]), float(params[dk.P_CORPUS_LOCALITY]), int(params[dk.P_NEAR_BACK]),
            int(params[dk.P_NEAR_AHEAD]))
