"""Recipe: repository-context completion traces with a stale corpus, from two CPython versions.

The "repository" is a set of top-level standard-library modules; its *corpus* is those modules'
files in the older Python (one document per file), and each trace completes a function of the
newer Python's file from the text that precedes it there (the file up to and including the
function's header, its last `--prompt-tokens` tokens). The output is the embedded default model's
greedy completion (plain `model.generate`, `--max-new-tokens` tokens), as token ids, so
`suffixspec simulate` replays exactly what the model would produce.

Two sets that share no module and no Python pair, so that tuning on one cannot leak into the other:

    python corpora/make_corpus_completion_traces.py --set dev -o corpora/corpus_completion_dev.jsonl
    python corpora/make_corpus_completion_traces.py --set heldout -o corpora/corpus_completion_heldout.jsonl

- `dev`: modules whose name hashes even (crc32), corpus CPython 3.11.7, functions of 3.12.1;
- `heldout`: modules whose name hashes odd, corpus CPython 3.12.1, functions of 3.13.0.

`corpus_files(set)` lists the corpus documents (what `bench/bench_corpus_drafting.py` indexes at
run time from the same pyenv root: the index is never committed). Functions are taken one per
module in turn (modules in name order, functions in file order past line 40, bodies of at least
6 lines), up to
`--limit`. Each line: `id` (module.py:function), `set`, `prompt_ids`, `output_ids`. Deterministic for
given Pythons, model and transformers version. The code is CPython source (Python Software
Foundation License).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import sys
import tempfile
import time
import zlib
from pathlib import Path

PYENV = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
SETS = {
    "dev": {"old": "3.11.7", "new": "3.12.1", "part": 0},
    "heldout": {"old": "3.12.1", "new": "3.13.0", "part": 1},
}
MAX_MODULES = 60  # the repository's size: about the 59 documents
MIN_BYTES, MAX_BYTES = 3000, 60000
MIN_LINE = 40  # functions with at least this much preceding text


def stdlib_dir(version: str) -> Path:
    major_minor = ".".join(version.split(".")[:2])
    return PYENV / version / "lib" / f"python{major_minor}"


def modules(name: str) -> list[str]:
    """The set's module file names (present in both Pythons, sized MIN_BYTES..MAX_BYTES in the
    older one), in name order, at most MAX_MODULES."""
    spec = SETS[name]
    old, new = stdlib_dir(spec["old"]), stdlib_dir(spec["new"])
    out = []
    for path in sorted(old.glob("*.py")):
        if zlib.crc32(path.stem.encode()) % 2 != spec["part"] or not (new / path.name).exists():
            continue
        if MIN_BYTES <= path.stat().st_size <= MAX_BYTES:
            out.append(path.name)
    return out[:MAX_MODULES]


def corpus_files(name: str) -> list[Path]:
    """The corpus documents of set `name`: its modules in the older Python."""
    old = stdlib_dir(SETS[name]["old"])
    return [old / m for m in modules(name)]


def function_prompts(name: str):
    """(id, preceding text) per candidate function of the newer Python, one module at a time in turn."""
    new = stdlib_dir(SETS[name]["new"])
    per_module = []
    for m in modules(name):
        src = (new / m).read_text(encoding="utf-8", errors="replace")
        try:
            tree = ast.parse(src)
        except SyntaxError:
            continue
        lines = src.splitlines(keepends=True)
        found = []
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno:
                body_start = node.body[0].lineno
                if node.end_lineno - body_start + 1 >= 6 and body_start > node.lineno and node.lineno > MIN_LINE:
                    found.append((node.lineno, f"{m}:{node.name}", "".join(lines[: body_start - 1])))
        found.sort()
        per_module.append([(fid, text) for _, fid, text in found])
    k = 0
    while any(k < len(f) for f in per_module):
        for f in per_module:
            if k < len(f):
                yield f[k]
        k += 1


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--set", choices=sorted(SETS), required=True)
    ap.add_argument("--limit", type=int, default=48, help="functions (traces)")
    ap.add_argument("--prompt-tokens", type=int, default=1024)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("-o", "--output", required=True)
    args = ap.parse_args(argv)

    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from suffixspec.models import load_model

    torch.set_num_threads(args.threads)
    model, tok = load_model(None)
    out = Path(args.output)
    fd, tmp = tempfile.mkstemp(dir=out.parent if str(out.parent) else ".", suffix=".tmp")
    t0 = time.time()
    n = 0
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        for fid, text in function_prompts(args.set):
            if n >= args.limit:
                break
            prompt_ids = tok.encode(text)[-args.prompt_tokens :]
            with torch.no_grad():
                gen = model.generate(torch.tensor([prompt_ids]), max_new_tokens=args.max_new_tokens, do_sample=False,
                                     attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long))
            output_ids = gen[0, len(prompt_ids) :].tolist()
            f.write(json.dumps({"id": fid, "set": args.set, "prompt_ids": prompt_ids, "output_ids": output_ids}) + "\n")
            n += 1
            print(f"{fid}: {len(prompt_ids)} + {len(output_ids)} tokens, {time.time() - t0:.0f} s", flush=True)
    os.chmod(tmp, 0o644)
    os.replace(tmp, out)
    print(f"wrote {n} traces to {out}")


if __name__ == "__main__":
    main()
