"""Recipe: code-edit traces from two versions of the Python standard library on this machine.

Each trace is one edited region of a module that changed between two CPython versions: the
prompt shows the old region (with a short instruction), the output is the new region, which a
model asked to rewrite the code copies heavily from the prompt. Text fields, so any tokenizer
can replay them: `suffixspec simulate traces.jsonl --tokenizer default`.

    python corpora/make_code_edit_traces.py --old 3.12.1 --new 3.13.0 --limit 40 -o traces.jsonl

The shipped sample `code_edit_traces.jsonl` was made with the command above (Python Software
Foundation License: the regions are CPython source).
"""

import argparse
import difflib
import json
import os
import tempfile
from pathlib import Path

PYENV = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"


def stdlib_dir(version: str) -> Path:
    major_minor = ".".join(version.split(".")[:2])
    return PYENV / version / "lib" / f"python{major_minor}"


def edit_regions(old_lines, new_lines, context=12, max_lines=80):
    """Yield (old_region, new_region) around each group of changes, at most max_lines long."""
    matcher = difflib.SequenceMatcher(None, old_lines, new_lines, autojunk=False)
    for group in matcher.get_grouped_opcodes(context):
        i1, i2 = group[0][1], group[-1][2]
        j1, j2 = group[0][3], group[-1][4]
        if 4 <= i2 - i1 <= max_lines and 4 <= j2 - j1 <= max_lines:
            yield "".join(old_lines[i1:i2]), "".join(new_lines[j1:j2])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", default="3.12.1")
    ap.add_argument("--new", default="3.13.0")
    ap.add_argument("--limit", type=int, default=40, help="number of traces")
    ap.add_argument("--per-file", type=int, default=1, help="regions taken per module")
    ap.add_argument("-o", "--output", required=True)
    args = ap.parse_args(argv)
    old_dir, new_dir = stdlib_dir(args.old), stdlib_dir(args.new)
    traces = []
    for old_path in sorted(old_dir.glob("*.py")):
        new_path = new_dir / old_path.name
        if not new_path.exists():
            continue
        old = old_path.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)
        new = new_path.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)
        if old == new:
            continue
        for k, (before, after) in enumerate(edit_regions(old, new)):
            if k >= args.per_file:
                break
            prompt = f"Update this code from {old_path.name} (Python {args.old}) to its Python {args.new} version:\n```python\n{before}```\n"
            traces.append({"id": f"{old_path.name}#{k}", "prompt": prompt, "output": f"```python\n{after}```\n"})
        if len(traces) >= args.limit:
            break
    out = Path(args.output)
    fd, tmp = tempfile.mkstemp(dir=out.parent if str(out.parent) else ".", suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        for t in traces:
            f.write(json.dumps(t) + "\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, out)
    print(f"wrote {len(traces)} traces to {out}")


if __name__ == "__main__":
    main()
