"""Drafting: what a request's continuation is likely to be, from text already seen.

- `automaton`: the suffix automata (growable and frozen) over token ids;
- `proposer`, `session`, `config`: the proposer, one session per request, every knob;
- `sources`, `response_cache`, `upkeep`: what sessions read besides their own text;
- `tree`: the draft tree a proposer returns; `prediction`: a request's predicted output;
- `recycle`: the target's own earlier predictions; `simulate`: trace replay without a model.

Nothing here imports torch.
"""
