"""Predicted outputs: text the caller expects the answer to contain, as a request's first draft source.

A code editor that asks for an edit of a file sends the file as the prediction: most of the answer
copies it. `Prediction` follows the output along the predicted tokens (a cursor that advances while
the output agrees, and re-anchors on the output's last tokens after a divergence, as an edit skips
or inserts text) and drafts the predicted tokens that come next as one path, scored by how this
request's prediction has fared so far. `with_path` merges that path into the proposer's tree.
Drafts never change what is committed: verification decides, so a wrong prediction costs speed only.

`prediction_counts(prediction, output)` counts as OpenAI's usage does: accepted prediction tokens are
those that appear in the completion (matched in order, as a diff of the two token sequences would
keep them), rejected ones the rest of the prediction; how the drafts fared does not enter.
"""

from __future__ import annotations

import numpy as np

from .tree import DraftTree

__all__ = ["Prediction", "with_path", "prediction_counts"]

ANCHORS = (16, 12, 8)  # output tail lengths tried, longest first, to re-anchor after a divergence
# (shorter tails, in code, match in many places: a wrong anchor drafts a wrong path first)


class Prediction:
    """The predicted tokens of one request and where its output stands in them."""

    __slots__ = ("tokens", "cursor", "last", "drafted", "accepted")

    def __init__(self, tokens):
        self.tokens = np.asarray(tokens, np.int64)  # int64[m]
        self.cursor: int | None = 0  # index of the predicted token expected next; None: lost
        self.last = 0  # the cursor before it was lost: an edit moves forward through the prediction
        self.drafted = 0  # prediction tokens verified as drafts
        self.accepted = 0  # of which accepted

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    def rate(self) -> float:
        """Estimated acceptance of the next predicted token (a prior of 4 in 5 before any evidence)."""
        return (self.accepted + 4.0) / (self.drafted + 5.0)

    def draft(self, budget: int) -> tuple[list[int], np.ndarray]:
        """Up to `budget` predicted tokens that should come next, and their path scores."""
        if self.cursor is None or budget <= 0 or self.cursor >= len(self):
            return [], np.zeros(0)
        path = self.tokens[self.cursor : self.cursor + budget].tolist()
        scores = np.minimum(self.rate(), 0.995) ** np.arange(1, len(path) + 1)
        return path, scores

    def advance(self, output: list[int], committed: list[int], drafted: int, accepted: int) -> None:
        """The output grew by `committed`; `drafted`/`accepted`: prediction tokens verified this round."""
        self.drafted += drafted
        self.accepted += accepted
        if self.cursor is not None:
            end = self.cursor + len(committed)
            if end <= len(self) and self.tokens[self.cursor : end].tolist() == list(committed):
                self.cursor = self.last = end
                return
            self.last = self.cursor
        self.cursor = self._anchor(output)
        if self.cursor is not None:
            self.last = self.cursor

    def _anchor(self, output: list[int]) -> int | None:
        """Where the prediction continues the output's tail: after the first occurrence of its longest
        tail that the prediction holds at or after where the output last stood in it, else after the
        latest occurrence before (None when none of `ANCHORS` is found)."""
        m = len(self)
        for k in ANCHORS:
            if len(output) < k or m < k:
                continue
            tail = np.asarray(output[-k:], np.int64)
            windows = np.lib.stride_tricks.sliding_window_view(self.tokens, k)  # [m - k + 1, k]
            hits = np.flatnonzero((windows == tail).all(axis=1))
            if len(hits):
                ahead = hits[hits + k >= self.last]
                return int(ahead[0] if len(ahead) else hits[-1]) + k
        return None


def with_path(tree: DraftTree, path: list[int], path_scores: np.ndarray) -> DraftTree:
    """`tree` with the linear `path` below its root merged in: the path's nodes come first (node i
    at depth i + 1); a tree node that repeats a path node is merged into it, keeping the higher score."""
    if not path:
        return tree
    tokens = list(path)
    parents = list(range(-1, len(path) - 1))
    scores = [float(s) for s in path_scores]
    where = {(p, t): i for i, (p, t) in enumerate(zip(parents, tokens))}
    remap = []
    for tok, par, score in zip(tree.tokens.tolist(), tree.parents.tolist(), tree.scores.tolist()):
        key = (remap[par] if par >= 0 else -1, tok)
        node = where.get(key)
        if node is None:
            node = len(tokens)
            where[key] = node
            tokens.append(tok)
            parents.append(key[0])
            scores.append(score)
        else:
            scores[node] = max(scores[node], score)
        remap.append(node)
    for i in range(len(tokens) - 1, 0, -1):  # a path is accepted at least as often as any extension of it
        if parents[i] >= 0 and scores[parents[i]] < scores[i]:
            scores[parents[i]] = scores[i]
    return DraftTree(tokens, parents, scores)


def prediction_counts(prediction, output) -> tuple[int, int]:
    """(accepted, rejected): prediction tokens kept in `output` in order (the matching blocks of a
    diff; no junk heuristic, so repeated tokens count too), and the prediction's other tokens."""
    from difflib import SequenceMatcher

    predicted = [int(t) for t in prediction]
    matcher = SequenceMatcher(None, predicted, [int(t) for t in output], autojunk=False)
    accepted = sum(block.size for block in matcher.get_matching_blocks())
    return accepted, len(predicted) - accepted
