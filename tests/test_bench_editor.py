"""The editor workload: its session generator (deterministic; every keystroke splits the file where a
brute-force scan of the file says it should), completion matching, the context window, and its runs
on a fake engine with known costs (superseded requests cancelled, latencies exact, the time split)."""

import random

import pytest

from suffixspec.bench import BenchSettings
from suffixspec.bench.editor import (
    RepoFile,
    context,
    editor_sessions,
    first_line_matches,
    load_repo,
    matches,
    shipped_repo,
    stop_sequences,
)
from suffixspec.bench.editor_run import EditorTiming, editor_steps, run_editor
from suffixspec.bench.editor_summary import format_editor_table, summarize_editor
from suffixspec.engine.engine import Event, Step
from suffixspec.errors import BadInputError

from support.fakes import FakeBackend, FakeEngine

SOURCE = '''"""A module."""

import os


def first(a, b):
    x = a + b

    if x > 2:
        return os.sep.join([a, b])
    return x


class Box:
    def __init__(self, items):
        self.items = list(items)
        self.size = len(self.items)

    @property
    def total(self):
        return sum(self.items)


def short(a):
    return a
'''


def _functions_brute(text):
    """(name, first line, end line) of each outermost function, by scanning indentation (no ast)."""
    lines = text.splitlines(keepends=True)
    out = []
    k = 0
    while k < len(lines):
        stripped = lines[k].lstrip()
        if stripped.startswith(("def ", "@")):
            start = k
            while not lines[k].lstrip().startswith("def "):
                k += 1
            indent = len(lines[k]) - len(lines[k].lstrip())
            name = lines[k].lstrip()[4:].split("(")[0]
            end = k + 1
            while end < len(lines) and (not lines[end].strip() or len(lines[end]) - len(lines[end].lstrip()) > indent):
                end += 1
            while not lines[end - 1].strip():
                end -= 1
            out.append((name, start, end))
            k = end
        else:
            k += 1
    return out


def test_every_keystroke_splits_the_file_where_a_scan_says():
    files = [RepoFile("m.py", SOURCE, {"repo": "r"})] + load_repo(shipped_repo()[0])
    sessions = editor_sessions(files, max_keystrokes=1000, mid_line=0.5, seed=3, prefix_chars=None,
                               suffix_chars=None, min_lines=2)
    for f in files:
        lines = f.text.splitlines(keepends=True)
        offsets = [0]
        for line in lines:
            offsets.append(offsets[-1] + len(line))
        mine = [s for s in sessions if s.path == f.path]
        expected = [(n, a, b) for n, a, b in _functions_brute(f.text) if b - a >= 2]
        assert [s.function for s in mine] == [n for n, _, _ in expected]
        for s, (name, a, b) in zip(mine, expected):
            # end-of-line pauses: before the newline of every function line followed by a non-blank one
            want = [offsets[k] - 1 for k in range(a + 1, b) if lines[k].strip()]
            got = [len(ks.prefix) for ks in s.keystrokes if ks.waits]
            assert got == want
            for ks in s.keystrokes:
                assert ks.prefix + ks.expected + ks.suffix == f.text
                assert ks.suffix == "".join(lines[b:])
                assert offsets[a] < len(ks.prefix) < offsets[b]
                assert ks.tags == f.tags
                if ks.waits:
                    assert ks.expected.startswith("\n")
                else:  # inside a line, just after a word
                    assert f.text[len(ks.prefix) - 1] in " (.=[" and f.text[len(ks.prefix)] not in " \n"
            indent = lines[a][: len(lines[a]) - len(lines[a].lstrip())]
            assert s.keystrokes[0].stop == stop_sequences(indent)
    assert sum(not ks.waits for s in sessions for ks in s.keystrokes) > 10


def test_sessions_are_deterministic_and_bounded():
    files = load_repo(shipped_repo()[0])
    a = editor_sessions(files, sessions=3, seed=1)
    assert a == editor_sessions(files, sessions=3, seed=1)
    assert len(a) == 3 and all(sum(ks.waits for ks in s.keystrokes) <= 16 for s in a)
    mids = lambda ss: [(s.id, ks.index) for s in ss for ks in s.keystrokes if not ks.waits]  # noqa: E731
    assert mids(editor_sessions(files, seed=1)) != mids(editor_sessions(files, seed=2))
    for s in a:
        assert [ks.index for ks in s.keystrokes] == list(range(len(s.keystrokes)))
        assert all(ks.session == s.id for ks in s.keystrokes)


def test_context_window_cuts_at_lines():
    rnd = random.Random(0)
    text = "".join(f"line {i} " + "x" * rnd.randint(0, 30) + "\n" for i in range(200))
    for limit in (1, 50, 333, 5000):
        pre, suf = context(text, text, limit, limit)
        assert len(pre) <= limit and text.endswith(pre) and (pre == text or text[len(text) - len(pre) - 1] == "\n")
        assert len(suf) <= limit and text.startswith(suf) and (suf == text or suf.endswith("\n") or len(suf) == limit)
    assert context(text, text, None, None) == (text, text)


def test_matching():
    expected = "\n    if x > 2:\n        return y\n    return x\n"
    assert matches("\n    if x > 2:\n        return y", expected)
    assert matches("\n    if x > 2:\n  \n", "\n    if x > 2:\n  \n") and not matches("\n\n", expected)
    assert not matches("\n    if x > 3:", expected)
    assert first_line_matches("\n    if x > 2:\n        return z", expected)
    assert not first_line_matches("\n    if x > 2", expected)


def test_bad_repository_is_named(tmp_path):
    bad = tmp_path / "r.jsonl"
    bad.write_text('{"id": "a.py", "text": "def f(:\\n    pass\\n"}\n')
    with pytest.raises(BadInputError, match="a.py is not Python"):
        editor_sessions(load_repo(bad))
    bad.write_text("{nope\n")
    with pytest.raises(BadInputError, match="r.jsonl:1: not a JSON object"):
        load_repo(bad)


class CancellingEngine(FakeEngine):
    """The fake engine with `cancel` (the request leaves at the next step, its row freed) and
    per-request options as the real engine takes them."""

    options = None

    def add(self, prompt, *, max_new_tokens=None, key=None, **_):
        return super().add(prompt, max_new_tokens=max_new_tokens, key=key)

    def cancel(self, index):
        if any(q == index for q, _ in self.waiting + self.running):
            self.cancelled = getattr(self, "cancelled", set()) | {index}
            return True
        return False

    def step(self):
        gone = getattr(self, "cancelled", set())
        events = []
        for q in sorted(gone):
            self.stats.requests[q].finish_reason = "cancelled"
            events.append(Event(q, [], self.clock, "cancelled"))
        self.waiting = [r for r in self.waiting if r[0] not in gone]
        self.running = [r for r in self.running if r[0] not in gone]
        self.cancelled = set()
        if not self.waiting and not self.running:
            return Step(self.clock, self.clock, [], events)
        step = super().step()
        step.events[:0] = events
        return step


class CancellingBackend(FakeBackend):
    def serve(self, *, max_batch, max_new_tokens, do_sample, temperature, top_k, top_p, seed, budget,
              logits_processor=None):
        self.engines = getattr(self, "engines", []) + [CancellingEngine(max_batch, max_new_tokens, budget, self.base,
                                                                        self.per_row, self.k, False, seed)]
        return self.engines[-1]


def _submit(engine, ks, key):
    return engine.add([1] * 5, max_new_tokens=32, key=key)


def test_runs_cancel_superseded_requests_and_time_exactly():
    sessions = editor_sessions([RepoFile("m.py", SOURCE, {"repo": "r"})] + load_repo(shipped_repo()[0]),
                               sessions=3, max_keystrokes=6, mid_line=0.6, seed=0)
    mid = sum(not ks.waits for s in sessions for ks in s.keystrokes)
    assert mid > 0
    backend = CancellingBackend(base=0.010, per_row=0.002, k=3)
    settings = BenchSettings(concurrency=[1], max_new_tokens=64, modes=("plain", "speculative"))
    runs = run_editor(sessions, {"plain": backend, "speculative": backend}, settings, _submit,
                      decode=lambda ids: "x" * len(ids), timing=EditorTiming(type_on_s=0.3))
    by_mode = {r.mode: r for r in runs}
    plain, spec = by_mode["plain"], by_mode["speculative"]
    # one user: one row at a time; plain commits 1 token a round (32 rounds), speculation 3 (11 rounds)
    for run, rounds in ((plain, 32), (spec, 11)):
        waited = [r for r in run.sent if r.keystroke.waits]
        assert len(waited) == sum(ks.waits for s in sessions for ks in s.keystrokes)
        assert all(r.e2e_s == pytest.approx(rounds * 0.012) for r in waited)
        assert all(r.ttft_s == pytest.approx(0.012) for r in waited)
    # plain's mid-line requests outlive the next keystroke (0.384 s > 0.3 s): every one cancelled, its
    # row freed at once (the next request ran alone, above); speculation answers them in time
    plain_mid = [r for r in plain.sent if not r.keystroke.waits]
    assert len(plain_mid) == mid and all(r.cancelled_s == pytest.approx(0.3) and r.e2e_s is None for r in plain_mid)
    assert all(r.finish_reason == "cancelled" for r in plain_mid)
    assert all(r.e2e_s == pytest.approx(0.132) and r.cancelled_s is None for r in spec.sent if not r.keystroke.waits)
    assert all(not e.running and not e.waiting for e in backend.engines)
    records = summarize_editor(runs, settings)
    rec = {r["mode"]: r for r in records}
    assert rec["plain"]["latency_ms_p50"] == pytest.approx(384.0)
    assert rec["speculative"]["latency_ratio_p50"] == pytest.approx(11 / 32)
    assert rec["plain"]["cancelled"] == mid and rec["speculative"]["cancelled"] == 0
    assert rec["plain"]["mid_line_answered"] == 0.0 and rec["speculative"]["mid_line_answered"] == 1.0
    assert rec["speculative"]["mean_accepted_tokens"] == pytest.approx(32 / 11)
    assert rec["speculative"]["mismatches"] == 0 and rec["speculative"]["failures"] == 0
    split = rec["speculative"]["time_split"]
    assert split["busy_s"] == pytest.approx(sum(split[k] for k in ("prefill_s", "draft_s", "verify_s", "rest_s")))
    assert "lat/plain" in format_editor_table(records)


def test_users_share_the_engine_and_every_session_finishes():
    sessions = editor_sessions(load_repo(shipped_repo()[0]), sessions=4, max_keystrokes=3, mid_line=0.0)
    engine = CancellingBackend().serve(max_batch=2, max_new_tokens=16, do_sample=False, temperature=1.0, top_k=None,
                                       top_p=None, seed=0, budget=0)
    steps = editor_steps(engine, sessions, _submit, EditorTiming(), users=2)
    most = 0
    while True:
        try:
            next(steps)
            most = max(most, len(engine.running))
        except StopIteration as end:
            sent, makespan = end.value
            break
    assert most == 2 and len(sent) == 12 and all(r.e2e_s is not None for r in sent)
    assert [r.keystroke.index for r in sent if r.session == 0] == [0, 1, 2]
    assert makespan > 0


class PrefillCountingEngine(FakeEngine):
    """The fake engine counting its admission steps as prefill (as the real engine's `prefill_steps`),
    a third of every step charged to the verifier."""

    def step(self):
        admits = bool(self.waiting) and len(self.running) < self.max_batch
        before = self.clock
        step = super().step()
        if admits:
            self.stats.prefill_steps += 1
        self.stats.verifier_s += (self.clock - before) / 3
        return step


def test_the_time_split_of_a_run_adds_up_to_its_steps():
    from suffixspec.bench import format_table, run_benchmark, summarize
    from suffixspec.bench.schedule import serve_schedule
    from suffixspec.bench.timesplit import StepSplit

    from support.fakes import fake_workload

    class Backend(FakeBackend):
        def serve(self, *, max_batch, max_new_tokens, do_sample, temperature, top_k, top_p, seed, budget,
                  logits_processor=None):
            return PrefillCountingEngine(max_batch, max_new_tokens, budget, self.base, self.per_row, self.k, False, seed)

    engine = Backend().serve(max_batch=1, max_new_tokens=64, do_sample=False, temperature=1.0, top_k=None, top_p=None,
                             seed=0, budget=3)
    split = StepSplit()
    serve_schedule(engine, [[1, 2, 3]] * 2, 1, limits=[6, 6], split=split)
    got = split.result(engine)
    # one row: every step costs 12 ms; 2 requests x 2 rounds (3 tokens each), the first of each an admission
    assert got["busy_s"] == pytest.approx(0.048) and got["prefill_s"] == pytest.approx(0.024)
    assert got["verify_s"] == pytest.approx(0.008) and got["draft_s"] == pytest.approx(0.002)
    assert got["rest_s"] == pytest.approx(0.048 - 0.024 - 0.008 - 0.002)
    settings = BenchSettings(concurrency=[1], max_new_tokens=6, modes=("plain", "speculative"), warmup=False)
    runs = run_benchmark(fake_workload(2), [[1, 2, 3]] * 2, {"plain": Backend(), "speculative": Backend()}, settings,
                         progress=False)
    records = summarize(runs, settings)
    assert all(r.time_split is not None for r in runs)
    share = records[1]["time_split"]["share"]
    assert sum(share.values()) == pytest.approx(1.0) and share["prefill"] == pytest.approx(0.5)
    assert "split p/d/v/r %" in format_table(records) and "50/" in format_table(records)


@pytest.mark.parametrize("flags, message", [
    (["--keystrokes", "0"], "--keystrokes: expected > 0, got 0"),
    (["--request-filters"], "--request-filters applies to --url"),
    (["--prefix-cache-bytes", "-1"], "--prefix-cache-bytes: expected a number of bytes"),
    (["--no-prefix-cache", "--url", "http://127.0.0.1:9"], "--no-prefix-cache applies to a model loaded here"),
    (["--editor-files", "/nonexistent/repo.jsonl"], "is not a file"),
])
def test_bad_editor_flags_are_refused_by_name_before_the_model_loads(flags, message, capsys):
    from suffixspec import cli

    assert cli.main(["bench", "--workload", "editor", *flags]) == 2
    assert message in capsys.readouterr().err
