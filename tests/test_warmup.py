"""`warm_kernels` reaches every kernel specialisation a server's rounds use: after it, a batched
workload whose response cache merges, thaws and rotates compiles or loads no further kernel. Each run
is a fresh interpreter (in this one, earlier tests have already loaded every kernel)."""

import json
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent

RUN = r"""
import importlib, json, pkgutil, sys
sys.path.insert(0, sys.argv[1])
import numpy as np
from numba.core.registry import CPUDispatcher
import suffixspec
import suffixspec._kernels as kernels

modules = [importlib.import_module(f"suffixspec._kernels.{m.name}") for m in pkgutil.iter_modules(kernels.__path__)]

def signatures():
    return {f"{mod.__name__}.{name}{sig}" for mod in modules for name, obj in vars(mod).items()
            if isinstance(obj, CPUDispatcher) and obj.__module__ == mod.__name__ for sig in obj.signatures}

before = signatures()
if sys.argv[2] == "warm":
    suffixspec.warm_kernels()
warmed = signatures()
from support.tiny_models import tiny_model
from suffixspec import CostModel, Proposer, SpeculativeGenerator

# a cache of 2 generations of 600 tokens: its levels merge, a level of 256+ tokens is thawed, and it rotates
proposer = Proposer(cache_tokens=1200, cache_generations=2)
cost = CostModel([1, 2, 4, 8, 16, 32, 64], [1.0, 1.01, 1.02, 1.05, 1.1, 1.3, 1.6])
gen = SpeculativeGenerator(tiny_model("llama", sharpen=4.0), proposer=proposer, cost_model=cost)
rng = np.random.default_rng(0)
drafted = 0
for wave in range(6):
    prompts = [np.tile(rng.integers(1, 97, 10), 5).tolist() for _ in range(4)]
    result = gen.generate(prompts, max_new_tokens=32, max_batch=4)
    drafted += sum(rs.drafted for rs in result.stats.requests)
print(json.dumps({"before": len(before), "warmed": len(warmed), "new": sorted(signatures() - warmed),
                  "rotated": bool(proposer.cache._frozen), "drafted": drafted}))
"""


def _run(mode: str) -> dict:
    out = subprocess.run([sys.executable, "-c", RUN, str(TESTS), mode], capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_warm_kernels_leaves_nothing_for_the_rounds_to_compile():
    cold = _run("cold")
    # the workload drafts, batches and rotates its cache, and without a warm-up it loads kernels the
    # rounds would wait for: among them the batched proposal and the thaw of a large cache level
    assert cold["drafted"] > 0 and cold["rotated"]
    assert any(".propose." in s for s in cold["new"]), cold["new"]
    assert any(".build.extend_frozen" in s for s in cold["new"]), cold["new"]
    warm = _run("warm")
    assert warm["warmed"] > warm["before"]
    assert warm["new"] == [], warm["new"]
