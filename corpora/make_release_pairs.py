"""Recipe: corpus-drafting requests on pairs of releases of real Python projects (PyPI sdists).

Each project contributes one pair of releases: the *older* release's `.py` files are the corpus
(one document per file, id `project/path`), and each request completes a function of the *newer*
release from the text that precedes it in its file. Every request carries the real code that
follows (no model is run), so replay measures what a drafter would copy of the code as it now is:

- `prompt`: the newer file up to and including the function's header, its last PROMPT_CHARS
  characters cut at a line start;
- `output`: the function's body as the newer release has it, its first OUTPUT_CHARS characters
  cut at a line end (at least one line);
- `kind`: `unchanged` (the older release has this function, same qualified name in the same file,
  with the same source), `edited` (it has it, with another source: an edit between the releases)
  or `added` (it has no such function).

Two sets that share no project, so tuning on `dev` cannot leak into `heldout` (PAIRS). Per project,
functions whose body spans at least MIN_BODY_LINES lines and starts past line MIN_LINE; at most
PER_PROJECT requests: the changed ones (edited, added) first up to half, then unchanged ones, each
in crc32 order of their id. Text only: `bench/bench_corpus_drafting.py` tokenizes it with either
tokenizer (the default's, the code model's) and builds the corpus index from the same sdists.

    python corpora/make_release_pairs.py --set dev -o corpora/release_pairs_dev.jsonl
    python corpora/make_release_pairs.py --set heldout -o corpora/release_pairs_heldout.jsonl

Sdists come from the registry (`pip download --no-deps --no-binary :all: PKG==VER` into
`--sdists`, default bench/.cache/sdists) and are checked against MANIFEST (file name, bytes,
sha256, licence); `--write-manifest` records them instead. Deterministic from those files.
The code in the sets is the projects' own, under their licences (MANIFEST, corpora/README.md).
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
MANIFEST = HERE / "release_pairs_manifest.json"
DEFAULT_SDISTS = HERE.parent / "bench" / ".cache" / "sdists"

# set -> (project, older release, newer release, licence); no project in two sets
PAIRS = {
    "dev": [("click", "8.1.3", "8.1.7", "BSD-3-Clause"), ("requests", "2.31.0", "2.32.3", "Apache-2.0"),
            ("attrs", "23.1.0", "23.2.0", "MIT"), ("jinja2", "3.1.2", "3.1.4", "BSD-3-Clause"),
            ("more-itertools", "10.1.0", "10.3.0", "MIT")],
    "heldout": [("werkzeug", "3.0.1", "3.0.4", "BSD-3-Clause"), ("rich", "13.7.0", "13.8.0", "MIT"),
                ("packaging", "23.2", "24.1", "Apache-2.0 OR BSD-2-Clause"),
                ("httpx", "0.27.0", "0.27.2", "BSD-3-Clause")],
}
PROMPT_CHARS = 4096
OUTPUT_CHARS = 384
MIN_BODY_LINES = 6
MIN_LINE = 20
PER_PROJECT = 12


class ReleaseError(Exception):
    """A release file that is missing, damaged or not the one the manifest records."""


@dataclass(frozen=True)
class Function:
    """One function of a file: its qualified name, the text before its body, its body's text."""

    qualname: str
    head: str
    body: str
    lineno: int


def _norm(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def find_sdist(folder: Path, project: str, version: str) -> Path | None:
    """The sdist of `project`==`version` in `folder` (names normalised as the registry does)."""
    for path in sorted(folder.glob("*")):
        name = path.name
        for ext in (".tar.gz", ".zip"):
            if name.endswith(ext):
                stem = name[: -len(ext)]
                base, _, ver = stem.rpartition("-")
                if _norm(base) == _norm(project) and ver == version:
                    return path
    return None


def fetch(project: str, version: str, folder: Path) -> Path:
    """The sdist of `project`==`version` in `folder`, downloaded with pip when absent."""
    found = find_sdist(folder, project, version)
    if found is None:
        folder.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-q",
               f"{project}=={version}", "-d", str(folder)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        found = find_sdist(folder, project, version)
        if found is None:
            raise ReleaseError(f"{project}=={version}: pip download gave no sdist ({done.stderr.strip()[-300:]})")
    return found


def checked(path: Path, manifest: dict) -> Path:
    """`path`, after its size and sha256 matched the manifest's entry for its file name."""
    entry = manifest.get("files", {}).get(path.name)
    if entry is None:
        raise ReleaseError(f"{path.name}: not in the manifest {MANIFEST.name} (run with --write-manifest to record it)")
    digest = sha256(path)
    if digest != entry["sha256"] or path.stat().st_size != entry["bytes"]:
        raise ReleaseError(f"{path}: expected sha256 {entry['sha256']} ({entry['bytes']} bytes), "
                           f"got {digest} ({path.stat().st_size} bytes)")
    return path


def python_files(archive: Path) -> dict[str, str]:
    """{path inside the release (its top folder stripped): text} of the archive's `.py` files."""
    out = {}
    if archive.name.endswith(".zip"):
        with zipfile.ZipFile(archive) as z:
            members = [(i.filename, lambda i=i: z.read(i)) for i in z.infolist() if not i.is_dir()]
            out = _decode(members)
    else:
        with tarfile.open(archive, "r:gz") as t:
            members = [(m.name, lambda m=m: t.extractfile(m).read()) for m in t.getmembers() if m.isfile()]
            out = _decode(members)
    return dict(sorted(out.items()))


def _decode(members) -> dict[str, str]:
    out = {}
    for name, read in members:
        parts = name.split("/", 1)
        if len(parts) == 2 and parts[1].endswith(".py"):
            out[parts[1]] = io.TextIOWrapper(io.BytesIO(read()), encoding="utf-8", errors="replace",
                                             newline="").read()
    return out


def functions(text: str) -> dict[str, Function]:
    """Every function of `text` worth a request, by qualified name (first definition wins)."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return {}
    lines = text.splitlines(keepends=True)
    out: dict[str, Function] = {}

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef) and child.end_lineno:
                    start = child.body[0].lineno
                    if (child.end_lineno - start + 1 >= MIN_BODY_LINES and start > child.lineno
                            and child.lineno > MIN_LINE and name not in out):
                        out[name] = Function(name, "".join(lines[: start - 1]),
                                             "".join(lines[start - 1 : child.end_lineno]), child.lineno)
                visit(child, name + ".")

    visit(tree, "")
    return out


def _tail(text: str, chars: int) -> str:
    """The last `chars` characters of `text`, from a line start."""
    if len(text) <= chars:
        return text
    cut = text.find("\n", len(text) - chars)
    return text[cut + 1 :] if cut >= 0 else text[-chars:]


def _head(text: str, chars: int) -> str:
    """The first `chars` characters of `text` to a line end, at least its first line."""
    if len(text) <= chars:
        return text
    cut = text.rfind("\n", 0, chars)
    if cut < 0:
        cut = text.find("\n")
    return text[: cut + 1] if cut >= 0 else text


def project_requests(set_name: str, project: str, old: dict[str, str], new: dict[str, str], versions) -> list[dict]:
    """The requests of one project pair (module docstring), in selection order."""
    found = {"unchanged": [], "edited": [], "added": []}
    for path, text in new.items():
        before = functions(old[path]) if path in old else {}
        for name, fn in functions(text).items():
            if name not in before:
                kind = "added"
            elif before[name].body == fn.body and _sig(before[name]) == _sig(fn):
                kind = "unchanged"
            else:
                kind = "edited"
            fid = f"{project}/{path}:{name}"
            found[kind].append((zlib.crc32(fid.encode()), fid, kind, fn))
    for v in found.values():
        v.sort(key=lambda r: (r[0], r[1]))
    changed = sorted(found["edited"] + found["added"], key=lambda r: (r[0], r[1]))[: PER_PROJECT // 2]
    picked = changed + found["unchanged"][: PER_PROJECT - len(changed)]
    return [{"id": fid, "set": set_name, "project": project, "old": versions[0], "new": versions[1], "kind": kind,
             "prompt": _tail(fn.head, PROMPT_CHARS), "output": _head(fn.body, OUTPUT_CHARS)}
            for _, fid, kind, fn in picked]


def _sig(fn: Function) -> str:
    """The function's header line(s) (the end of the text before its body, from its `def`)."""
    i = fn.head.rfind("def ")
    return fn.head[i:] if i >= 0 else ""


def load_manifest() -> dict:
    return json.loads(MANIFEST.read_text(encoding="utf-8")) if MANIFEST.exists() else {"files": {}}


def releases(set_name: str, sdists: Path, manifest: dict, download: bool = True):
    """(project, licence, older archive, newer archive, (old version, new version)) of each pair."""
    out = []
    for project, old, new, licence in PAIRS[set_name]:
        paths = []
        for version in (old, new):
            path = fetch(project, version, sdists) if download else find_sdist(sdists, project, version)
            if path is None:
                raise ReleaseError(f"{project}=={version}: no sdist in {sdists}")
            paths.append(checked(path, manifest))
        out.append((project, licence, paths[0], paths[1], (old, new)))
    return out


def corpus_documents(set_name: str, sdists: Path = DEFAULT_SDISTS, manifest: dict | None = None,
                     download: bool = True) -> list[tuple[str, str]]:
    """(document id `project/path`, text) of the set's corpus: the older releases' `.py` files."""
    manifest = load_manifest() if manifest is None else manifest
    docs = []
    for project, _lic, old, _new, _v in releases(set_name, sdists, manifest, download):
        docs.extend((f"{project}/{p}", t) for p, t in python_files(old).items())
    return docs


def build_requests(set_name: str, sdists: Path = DEFAULT_SDISTS, manifest: dict | None = None,
                   download: bool = True) -> list[dict]:
    """Every request of the set, projects in PAIRS order."""
    manifest = load_manifest() if manifest is None else manifest
    out = []
    for project, _lic, old, new, versions in releases(set_name, sdists, manifest, download):
        out.extend(project_requests(set_name, project, python_files(old), python_files(new), versions))
    return out


def write_manifest(sdists: Path) -> None:
    files = {}
    for set_name, pairs in PAIRS.items():
        for project, old, new, licence in pairs:
            for version in (old, new):
                path = fetch(project, version, sdists)
                files[path.name] = {"project": project, "version": version, "set": set_name, "licence": licence,
                                    "bytes": path.stat().st_size, "sha256": sha256(path)}
    MANIFEST.write_text(json.dumps({"files": dict(sorted(files.items()))}, indent=1) + "\n", encoding="utf-8")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--set", choices=sorted(PAIRS))
    ap.add_argument("--sdists", default=str(DEFAULT_SDISTS), help="folder of the downloaded sdists")
    ap.add_argument("--write-manifest", action="store_true", help="download every release and record the manifest")
    ap.add_argument("-o", "--output")
    args = ap.parse_args(argv)
    sdists = Path(args.sdists)
    if args.write_manifest:
        write_manifest(sdists)
        print(f"wrote {MANIFEST}")
    if args.set is None:
        return
    if not args.output:
        ap.error("--set needs -o/--output")
    rows = build_requests(args.set, sdists)
    out = Path(args.output)
    fd, tmp = tempfile.mkstemp(dir=out.parent if str(out.parent) else ".", suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, out)
    kinds = {k: sum(r["kind"] == k for r in rows) for k in ("unchanged", "edited", "added")}
    print(f"wrote {len(rows)} requests to {out} ({kinds})")


if __name__ == "__main__":
    main()
