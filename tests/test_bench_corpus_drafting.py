"""`bench/bench_corpus_drafting.py` end to end on a tiny data directory: its table and the JSON
line last, with every field the issue asks for, and figures consistent with each other."""

import hashlib
import importlib.util
import io
import json
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load_bench(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "bench"))  # its sibling modules, as `python bench/x.py` finds them
    spec = importlib.util.spec_from_file_location("bench_corpus_drafting", ROOT / "bench" / "bench_corpus_drafting.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_bench_runs_on_a_tiny_set_and_prints_json_last(tmp_path, capsys, monkeypatch):
    rng = np.random.default_rng(0)
    block = rng.integers(5, 400, 300).tolist()
    old = tmp_path / "old.py"
    old.write_text("def f(x):\n    return x + 1\n" * 20, encoding="utf-8")
    (tmp_path / "make_corpus_completion_traces.py").write_text(
        f"from pathlib import Path\ndef corpus_files(name):\n    return [Path({str(old)!r})]\n", encoding="utf-8")
    with open(tmp_path / "corpus_completion_dev.jsonl", "w") as f:
        for k in range(3):
            f.write(json.dumps({"id": k, "prompt_ids": block[: 100 + k], "output_ids": block[100 + k : 140 + k]}) + "\n")
    with open(tmp_path / "chat_traces_smollm2.jsonl", "w") as f:
        f.write(json.dumps({"prompt_ids": block[:50], "output_ids": block[20:40]}) + "\n")
    with open(tmp_path / "code_edit_traces.jsonl", "w") as f:
        f.write(json.dumps({"prompt": "def f(x):\n    return x\n", "output": "def f(x):\n    return x\n"}) + "\n")
    bench = _load_bench(monkeypatch)
    monkeypatch.setattr(bench, "CACHE", tmp_path / "cache")
    bench.main(["--data", str(tmp_path), "--sets", "dev", "--repeats", "1"])
    lines = capsys.readouterr().out.strip().splitlines()
    got = json.loads(lines[-1])
    assert "dev" in lines[1] and "latency" in lines[-2]
    for b in ("16", "64"):
        r = got["sets"]["dev"]["budgets"][b]
        assert r["ratio_with"] == round(r["with_corpus"] / r["bound_with"], 3)
        assert r["bound_without"] <= r["copy_oracle_without"] and r["bound_with"] <= r["copy_oracle_with"]
        assert r["bound_without"] <= r["bound_with"]  # the corpus only adds text
        assert set(got["no_corpus"]["chat"]) == set(got["no_corpus"]["code_edit"]) == {"16", "64"}
    lat = got["latency_us"]["dev"]["64"]
    assert set(got["latency_us"]["dev"]) == {"16", "64"}
    assert lat["proposals"] > 3 and lat["all"]["p50"] <= lat["all"]["p99"] <= lat["all"]["max"]
    assert lat["first"]["max"] <= lat["all"]["max"]
    assert lat["all_fastest"]["p50"] <= lat["all_fastest"]["p99"] <= lat["all_fastest"]["max"] <= lat["all"]["max"]
    assert lat["gc_collections"] >= 0
    sys.modules.pop("make_corpus_completion_traces", None)


def _load_builder(monkeypatch):
    spec = importlib.util.spec_from_file_location("make_release_pairs", ROOT / "corpora" / "make_release_pairs.py")
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "make_release_pairs", mod)
    spec.loader.exec_module(mod)
    return mod


def _sdist(folder: Path, name: str, files: dict[str, str]) -> Path:
    path = folder / f"{name}.tar.gz"
    with tarfile.open(path, "w:gz") as t:
        for rel, text in sorted(files.items()):
            data = text.encode()
            info = tarfile.TarInfo(f"{name}/{rel}")
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return path


def _module(bodies: dict[str, str]) -> str:
    head = "".join(f"X{i} = {i}\n" for i in range(25))
    return head + "".join(f"\n\ndef {n}(a, b):\n" + body for n, body in bodies.items())


BODY = "".join(f"    v{i} = a + {i}\n" for i in range(6)) + "    return v0\n"


def test_release_pairs_builder_is_deterministic_from_the_registry_files(tmp_path, monkeypatch):
    """Requests and corpus come from the sdists' bytes alone, checked against the manifest's
    sha256: the same files give the same sets; a changed or missing file is refused."""
    mp = _load_builder(monkeypatch)
    monkeypatch.setattr(mp, "PAIRS", {"dev": [("proj", "1.0", "1.1", "MIT")]})
    old = _sdist(tmp_path, "proj-1.0", {"pkg/mod.py": _module({"same": BODY, "edit": BODY}), "README": "x"})
    new = _sdist(tmp_path, "proj-1.1", {"pkg/mod.py": _module({"same": BODY, "edit": BODY.replace("+ 3", "- 3"),
                                                               "added": BODY})})
    manifest = {"files": {p.name: {"bytes": p.stat().st_size, "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
                          for p in (old, new)}}
    rows = mp.build_requests("dev", tmp_path, manifest, download=False)
    assert rows == mp.build_requests("dev", tmp_path, manifest, download=False)
    assert {r["id"].split(":")[1]: r["kind"] for r in rows} == {"same": "unchanged", "edit": "edited", "added": "added"}
    for r in rows:
        assert r["prompt"].endswith(f"def {r['id'].split(':')[1]}(a, b):\n") and r["output"].startswith("    v0 = a + 0\n")
        assert (r["project"], r["old"], r["new"], r["set"]) == ("proj", "1.0", "1.1", "dev")
    docs = mp.corpus_documents("dev", tmp_path, manifest, download=False)
    assert docs == [("proj/pkg/mod.py", _module({"same": BODY, "edit": BODY}))]
    bad = json.loads(json.dumps(manifest))
    bad["files"][new.name]["sha256"] = "0" * 64
    with pytest.raises(mp.ReleaseError, match="expected sha256 0{64}"):
        mp.build_requests("dev", tmp_path, bad, download=False)
    new.unlink()
    with pytest.raises(mp.ReleaseError, match=r"proj==1.1: no sdist"):
        mp.build_requests("dev", tmp_path, manifest, download=False)


def test_release_pairs_manifest_covers_every_pair_and_no_project_is_in_two_sets(monkeypatch):
    mp = _load_builder(monkeypatch)
    manifest = mp.load_manifest()["files"]
    projects = {name: {p[0] for p in pairs} for name, pairs in mp.PAIRS.items()}
    assert not projects["dev"] & projects["heldout"]
    recorded = {(e["project"], e["version"]) for e in manifest.values()}
    for pairs in mp.PAIRS.values():
        for project, old, new, _lic in pairs:
            assert {(project, old), (project, new)} <= recorded
    assert all(len(e["sha256"]) == 64 and e["bytes"] > 0 for e in manifest.values())


def test_bench_runs_on_a_release_pair_set(tmp_path, capsys, monkeypatch):
    (tmp_path / "make_release_pairs.py").write_text(
        "def corpus_documents(name, sdists):\n"
        "    return [('p/a.py', 'def f(x):\\n    return x + 1\\n' * 30)]\n", encoding="utf-8")
    with open(tmp_path / "release_pairs_dev.jsonl", "w") as f:
        for k in range(2):
            f.write(json.dumps({"id": f"p/a.py:f{k}", "kind": "unchanged", "prompt": "def f(x):\n" * (k + 1),
                                "output": "    return x + 1\ndef f(x):\n"}) + "\n")
    bench = _load_bench(monkeypatch)
    monkeypatch.setattr(bench, "CACHE", tmp_path / "cache")
    bench.main(["--data", str(tmp_path), "--sets", "pairs-dev", "--repeats", "1", "--no-others"])
    got = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    st = got["sets"]["pairs-dev"]
    assert st["traces"] == 2 and st["corpus_documents"] == 1
    for b in ("16", "64"):
        r = st["budgets"][b]
        assert 0 < r["with_corpus"] <= r["copy_oracle_with"] and r["bound_without"] <= r["bound_with"]
    assert got["latency_us"]["pairs-dev"]["16"]["proposals"] > 0
    sys.modules.pop("make_release_pairs", None)
