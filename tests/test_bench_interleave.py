"""The benchmark's interleaved runs: engines that take turns step by step on clocks that stop during
the other engines' turns give exactly the figures each engine gives alone, whatever the other costs."""

from __future__ import annotations

import subprocess
import sys

import pytest

from suffixspec import bench
from suffixspec.bench import BenchSettings, TurnClocks

from support.fakes import FakeEngine, fake_workload


class Wall:
    """A machine's clock that only moves when an engine's work advances it."""

    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


class ClockedEngine(FakeEngine):
    """`FakeEngine` whose steps cost their time on a shared `Wall`, read through the clock the
    benchmark gives it; it logs its steps to `log` and raises at step `fail_at`."""

    def __init__(self, wall, clock, log, name, fail_at=None, **kw):
        super().__init__(**kw)
        self.wall, self.read, self.log, self.name, self.fail_at = wall, clock, log, name, fail_at
        self.run = sum(1 for entry in log if entry == ("open",)) // 2  # engines open in pairs, one per mode
        log.append(("open",))
        self.clock = self.read()
        self.steps = 0

    def now(self):
        return self.read()

    def add(self, prompt, **kw):
        self.clock = self.read()  # FakeEngine keeps its times on its `clock` attribute
        return super().add(prompt, **kw)

    def step(self):
        if self.fail_at is not None and self.steps == self.fail_at:
            raise RuntimeError(f"{self.name} broke")
        start = self.clock = self.read()
        step = super().step()
        self.wall.t += self.clock - start
        self.steps += 1
        self.log.append((self.name, self.run, tuple(step.admitted)))
        return step


class ClockedBackend:
    def __init__(self, wall, log, name, budget_k=3, **engine_kw):
        self.wall, self.log, self.name, self.k, self.engine_kw = wall, log, name, budget_k, engine_kw

    def serve(self, *, max_batch, max_new_tokens, do_sample, temperature, top_k, top_p, seed, budget,
              logits_processor=None, clock=None):
        return ClockedEngine(self.wall, clock or self.wall, self.log, self.name, max_batch=max_batch,
                             max_new_tokens=max_new_tokens, budget=budget, base=0.010, per_row=0.002, k=self.k,
                             diverge=False, seed=seed, **self.engine_kw)


def test_turn_clocks_stop_during_the_other_lanes_turns():
    wall = Wall()
    clocks = TurnClocks(2, clock=wall)
    a, b = clocks.clock(0), clocks.clock(1)
    with clocks.turn(0):
        wall.t += 3.0
    assert (a(), b()) == (103.0, 100.0)
    with clocks.turn(1):
        wall.t += 0.5
        assert b() == 100.5  # inside its own turn a lane's clock runs
    assert (a(), b()) == (103.0, 100.5)
    wall.t += 1.0  # outside every turn: counts for both
    assert (a(), b()) == (104.0, 101.5)
    with pytest.raises(ValueError), clocks.turn(0):  # a turn that raises still stops the others' clocks
        wall.t += 2.0
        raise ValueError
    assert (a(), b()) == (106.0, 101.5)


def test_a_held_lane_clock_stands_still_between_turns_too():
    wall = Wall()
    clocks = TurnClocks(2, clock=wall)
    a, b = clocks.clock(0), clocks.clock(1)
    clocks.hold(1)
    for _ in range(3):
        with clocks.turn(0):
            wall.t += 2.0
        wall.t += 0.25  # between turns: counts for the lane that runs, not the one held
    assert (a(), b()) == (106.75, 100.0)
    clocks.hold(1)  # holding again changes nothing
    clocks.release(1)
    clocks.release(1)
    wall.t += 1.0
    assert (a(), b()) == (107.75, 101.0)
    with clocks.turn(1):
        wall.t += 0.5
    assert (a(), b()) == (107.75, 101.5)


def runs_of(interleave, fail=None, concurrency=(1, 2), repeat=2, n=4):
    wall, log = Wall(), []
    backends = {"plain": ClockedBackend(wall, log, "plain", fail_at=fail),
                "speculative": ClockedBackend(wall, log, "speculative")}
    settings = BenchSettings(concurrency=list(concurrency), max_new_tokens=6, budget=8, repeat=repeat,
                             interleave=interleave, warmup=False)
    runs = bench.run_benchmark(fake_workload(n, [6, 3, 5, 2][:n]), [[1, 2, 3]] * n, backends, settings,
                               progress=False, clock=wall)
    return runs, log


def figures(run):
    return (run.mode, run.concurrency, run.repeat, round(run.makespan_s, 9),
            [(q["id"], round(q["ttft_s"], 9), round(q["e2e_s"], 9), q["new_tokens"]) for q in run.requests])


def test_interleaved_runs_give_each_engine_its_own_figures():
    alone, alone_log = runs_of(interleave=False)
    together, log = runs_of(interleave=True)
    key = lambda r: (r.repeat, r.concurrency, r.mode)  # noqa: E731
    assert [figures(r) for r in sorted(together, key=key)] == [figures(r) for r in sorted(alone, key=key)]
    assert all(r.makespan_s > 0 and not r.errors for r in together)
    steps = [entry for entry in log if entry != ("open",)]
    steps_alone = [entry for entry in alone_log if entry != ("open",)]
    # the engines really take turns (plain first on even repeats); back to back, each run's steps
    # come in one block
    assert [name for name, *_ in steps[:2]] == ["plain", "speculative"]
    assert [name for name, *_ in steps_alone[:2]] == ["plain", "plain"]
    # the faster engine waits for the slower one to add each request, so both admit request q in
    # consecutive turns (speculation commits 3 tokens a round here: it is ahead after every request)
    position = {(name, run, q): k for k, (name, run, admitted) in enumerate(steps) for q in admitted}
    pairs = [(k, position[("speculative", run, q)]) for (name, run, q), k in position.items() if name == "plain"]
    assert len(pairs) == 2 * 2 * 4 and all(abs(a - b) == 1 for a, b in pairs), pairs
    assert {(r.mode, r.concurrency, r.repeat) for r in together} == {
        (m, c, k) for m in ("plain", "speculative") for c in (1, 2) for k in (0, 1)}


def test_a_failing_engine_fails_its_own_run_only():
    runs, log = runs_of(interleave=True, fail=2, concurrency=(2,), repeat=1)
    by = {r.mode: r for r in runs}
    assert by["plain"].errors == ["RuntimeError: plain broke"]
    assert not by["speculative"].errors
    assert sum(q["new_tokens"] for q in by["speculative"].requests) == 6 + 3 + 5 + 2
    names = [entry[0] for entry in log if entry != ("open",)]
    assert names.count("plain") == 2 and names.count("speculative") > 2


def test_backends_without_a_clock_run_back_to_back():
    from support.fakes import FakeBackend

    assert not bench.takes_clock(FakeBackend())
    assert bench.takes_clock(ClockedBackend(Wall(), [], "x"))
    assert bench.takes_clock(bench.SpeculativeBackend(None, None, lambda: None))
    assert bench.takes_clock(bench.PromptLookupBackend(None))


FAULTS = r"""
import resource, sys
import numpy as np
from suffixspec.bench import keep_freed_memory, reserve_memory
kept = keep_freed_memory() if sys.argv[1] != "plain" else None
if sys.argv[1] == "reserve":
    assert reserve_memory()  # 256 MiB of room faulted in on top of the heap
else:
    a = np.ones(1 << 25)  # 256 MiB, faulted in
    del a
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
b = np.ones(1 << 24 if sys.argv[1] == "reserve" else 1 << 25)
print(kept is not None, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux only")
def test_kept_memory_is_reused_without_faulting_fresh_pages():
    def faults(mode):
        out = subprocess.run([sys.executable, "-c", FAULTS, mode], capture_output=True, text=True, check=True)
        kept, n = out.stdout.split()
        return kept == "True", int(n)

    kept, with_keep = faults("keep")
    _, without = faults("plain")
    assert kept
    # glibc unmaps a freed 256 MiB block, so the next one's pages come back fresh: at least one fault
    # per 2 MiB (huge pages), up to one per 4 KiB
    assert without >= (1 << 28) // (2 << 20)
    assert with_keep <= 8  # kept: the second block reuses the first one's pages
    kept, after_reserve = faults("reserve")
    assert kept and after_reserve <= 8  # a 128 MiB block inside the reserved room: no fresh pages


@pytest.mark.parametrize("flags, runs_as", [([], "interleaved"), (["--sequential"], "back_to_back")])
def test_bench_cli_in_process_runs_the_modes_together_or_back_to_back(tmp_path, flags, runs_as):
    # `suffixspec bench` as a user runs it: its own process, a local model directory, a workload file
    import json

    pytest.importorskip("transformers")
    from support.http import make_tiny_model_dir

    model_dir = make_tiny_model_dir(tmp_path / "tiny", fim=False)
    prompts = [f"def g{i}(a, b):\n    return a * {i} + b\n\ndef g{i}(a, b):\n    return a" for i in range(3)]
    path = tmp_path / "w.jsonl"
    path.write_text("".join(json.dumps({"id": f"p{i}", "prompt": p}) + "\n" for i, p in enumerate(prompts)))
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "suffixspec.cli", "bench", "--model", str(model_dir), "--workload",
                           str(path), "--num-prompts", "3", "--concurrency", "1,2", "--max-new-tokens", "12",
                           "--budget", "8", "--threads", "1", "--no-prompt-lookup", "--out", str(out), *flags],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert report["settings"]["mode_runs"] == runs_as
    if sys.platform.startswith("linux"):
        assert report["environment"]["allocator"].startswith("glibc mallopt")
    by = {(r["mode"], r["concurrency"]): r for r in report["records"]}
    assert set(by) == {(m, c) for m in ("plain", "speculative") for c in (1, 2)}
    for rec in by.values():
        assert rec["mismatches"] == 0 and rec["failures"] == 0 and rec["new_tokens"] > 0, rec
        assert rec["throughput_tok_s"] > 0 and rec["ttft_ms"] > 0
    outputs = {(r["mode"], r["concurrency"]): r["outputs"] for r in report["runs"] if r["repeat"] == 0}
    assert len({json.dumps(o) for o in outputs.values()}) == 1  # greedy: every mode's texts are the same
    assert json.loads(done.stdout.strip().splitlines()[-1])["report"] == str(out / "report.json")
