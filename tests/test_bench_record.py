"""`--record`: the line a benchmark appends to its results file (`suffixspec.bench.record`), and one
real script (`bench/replay_generate.py`, the quickest: no model) run with `--record` into a tmp path."""

import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

from suffixspec.bench import record

ROOT = Path(__file__).resolve().parents[1]


def test_record_line_fields():
    line = record.record_line("demo", {"x": 1.5}, argv=["bench/demo.py", "--quick"], where=ROOT)
    assert line["benchmark"] == "demo" and line["result"] == {"x": 1.5}
    assert line["command"] == ["bench/demo.py", "--quick"]
    date = datetime.datetime.fromisoformat(line["date"])
    assert date.utcoffset() == datetime.timedelta(0)
    host = line["host"]
    assert host["cpu"] and host["logical_cores"] == os.cpu_count() and host["python"]
    if "torch" in sys.modules:
        assert host["torch_threads"] == sys.modules["torch"].get_num_threads()
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode == 0:
        assert line["git_revision"] == head.stdout.strip() and isinstance(line["git_dirty"], bool)


def test_outside_a_checkout_no_revision(tmp_path):
    assert record.git_revision(tmp_path) == (None, None)
    assert record.record_line("demo", {}, where=tmp_path)["git_revision"] is None


def test_host_never_imports_torch():
    code = "import sys; from suffixspec.bench import record; h = record.host(); print('torch' in sys.modules, 'torch_threads' in h)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.stdout.split() == ["False", "False"]


def test_appending_twice_gives_two_lines(tmp_path):
    path = tmp_path / "sub" / "demo.jsonl"
    first = record.append_record(path, "demo", {"run": 1}, argv=["a"])
    record.append_record(path, "demo", {"run": 2}, argv=["b"])
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert [x["result"]["run"] for x in lines] == [1, 2]
    assert lines[0] == first and [x["command"] for x in lines] == [["a"], ["b"]]


def test_emit_prints_the_line_last_and_records_only_when_asked(tmp_path, capsys):
    class Args:
        record = None

    assert record.emit({"a": 1}, Args(), "demo", tmp_path) is None
    assert json.loads(capsys.readouterr().out.splitlines()[-1]) == {"a": 1}
    assert not list(tmp_path.iterdir())
    Args.record = ""  # the flag given without a path: <results_dir>/<benchmark>.jsonl
    record.emit({"a": 2}, Args(), "demo", tmp_path)
    assert json.loads((tmp_path / "demo.jsonl").read_text())["result"] == {"a": 2}


def test_a_script_run_with_record(tmp_path):
    """bench/replay_generate.py on two shipped copy edits, with a given cost curve (no model loaded)."""
    rows = (ROOT / "corpora" / "copy_edit_prompts.jsonl").read_text(encoding="utf-8").splitlines()[:2]
    data = tmp_path / "two.jsonl"
    data.write_text("\n".join(rows) + "\n", encoding="utf-8")
    out = tmp_path / "results" / "replay.jsonl"
    curve = json.dumps({1: 1.0, 2: 1.05, 4: 1.05, 8: 1.18, 16: 1.44, 32: 2.06, 64: 3.28, 128: 5.63})
    cmd = [sys.executable, str(ROOT / "bench" / "replay_generate.py"), str(data), "--max-new-tokens", "24",
           "--curve", curve, "--record", str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for _ in range(2):
        run = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
        assert run.returncode == 0, run.stderr[-2000:]
    printed = json.loads(run.stdout.strip().splitlines()[-1])
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(lines) == 2 and lines[-1]["result"] == printed
    assert lines[-1]["benchmark"] == "replay_generate" and lines[-1]["command"][-2:] == ["--record", str(out)]


def test_suffixspec_bench_record(tmp_path):
    """`suffixspec bench --record PATH` on a tiny local model: the JSON line it prints last, recorded."""
    import pytest

    pytest.importorskip("transformers")
    from support.http import make_tiny_model_dir

    model_dir = make_tiny_model_dir(tmp_path / "tiny", fim=False)
    workload = tmp_path / "w.jsonl"
    workload.write_text("".join(json.dumps({"id": f"p{i}", "prompt": f"def g{i}(a):\n    return a + {i}\n"}) + "\n"
                                for i in range(2)))
    path = tmp_path / "rec.jsonl"
    done = subprocess.run([sys.executable, "-m", "suffixspec.cli", "bench", "--model", str(model_dir), "--workload",
                           str(workload), "--num-prompts", "2", "--concurrency", "1", "--max-new-tokens", "6",
                           "--budget", "4", "--threads", "1", "--no-prompt-lookup", "--out", str(tmp_path / "out"),
                           "--record", str(path)], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    (line,) = [json.loads(x) for x in path.read_text().splitlines()]
    assert line["benchmark"] == "suffixspec_bench"
    assert line["result"] == json.loads(done.stdout.strip().splitlines()[-1])
    assert line["host"]["torch_threads"] == 1 and "--record" in line["command"]
