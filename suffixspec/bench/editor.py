"""Editor sessions over a repository: a user types functions of a file line by line.

Contract: `editor_sessions(files, ...)` returns one `EditorSession` per function typed (in file order,
at most `sessions`), each a list of `Keystroke`s: the debounced points where the editor sends a
fill-in-the-middle request. A function's body is typed line by line; at the end of each line before
a non-blank one the user pauses (`waits`: the editor's request is answered before the user goes on;
the cursor before the line's newline, so the completion starts with it); with probability `mid_line`
(seeded) the user also pauses inside the next line after a word, only long enough for the debounce (`waits` False: the next keystroke
supersedes the request, which the editor cancels if it is still running). At every keystroke
`prefix + expected + suffix` is the whole file: `prefix` is the file up to the cursor, `expected` what
the user types next (the rest of the function), `suffix` the rest of the file after the function.
The prefix and suffix are cut to at most `prefix_chars` / `suffix_chars` at line boundaries
(`context`), as editors send a window. `stop_sequences(indent)` ends a completion at the end of the
block; `matches(completion, expected)` says whether the user would keep the whole suggestion.
Everything is deterministic for a seed; nothing here touches a model.
"""

from __future__ import annotations

import ast
import json
import random
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import BadInputError

__all__ = ["RepoFile", "Keystroke", "EditorSession", "load_repo", "editor_sessions", "stop_sequences", "matches",
           "first_line_matches", "context", "shipped_repo", "EDITOR_MAX_TOKENS"]

EDITOR_MAX_TOKENS = 32  # a completion's token limit (an editor asks for the rest of a line or a few lines)


@dataclass(frozen=True)
class RepoFile:
    path: str
    text: str
    tags: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Keystroke:
    """One debounced request: the text around the cursor and what the user types next."""

    session: str
    index: int  # its position in the session
    prefix: str  # the file before the cursor (cut to the window)
    suffix: str  # the file after the function being typed (cut to the window)
    expected: str  # what the user types next: the rest of the function from the cursor
    waits: bool  # the user waits for the completion (end of a line); else types on and supersedes it
    stop: tuple[str, ...]
    tags: dict


@dataclass
class EditorSession:
    id: str
    path: str
    function: str
    tags: dict
    keystrokes: list[Keystroke]


def load_repo(path) -> list[RepoFile]:
    """The files of a JSONL repository (`id`, `text`, optional `tags`), as `corpora/make_editor_repo.py` writes."""
    files = []
    with open(path, encoding="utf-8") as handle:
        for n, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError as exc:
                raise BadInputError(f"{path}:{n}: not a JSON object ({exc})") from None
            if not isinstance(rec, dict) or not isinstance(rec.get("text"), str):
                raise BadInputError(f"{path}:{n}: expected an object with a string 'text' field")
            files.append(RepoFile(str(rec.get("id", n)), rec["text"], dict(rec.get("tags") or {})))
    return files


def stop_sequences(indent: str) -> tuple[str, ...]:
    """Where a completion inside a function indented by `indent` ends: the next definition at that
    level (or at the top level) or two blank lines. Four at most (OpenAI's limit)."""
    if not indent:
        return ("\ndef ", "\nclass ", "\n@", "\n\n\n")
    return (f"\n{indent}def ", f"\n{indent}@", "\nclass ", "\n\n\n")


def matches(completion: str, expected: str) -> bool:
    """The whole suggestion is what the user typed next (trailing blanks aside): non-empty and a prefix of it."""
    text = completion.rstrip()
    return bool(text.strip()) and expected.startswith(text)


def first_line_matches(completion: str, expected: str) -> bool:
    """The suggestion's first line (its leading newlines aside) is the line the user typed next."""
    first = completion.lstrip("\n").split("\n", 1)[0].rstrip()
    return bool(first.strip()) and first == expected.lstrip("\n").split("\n", 1)[0].rstrip()


def _functions(text: str) -> list[tuple[str, int, int]]:
    """(name, first line, end line) of every function (methods too), 0-based, end exclusive, in order;
    decorators are part of the function."""
    tree = ast.parse(text)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            start = min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1
            found.append((node.name, start, node.end_lineno))
    found.sort(key=lambda f: f[1])
    return [f for i, f in enumerate(found) if not any(o[1] < f[1] < o[2] for o in found[:i])]  # outermost only


def context(prefix: str, suffix: str, prefix_chars: int | None, suffix_chars: int | None) -> tuple[str, str]:
    """The window an editor sends: the last `prefix_chars` of the prefix from a line start, the first
    `suffix_chars` of the suffix to a line end (None: all of it)."""
    if prefix_chars is not None and len(prefix) > prefix_chars:
        cut = prefix.find("\n", len(prefix) - prefix_chars)
        prefix = prefix[cut + 1:] if cut >= 0 else prefix[-prefix_chars:]
    if suffix_chars is not None and len(suffix) > suffix_chars:
        cut = suffix.rfind("\n", 0, suffix_chars)
        suffix = suffix[: cut + 1] if cut >= 0 else suffix[:suffix_chars]
    return prefix, suffix


def _mid_cut(line: str, rng: random.Random) -> int | None:
    """A cursor inside `line` (after its indentation) just after a word, or None."""
    body = len(line) - len(line.lstrip())
    spots = [i + 1 for i in range(body, len(line.rstrip("\n")) - 1) if line[i] in " (.=[" and line[i + 1] != " "]
    return rng.choice(spots) if spots else None


def editor_sessions(files: list[RepoFile], sessions: int | None = None, max_keystrokes: int = 16,
                    mid_line: float = 0.25, seed: int = 0, prefix_chars: int | None = 3000,
                    suffix_chars: int | None = 1000, min_lines: int = 4) -> list[EditorSession]:
    """Sessions typing every function of at least `min_lines` lines of `files` (in order), at most
    `sessions`; each at most `max_keystrokes` end-of-line keystrokes (its mid-line ones come on top)."""
    rng = random.Random(seed)
    out: list[EditorSession] = []
    for f in files:
        try:
            functions = _functions(f.text)
        except SyntaxError as exc:
            raise BadInputError(f"editor repository: {f.path} is not Python ({exc.msg}, line {exc.lineno})") from None
        lines = f.text.splitlines(keepends=True)
        for name, start, end in functions:
            if end - start < min_lines:
                continue
            if sessions is not None and len(out) >= sessions:
                return out
            sid = f"{f.path}:{name}"
            head, tail = "".join(lines[:start]), "".join(lines[end:])
            indent = lines[start][: len(lines[start]) - len(lines[start].lstrip())]
            stop = stop_sequences(indent)
            strokes: list[Keystroke] = []
            ends = 0
            for k in range(start + 1, end):  # the cursor on line k: lines start..k-1 typed
                line = lines[k]
                if not line.strip():
                    continue  # an empty line is typed without a pause
                if ends >= max_keystrokes:
                    break
                typed = head + "".join(lines[start:k])  # ends with the newline of line k - 1
                rest = "".join(lines[k:end])
                # the pause at the end of line k - 1, before its newline: the next line is all to come
                prefix, suffix = context(typed[:-1], tail, prefix_chars, suffix_chars)
                strokes.append(Keystroke(sid, len(strokes), prefix, suffix, "\n" + rest, True, stop, dict(f.tags)))
                cut = _mid_cut(line, rng) if rng.random() < mid_line else None
                if cut is not None:  # a pause inside line k, after a word
                    prefix, suffix = context(typed + line[:cut], tail, prefix_chars, suffix_chars)
                    strokes.append(Keystroke(sid, len(strokes), prefix, suffix, rest[cut:], False, stop, dict(f.tags)))
                ends += 1
            if strokes:
                out.append(EditorSession(sid, f.path, name, dict(f.tags), strokes))
    return out


def shipped_repo() -> tuple[Path, Path]:
    """The shipped repository's session files and corpus files (`corpora/editor_*.jsonl`)."""
    from .workloads import corpora_dir

    root = corpora_dir()
    return root / "editor_sessions.jsonl", root / "editor_corpus.jsonl"
