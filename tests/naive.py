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
