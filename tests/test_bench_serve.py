"""`suffixspec bench --url` against a real `suffixspec serve` process on a tiny random-weight model:
greedy texts equal across modes and equal in-process decoding, `usage.suffixspec` read."""

import json

import pytest

from support.http import ServerProcess, make_tiny_model_dir

KEY = "bench-key"
PROMPTS = [f"def g{i}(a, b):\n    return a * {i} + b\n\ndef g{i}(a, b):\n    return a" for i in range(2)]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from support import tiny_models  # noqa: F401  (one torch thread, as the server)

    root = tmp_path_factory.mktemp("bench_serve")
    model_dir = make_tiny_model_dir(root / "tiny", fim=False)
    server = ServerProcess(["--model", str(model_dir), "--api-key", KEY, "--max-batch", "4"], root / "server.log")
    yield server, model_dir
    assert server.stop() == 0, server.log()


def test_bench_url_against_suffixspec_serve(served, tmp_path, capsys):
    from suffixspec import SpeculativeGenerator, load_model
    from suffixspec.cli import main

    server, model_dir = served
    # the reference: greedy decoding here, on the same model directory (the server drops the EOS token)
    model, tokenizer = load_model(str(model_dir))
    gen = SpeculativeGenerator(model, tokenizer)
    raw = [gen.generate([p], max_new_tokens=16, budget=0).sequences[0] for p in PROMPTS]
    ref = [s[:-1] if s and s[-1] == tokenizer.eos_token_id else s for s in raw]

    path = tmp_path / "w.jsonl"
    path.write_text("".join(json.dumps({"id": f"p{i}", "prompt": p}) + "\n" for i, p in enumerate(PROMPTS)))
    out = tmp_path / "out"
    code = main(["bench", "--url", server.url, "--api-key", KEY, "--workload", str(path), "--num-prompts", "2",
                 "--concurrency", "1,2", "--max-new-tokens", "16", "--budget", "8", "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 0, printed + server.log()[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert report["settings"]["model"] == "tiny" and report["settings"]["token_counts"]["plain"]["chunks"] == 0
    assert report["timing"]["warmup_s"] > 0  # the warm-up, timed apart from the runs
    by = {(r["mode"], r["concurrency"]): r for r in report["records"]}
    assert set(by) == {("plain", 1), ("speculative", 1), ("plain", 2), ("speculative", 2)}
    for (mode, _), rec in by.items():
        assert rec["mismatches"] == 0 and rec["failures"] == 0, rec
        # usage.completion_tokens: EOS included, as the in-process engine counts it
        assert rec["new_tokens"] == sum(map(len, raw)), rec
        assert rec["mean_accepted_tokens"] >= 1.0 and rec["verifier_s"] > 0  # from usage.suffixspec
        assert (rec["drafted_per_round"] > 0) == (mode == "speculative")
    assert by[("plain", 1)]["mean_accepted_tokens"] == pytest.approx(1.0)
    # the texts are the server's greedy answers: the same as decoding here, in both modes
    expected = [tokenizer.decode(s) for s in ref]
    for run in report["runs"]:
        if run["repeat"] == 0:
            assert run["outputs"] == expected, (run["mode"], run["concurrency"])


def test_bench_grid_process_against_suffixspec_serve(served, tmp_path):
    """`suffixspec bench --grid --url` as its own process against the real server: exit 0, a table with
    the paired columns, one JSON line last, grid.json whose cells carry both paired ratios (equal to
    pairing the report's own per-request runs) and a PNG heat map."""
    import subprocess
    import sys

    from suffixspec.bench.grid import paired_ratios

    server, _ = served
    path = tmp_path / "w.jsonl"
    path.write_text("".join(json.dumps({"id": f"p{i}", "prompt": p}) + "\n" for i, p in enumerate(PROMPTS)))
    out = tmp_path / "grid"
    done = subprocess.run([sys.executable, "-m", "suffixspec.cli", "bench", "--url", server.url, "--api-key", KEY,
                           "--grid", "--grid-workloads", str(path), "--grid-concurrency", "1,2",
                           "--grid-max-new-tokens", "8", "--num-prompts", "2", "--repeat", "2", "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr + server.log()[-3000:]
    lines = done.stdout.strip().splitlines()
    assert any("TTFT paired" in line and "e2e paired" in line for line in lines), done.stdout
    last = json.loads(lines[-1])
    assert [(c["max_new_tokens"], c["concurrency"]) for c in last["cells"]] == [(8, 1), (8, 2)]
    report = json.loads((out / "grid.json").read_text())
    runs = report["benchmarks"][0]["runs"]
    for cell in report["cells"]:
        assert cell["failures"] == 0 and cell["mismatches"] == 0, cell
        for field, key in (("ttft_s", "ttft_ratio_paired"), ("e2e_s", "e2e_ratio_paired")):
            assert cell[key] > 0 and cell[key] == pytest.approx(paired_ratios(runs, field)[cell["concurrency"]])
    assert (out / "grid_speedup.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
