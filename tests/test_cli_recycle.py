"""The recycled-prediction source on the command line: `--recycle/--no-recycle` on `generate`,
`bench` and `serve` (a bad value exits 2 naming the flag), and `serve --recycle-table FILE`: written
at shutdown, read back by the next server (which then drafts from it), a damaged file refused
with one line and exit status 2."""

import subprocess
import sys

import httpx
import numpy as np
import pytest

from suffixspec.draft.recycle import RecycleTable

from support.http import ROOT, ServerProcess, make_tiny_model_dir


def cli(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "suffixspec.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=str(ROOT))


@pytest.mark.parametrize("command", ["generate", "bench", "serve"])
def test_bad_recycle_values_exit_2_naming_the_flag(command):
    extra = ["--prompt", "x"] if command == "generate" else []
    r = cli(command, *extra, "--recycle=yes")
    assert r.returncode == 2 and "--recycle" in r.stderr and "Traceback" not in r.stderr


def test_generate_with_recycle_prints_the_same_text(tmp_path):
    model_dir = make_tiny_model_dir(tmp_path / "tiny")
    args = ["generate", "--model", str(model_dir), "--prompt", "def f(x):\n    return x\n", "--max-new-tokens", "12",
            "--threads", "1"]
    plain = cli(*args, "--budget", "0", timeout=300)
    on = cli(*args, "--recycle", "--budget", "8", timeout=300)
    assert plain.returncode == 0 and on.returncode == 0, on.stderr
    assert on.stdout == plain.stdout


def test_serve_keeps_its_table_across_restarts(tmp_path):
    model_dir = make_tiny_model_dir(tmp_path / "tiny")
    table_path = tmp_path / "state" / "recycle.tab"
    table_path.parent.mkdir()
    args = ["--model", str(model_dir), "--recycle", "--recycle-table", str(table_path), "--threads", "1"]
    body = {"model": "tiny", "prompt": "class A:\n    def f(self):\n", "max_tokens": 16, "temperature": 0}
    first = ServerProcess(args, tmp_path / "first.log")
    try:
        r = httpx.post(first.url + "/v1/completions", json=body, timeout=120)
        assert r.status_code == 200
        text = r.json()["choices"][0]["text"]
    finally:
        assert first.stop() == 0, first.log()
    assert "none yet, starting empty" in first.log() and "recycle table written" in first.log()
    saved = RecycleTable.load(table_path)
    assert (saved.table[:, 0] >= 0).sum() > 0 and saved.trials.sum() > 0
    second = ServerProcess(args, tmp_path / "second.log")
    try:
        r = httpx.post(second.url + "/v1/completions", json=body, timeout=120)
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == text
    finally:
        assert second.stop() == 0, second.log()
    assert "tokens and" in second.log() and "pairs seen" in second.log()
    grown = RecycleTable.load(table_path)
    assert grown.trials.sum() > saved.trials.sum()
    # a damaged table: refused with one line naming the flag, exit 2, the file left as it was
    data = bytearray(table_path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    table_path.write_bytes(bytes(data))
    bad = ServerProcess(args, tmp_path / "bad.log", wait=False)
    code = bad.proc.wait(300)
    bad.stop()
    assert code == 2
    lines = [ln for ln in bad.log().splitlines() if "error: --recycle-table" in ln]
    assert len(lines) == 1 and "not a valid suffixspec recycle table" in lines[0], bad.log()
    assert table_path.read_bytes() == bytes(data)
    assert np.array_equal(RecycleTable.from_bytes(saved.to_bytes()).table, saved.table)
