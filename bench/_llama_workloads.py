"""The prompts of bench/bench_llama_cpp.py, as token ids of the model under test, and the corpus index of
its corpus case.

- `code-edit`: corpora/copy_edit_prompts.jsonl (ChatML user turns asking to edit a given function);
- `spec-bench`: Spec-Bench's first turns (`--specbench PATH`, $SUFFIXSPEC_SPECBENCH or
  ../shared/data/specbench-dev.jsonl), the first of each category in turn, in file order;
- `corpus`: raw completions (no chat template) of functions of corpora/python_stdlib.jsonl from
  their first lines (the header and the start of the docstring, `CORPUS_HEAD` characters); the
  corpus index holds python_stdlib.jsonl and stdlib_docs.jsonl, the function's own file among
  them, as an index of the repository being edited would.

Every engine is given the same ids (`Llama.tokenize` of the model's own vocabulary, special tokens
parsed, no BOS added: neither embedded model's ChatML prompt starts with one).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import common

WORKLOADS = ("code-edit", "spec-bench", "corpus")
SPECBENCH_ENV = common.SPECBENCH_ENV
CORPUS_HEAD = 240  # characters of the function given as the prompt
CORPUS_MIN_CHARS = 1200  # functions long enough for 128 new tokens to stay inside them


@dataclass
class Workload:
    name: str
    texts: list[str]
    corpus_docs: list[dict] | None = None  # the corpus case's documents (id, text)


def specbench_path(given: str | None) -> Path | None:
    path = given or os.environ.get(SPECBENCH_ENV) or (str(common.SPECBENCH_DEFAULT) if common.SPECBENCH_DEFAULT.exists() else None)
    return Path(path) if path else None


def load(name: str, n: int, specbench: Path | None) -> Workload:
    if name == "code-edit":
        return Workload(name, [r["chatml"] for r in common.read_jsonl(common.CORPORA / "copy_edit_prompts.jsonl")[:n]])
    if name == "spec-bench":
        if specbench is None:
            raise SystemExit(common.missing("workload spec-bench: Spec-Bench questions", "--specbench", SPECBENCH_ENV))
        rows = common.read_jsonl(specbench)
        by_cat: dict[str, list[str]] = {}
        for r in rows:
            by_cat.setdefault(r["category"], []).append(r["turns"][0][:3000])
        texts, i = [], 0
        while len(texts) < n and any(i < len(v) for v in by_cat.values()):
            texts += [common.user_turn(v[i]) for v in by_cat.values() if i < len(v)]
            i += 1
        return Workload(name, texts[:n])
    if name == "corpus":
        docs = common.read_jsonl(common.CORPORA / "python_stdlib.jsonl")
        picked = [d for d in docs if len(d["text"]) >= CORPUS_MIN_CHARS and d["text"].startswith("def ")]
        step = max(1, len(picked) // max(n, 1))
        texts = [d["text"][:CORPUS_HEAD] for d in picked[::step][:n]]
        return Workload(name, texts, docs + common.read_jsonl(common.CORPORA / "stdlib_docs.jsonl"))
    raise SystemExit(f"bench_llama_cpp: unknown workload {name!r} (expected one of {', '.join(WORKLOADS)})")


def token_ids(vocab, text: str) -> list[int]:
    """`text`'s ids in `vocab` (a `llama_cpp.Llama`), special tokens parsed, no BOS added."""
    return vocab.tokenize(text.encode("utf-8"), add_bos=False, special=True)


def build_corpus(vocab, docs: list[dict], where: Path) -> Path:
    """An index of `docs` tokenized by `vocab` (the model's own tokenizer) at `where`."""
    import numpy as np

    from suffixspec import Document, build_index

    items = [Document(np.array(vocab.tokenize(d["text"].encode("utf-8"), add_bos=False, special=False), np.int32),
                      id=d["id"]) for d in docs]
    info = {"name": Path(vocab.model_path).name, "vocab_size": int(vocab.n_vocab()), "fingerprint": "llama.cpp-vocab"}
    build_index(items, where, tokenizer=info)
    return where
