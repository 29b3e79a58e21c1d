"""Helpers of the real-vLLM tests (run by .ci/vllm.sh in its own venv; the main suite never
collects this directory: pytest's testpaths is tests/)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
# a numba cache of this venv's own (the project's venv may run another numba over the same kernels)
os.environ.setdefault("NUMBA_CACHE_DIR", str(Path(sys.prefix) / "numba-cache"))


@pytest.fixture(scope="session", autouse=True)
def compiled_kernels():
    """Compile suffixspec's kernels into the cache once, here, rather than in every engine process."""
    from types import SimpleNamespace as NS

    from suffixspec.integrations.vllm import SuffixSpecProposer

    cfg = NS(speculative_config=NS(num_speculative_tokens=8), model_config=NS(max_model_len=512, get_vocab_size=lambda: 512),
             scheduler_config=NS(max_num_seqs=4), additional_config=None)
    SuffixSpecProposer(cfg).close()


def run_engines(tmp_path: Path, base: dict, runs: list[dict], parallel: int = 2, timeout: float = 480) -> list[dict]:
    """Each of `runs` on `base` (see engine.py) in a fresh process of its own, `parallel` at a time
    (vLLM's CPU engine serves on one thread); their results, or an error with the log's tail."""
    procs = []
    for i, run in enumerate(runs):
        path = tmp_path / f"request-{i}-{run.get('label', run['method'])}.json"
        path.write_text(json.dumps({**base, "runs": [run]}))
        procs.append(path)
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0")
    results = []
    for at in range(0, len(procs), parallel):
        batch = [subprocess.Popen([sys.executable, str(HERE / "engine.py"), str(path)], stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, env=env, cwd=str(ROOT)) for path in procs[at : at + parallel]]
        for proc in batch:
            try:
                out, _ = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, _ = proc.communicate()
                raise AssertionError(f"engine process ran past {timeout} s:\n{out[-4000:]}")
            lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
            if proc.returncode != 0 or not lines:
                raise AssertionError(f"engine process failed (exit {proc.returncode}):\n{out[-6000:]}")
            results.extend(json.loads(lines[-1][len("RESULT "):]))
    return results


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> Path:
    """A random-weight float32 Llama small enough for fast engine starts (head size 64: CPU attention
    supports 32, 64, 80, 96, ...)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    path = tmp_path_factory.mktemp("tiny-llama")
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=2, head_dim=64, max_position_embeddings=2048, tie_word_embeddings=False)
    LlamaForCausalLM(cfg).to(torch.float32).save_pretrained(str(path), safe_serialization=True)
    return path
