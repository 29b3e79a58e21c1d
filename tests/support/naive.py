"""Obviously-correct reference implementations over plain Python lists (slow on purpose)."""


def end_positions(docs, pattern):
    """End positions (global, over the concatenated documents) of `pattern` within documents."""
    pattern = list(pattern)
    m = len(pattern)
    out = []
    base = 0
    for doc in docs:
        for end in range(len(doc)):
            if end + 1 >= m and doc[end + 1 - m : end + 1] == pattern:
                out.append(base + end)
        base += len(doc)
    return out


def count(docs, pattern):
    return len(end_positions(docs, pattern))


def match_length(docs, context):
    context = list(context)
    best = 0
    for length in range(1, len(context) + 1):
        if count(docs, context[len(context) - length :]):
            best = length
        else:
            break  # a suffix that does not occur has no occurring extension
    return best


def continuations(docs, pattern):
    """token -> (count, most recent end position) of pattern + token, for every token that follows."""
    out = {}
    for tok in sorted({t for d in docs for t in d}):
        ends = end_positions(docs, list(pattern) + [tok])
        if ends:
            out[tok] = (len(ends), max(ends))
    return out


def occurrence_layout(links, pstate):
    """(occ, occ_start) of a corpus shard: every position p filed under its prefix state pstate[p],
    listed in suffix-link-tree preorder (a state's own positions increasing, then its children's
    subtrees, ordered by the least state number each subtree holds: the order in which a pass over
    the states in number order first reaches them); occ_start[v] is where v's subtree starts."""
    n_states = len(links)
    children = [[] for _ in range(n_states)]
    for v in range(1, n_states):
        children[int(links[v])].append(v)
    least = list(range(n_states))
    changed = True  # a parent may outnumber its children (a clone): relax until stable
    while changed:
        changed = False
        for v in range(1, n_states):
            p = int(links[v])
            if least[v] < least[p]:
                least[p] = least[v]
                changed = True
    for kids in children:
        kids.sort(key=lambda w: least[w])
    own = [[] for _ in range(n_states)]
    for p, s in enumerate(pstate):
        own[int(s)].append(p)
    occ, occ_start, stack = [], [0] * n_states, [0]
    while stack:
        v = stack.pop()
        occ_start[v] = len(occ)
        occ.extend(own[v])
        stack.extend(reversed(children[v]))
    return occ, occ_start


# -- The draft tree, grown best-first in plain Python (the reference of `_kernels/draft.expand`).
# Same formulas and the same order of floating-point operations as the kernel, the same binary
# heap (its tie order is part of the result), over plain lists and dicts; a state's children come
# from a callback, so the automata are read through their public queries. Assumes no state has
# more children than the kernel reads in one gather or than its frozen top tables cover (small
# alphabets).

CLS_OWN, CLS_CACHE, CLS_CORPUS = 0, 1, 2
N_AGREE = 4
SHARE_EDGES = (0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95)
N_RANKS = 4


def length_bucket(length):
    """The learn stats' length bucket: 1, 2, 3, 4-5, 6-7, 8-11, 12-15, 16-23, 24-31, 32-47, 48-63, 64+."""
    edges = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64]
    return max(i for i, e in enumerate(edges) if max(length, 1) >= e)


def conf(local, glob, cls, length, prior, prior_strength, session_strength):
    base = length / (length + prior)
    b = length_bucket(length)
    hits_g, trials_g = glob[cls][b]
    g = base if trials_g <= 0 else (hits_g + prior_strength * base) / (trials_g + prior_strength)
    hits_s, trials_s = local[cls][b]
    return g if trials_s <= 0 else (hits_s + session_strength * g) / (trials_s + session_strength)


def learned_conf(local, glob, cls, length, prior=1.0, prior_strength=8.0, session_strength=16.0):
    """`conf` with the learn tests' default knobs (match prior 1, prior strength 8, session strength 16)."""
    return conf(local, glob, cls, length, prior, prior_strength, session_strength)


def rank_factor(cal, rank, share, strength):
    """min over ranks 0..rank of the judged (hits + strength) / (expected + strength), at most 1."""
    b = sum(1 for e in SHARE_EDGES if share >= e)
    f = 1.0
    for r in range(min(rank, N_RANKS - 1) + 1):
        hits, expected, trials = cal[r][b]
        if trials > 0:
            f = min(f, (hits + strength) / (expected + strength))
    return f


def group(cls, agree):
    return -1 if cls != CLS_CORPUS else cls * N_AGREE + min(agree, N_AGREE - 1)


def group_factor(gcal, g, strength):
    if g < 0 or gcal[g][2] <= 0:
        return 1.0
    hits, expected, _ = gcal[g]
    return min(1.0, (hits + strength) / (expected + strength))


class Heap:
    """The kernel's binary max-heap of (key, value), ties as it breaks them."""

    def __init__(self):
        self.items = []

    def __len__(self):
        return len(self.items)

    def top(self):
        return self.items[0][0]

    def push(self, key, val):
        h = self.items
        h.append((key, val))
        i = len(h) - 1
        while i > 0 and not h[(i - 1) // 2][0] >= h[i][0]:
            h[(i - 1) // 2], h[i] = h[i], h[(i - 1) // 2]
            i = (i - 1) // 2

    def pop(self):
        h = self.items
        out = h[0]
        last = h.pop()
        if h:
            h[0] = last
            i = 0
            while 2 * i + 1 < len(h):
                a, b = 2 * i + 1, 2 * i + 2
                c = b if b < len(h) and h[b][0] > h[a][0] else a
                if h[i][0] >= h[c][0]:
                    break
                h[c], h[i] = h[i], h[c]
                i = c
        return out


def near_anchor(kids, target, knobs):
    """(last end, weight) of a corpus expansion's bonus: the child whose most recent end lies
    nearest `target` within [-near_back, near_ahead] (the first such on ties) and the locality
    weight; (-1, 0.0) when target < 1 (no anchor) or no child is that near."""
    best, best_d = -1, None
    if target >= 1:
        for kid in kids:
            d = kid[3] - target
            if -knobs["near_back"] <= d <= knobs["near_ahead"] and (best_d is None or abs(d) < best_d):
                best, best_d = kid[3], abs(d)
    return best, (knobs["locality"] if best >= 0 else 0.0)


def draft_tree(parts, children, knobs, local, glob, cal, gcal, budget):
    """The kernel's draft tree: a list of nodes, dicts with token, parent, prob, share, group, step.

    `parts`: [(source, cls, state, length, anchor)], source -1 for the request's own automaton,
    anchor the session's place in a corpus source (-1: none; `near_anchor`);
    `children(source, state)`: [(token, next state, count, last end)] in the order the kernel
    gathers them (a lone child of the own automaton counts 1, last end 0: its share is 1);
    `knobs`: dict of match_prior, recency, min_prob, max_depth, max_children, prior_strength,
    session_strength, cal_strength, locality, near_back, near_ahead; tables as nested lists (`learn.py` layouts)."""
    rec, min_prob, max_depth = knobs["recency"], knobs["min_prob"], knobs["max_depth"]
    strength = knobs["cal_strength"]
    cal_on = any(cal[0][b][2] > 0 for b in range(len(cal[0])))
    nodes = []
    kids_of = {}  # output node (-1: the context) -> its children's node indexes, oldest first

    def conf_at(cls, length):
        return conf(local, glob, cls, length, knobs["match_prior"], knobs["prior_strength"], knobs["session_strength"])

    def find(parent, tok):
        """(node or -1, rank): rank of an existing node, else its sibling count."""
        siblings = kids_of.get(parent, [])
        for x in siblings:
            if nodes[x]["token"] == tok:
                return x, nodes[x]["rank"]
        return -1, len(siblings)

    def add(tok, parent, prob, share, grp, step, rank):
        nodes.append(dict(token=tok, parent=parent, prob=prob, share=share, group=grp, step=step, rank=rank))
        kids_of.setdefault(parent, []).append(len(nodes) - 1)
        return len(nodes) - 1

    cands = []  # dicts: token, parent, state, length, depth, part, group, p, share
    heap = Heap()
    direct = None
    rooted = not any(src >= 0 and group(cls, 1) >= 0 for src, cls, *_ in parts)
    seeded = 0
    while budget > 0:
        if seeded == len(parts) and not rooted:
            rooted, direct, heap = True, None, Heap()
            for i, c in enumerate(cands):
                src, cls = parts[c["part"]][:2]
                if src >= 0 and group(cls, 1) >= 0:
                    c["group"] = group(cls, sum(1 for c2 in cands if c2["token"] == c["token"]))
                    c["p"] = min(1.0, c["share"] * group_factor(gcal, c["group"], strength))
                heap.push(c["p"], i)
        if seeded < len(parts):
            here, q, v, length, depth, p = -1, seeded, parts[seeded][2], parts[seeded][3], 0, 1.0
            seeded += 1
        else:
            if direct is not None:
                (p, ci), direct = direct, None
            elif not heap:
                break
            else:
                p, ci = heap.pop()
            c = cands[ci]
            x, rank = find(c["parent"], c["token"])
            pc, rf = c["p"], 1.0
            if rank > 0 or cal_on:
                rf = rank_factor(cal, rank, c["share"], strength)
                pc *= rf
            if pc < p:  # discounted at its rank: waits for its turn
                if pc >= min_prob:
                    heap.push(pc, ci)
                continue
            if x == -1:
                x = add(c["token"], c["parent"], p, c["share"], c["group"], c["share"] * rf, rank)
                if len(nodes) >= budget:
                    break
            here, q, v, length, depth = x, c["part"], c["state"], c["length"], c["depth"]
        src, cls = parts[q][:2]
        gf = group_factor(gcal, group(cls, 0), strength)
        deep_enough = lambda d: max_depth > 0 and d + 1 > max_depth  # noqa: E731
        # a lone child more probable than every waiting candidate is taken at once
        while seeded >= len(parts) and rooted and not deep_enough(depth):
            kids = children(src, v)
            if len(kids) != 1:
                break
            tok, w, cnt, _ = kids[0]
            total = float(cnt)
            cf = conf_at(cls, length)
            prob = (cnt + rec * total) * (p * cf / (total * (1.0 + rec)))
            if gf < 1.0:
                prob *= gf
            if prob < min_prob or (heap and not prob > heap.top()):
                break
            x, rank = find(here, tok)
            rf = 1.0
            if rank > 0 or cal_on:
                rf = rank_factor(cal, rank, cf, strength)
                if prob * rf < prob:
                    if prob * rf < min_prob or (heap and not prob * rf > heap.top()):
                        break
                    prob = prob * rf
            if x == -1:
                x = add(tok, here, prob, cf, group(cls, 0), cf * rf, rank)
                if len(nodes) >= budget:
                    break
            here, v, length, depth, p = x, w, length + 1, depth + 1, prob
        if len(nodes) >= budget:
            break
        if deep_enough(depth):
            continue
        kids = children(src, v)
        total = float(sum(k[2] for k in kids))
        if not kids or total <= 0:
            continue
        top, r = max(k[3] for k in kids), rec
        if cls == CLS_CORPUS:
            top, r = near_anchor(kids, parts[q][4] + depth + 1, knobs)
        step = conf_at(cls, length) / (total * (1.0 + r))
        scale = p * step * (gf if here >= 0 else 1.0)
        bonus = r * total
        weight = lambda kid: kid[2] + (bonus if kid[3] == top else 0.0)  # noqa: E731
        best = sorted(kids, key=lambda kid: -weight(kid))[: knobs["max_children"]]  # stable: ties in order
        for taken, kid in enumerate(best):
            prob = weight(kid) * scale
            if prob < min_prob:
                break
            cands.append(dict(token=kid[0], parent=here, state=kid[1], length=length + 1, depth=depth + 1, part=q,
                              group=group(cls, 0), p=prob, share=weight(kid) * step))
            if taken == 0 and seeded >= len(parts) and rooted and (not heap or prob > heap.top()):
                direct = (prob, len(cands) - 1)
            else:
                heap.push(prob, len(cands) - 1)
    return nodes
