"""Advancing a match by one token: the one loop every cursor over an automaton runs.

A match is (state, length): the longest suffix of the tokens read so far that occurs in the text,
and the state holding it. `follow` reads one more token `c`: the state's edge on c when it has one
(length + 1), else the first state up its suffix links that has one, else the root with length 0.

The automaton is a tuple `g` of arrays with two functions over it, passed in (numba inlines them):
- `trans(g, state, tok)`: the target of state's edge on tok, -1 for none, below -1 an error code;
- `up(g, state, steps)`: (suffix link of state, its length) at the `steps`-th step of one walk,
  a link below 0 being an error code.
`sam.edge_to` / `sam.link_up` read the growable layout, `frozen.edge_to` / `frozen.link_up` the
frozen one (range-checked: a damaged array gives frozen.CORRUPT).

Returns (state, length, first): `first` is 1 when the starting state had an edge on c, 0 when it had
none, -1 when that lookup failed; after an error, state is the error code and length 0.
"""

from numba import njit


@njit(cache=True, nogil=True, inline="always")
def follow(trans, up, g, state, length, c):
    """(state, length, first) after reading token c from the match (state, length)."""
    first = -1
    steps = 0
    while True:
        nxt = trans(g, state, c)
        if nxt < -1:
            return nxt, 0, first
        if first < 0:
            first = 0 if nxt == -1 else 1
        if nxt != -1:
            return nxt, length + 1, first
        if state == 0:
            return 0, 0, first
        steps += 1
        state, length = up(g, state, steps)
        if state < 0:
            return state, 0, first
