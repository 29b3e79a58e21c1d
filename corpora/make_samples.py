"""Regenerate the sample corpora from the Python standard library on this machine.

    python corpora/make_samples.py

Writes `python_stdlib.jsonl` (one top-level function or class per line, with `repo=` the
module and `lang=python`) and `stdlib_docs.jsonl` (module docstrings, `lang=en`). The source
is the Python standard library (PSF License Agreement, see README.md); output is deterministic
for a given Python version.
"""

import ast
import json
import sys
import sysconfig
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODULES = ("textwrap", "shlex", "fnmatch", "bisect", "heapq", "glob", "colorsys", "string", "reprlib",
           "difflib", "argparse", "json/decoder", "json/encoder", "csv", "queue")
MAX_DEF_CHARS = 6000
BUDGET = 300_000


def main():
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    code, docs, used = [], [], 0
    for mod in MODULES:
        path = stdlib / f"{mod}.py"
        src = path.read_text(encoding="utf-8")
        tree = ast.parse(src)
        lines = src.splitlines(keepends=True)
        repo = mod.split("/")[0]
        doc = ast.get_docstring(tree)
        if doc:
            docs.append({"id": f"{mod}.py", "text": doc, "tags": {"repo": repo, "lang": "en"}})
        for node in tree.body:
            if not isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                continue
            start = min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1
            text = "".join(lines[start:node.end_lineno])
            if len(text) > MAX_DEF_CHARS or used + len(text) > BUDGET:
                continue
            used += len(text)
            code.append({"id": f"{mod}.py:{node.name}", "text": text, "tags": {"repo": repo, "lang": "python"}})
    for name, rows in (("python_stdlib.jsonl", code), ("stdlib_docs.jsonl", docs)):
        with open(HERE / name, "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"python {sys.version.split()[0]}: {len(code)} code documents ({used} chars), {len(docs)} docstrings")


if __name__ == "__main__":
    main()
