"""The CPU threads of the model's forward passes: how many, chosen from the cores other work leaves.

Why it matters: a forward pass on CPU is hundreds of small parallel regions, each ending at a barrier
that waits for the pool's slowest thread. When another process keeps a core busy, one of our threads
is often descheduled and every region waits a scheduler time slice for it: on a 2-core host torch's
default (one thread per core) decoded 0.35x as fast as one thread with two competing processes, and
about 35x slower at a load of 3 to 6 (issue 44; `bench/bench_threads.py` measures it). One thread
per core left free avoids the barrier stalls; on an idle host it is every core.

Contract
--------
- `ThreadPlan.start(requested, env=os.environ)` runs before torch is imported: it leaves OpenMP's
  wait policy as the user set it, else sets ``OMP_WAIT_POLICY=PASSIVE`` when the count is chosen
  here (idle pool threads sleep instead of spinning on a core another thread needs; libgomp reads the
  variable once, when torch loads it) and starts measuring the CPU time other processes take on this
  process's cores. `finish()` (after the model has loaded: the load is the measuring window, topped
  up by a sleep to `MIN_WINDOW_S`) chooses, calls `torch.set_num_threads` and returns a
  `ThreadChoice`, whose `describe()` is the start-up log line.
- `choose(requested, cores, others_busy, env)` is the pure rule: ``--threads N`` wins, then
  ``OMP_NUM_THREADS``; otherwise the cores this process may use (affinity and a cgroup CPU quota)
  less the cores other processes kept busy, rounded, at least 1.
- The choice is made once, at start-up: torch takes a thread's count when the thread first runs a
  parallel op, so a later change in load is not followed (``--threads`` pins it).
- torch's inter-op pool is left alone: it starts only for `torch.jit.fork`-style work, which no model
  path here uses.
"""

from __future__ import annotations

import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ThreadChoice", "ThreadPlan", "choose", "usable_cores"]

MIN_WINDOW_S = 0.3  # shortest window over which other processes' CPU time is measured
WAIT_POLICY = "PASSIVE"


@dataclass(frozen=True)
class ThreadChoice:
    threads: int
    reason: str  # why this count, for the log
    wait_policy: str  # OMP_WAIT_POLICY as the process runs with it ("" when unset: libgomp's default)
    cores: int  # cores this process may use
    others_busy: float | None  # cores other processes kept busy during the window (None: not measured)

    def describe(self) -> str:
        policy = self.wait_policy or "unset (libgomp's default)"
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
    except (OSError, ValueError, IndexError):
        pass
    try:
        quota = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").read_text())
        period = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us").read_text())
        return quota / period if quota > 0 and period > 0 else None
    except (OSError, ValueError):
        return None


def choose(requested: int | None, cores: int, others_busy: float | None, env=os.environ) -> tuple[int, str]:
    """(threads, reason): `requested` (``--threads``), else ``OMP_NUM_THREADS``, else one thread per
    core not kept busy by other processes (`others_busy` cores of `cores`; None: not measured)."""
    if requested is not None:
        return requested, "--threads"
    omp = env.get("OMP_NUM_THREADS", "").strip()
    if omp.isdigit() and int(omp) >= 1:
        return int(omp), "OMP_NUM_THREADS"
    if others_busy is None:
        return cores, f"{cores} usable cores; the load of other processes could not be read"
    free = cores - others_busy
    threads = max(1, min(cores, math.floor(free + 0.5)))
    return threads, (f"{cores} usable cores, other processes kept {others_busy:.1f} busy at start-up: "
                     f"one thread per free core")


class _CpuTimes:
    """Busy and total CPU time on `cpus` (from /proc/stat, in seconds) and this process's CPU time."""

    def __init__(self, cpus):
        self.cpus = {f"cpu{c}" for c in cpus}
        self.tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

    def read(self) -> tuple[float, float] | None:
        """(busy seconds of all processes on the cpus, this process's CPU seconds); None off Linux."""
        try:
            lines = Path("/proc/stat").read_text().splitlines()
        except OSError:
            return None
        busy = 0
        for line in lines:
            name, _, rest = line.partition(" ")
            if name in self.cpus:
                # user nice system idle iowait irq softirq steal ...: steal is time the host gave away
                f = [int(x) for x in rest.split()]
                busy += f[0] + f[1] + f[2] + f[5] + f[6] + (f[7] if len(f) > 7 else 0)
        t = os.times()
        return busy / self.tick, t.user + t.system


class ThreadPlan:
    """Started before torch is imported, finished once the model has loaded (see the module doc)."""

    def __init__(self, requested: int | None, env=None):
        self.requested = requested
        self.env = os.environ if env is None else env
        self.cores = usable_cores()
        try:
            cpus = sorted(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            cpus = list(range(self.cores))
        self._times = _CpuTimes(cpus)
        self._t0 = time.monotonic()
        self._start = self._times.read()
        self.torch_loaded = "torch" in sys.modules
        automatic = requested is None and not self.env.get("OMP_NUM_THREADS", "").strip()
        if automatic and not self.env.get("OMP_WAIT_POLICY") and not self.torch_loaded:
            self.env["OMP_WAIT_POLICY"] = WAIT_POLICY

    @classmethod
    def start(cls, requested: int | None, env=None) -> "ThreadPlan":
        return cls(requested, env)

    def others_busy(self) -> float | None:
        """Cores that other processes kept busy since `start` (waits until `MIN_WINDOW_S` has passed)."""
        if self._start is None:
            return None
        left = MIN_WINDOW_S - (time.monotonic() - self._t0)
        if left > 0:
            time.sleep(left)
        end = self._times.read()
        window = time.monotonic() - self._t0
        if end is None or window <= 0:
            return None
        others = (end[0] - self._start[0]) - (end[1] - self._start[1])
        return min(float(self.cores), max(0.0, others / window))

    def finish(self) -> ThreadChoice:
        """Choose (measuring only when the count is not given), set torch's count, return the choice."""
        import torch

        measured = None
        if self.requested is None and not self.env.get("OMP_NUM_THREADS", "").strip().isdigit():
            measured = self.others_busy()
        threads, reason = choose(self.requested, self.cores, measured, self.env)
        torch.set_num_threads(threads)
        policy = self.env.get("OMP_WAIT_POLICY", "")
        if self.torch_loaded and self.requested is None:
            reason += "; torch was loaded before the wait policy could be set"
        return ThreadChoice(threads, reason, policy, self.cores, measured)
