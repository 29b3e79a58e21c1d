"""`bench/gpu_check.py` on the CPU path: it runs without pyroaring and without the embedded model's
package, writes exactly the documented top-level keys, and its float32 exactness check passes."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# The script as the GPU machine runs it: pyroaring and the embedded model's package cannot be imported.
RUNNER = """
import runpy, sys
sys.modules["pyroaring"] = None
import suffixspec.tokenizer as tokenizer
def _absent(*args, **kwargs):
    raise RuntimeError("the embedded model's package is not installed")
tokenizer.default_gguf_path = _absent
sys.argv = ["gpu_check.py", "--out", sys.argv[1], "--device", "cpu"]
sys.path.insert(0, %r)
runpy.run_path(%r, run_name="__main__")
"""


def test_gpu_check_cpu_path(tmp_path):
    code = RUNNER % (str(ROOT / "bench"), str(ROOT / "bench" / "gpu_check.py"))
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=600,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "gpu_check.json").read_text())
    assert list(result) == ["device", "exactness", "cost_curve", "replay", "cpu_share"]
    assert result["device"]["type"] == "cpu"
    from suffixspec.engine.costmodel import CostModel

    curves = sorted(tmp_path.glob("cost_curve_*.json"))  # each model's curve, as `--cost-curve FILE` reads it
    assert [p.name for p in curves] == [f"cost_curve_{n}.json" for n in sorted(result["cost_curve"]["models"])]
    for path in curves:
        assert CostModel.from_relative(json.loads(path.read_text())).relative()[1] == 1.0
    ex = result["exactness"]
    assert ex["passed"] is True
    for variant in ("random", "cycling"):
        runs = {k: v for k, v in ex["float32"][variant].items() if k.startswith("batch_")}
        assert set(runs) == {"batch_1", "batch_4", "batch_16"}
        assert all(r["equal"] == ex["prompts"] == 16 and r["drafted"] > 0 for r in runs.values())
    assert ex["float32"]["cycling"]["batch_4"]["accepted"] > 0  # accepted drafts were committed
    assert 0.0 <= ex["half"]["bfloat16"]["mismatch_rate"] <= 1.0
    for entry in result["cost_curve"]["models"].values():
        assert {(p["batch"], p["width"]) for p in entry["points"]} >= {(1, 1), (4, 4), (64, 1), (256, 1)}
    runs = result["replay"]["runs"]
    assert runs and all(set(by_c) == {"concurrency_1", "concurrency_4"}
                        for by_w in runs.values() for by_c in by_w.values())
    assert set(result["cpu_share"]["batches"]) == {"64", "256"}
    last = proc.stdout.strip().splitlines()[-1]
    assert json.loads(last)["exactness_passed"] is True  # the JSON line comes last
