import io
import sysconfig
import tokenize
from pathlib import Path

import pytest


def _python_token_stream(max_files=6, max_tokens=4000):
    """Real token ids: Python source of the standard library through `tokenize`, one id per distinct token."""
    vocab = {}
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    streams = []
    for name in ("textwrap.py", "shlex.py", "difflib.py", "fnmatch.py", "bisect.py", "heapq.py")[:max_files]:
        src = (stdlib / name).read_text(encoding="utf-8")
        ids = []
        for tok in tokenize.generate_tokens(io.StringIO(src).readline):
            ids.append(vocab.setdefault(tok.string, len(vocab)))
            if len(ids) >= max_tokens:
                break
        streams.append(ids)
    return streams


def _prose_token_stream(max_tokens=4000):
    """Real prose: the docstrings of a few standard-library modules, split into words and marks."""
    import argparse
    import email
    import json
    import logging
    import re
    import unittest

    text = " ".join(m.__doc__ or "" for m in (argparse, email, json, logging, unittest))
    vocab = {}
    return [vocab.setdefault(w, len(vocab)) for w in re.findall(r"\w+|[^\w\s]", text)][:max_tokens]


@pytest.fixture(scope="session")
def real_streams():
    return _python_token_stream() + [_prose_token_stream()]


@pytest.fixture(scope="module", params=["llama", "qwen2", "gpt2", "gemma3"])
def family(request):
    """A tiny random model of each family with four prompts and their plain greedy references."""
    from support.prompts import NEW, prompts_for
    from support.tiny_models import hf_generate, tiny_model

    model = tiny_model(request.param)
    prompts = prompts_for()
    refs = {tuple(p): hf_generate(model, p, NEW) for p in prompts}
    return request.param, model, prompts, refs
