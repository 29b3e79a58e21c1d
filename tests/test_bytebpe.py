"""`tokenizer.bytebpe.ByteLevelEncoder` against the tokenizers library: the same ids on random text built from
the characters and fragments the GPT-2 split treats specially (every ASCII byte, contractions,
whitespace runs before letters, digits and punctuation, non-ASCII letters, digits and spaces, added
tokens), on real source files, with the digit split and without, and with a cache too small to
hold anything; pipelines it does not implement are refused."""

import json

import numpy as np
import pytest

from suffixspec import tokenizer as tk
from suffixspec.tokenizer import bytebpe
from suffixspec.tokenizer.bytebpe import ByteLevelEncoder

FRAGMENTS = ([chr(c) for c in range(128)]
             + ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'x", "  ", "   ", "\n    ", "\n\n", " \n", "\t\t",
                "def", " self", "return", "ing", "Foo", "42", " 7", "==", " (", "é", "ü", "中文", "😀", "\u00a0",
                "\u2028", "\u3000", "\u0085", "²", "٣", "Ⅻ", "ǅ", "<|im_start|>", "<|endoftext|>", "<repo_name>"])


def random_texts(rng, n, max_parts=40):
    weights = np.array([1.0] * 128 + [3.0] * (len(FRAGMENTS) - 128))
    for c in b"aZq19 \n'(_":  # the usual characters more often
        weights[c] = 8.0
    p = weights / weights.sum()
    return ["".join(FRAGMENTS[i] for i in rng.choice(len(FRAGMENTS), size=int(rng.integers(0, max_parts)), p=p))
            for _ in range(n)]


@pytest.fixture(scope="module")
def default_tok():
    try:
        tk.default_gguf_path()
    except tk.TokenizerError:
        pytest.skip(f"{tk.DEFAULT_DISTRIBUTION} is not installed")
    return tk.load_tokenizer()


def with_pipeline(tok, **changes):
    """A copy of `tok` with top-level pipeline parts of its tokenizer.json replaced."""
    from tokenizers import Tokenizer

    spec = json.loads(tok.backend.to_str())
    spec.update(changes)
    return tk.Tokenizer(Tokenizer.from_str(json.dumps(spec)), tok.name + "-changed")


def library_ids(tok, texts):
    return [e.ids for e in tok.backend.encode_batch(texts, add_special_tokens=False)]


def assert_same(enc, tok, texts):
    got = enc.encode_batch(texts)
    want = library_ids(tok, texts)
    for text, g, w in zip(texts, got, want):
        assert g.dtype == np.int32
        assert g.tolist() == w, text


def test_random_text_matches_the_library(default_tok):
    enc = ByteLevelEncoder.of(default_tok)
    assert enc is not None and enc.split_digits
    rng = np.random.default_rng(0)
    for _ in range(3):
        assert_same(enc, default_tok, random_texts(rng, 1500))
    # the cache is filled now: the same texts again go through it
    assert enc.cmeta[0] > 0
    assert_same(enc, default_tok, random_texts(np.random.default_rng(0), 1500))


def test_without_the_digit_split(default_tok):
    spec = json.loads(default_tok.backend.to_str())
    tok = with_pipeline(default_tok, pre_tokenizer=spec["pre_tokenizer"]["pretokenizers"][1])
    enc = ByteLevelEncoder.of(tok)
    assert enc is not None and not enc.split_digits
    assert_same(enc, tok, random_texts(np.random.default_rng(1), 1500))


def test_source_files_and_long_words(default_tok):
    import os
    from pathlib import Path

    stdlib = Path(os.__file__).parent
    texts = [(stdlib / name).read_text(encoding="utf-8") for name in ("os.py", "inspect.py", "difflib.py", "enum.py")]
    texts += ["x" * 300, " " * 500 + "y", "=" * 1000, "\u00e9" * 50 + "a" * 60, "", "a\ud800b"]
    enc = ByteLevelEncoder.of(default_tok)
    assert_same(enc, default_tok, texts[:-1])
    with pytest.raises(TypeError):  # a lone surrogate: the library refuses it, and so do we
        library_ids(default_tok, texts[-1:])
    with pytest.raises(TypeError):
        enc.encode_batch(texts[-1:])


def test_a_full_cache_changes_nothing(default_tok, monkeypatch):
    monkeypatch.setattr(bytebpe, "CACHE_SLOTS", 4)
    enc = ByteLevelEncoder.of(default_tok)
    assert_same(enc, default_tok, random_texts(np.random.default_rng(2), 800))
    assert enc.cmeta[0] <= 2


def test_unsupported_pipelines_are_refused(default_tok):
    from tokenizers import Tokenizer, models, pre_tokenizers

    assert ByteLevelEncoder.of(with_pipeline(default_tok, normalizer={"type": "NFC"})) is None
    assert ByteLevelEncoder.of(with_pipeline(default_tok, pre_tokenizer={"type": "Whitespace"})) is None
    assert ByteLevelEncoder.of(with_pipeline(default_tok, truncation={"direction": "Right", "max_length": 8, "strategy":
                                                                       "LongestFirst", "stride": 0})) is None
    word = Tokenizer(models.WordLevel({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    word.pre_tokenizer = pre_tokenizers.Whitespace()
    assert ByteLevelEncoder.of(tk.Tokenizer(word, "word")) is None


def test_index_encodes_through_it(default_tok):
    """`suffixspec index` takes the kernels' path for the default tokenizer: the library's ids."""
    from suffixspec._commands.index import batch_encoder

    encode = batch_encoder(default_tok)
    assert isinstance(getattr(encode, "__self__", None), ByteLevelEncoder)
    texts = random_texts(np.random.default_rng(3), 200) + ["def f(x):\n    return x  # é\n"]
    assert [a.tolist() for a in encode(texts)] == library_ids(default_tok, texts)
