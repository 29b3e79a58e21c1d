"""The editor workload against a real `suffixspec serve` with a tiny FIM model (one slot): a request the
editor cancels frees its row, so the next keystroke's request is answered; whole editor sessions run
through `--url` with fill-in-the-middle requests, mid-line ones cancelled when superseded."""

import json

import httpx
import pytest

from suffixspec.bench import BenchSettings
from suffixspec.bench.editor import RepoFile, editor_sessions
from suffixspec.bench.editor_run import EditorTiming, run_editor
from suffixspec.bench.editor_summary import summarize_editor
from suffixspec.bench.remote import HTTPBackend, default_modes, list_models

from support.http import ServerProcess, make_tiny_model_dir

SOURCE = "\n\n".join(
    f"def value_count{i}(value, count=None):\n    total = len(value)\n    for i in range({i + 3}):\n"
    f"        total += value[i] * 2 + count\n    if total > {10 * i} and count is not None:\n"
    f"        return total - count\n    return total\n" for i in range(3))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("editor_http")
    model_dir = make_tiny_model_dir(root / "model", fim=True)
    proc = ServerProcess(["--model", str(model_dir), "--max-batch", "1"], root / "server.log")
    yield proc
    proc.stop()


def _run(engine, until):
    """Step `engine` until `until(events so far)`; returns the events."""
    seen = []
    for _ in range(100_000):
        seen.extend(engine.step().events)
        if until(seen):
            return seen
    raise AssertionError(f"no end: {seen}")


def test_a_cancelled_request_frees_its_row_for_the_next_keystroke(server):
    backend = HTTPBackend(server.url, body=default_modes("auto")["speculative"], model=list_models(server.url)[0],
                          timeout=60)
    engine = backend.serve(max_batch=2, max_new_tokens=400, do_sample=False, temperature=1.0, top_k=None,
                           top_p=None, seed=0)
    fim = {"suffix": "\n    return total\n", "ignore_eos": True}
    first = engine.add("def value_count(value, count=None):\n", max_new_tokens=400, extra=fim)
    got = _run(engine, lambda ev: any(e.index == first for e in ev))  # its first chunk: it holds the only slot
    assert not any(e.finish_reason for e in got), (got, engine._streams[first].error)
    assert engine.cancel(first)
    nxt = engine.add("def value_count(value, count=None):\n    total", max_new_tokens=6,
                     extra={"suffix": "\n    return total\n", "stop": ["\ndef "]})
    events = _run(engine, lambda ev: {e.index for e in ev if e.finish_reason} >= {first, nxt})
    ends = {e.index: e.finish_reason for e in events if e.finish_reason}
    assert ends[first] == "cancelled"
    assert ends[nxt] in ("length", "stop", "eos"), server.log()
    result = engine.result()
    assert result.stats.requests[nxt].new_tokens > 0 and result.stats.requests[first].new_tokens < 400
    assert not engine.cancel(nxt)  # finished: nothing to cancel
    engine.close()
    metrics = httpx.get(server.url + "/metrics", timeout=10).text
    values = {line.split()[0]: float(line.split()[-1]) for line in metrics.splitlines()
              if line.startswith(("suffixspec_running_requests", "suffixspec_requests_finished_total"))}
    assert values["suffixspec_running_requests"] == 0.0, values
    assert values['suffixspec_requests_finished_total{reason="cancelled"}'] >= 1.0, values


def test_editor_sessions_through_the_endpoint(server):
    sessions = editor_sessions([RepoFile("m.py", SOURCE, {"repo": "tiny"})], sessions=2, max_keystrokes=4,
                               mid_line=1.0, seed=0)
    model = list_models(server.url)[0]
    backends = {m: HTTPBackend(server.url, body=b, model=model, timeout=60) for m, b in default_modes("auto").items()}
    settings = BenchSettings(concurrency=[1], max_new_tokens=12, modes=("plain", "speculative"))
    seen = []

    def submit(engine, ks, key):
        seen.append(ks)
        return engine.add(ks.prefix, max_new_tokens=12, key=key,
                          extra={"suffix": ks.suffix, "stop": list(ks.stop)})

    # a mid-line request is superseded the moment it is sent: the editor cancels every one
    runs = run_editor(sessions, backends, settings, submit, decode=str, timing=EditorTiming(type_on_s=0.0))
    strokes = sum(len(s.keystrokes) for s in sessions)
    assert len(seen) == 2 * strokes
    for run in runs:
        assert not run.errors, run.errors
        assert all(r.e2e_s is not None for r in run.sent if r.keystroke.waits)
        assert all(r.e2e_s is None or r.cancelled_s is None for r in run.sent)
        assert any(r.cancelled_s is not None for r in run.sent if not r.keystroke.waits)
    records = {r["mode"]: r for r in summarize_editor(runs, settings)}
    assert records["speculative"]["mismatches"] == 0, json.dumps(records["speculative"]["mismatched_requests"])
    assert records["plain"]["latency_ms_p50"] > 0 and records["speculative"]["time_split"] is not None


def test_the_bench_command_runs_the_editor_workload_against_the_endpoint(server, tmp_path):
    import subprocess
    import sys

    from support.http import ROOT

    files = tmp_path / "repo.jsonl"
    files.write_text(json.dumps({"id": "m.py", "text": SOURCE, "tags": {"repo": "tiny"}}) + "\n")
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "suffixspec.cli", "bench", "--workload", "editor", "--url", server.url,
                           "--editor-files", str(files), "--num-prompts", "1", "--keystrokes", "2",
                           "--concurrency", "1", "--max-new-tokens", "8", "--out", str(out)],
                          capture_output=True, text=True, cwd=str(ROOT), timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "fill-in-the-middle" in proc.stdout and "lat/plain" in proc.stdout
    report = json.loads((out / "report.json").read_text())
    assert [r["mode"] for r in report["records"]] == ["plain", "speculative"]
    sent = report["runs"][0]["requests"]
    assert len(sent) >= 2 and all(r["finish_reason"] in ("length", "stop", "eos", "cancelled") for r in sent)
    last = json.loads(proc.stdout.strip().splitlines()[-1])
    assert last["workload"] == "editor" and last["records"][1]["latency_ratio_p50"] > 0
