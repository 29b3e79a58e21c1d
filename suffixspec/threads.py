"""The CPU threads of the model's forward passes: one per usable core, and idle OpenMP threads that
sleep instead of spinning.

Why (docs/architecture.md, "Threads"): a CPU forward pass is hundreds of small OpenMP regions
ending at barriers; with libgomp's default policy a waiting thread spins and, on a busy host, burns
the slice a descheduled partner needs. With ``OMP_WAIT_POLICY=PASSIVE`` it sleeps at once, so one
thread per core holds up under load and the load at start-up need not be guessed.

Contract
--------
- `ThreadPlan.start(requested, env=os.environ)` runs before torch is imported (libgomp reads its
  environment once, when torch loads it). Unless ``--threads`` or ``OMP_NUM_THREADS`` gives the
  count, it sets `WAIT_ENV` in the environment, each variable only where the user has not set it.
  `finish()` (once the model has loaded) calls `torch.set_num_threads` and returns a `ThreadChoice`,
  whose `describe()` is the start-up log line: the count, why, and the wait policy in force.
- `choose(requested, cores, env)`: ``--threads N`` wins, then ``OMP_NUM_THREADS``, then the cores this
  process may use (`usable_cores`: its affinity mask, capped by a cgroup CPU quota).
- A count given by ``--threads`` or ``OMP_NUM_THREADS`` leaves OpenMP's environment as it is: the
  user's setting is taken literally.
- torch's inter-op pool is left alone: it starts only for `torch.jit.fork`-style work, which no model
  path here uses. The proposer's numba kernels run on one thread (`ProposerConfig.threads`).
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["WAIT_ENV", "ThreadChoice", "ThreadPlan", "choose", "usable_cores"]

WAIT_ENV = {"OMP_WAIT_POLICY": "PASSIVE"}


@dataclass(frozen=True)
class ThreadChoice:
    threads: int
    reason: str  # why this count, for the log
    wait_policy: str  # OMP_WAIT_POLICY as the process runs with it ("" when unset: the runtime's default)
    cores: int  # cores this process may use

    def describe(self) -> str:
        policy = self.wait_policy or "unset (the runtime's default)"
        return f"torch threads: {self.threads} ({self.reason}); OpenMP wait policy {policy}"


def usable_cores() -> int:
    """Cores this process may run on: its affinity mask, capped by a cgroup CPU quota if one is set."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    quota = _cgroup_quota()
    return max(1, min(cores, math.ceil(quota)) if quota else cores)


def _cgroup_quota() -> float | None:
    """CPUs' worth of the cgroup's CPU quota (v2 ``cpu.max``, v1 ``cfs_quota_us``), None if unlimited."""
    try:
        text = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        if text and text[0] != "max":
            return int(text[0]) / int(text[1])
    except (OSError, ValueError, IndexError, ZeroDivisionError):
        pass
    try:
        quota = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").read_text())
        period = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us").read_text())
        return quota / period if quota > 0 and period > 0 else None
    except (OSError, ValueError):
        return None


def _omp_count(env) -> int | None:
    value = env.get("OMP_NUM_THREADS", "").strip()
    return int(value) if value.isdigit() and int(value) >= 1 else None


def choose(requested: int | None, cores: int, env=os.environ) -> tuple[int, str]:
    """(threads, reason): `requested` (``--threads``), else ``OMP_NUM_THREADS``, else `cores`."""
    if requested is not None:
        return requested, "--threads"
    omp = _omp_count(env)
    if omp is not None:
        return omp, "OMP_NUM_THREADS"
    return cores, f"one per usable core, {cores}; --threads N to change"


class ThreadPlan:
    """Started before torch is imported, finished once the model has loaded (see the module doc)."""

    def __init__(self, requested: int | None, env=None):
        self.requested = requested
        self.env = os.environ if env is None else env
        self.torch_loaded = "torch" in sys.modules
        self.automatic = requested is None and _omp_count(self.env) is None
        if self.automatic and not self.torch_loaded:
            for name, value in WAIT_ENV.items():
                self.env.setdefault(name, value)

    @classmethod
    def start(cls, requested: int | None, env=None) -> "ThreadPlan":
        return cls(requested, env)

    def finish(self) -> ThreadChoice:
        """Set torch's count and return the choice."""
        import torch

        cores = usable_cores()
        threads, reason = choose(self.requested, cores, self.env)
        torch.set_num_threads(threads)
        if self.automatic and self.torch_loaded:
            reason += "; torch was loaded before the wait policy could be set"
        return ThreadChoice(threads, reason, self.env.get("OMP_WAIT_POLICY", ""), cores)
