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
