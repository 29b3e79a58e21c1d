"""Quality gates: task scores per mode with confidence intervals, and a structured-output constraint.

Contract: `quality_gate(workload, runs, decode)` scores every checked request's output (HumanEval
unit tests in a subprocess with a timeout, `humaneval_passes`; or the last number of the text against
a known answer, `numeric_correct`), pooled over repeats and concurrencies, per mode, with 95% Wilson
intervals (`wilson_interval`) and the difference speculative - plain with a 95% interval; None when the
workload has no checks. `CharsetConstraint` is a transformers `LogitsProcessor` that only lets tokens
made of a given character set (and EOS) through; it imports torch when built.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
import tempfile
from typing import Any, Callable

from .runs import Run
from .workloads import Workload

__all__ = ["wilson_interval", "humaneval_passes", "numeric_correct", "quality_gate", "CharsetConstraint"]

def wilson_interval(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a proportion k/n."""
    if n == 0:
        return (0.0, 1.0)
    p = k / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return (max(0.0, mid - half), min(1.0, mid + half))


def humaneval_passes(check: dict, completion: str, timeout: float = 10.0) -> bool:
    """Run the problem's unit tests on prompt + completion in a subprocess with a timeout."""
    for stop in ("\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#", "\n```"):
        cut = completion.find(stop)
        if cut >= 0:
            completion = completion[:cut]
    program = f"{check['prompt']}{completion}\n\n{check['test']}\n\ncheck({check['entry_point']})\n"
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "candidate.py")
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(program)
        try:
            proc = subprocess.run([sys.executable, "-I", path], cwd=tmp, timeout=timeout,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return False
    return proc.returncode == 0


_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def numeric_correct(check: dict, text: str) -> bool:
    numbers = _NUMBER.findall(text)
    if not numbers:
        return False
    try:
        return abs(float(numbers[-1].replace(",", "")) - float(check["answer"])) < 1e-6
    except ValueError:
        return False


def quality_gate(workload: Workload, runs: list[Run], decode: Callable[[list[int]], str]) -> dict[str, Any] | None:
    """Task quality per mode (pooled over repeats, at every concurrency) with 95% Wilson intervals, and
    the difference speculative - plain with a 95% normal-approximation interval."""
    if not workload.checkable:
        return None
    per_mode: dict[str, list[bool]] = {}
    for run in runs:
        for q, out in enumerate(run.outputs):
            check = workload.requests[q].check
            if not check or run.requests[q].get("finish_reason") == "error":
                continue
            text = decode(out)
            ok = humaneval_passes(check, text) if check["kind"] == "humaneval" else numeric_correct(check, text)
            per_mode.setdefault(run.mode, []).append(ok)
    out: dict[str, Any] = {"metric": "pass@1 (unit tests)" if workload.requests[0].check["kind"] == "humaneval"
                           else "exact numeric answer"}
    for mode, oks in per_mode.items():
        k, n = sum(oks), len(oks)
        out[mode] = {"correct": k, "total": n, "rate": k / n if n else 0.0, "ci95": list(wilson_interval(k, n))}
    if "plain" in out and "speculative" in out:
        p1, n1 = out["plain"]["rate"], out["plain"]["total"]
        p2, n2 = out["speculative"]["rate"], out["speculative"]["total"]
        diff = p2 - p1
        half = 1.96 * math.sqrt(max(p1 * (1 - p1), 0.25 / n1) / n1 + max(p2 * (1 - p2), 0.25 / n2) / n2)
        out["difference"] = diff
        out["difference_ci95"] = [diff - half, diff + half]
        out["within_noise"] = diff - half <= 0.0 <= diff + half
    return out


class CharsetConstraint:
    """A structured-output constraint as a transformers `LogitsProcessor`: only tokens whose bytes
    are all in `charset` (and the end-of-sequence token) may be produced."""

    def __init__(self, tokenizer, vocab_size: int, charset: str = "0123456789 ,[]\n", eos_token_id=None):
        import torch

        self.charset = charset
        allowed = set(charset.encode())
        mask = torch.zeros(vocab_size, dtype=torch.bool)
        for t in range(min(vocab_size, tokenizer.vocab_size)):
            try:
                data = tokenizer.token_bytes(t)
            except (IndexError, KeyError, ValueError):
                continue
            if data and all(b in allowed for b in data):
                mask[t] = True
        if eos_token_id is not None:
            mask[int(eos_token_id)] = True
        self.allowed = mask  # [vocab]

    def __call__(self, input_ids, scores):
        return scores.masked_fill(~self.allowed[: scores.shape[-1]].to(scores.device), float("-inf"))

    def valid(self, tokens: list[int]) -> bool:
        return all(0 <= t < len(self.allowed) and bool(self.allowed[t]) for t in tokens)
