"""The vLLM entry point (`suffixspec_vllm:register`): light at load, nothing below vLLM 0.34, the
"suffixspec" method registered from 0.34 (against a fake `vllm` package of each version)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from vllm034_standin import write_fake_vllm

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("numba", "llvmlite", "torch", "suffixspec", "numpy", "transformers")

PROBE = """
import json, sys
from importlib.metadata import EntryPoint
ep = EntryPoint(name="suffixspec", value="suffixspec_vllm:register", group="vllm.general_plugins")
ep.load()()
ep.load()()  # vLLM may load a plugin more than once (in several processes, or again)
out = {"heavy": sorted({m.split(".")[0] for m in sys.modules} & set(HEAVY)),
       "vllm": sorted(m for m in sys.modules if m.startswith("vllm"))}
cfg = sys.modules.get("vllm.v1.worker.gpu.spec_decode.speculator_config")
if cfg is not None:
    out["calls"] = [list(c) for c in cfg.REGISTER_CALLS]
    cls = cfg.get_custom_speculator_config_class("suffixspec")
    out["config"] = [cls.__module__, cls.__name__, cls.speculator_class, sorted(cls.supported_options),
                     cls.adaptive_verification_uses_draft_logits, issubclass(cls, cfg.SpeculatorConfig)]
    out["heavy_after_config"] = sorted({m.split(".")[0] for m in sys.modules} & set(HEAVY))
print(json.dumps(out))
"""


def probe(tmp_path, version):
    fake = write_fake_vllm(tmp_path / "fake", version)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(fake), str(ROOT)]))
    code = f"HEAVY = {HEAVY!r}\n" + PROBE
    res = subprocess.run([sys.executable, "-S", "-c", code], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("version", ["0.32.0", "0.33.1", "0.11.1", "dev"])
def test_below_034_the_entry_point_does_nothing_and_imports_nothing_heavy(tmp_path, version):
    out = probe(tmp_path, version)
    assert out["heavy"] == []
    assert out["vllm"] == ["vllm", "vllm.version"]  # read its version, nothing else
    assert "calls" not in out


@pytest.mark.parametrize("version", ["0.34.0", "0.35.2rc1"])
def test_from_034_it_registers_the_method_by_a_light_config(tmp_path, version):
    out = probe(tmp_path, version)
    assert out["heavy"] == [] and out["heavy_after_config"] == []  # numba, torch, suffixspec: only in the worker
    assert out["calls"] == [["suffixspec", "suffixspec_vllm.SuffixSpecSpeculatorConfig"]] * 2
    module, name, speculator, options, by_logits, subclass = out["config"]
    assert (module, name) == ("suffixspec_vllm", "SuffixSpecSpeculatorConfig") and subclass
    assert speculator == "suffixspec.integrations.vllm_speculator.SuffixSpecSpeculator"
    assert options == ["speculator_options"] and by_logits is False


def test_pyproject_declares_the_entry_point():
    text = (ROOT / "pyproject.toml").read_text()
    assert '[project.entry-points."vllm.general_plugins"]\nsuffixspec = "suffixspec_vllm:register"' in text
    assert 'py-modules = ["suffixspec_vllm"]' in text
