"""Requests for the vLLM adapter tests: a fake request (prompt, the fixed greedy answer its "model"
gives, steps of prefill left), code-edit-like requests whose answers copy spans of their prompts,
and the brute-force best path of a draft tree that a step of constant cost drafts."""

import numpy as np

VOCAB = 1000


class Request:
    def __init__(self, rid, prompt, answer, prefill_steps=1):
        self.rid, self.prompt, self.answer = rid, list(prompt), list(answer)
        self.prefill_left = prefill_steps  # steps of (chunked) prefill; the last one samples a token
        self.generated = 0
        self.draft = []

    @property
    def content(self):
        return self.prompt + self.answer[: self.generated]

    @property
    def done(self):
        return self.generated >= len(self.answer)


def copy_requests(count, seed, prompt_len=60, answer_len=40, vocab=VOCAB):
    """Code-edit-like requests: the answer copies spans of the prompt with small edits."""
    rng = np.random.default_rng(seed)
    out = []
    for rid in range(count):
        prompt = rng.integers(1, vocab, prompt_len).tolist()
        answer = []
        while len(answer) < answer_len:
            a = int(rng.integers(0, prompt_len - 10))
            answer += prompt[a : a + int(rng.integers(4, 12))] + rng.integers(1, vocab, int(rng.integers(0, 3))).tolist()
        out.append(Request(rid, prompt, answer[:answer_len], prefill_steps=int(rng.integers(1, 4))))
    return out


def brute_best_path(tree, limit, vocab=VOCAB):
    """The root path of at most `limit` nodes whose scores have the largest sum, by enumeration (what
    a step of constant cost drafts); ties go to the shorter path, then the lowest node index; a
    path stops before a token outside the vocabulary."""
    best, best_len, best_tokens = 0.0, 0, []
    for node in range(len(tree)):
        path = tree.path_to(node).tolist()
        if len(path) > limit or any(not 0 <= int(tree.tokens[i]) < vocab for i in path):
            continue
        s = 0.0
        for i in path:
            s += float(tree.scores[i])
        if s > best or (s == best and len(path) < best_len):
            best, best_len, best_tokens = s, len(path), [int(tree.tokens[i]) for i in path]
    return best_tokens
