"""`bench/bench_corpus_drafting.py` end to end on a tiny data directory: its table and the JSON
line last, with every field the issue asks for, and figures consistent with each other."""

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def _load_bench(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "bench"))  # its sibling modules, as `python bench/x.py` finds them
    spec = importlib.util.spec_from_file_location("bench_corpus_drafting", ROOT / "bench" / "bench_corpus_drafting.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_bench_runs_on_a_tiny_set_and_prints_json_last(tmp_path, capsys, monkeypatch):
    rng = np.random.default_rng(0)
    block = rng.integers(5, 400, 300).tolist()
    old = tmp_path / "old.py"
    old.write_text("def f(x):\n    return x + 1\n" * 20, encoding="utf-8")
    (tmp_path / "make_corpus_completion_traces.py").write_text(
        f"from pathlib import Path\ndef corpus_files(name):\n    return [Path({str(old)!r})]\n", encoding="utf-8")
    with open(tmp_path / "corpus_completion_dev.jsonl", "w") as f:
        for k in range(3):
            f.write(json.dumps({"id": k, "prompt_ids": block[: 100 + k], "output_ids": block[100 + k : 140 + k]}) + "\n")
    with open(tmp_path / "chat_traces_smollm2.jsonl", "w") as f:
        f.write(json.dumps({"prompt_ids": block[:50], "output_ids": block[20:40]}) + "\n")
    with open(tmp_path / "code_edit_traces.jsonl", "w") as f:
        f.write(json.dumps({"prompt": "def f(x):\n    return x\n", "output": "def f(x):\n    return x\n"}) + "\n")
    bench = _load_bench(monkeypatch)
    monkeypatch.setattr(bench, "CACHE", tmp_path / "cache")
    bench.main(["--data", str(tmp_path), "--sets", "dev", "--repeats", "1"])
    lines = capsys.readouterr().out.strip().splitlines()
    got = json.loads(lines[-1])
    assert "dev" in lines[1] and "latency" in lines[-2]
    for b in ("16", "64"):
        r = got["sets"]["dev"]["budgets"][b]
        assert r["ratio_with"] == round(r["with_corpus"] / r["bound_with"], 3)
        assert r["bound_without"] <= r["copy_oracle_without"] and r["bound_with"] <= r["copy_oracle_with"]
        assert r["bound_without"] <= r["bound_with"]  # the corpus only adds text
        assert set(got["no_corpus"]["chat"]) == set(got["no_corpus"]["code_edit"]) == {"16", "64"}
    lat = got["latency_us"]
    assert lat["proposals"] > 3 and lat["all"]["p50"] <= lat["all"]["p99"] <= lat["all"]["max"]
    assert lat["first"]["max"] <= lat["all"]["max"]
    sys.modules.pop("make_corpus_completion_traces", None)
