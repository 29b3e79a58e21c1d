"""Regenerate the editor workload's repository from an installed markdown-it-py.

    pip download --no-deps markdown-it-py==4.3.0   # or: pip install --no-deps markdown-it-py==4.3.0
    python corpora/make_editor_repo.py [PATH/TO/markdown_it]

Writes `editor_sessions.jsonl` (the files the editor workload's users type functions of) and
`editor_corpus.jsonl` (every other Python file of the package: the corpus a `--corpus` index is built
from), one file per line with `id` (its path in the package), `text` and `tags` (`repo=markdown-it-py`,
`lang=python`), and writes the package's licences (MIT: its own and markdown-it's, which it ports) to `editor_repo_LICENSE.txt`. The source is
markdown-it-py 4.3.0 (MIT License, Copyright (c) 2020 ExecutableBookProject); output is deterministic
for a given source.
"""

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
VERSION = "4.3.0"
# files whose functions users type (block and inline rules: the rest of the package has many like them)
SESSION_FILES = ("rules_block/hr.py", "rules_inline/entity.py", "rules_block/heading.py", "rules_inline/newline.py",
                 "rules_block/paragraph.py", "rules_inline/escape.py")
TAGS = {"repo": "markdown-it-py", "lang": "python"}


def main(argv):
    if argv:
        root = Path(argv[0])
    else:
        import markdown_it

        root = Path(markdown_it.__file__).parent
    from importlib.metadata import distribution

    dist = distribution("markdown-it-py")
    if dist.version != VERSION:
        print(f"warning: markdown-it-py {dist.version} installed, the shipped files are from {VERSION}", file=sys.stderr)
    files = sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)
    sessions, corpus = [], []
    for path in files:
        rel = path.relative_to(root).as_posix()
        row = {"id": f"markdown_it/{rel}", "text": path.read_text(encoding="utf-8"), "tags": TAGS}
        (sessions if rel in SESSION_FILES else corpus).append(row)
    sessions.sort(key=lambda r: SESSION_FILES.index(r["id"].split("/", 1)[1]))
    for name, rows in (("editor_sessions.jsonl", sessions), ("editor_corpus.jsonl", corpus)):
        with open(HERE / name, "w", encoding="utf-8") as handle:
            for row in rows:
                handle.write(json.dumps(row, ensure_ascii=False) + "\n")
    # the package's licence and that of markdown-it (JavaScript), which it ports: both MIT
    texts = [Path(dist.locate_file(f)).read_text(encoding="utf-8")
             for name in ("LICENSE", "LICENSE.markdown-it") for f in dist.files if f.name == name]
    (HERE / "editor_repo_LICENSE.txt").write_text("\n\n".join(texts), encoding="utf-8")
    print(f"markdown-it-py {dist.version}: {len(sessions)} session files, {len(corpus)} corpus files "
          f"({sum(len(r['text']) for r in corpus)} chars)")


if __name__ == "__main__":
    main(sys.argv[1:])
