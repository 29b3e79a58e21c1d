"""Helpers of the real llama-cpp-python tests (run by .ci/llama_cpp.sh in its own venv; the main
suite never collects this directory: pytest's testpaths is tests/).

`greedy(llm, prompt_ids, n)` decodes with `Llama.generate` at temperature 0 after `reset()`;
`chat_ids(llm, text)` wraps a user message in SmolLM2's ChatML template; `COPY_EDITS` are the
project's code-edit prompts (corpora/copy_edit_prompts.jsonl)."""

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
# a numba cache of this venv's own (the project's venv may run another numba over the same kernels)
os.environ.setdefault("NUMBA_CACHE_DIR", str(Path(sys.prefix) / "numba-cache"))
COPY_EDITS = [json.loads(line) for line in (ROOT / "corpora" / "copy_edit_prompts.jsonl").read_text().splitlines() if line.strip()]


def chat_ids(llm, text: str) -> list[int]:
    formatted = f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"
    return llm.tokenize(formatted.encode("utf-8"), add_bos=False, special=True)


def greedy(llm, prompt_ids, n: int) -> list[int]:
    """Up to `n` tokens of greedy decoding, from an empty context; stops at end of generation."""
    llm.reset()
    out = []
    for token in llm.generate(list(prompt_ids), temp=0.0, repeat_penalty=1.0, reset=True):
        if llm.token_eos() == token:
            break
        out.append(token)
        if len(out) >= n:
            break
    return out


def top_two(row: np.ndarray):
    """(best token, its logit, second token, its logit) of one row of logits."""
    a, b = np.argsort(row)[::-1][:2]
    return int(a), float(row[a]), int(b), float(row[b])


@pytest.fixture(scope="session")
def gguf():
    from suffixspec.tokenizer import default_gguf_path

    return str(default_gguf_path())
