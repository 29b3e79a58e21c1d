"""Verification: one forward pass over every row's draft tree, and acceptance.

- `kv`: the batch's KV state and the pass layout; `accept`: greedy and stochastic acceptance;
- `support`: what a model must offer for tree verification;
- `treemask`: the tree's ancestor mask; `logprobs`: logprobs read off the accepting pass;
- `batch`: the round's rows as the policy and the verifier see them;
- `processors`, `structured`: logits processors and structured-output constraints.

Importing this package imports nothing; `kv`, `accept` and `treemask` import torch.
"""
