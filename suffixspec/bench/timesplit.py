"""Where a run's time goes: prefill, drafting, verification and the rest.

Contract: a `StepSplit` watches the steps of one engine (`before(engine)` ahead of `engine.step()`,
`after(engine, step, mark)` once it returned). A step that read prompts (the engine's
`stats.prefill_steps` or `stats.prefill_chunks` advanced: an admission, whose first round is the
newcomers' prefill) counts whole as `prefill_s`; in the other steps the engine's own timers split the
step: `draft_s` (proposer and automatic budget: `proposer_s` + `budget_s`), `verify_s` (forward passes,
acceptance, cache commits: `verifier_s`), and `rest_s`, the step's time that no timer claims
(sampling, settling, bookkeeping). `busy_s` is the time inside steps (their sum), so the four parts
add up to it. An engine without `stats` during the run (an HTTP endpoint) has no step split: `result()`
then takes the server's per-request figures (`HTTPEngine.time_split()`, approximate: prefill is the
server's time to first token less its queueing), or None.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["StepSplit", "SPLIT_KEYS", "split_shares"]

SPLIT_KEYS = ("prefill_s", "draft_s", "verify_s", "rest_s")


@dataclass
class _Mark:
    prefill_steps: int
    prefill_chunks: int
    draft: float
    verify: float


class StepSplit:
    def __init__(self):
        self.prefill_s = self.draft_s = self.verify_s = self.busy_s = 0.0
        self.steps = 0

    @staticmethod
    def before(engine) -> _Mark | None:
        stats = getattr(engine, "stats", None)
        if stats is None or not hasattr(stats, "prefill_steps"):
            return None
        return _Mark(stats.prefill_steps, stats.prefill_chunks, stats.proposer_s + stats.budget_s, stats.verifier_s)

    def after(self, engine, step, mark: _Mark | None) -> None:
        if mark is None:
            return
        stats = engine.stats
        took = max(0.0, step.end_s - step.start_s)
        self.busy_s += took
        self.steps += 1
        if stats.prefill_steps != mark.prefill_steps or stats.prefill_chunks != mark.prefill_chunks:
            self.prefill_s += took
            return
        self.draft_s += stats.proposer_s + stats.budget_s - mark.draft
        self.verify_s += stats.verifier_s - mark.verify

    def result(self, engine=None) -> dict | None:
        """The split in seconds (`SPLIT_KEYS` and `busy_s`), or None where nothing was measured."""
        if not self.steps:
            remote = getattr(engine, "time_split", None)
            return remote() if callable(remote) else None
        rest = max(0.0, self.busy_s - self.prefill_s - self.draft_s - self.verify_s)
        return {"prefill_s": self.prefill_s, "draft_s": self.draft_s, "verify_s": self.verify_s, "rest_s": rest,
                "busy_s": self.busy_s, "source": "engine steps"}


def split_shares(splits: list[dict | None]) -> dict | None:
    """The mean split of runs (seconds) and each part's share of their sum; None without any."""
    have = [s for s in splits if s]
    if not have:
        return None
    mean = {k: sum(s[k] for s in have) / len(have) for k in SPLIT_KEYS}
    total = sum(mean.values())
    return {**mean, "busy_s": sum(s.get("busy_s", 0.0) for s in have) / len(have), "source": have[0].get("source"),
            "share": {k[:-2]: (v / total if total > 0 else 0.0) for k, v in mean.items()}}
