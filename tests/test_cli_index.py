"""`suffixspec index`, `info` and `merge` through `suffixspec.cli.main` (and once as a process)."""

import json
import os
import subprocess
import sys

import pytest

from suffixspec.cli import main
from suffixspec.corpus import CorpusIndex


@pytest.fixture(scope="module")
def small_tokenizer(tmp_path_factory):
    """A tiny word-level tokenizer.json, distinct from the embedded default."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["[UNK]", "def", "return", "self", "(", ")", ":", "x", "y", "=", "+", "class", "import"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return str(path)


def write_jsonl(path, rows, extra_lines=()):
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
        for line in extra_lines:
            f.write(line + "\n")
    return path


ROWS = [
    {"id": "click/core.py", "text": "def invoke(self, ctx):\n    return ctx.invoke(self.callback)\n", "tags": {"repo": "click", "lang": "python"}},
    {"id": "click/utils.py", "text": "def echo(message=None, file=None):\n    return _echo(message)\n", "tags": ["repo=click", "lang=python"]},
    {"id": "flask/app.py", "text": "def invoke(self, ctx):\n    return self.app.dispatch(ctx)\n", "tags": {"repo": "flask"}},
]


def last_json(out):
    return json.loads(out.strip().splitlines()[-1])


def test_index_jsonl_info_and_filtered_query(tmp_path, capsys):
    src = write_jsonl(tmp_path / "docs.jsonl", ROWS)
    ix = tmp_path / "code.idx"
    assert main(["index", str(src), "-o", str(ix), "--id-field", "id", "--tag-field", "tags", "--jobs", "1"]) == 0
    out = capsys.readouterr().out
    assert "indexed 3 documents" in out and "B/token" in out
    assert ix.is_dir() and not any(p.name.startswith(".") for p in tmp_path.iterdir())
    assert main(["info", str(ix), "--json"]) == 0
    info = last_json(capsys.readouterr().out)
    for key in ("n_tokens", "n_documents", "bytes_on_disk", "bytes_per_token", "format_version", "tokenizer"):
        assert key in info
    assert info["n_documents"] == 3 and info["format_version"] == 4 and info["tokenizer"]["vocab_size"] > 1000
    files = [ix / "manifest.ssx"] + sorted(ix.glob("shard-*.ssx"))
    assert info["bytes_on_disk"] == sum(f.stat().st_size for f in files)
    assert info["bytes_per_token"] == round(info["bytes_on_disk"] / info["n_tokens"], 2)
    index = CorpusIndex.open(ix)
    assert index.document_ids == ["click/core.py", "click/utils.py", "flask/app.py"]
    assert index.document_tags[1] == {"repo": "click", "lang": "python"}
    ctx = "def invoke(self, ctx):\n    return"
    assert main(["info", str(ix), "--json", "--query", ctx]) == 0
    q = last_json(capsys.readouterr().out)["query"]
    assert q["count"] == 2 and q["match_length"] == q["n_context_tokens"]
    assert main(["info", str(ix), "--json", "--query", ctx, "--filter", "repo=click"]) == 0
    q = last_json(capsys.readouterr().out)["query"]
    assert q["count"] == 1 and q["n_documents_selected"] == 2 and not q["estimated"]
    assert q["continuations"][0]["document"] == "click/core.py"
    assert main(["info", str(ix), "--query", ctx, "--filter", "repo=flask"]) == 0
    assert "flask/app.py" in capsys.readouterr().out


def test_directory_walk_glob_and_ignores(tmp_path, capsys):
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    (repo / "pkg" / "a.py").write_text("def f(x):\n    return x + 1\n")
    (repo / "b.py").write_text("class B:\n    pass\n")
    (repo / "notes.txt").write_text("not python")
    (repo / "blob.py").write_bytes(b"\x00\x01\x02binary")
    for ignored in (".git", "__pycache__", "node_modules"):
        (repo / ignored).mkdir()
        (repo / ignored / "x.py").write_text("def ignored(): pass\n")
    ix = tmp_path / "repo.idx"
    assert main(["index", str(repo), "--glob", "*.py", "--tag", "repo=mine", "-o", str(ix)]) == 0
    out = capsys.readouterr().out
    assert "indexed 2 documents" in out and "1 unreadable or binary file" in out
    index = CorpusIndex.open(ix)
    assert sorted(index.document_ids) == ["repo/b.py", "repo/pkg/a.py"]
    assert index.document_tags[0] == {"repo": "mine"}
    # append a shard, then compact
    (tmp_path / "more").mkdir()
    (tmp_path / "more" / "c.py").write_text("def g(y):\n    return y\n")
    assert main(["index", str(tmp_path / "more"), "-o", str(ix), "--append"]) == 0
    assert "appended 1 documents" in capsys.readouterr().out
    assert CorpusIndex.open(ix).n_shards == 2
    assert main(["merge", str(ix), "-o", str(tmp_path / "merged.idx")]) == 0
    assert "3 documents" in capsys.readouterr().out
    assert CorpusIndex.open(tmp_path / "merged.idx").n_shards == 1


def test_bad_input_reports_file_and_line(tmp_path, capsys):
    src = write_jsonl(tmp_path / "bad.jsonl", ROWS[:1], extra_lines=['{"text": "ok"', '{"id": 3}'])
    out = str(tmp_path / "x.idx")
    assert main(["index", str(src), "-o", out]) == 2
    err = capsys.readouterr().err
    assert f"{src}:2: malformed JSON" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not os.path.exists(out)
    assert main(["index", str(src), "-o", out, "--skip-bad"]) == 0
    assert "skipped 2 bad line(s)" in capsys.readouterr().out
    assert main(["index", str(tmp_path / "missing.txt"), "-o", out]) == 2
    assert "missing.txt: no such file" in capsys.readouterr().err
    empty = write_jsonl(tmp_path / "empty.jsonl", [{"text": ""}])
    assert main(["index", str(empty), "-o", str(tmp_path / "e.idx")]) == 2
    assert "empty corpus" in capsys.readouterr().err
    (tmp_path / "emptydir").mkdir()
    assert main(["index", str(tmp_path / "emptydir"), "-o", str(tmp_path / "e.idx")]) == 2
    assert "empty corpus" in capsys.readouterr().err
    assert main(["index", str(src), "-o", out, "--tag", "oops"]) == 2
    assert "KEY=VALUE" in capsys.readouterr().err


def test_batch_encoder_gives_the_tokenizers_ids(small_tokenizer):
    """`suffixspec index` encodes through the backend's fast batch call: the ids of `encode_batch`."""
    from suffixspec._commands.index import batch_encoder
    from suffixspec.tokenizer import load_tokenizer

    texts = ["def invoke(self, ctx):\n    return 12345", "", "  naïve ünïcode  ✓\n\n\tx = 'a'  # ü", "x" * 3000,
             "\r\n".join(f"line {i}" for i in range(200))]
    for tok in (load_tokenizer(), load_tokenizer(small_tokenizer)):
        assert [list(x) for x in batch_encoder(tok)(texts)] == tok.encode_batch(texts)


def test_info_detects_damage_and_tokenizer_mismatch(tmp_path, capsys, small_tokenizer):
    src = write_jsonl(tmp_path / "d.jsonl", ROWS)
    ix = tmp_path / "small.idx"
    assert main(["index", str(src), "-o", str(ix), "--tokenizer", small_tokenizer]) == 0
    capsys.readouterr()
    assert main(["info", str(ix), "--query", "def invoke ( self"]) == 2  # default tokenizer is not the index's
    assert "built with tokenizer" in capsys.readouterr().err
    assert main(["info", str(ix), "--query", "def invoke ( self", "--tokenizer", small_tokenizer, "--json"]) == 0
    assert last_json(capsys.readouterr().out)["query"]["match_length"] == 4
    shard = ix / "shard-00000.ssx"
    data = bytearray(shard.read_bytes())
    data[-3] ^= 0xFF  # inside an array: only the checksum can tell
    shard.write_bytes(bytes(data))
    assert main(["info", str(ix)]) == 2
    err = capsys.readouterr().err
    assert "shard-00000.ssx" in err and "checksum" in err and "Traceback" not in err
    assert main(["info", str(tmp_path / "nope.idx")]) == 2


def test_cli_as_a_process(tmp_path):
    src = write_jsonl(tmp_path / "d.jsonl", ROWS)
    ix = tmp_path / "p.idx"
    run = lambda *a: subprocess.run([sys.executable, "-m", "suffixspec.cli", *a], capture_output=True, text=True, timeout=120)
    r = run("index", str(src), "-o", str(ix), "--tag-field", "tags")
    assert r.returncode == 0, r.stderr
    r = run("info", str(ix), "--json", "--query", "def", "--filter", "repo=click")
    assert r.returncode == 0, r.stderr
    info = last_json(r.stdout)
    assert info["n_documents"] == 3 and info["query"]["count"] == 2
    r = run("delete", str(ix), "--filter", "repo=flask", "--json")
    assert r.returncode == 0, r.stderr
    assert last_json(r.stdout)["document_ids"] == ["d.jsonl:3"]
    r = run("delete", str(ix), "--id", "nope")
    assert r.returncode == 2 and "no document with id 'nope'" in r.stderr and "Traceback" not in r.stderr
    r = run("index", str(tmp_path / "d.jsonl"), "-o", str(ix), "--field", "body")
    assert r.returncode == 2 and "d.jsonl:1: field 'body'" in r.stderr and "Traceback" not in r.stderr


def test_shipped_sample_corpora_index_and_filter(tmp_path, capsys):
    import importlib.resources

    root = importlib.resources.files("suffixspec.corpora")
    code, docs = root / "python_stdlib.jsonl", root / "stdlib_docs.jsonl"
    ix = tmp_path / "samples.idx"
    assert main(["index", str(code), str(docs), "--id-field", "id", "--tag-field", "tags", "-o", str(ix), "--jobs", "1"]) == 0
    capsys.readouterr()
    index = CorpusIndex.open(ix, verify=True)
    assert index.n_documents > 100 and index.n_tokens > 20_000
    assert {t["lang"] for t in index.document_tags} == {"python", "en"}
    assert main(["info", str(ix), "--json", "--query", "    def __init__(self", "--filter", "repo=argparse", "--filter", "lang=python"]) == 0
    q = last_json(capsys.readouterr().out)["query"]
    assert q["match_length"] >= 4 and q["count"] >= 1
    assert all(c["document"].startswith("argparse.py:") for c in q["continuations"])


def test_delete_by_id_and_filter_then_merge(tmp_path, capsys, small_tokenizer):
    """Queries after `suffixspec delete` equal brute force over the remaining documents."""
    from support import naive

    rows = ROWS + [{"id": f"gen/{i}.py", "text": f"def f{i % 3}(x):\n    return x + {i % 2}\n", "tags": {"repo": "gen", "half": str(i % 2)}}
                   for i in range(8)]
    src = write_jsonl(tmp_path / "d.jsonl", rows)
    ix = tmp_path / "d.idx"
    assert main(["index", str(src), "-o", str(ix), "--id-field", "id", "--tag-field", "tags",
                 "--tokenizer", small_tokenizer, "--shard-tokens", "40", "--jobs", "1"]) == 0
    capsys.readouterr()
    all_docs = [d.tokens.tolist() for d in CorpusIndex.open(ix).iter_documents()]
    ids = [r["id"] for r in rows]

    def check(gone_ids):
        index = CorpusIndex.open(ix, verify=True)
        assert sorted(index.document_ids[d] for d in index.deleted) == sorted(gone_ids)
        live = [d for i, d in zip(ids, all_docs) if i not in gone_ids]
        for doc in all_docs:
            for a in range(len(doc)):
                p = doc[a:a + 3]  # positions are global in the index, so compare counts, not ends
                assert index.count(p) == naive.count(live, p)
                got = index.continuations(p)
                assert {t: c for t, (c, _) in got.items()} == {t: c for t, (c, _) in naive.continuations(live, p).items()}
                assert index.match_length(p) == naive.match_length(live, p)

    assert main(["delete", str(ix), "--id", "flask/app.py", "--json"]) == 0
    out = last_json(capsys.readouterr().out)
    assert out["newly_deleted"] == 1 and out["n_deleted"] == 1 and out["document_ids"] == ["flask/app.py"]
    check({"flask/app.py"})
    assert main(["delete", str(ix), "--filter", "repo=gen", "--filter", "half=1", "--dry-run"]) == 0
    assert "would delete 4 document(s)" in capsys.readouterr().out
    check({"flask/app.py"})
    assert main(["delete", str(ix), "--filter", "repo=gen", "--filter", "half=1"]) == 0
    assert "deleted 4 document(s); 5 of 11 documents deleted" in capsys.readouterr().out
    gone = {"flask/app.py"} | {f"gen/{i}.py" for i in range(1, 8, 2)}
    check(gone)
    assert main(["delete", str(ix), "--id", "gen/0.py", "--id", "gen/1.py", "--filter", "repo=gen"]) == 0
    assert "deleted 1 document(s) (1 already deleted)" in capsys.readouterr().out
    gone.add("gen/0.py")
    check(gone)
    assert main(["info", str(ix), "--json"]) == 0
    assert last_json(capsys.readouterr().out)["n_deleted"] == 6
    assert main(["merge", str(ix), "-o", str(tmp_path / "m.idx")]) == 0
    capsys.readouterr()
    merged = CorpusIndex.open(tmp_path / "m.idx", verify=True)
    assert merged.document_ids == [i for i in ids if i not in gone] and len(merged.deleted) == 0


def test_delete_errors_exit_2_and_change_nothing(tmp_path, capsys):
    src = write_jsonl(tmp_path / "d.jsonl", ROWS)
    ix = tmp_path / "d.idx"
    assert main(["index", str(src), "-o", str(ix), "--id-field", "id", "--tag-field", "tags", "--jobs", "1"]) == 0
    capsys.readouterr()
    before = {p.name: p.read_bytes() for p in ix.iterdir()}
    cases = [
        (["--id", "click/core.py", "--id", "nope.py"], "no document with id 'nope.py'"),
        (["--filter", "repo=django"], "no document matches repo=django"),
        (["--filter", "repo"], "--filter: expected K=V"),
        ([], "expected --id ID or --filter"),
    ]
    for extra, msg in cases:
        assert main(["delete", str(ix), *extra]) == 2
        err = capsys.readouterr().err
        assert msg in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert {p.name: p.read_bytes() for p in ix.iterdir()} == before
    assert main(["delete", str(tmp_path / "missing.idx"), "--id", "x"]) == 2
    assert "no such index" in capsys.readouterr().err
    (ix / "manifest.ssx").write_bytes(b"garbage")
    assert main(["delete", str(ix), "--id", "click/core.py"]) == 2
    assert "manifest.ssx" in capsys.readouterr().err


def test_bad_corpus_cli_arguments_exit_2_with_one_line(tmp_path, capsys, small_tokenizer):
    """Every bad argument of index / info / delete / merge: exit 2, one line on stderr naming what
    was expected and what came, no traceback, nothing written."""
    src = write_jsonl(tmp_path / "d.jsonl", ROWS)
    ix = tmp_path / "d.idx"
    tok = ["--tokenizer", small_tokenizer]
    assert main(["index", str(src), "-o", str(ix), "--id-field", "id", "--jobs", "1", *tok]) == 0
    capsys.readouterr()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    loop = tmp_path / "loop.idx"
    os.symlink(loop.name, loop)
    plain = tmp_path / "notes.txt"
    plain.write_text("not an index")
    bare = tmp_path / "bare.idx"
    bare.mkdir()
    broken = tmp_path / "broken.idx"
    assert main(["index", str(src), "-o", str(broken), "--jobs", "1", *tok]) == 0
    (broken / "manifest.ssx").unlink()
    os.mkfifo(broken / "manifest.ssx")
    capsys.readouterr()
    index = ["index", str(src), "-o", str(tmp_path / "new.idx"), *tok]
    cases = [
        (index + ["--shard-tokens", "0"], "--shard-tokens: expected a positive integer, got 0"),
        (index + ["--shard-tokens", "-5"], "--shard-tokens: expected a positive integer, got -5"),
        (index + ["--jobs", "0"], "--jobs: expected a positive integer, got 0"),
        (index + ["--wait", "-1"], "--wait: expected a number of seconds >= 0, got -1.0"),
        (index + ["--wait", "nan"], "--wait: expected a number of seconds >= 0, got nan"),
        (index + ["--tag", "novalue"], "--tag: expected KEY=VALUE, got 'novalue'"),
        (["index", str(tmp_path / "nope.txt"), "-o", str(tmp_path / "n.idx"), *tok], "no such file or directory"),
        (["index", str(fifo), "-o", str(tmp_path / "f.idx"), *tok], "is a FIFO, expected a regular file"),
        (["index", str(src), "-o", str(plain), *tok], "exists and is not a suffixspec index"),
        (["index", str(src), "-o", str(tmp_path / "absent.idx"), "--append", *tok], "no such index"),
        (["info", str(tmp_path / "absent.idx")], "no such index"),
        (["info", str(fifo)], "not a suffixspec index"),
        (["info", str(plain)], "not a suffixspec index"),
        (["info", str(bare)], "no manifest.ssx"),
        (["info", str(loop)], "symlink loop"),
        (["info", str(broken)], "is a FIFO, expected a regular file"),
        (["info", str(ix), "--filter", "repo=click"], "--filter restricts a query"),
        (["delete", str(ix), "--id", "click/core.py", "--wait", "-3"], "--wait: expected a number of seconds >= 0"),
        (["delete", str(ix)], "expected --id ID or --filter"),
        (["delete", str(tmp_path / "absent.idx"), "--id", "x"], "no such index"),
        (["delete", str(broken), "--id", "x"], "is a FIFO"),
        (["merge", str(ix), "-o", str(tmp_path / "m.idx"), "--shard-tokens", "0"], "--shard-tokens: expected a positive integer, got 0"),
        (["merge", str(ix), "-o", str(tmp_path / "m.idx"), "--jobs", "0"], "--jobs: expected a positive integer, got 0"),
        (["merge", str(ix), "-o", str(tmp_path / "m.idx"), "--wait", "-1"], "--wait: expected a number of seconds >= 0"),
        (["merge", str(tmp_path / "absent.idx"), "-o", str(tmp_path / "m.idx")], "no such index"),
        (["merge", str(broken), "-o", str(tmp_path / "m.idx")], "is a FIFO"),
    ]
    before = {p.name: p.read_bytes() for p in ix.iterdir()}
    for argv, msg in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert msg in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, (argv, err)
    assert {p.name: p.read_bytes() for p in ix.iterdir()} == before
    assert not any(p.name in ("new.idx", "m.idx", "n.idx", "f.idx") or p.name.startswith(".") for p in tmp_path.iterdir())


def test_info_verify_and_no_verify(tmp_path, capsys):
    """`info` verifies every checksum by default (--verify); --no-verify makes only the cheap
    checks of every open, so a flipped byte inside the automaton's arrays passes it unseen."""
    from suffixspec.corpus.format import KIND_SHARD, SHARD_DTYPES, Container

    src = write_jsonl(tmp_path / "d.jsonl", ROWS)
    ix = tmp_path / "d.idx"
    assert main(["index", str(src), "-o", str(ix), "--jobs", "1"]) == 0
    shard = ix / "shard-00000.ssx"
    code, off, count, _ = Container(shard, KIND_SHARD, SHARD_DTYPES).entries["lasts"]
    data = bytearray(shard.read_bytes())
    data[off + 4] ^= 0x01  # the last end of state 1: in range, only a checksum sees it
    shard.write_bytes(bytes(data))
    capsys.readouterr()
    assert main(["info", str(ix), "--no-verify", "--json"]) == 0
    info = last_json(capsys.readouterr().out)
    assert info["verified"] is False and info["verify_ms"] is None
    for argv in (["info", str(ix)], ["info", str(ix), "--verify"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "shard-00000.ssx: array lasts is damaged (checksum mismatch)" in err and len(err.strip().splitlines()) == 1
