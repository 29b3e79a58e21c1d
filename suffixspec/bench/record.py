"""Recording a benchmark's result: one JSON line appended to a results file.

Contract
--------
- ``record_line(benchmark, result, argv=None, where=None) -> dict``: the line kept for one run of a
  benchmark: ``{"benchmark", "date" (ISO 8601, UTC, seconds), "host" (see ``host()``),
  "git_revision" (``git rev-parse HEAD`` of the checkout holding ``where``, default this package's
  folder: the code that was measured; None outside a git checkout or without git), "git_dirty"
  (tracked files modified; None with no revision), "command" (``argv``, default ``sys.argv``),
  "result" (the benchmark's own JSON line, unchanged)}``.
- ``host() -> dict``: ``{"cpu" (the model name from /proc/cpuinfo, else ``platform.processor()`` or
  ``platform.machine()``), "logical_cores", "platform", "python", "torch_threads" (only when torch
  is already imported: this never imports it)}``.
- ``append_record(path, benchmark, result, argv=None, where=None) -> dict``: appends
  ``record_line(...)`` as one line of JSON to ``path`` (folders made as needed) and returns it.
- ``default_results_dir() -> Path``: ``bench/results`` of the checkout this package lives in, else
  ``bench/results`` under the current directory.
- ``add_record_flag(parser)`` adds ``--record [PATH]`` to a script's parser; ``emit(result, args,
  benchmark, results_dir=None)`` prints ``result`` as the JSON line last and, when ``args.record`` is
  set, appends it to that path (``""``: ``<results_dir>/<benchmark>.jsonl``, default
  ``default_results_dir()``), ``where`` being the imported ``suffixspec`` (the code measured).

Standard library only, so that a benchmark script can load this file by path when the ``suffixspec``
it times is an older revision without it.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

__all__ = ["add_record_flag", "append_record", "default_results_dir", "emit", "git_revision", "host", "record_line"]

_PACKAGE_DIR = Path(__file__).resolve().parents[1]


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "cpu model") and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def host() -> dict:
    out = {"cpu": _cpu_model(), "logical_cores": os.cpu_count(), "platform": platform.platform(),
           "python": platform.python_version()}
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "get_num_threads"):
        out["torch_threads"] = int(torch.get_num_threads())
    return out


def _git(where: Path, *args: str) -> str | None:
    try:
        r = subprocess.run(["git", "-C", str(where), *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout if r.returncode == 0 else None


def git_revision(where: str | os.PathLike | None = None) -> tuple[str | None, bool | None]:
    """(commit, dirty) of the git checkout holding `where`; (None, None) outside one."""
    where = Path(where) if where is not None else _PACKAGE_DIR
    head = _git(where, "rev-parse", "HEAD")
    if not head:
        return None, None
    status = _git(where, "status", "--porcelain", "--untracked-files=no")
    return head.strip(), (bool(status.strip()) if status is not None else None)


def record_line(benchmark: str, result, argv=None, where=None) -> dict:
    commit, dirty = git_revision(where)
    return {"benchmark": benchmark,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "host": host(), "git_revision": commit, "git_dirty": dirty,
            "command": list(sys.argv if argv is None else argv), "result": result}


def append_record(path, benchmark: str, result, argv=None, where=None) -> dict:
    line = record_line(benchmark, result, argv, where)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(line) + "\n")
    return line


def default_results_dir() -> Path:
    checkout = _PACKAGE_DIR.parent
    if (checkout / "bench").is_dir() and (checkout / ".git").exists():
        return checkout / "bench" / "results"
    return Path.cwd() / "bench" / "results"


def add_record_flag(parser) -> None:
    parser.add_argument("--record", nargs="?", const="", default=None, metavar="PATH",
                        help="append the JSON line, with the date, host, git revision and command line, to PATH "
                             "(default bench/results/<benchmark>.jsonl)")


def emit(result, args, benchmark: str, results_dir=None) -> dict | None:
    """Print `result` as the JSON line last; with `args.record`, append it to the results file."""
    print(json.dumps(result), flush=True)
    path = getattr(args, "record", None)
    if path is None:
        return None
    path = Path(path) if path else Path(results_dir or default_results_dir()) / f"{benchmark}.jsonl"
    measured = sys.modules.get("suffixspec")
    where = Path(measured.__file__).parent if getattr(measured, "__file__", None) else _PACKAGE_DIR
    line = append_record(path, benchmark, result, where=where)
    print(f"recorded in {path}", file=sys.stderr)
    return line
