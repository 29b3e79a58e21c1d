"""Kernels of the recycled-prediction source (`suffixspec.draft.recycle`) over flat arrays.

Two tables of the target model's top-K next tokens seen in earlier verification passes, best
first, -1 past a row's last entry: `table` int32[V, K], row t for the positions that read token t;
`pairs` int32[S, K] with `pair_keys` int64[S], for the positions that read token t after token u:
the pair's code u * V + t lives in slot `pair_slot(code, S)` (direct-mapped: a later pair that
hashes to the same slot replaces it; -1: an empty slot).

`grow` merges a copy-source tree with recycled branches into one best-first tree. A node's score
is the chance its whole path is accepted. Candidates are a copy node (its own score) or a table
entry of rank j below a tree node of depth d-1: first the entries of the pair (the node's parent's
token, its token), then those of its token alone not already among them (score: the parent's
score times the learned acceptance of bucket (d, j, agree, pair)), where `agree` marks an entry
that is also the copy tree's child at that place (that node scores the larger of its copy score
and the recycled estimate). Every score is capped by its parent's, so taking the best candidate `budget` times keeps
the tree closed under parents and in topological order. Siblings come out in descending score
order because a node's children are taken best first.

`harvest` writes each position's top-K into the row of the token read there and the slot of the
pair read there (the most recent pass wins, as a row is overwritten whole).
"""

import numpy as np
from numba import njit

NO_BUCKET = -1


@njit(cache=True)
def bucket_of(depth, rank, agree, pair, depth_buckets, k):
    """The calibration bucket of a table entry of `rank` drafted at `depth` (1 = the root's child)."""
    d = depth if depth < depth_buckets else depth_buckets
    return ((d - 1) * k + rank) * 4 + agree * 2 + pair


@njit(cache=True)
def pair_slot(code, slots):
    """The slot of pair `code` in a pair table of `slots` rows (a power of two)."""
    h = (np.uint64(code) * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(32)
    return np.int64(h & np.uint64(slots - 1))


@njit(cache=True)
def _entries(table, pairs, pair_keys, prev, tok, out_tok, out_pair):
    """The candidates after `tok` read after `prev` (-1: unknown), pair entries first; returns their count."""
    vocab = table.shape[0]
    k = table.shape[1]
    n = 0
    if 0 <= prev < vocab and 0 <= tok < vocab:
        code = np.int64(prev) * vocab + tok
        slot = pair_slot(code, pairs.shape[0])
        if pair_keys[slot] == code:
            for r in range(k):
                t = pairs[slot, r]
                if t < 0:
                    break
                out_tok[n] = t
                out_pair[n] = 1
                n += 1
    if 0 <= tok < vocab:
        for r in range(k):
            t = table[tok, r]
            if t < 0:
                break
            dup = False
            for j in range(n):
                if out_tok[j] == t:
                    dup = True
                    break
            if not dup:
                out_tok[n] = t
                out_pair[n] = 0
                n += 1
    return n


@njit(cache=True)
def grow(c_tokens, c_parents, c_scores, root_prev, root_token, table, pairs, pair_keys, accept, depth_buckets,
         budget, max_depth, out_tokens, out_parents, out_depths, out_scores, out_buckets):
    """Fill the `out_*` arrays (length >= budget) with the merged tree; returns its node count.

    `c_*`: the copy tree (topological, parents -1 for the root's children). `accept`: float64, the
    learned acceptance per bucket (`bucket_of`). `out_buckets[i]`: node i's bucket, or NO_BUCKET
    for a copy node that no table entry proposed."""
    n_c = c_tokens.shape[0]
    k = table.shape[1]
    cap = (budget + 1) * 2 * k + n_c + 1
    ent_tok = np.empty(2 * k, np.int32)
    ent_pair = np.empty(2 * k, np.int32)
    cand_tok = np.empty(cap, np.int32)
    cand_parent = np.empty(cap, np.int32)  # index in the output tree, -1: the root
    cand_copy = np.empty(cap, np.int32)  # index in the copy tree, -1: none
    cand_score = np.empty(cap, np.float64)
    cand_bucket = np.empty(cap, np.int32)
    cand_alive = np.zeros(cap, np.bool_)
    n_cand = 0
    n_out = 0
    # expand the root, then every node taken
    node = -1
    node_copy = -1
    node_tok = root_token
    node_prev = root_prev
    node_depth = 0
    node_score = 1.0
    while True:
        if node_depth < max_depth:
            first = n_cand
            for j in range(n_c):
                if c_parents[j] == node_copy and (node_copy >= 0 or node < 0):
                    s = c_scores[j]
                    cand_tok[n_cand] = c_tokens[j]
                    cand_parent[n_cand] = node
                    cand_copy[n_cand] = j
                    cand_score[n_cand] = s if s < node_score else node_score
                    cand_bucket[n_cand] = NO_BUCKET
                    cand_alive[n_cand] = True
                    n_cand += 1
            copies_end = n_cand
            n_ent = _entries(table, pairs, pair_keys, node_prev, node_tok, ent_tok, ent_pair)
            rank_pair = 0
            rank_one = 0
            for e in range(n_ent):
                tok = ent_tok[e]
                pr = ent_pair[e]
                r = rank_pair if pr else rank_one
                if pr:
                    rank_pair += 1
                else:
                    rank_one += 1
                same = -1
                for c in range(first, copies_end):
                    if cand_tok[c] == tok:
                        same = c
                        break
                b = bucket_of(node_depth + 1, r, 1 if same >= 0 else 0, pr, depth_buckets, k)
                s = node_score * accept[b]
                if s > node_score:
                    s = node_score
                if same >= 0:
                    cand_bucket[same] = b
                    if s > cand_score[same]:
                        cand_score[same] = s
                    continue
                cand_tok[n_cand] = tok
                cand_parent[n_cand] = node
                cand_copy[n_cand] = -1
                cand_score[n_cand] = s
                cand_bucket[n_cand] = b
                cand_alive[n_cand] = True
                n_cand += 1
        if n_out >= budget:
            break
        best = -1
        best_score = -1.0
        for c in range(n_cand):
            if cand_alive[c] and cand_score[c] > best_score:
                best = c
                best_score = cand_score[c]
        if best < 0 or best_score <= 0.0:
            break
        cand_alive[best] = False
        p = cand_parent[best]
        out_tokens[n_out] = cand_tok[best]
        out_parents[n_out] = p
        out_depths[n_out] = 1 if p < 0 else out_depths[p] + 1
        out_scores[n_out] = best_score
        out_buckets[n_out] = cand_bucket[best]
        node = n_out
        node_copy = cand_copy[best]
        node_prev = root_token if p < 0 else out_tokens[p]
        node_tok = cand_tok[best]
        node_depth = out_depths[n_out]
        node_score = best_score
        n_out += 1
    return n_out


@njit(cache=True)
def harvest(table, pairs, pair_keys, prevs, keys, top):
    """Row keys[i] of `table`, and the slot of the pair (prevs[i], keys[i]) of `pairs`, become
    top[i] (int32[P, K], best first), in order: a later position with the same key wins. Keys
    outside the vocabulary are skipped (a previous token outside it: only the row is written)."""
    vocab = table.shape[0]
    k = table.shape[1]
    for i in range(keys.shape[0]):
        t = keys[i]
        if t < 0 or t >= vocab:
            continue
        for r in range(k):
            table[t, r] = top[i, r]
        u = prevs[i]
        if 0 <= u < vocab:
            code = np.int64(u) * vocab + t
            slot = pair_slot(code, pairs.shape[0])
            pair_keys[slot] = code
            for r in range(k):
                pairs[slot, r] = top[i, r]


@njit(cache=True)
def observe(tested_buckets, tested_accepted, hits, trials, decay):
    """One round of the calibration: decayed counts per bucket of tested table entries (a node is
    tested when its parent was accepted) and of those accepted."""
    for b in range(hits.shape[0]):
        hits[b] *= decay
        trials[b] *= decay
    for i in range(tested_buckets.shape[0]):
        b = tested_buckets[i]
        if b < 0:
            continue
        trials[b] += 1.0
        if tested_accepted[i]:
            hits[b] += 1.0
