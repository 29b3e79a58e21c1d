"""A fake continuous-batching engine with known costs on a virtual clock, the backend that serves it,
and a workload of identical fake requests, for the bench tests."""

from suffixspec.bench import Request, Workload
from suffixspec.engine.stats import GenerationResult, GenerationStats, RequestStats


class FakeEngine:
    """A continuous-batching engine with known costs on a virtual clock: each step first admits waiting
    requests (FIFO) up to `max_batch`, then runs one round of every running request, costing
    `base + per_row * rows` seconds; a round commits 1 token per request under plain decoding
    (budget 0) and `k` (k - 1 accepted drafts of k - 1 drafted) under speculation; every output is
    `[7] * n` (`[8] * n` when `diverge` and speculating)."""

    def __init__(self, max_batch, max_new_tokens, budget, base, per_row, k, diverge, seed, on_round=None):
        self.max_batch, self.max_new, self.budget = max_batch, max_new_tokens, budget
        self.base, self.per_row, self.k, self.diverge, self.seed = base, per_row, k, diverge, seed
        self.on_round = on_round
        self.clock = 0.0
        self.waiting, self.running = [], []
        self.stats = GenerationStats(requests=[])
        self.outputs = []
        self.added = []

    def now(self):
        return self.clock

    @property
    def idle(self):
        return not self.waiting and not self.running

    def add(self, prompt, *, max_new_tokens=None, key=None):
        q = len(self.outputs)
        self.outputs.append([])
        self.added.append(self.clock)
        self.stats.requests.append(RequestStats(prompt_tokens=len(prompt)))
        self.waiting.append((q, min(self.max_new, max_new_tokens or self.max_new)))
        return q

    def step(self):
        from suffixspec.engine.engine import Event, Step

        step = Step(self.clock, 0.0)
        while self.waiting and len(self.running) < self.max_batch:
            self.running.append(self.waiting.pop(0))
            step.admitted.append(self.running[-1][0])
        if self.on_round is not None:
            self.on_round(self)
        self.clock += self.base + self.per_row * len(self.running)
        per_round = 1 if self.budget == 0 else self.k
        self.stats.rounds += 1
        self.stats.proposer_s += 0.001 * (self.budget != 0)
        token = 8 if (self.diverge and self.budget != 0) else 7
        still = []
        for q, limit in self.running:
            rs = self.stats.requests[q]
            n = min(per_round, limit - len(self.outputs[q]))
            self.outputs[q] = self.outputs[q] + [token] * n
            if not rs.rounds:
                rs.ttft_s = self.clock - self.added[q]
            rs.rounds += 1
            rs.new_tokens += n
            rs.drafted += 0 if self.budget == 0 else per_round - 1
            rs.accepted += n - 1
            for d in range(n - 1):
                if d == len(rs.accepted_by_position):
                    rs.accepted_by_position.append(0)
                rs.accepted_by_position[d] += 1
            rs.e2e_s = self.clock - self.added[q]
            done = len(self.outputs[q]) >= limit
            rs.finish_reason = "length" if done else ""
            step.events.append(Event(q, [token] * n, self.clock, rs.finish_reason))
            if not done:
                still.append((q, limit))
        self.running = still
        step.end_s = self.clock
        return step

    def close(self):
        self.waiting, self.running = [], []

    def result(self):
        self.stats.e2e_s = self.clock
        self.stats.peak_memory_bytes = 2**20
        return GenerationResult([list(o) for o in self.outputs], self.stats)


class FakeBackend:
    def __init__(self, base=0.010, per_row=0.002, k=3, diverge=False):
        self.base, self.per_row, self.k, self.diverge = base, per_row, k, diverge
        self.calls = []
        self.on_round = None

    def serve(self, *, max_batch, max_new_tokens, do_sample, temperature, top_k, top_p, seed, budget,
              logits_processor=None):
        self.calls.append((max_batch, max_new_tokens, budget, seed))
        return FakeEngine(max_batch, max_new_tokens, budget, self.base, self.per_row, self.k, self.diverge, seed,
                          self.on_round)


def fake_workload(n, limits=None):
    return Workload("fake", [Request(f"r{i}", prompt_ids=[1, 2, 3], max_new_tokens=(limits or [None] * n)[i])
                             for i in range(n)], "test")
