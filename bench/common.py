"""What the benchmark scripts of this folder share: paths, the JSON line last and its record, the
lookup of data and peers given by flag or environment variable, a `suffixspec serve` to talk to.

The scripts import this folder's modules as siblings (``import common``, ``import _data``,
``import _peers``): ``python bench/x.py`` puts ``bench/`` first on ``sys.path``. ``suffixspec`` is
the installed package (or the checkout on ``PYTHONPATH``); nothing here edits ``sys.path``.

Contract
--------
- ``ROOT`` (this checkout), ``CORPORA`` (its ``corpora/``), ``CACHE`` (``bench/.cache``: tokenized
  data kept between runs, never committed), ``RESULTS`` (``bench/results``: recorded runs).
- ``add_record_flag(parser)``: ``--record [PATH]``; ``emit(result, args, benchmark)`` prints
  ``result`` as the one JSON line last and, with ``--record``, appends it with the date, the host,
  the git revision of the measured ``suffixspec`` and the command line to ``PATH`` (default
  ``bench/results/<benchmark>.jsonl``): ``suffixspec.bench.record``'s, or this checkout's copy of
  that file when the ``suffixspec`` being timed is an older revision without it.
- ``given(value, env) -> str | None``: a path given by a flag (its parsed ``value``), else by the
  environment variable ``env``, else None; ``missing(what, flag, env)`` is the message saying so.
- ``free_port()``; ``start_server(cmd, port, log_path, ...)``: any server command, returned with its URL
  once ``/health`` answers 200; ``spawn_server(model, max_batch, log_path, extra=(), env=None)``:
  ``suffixspec serve`` of this interpreter on a free loopback port, the same way.
- ``load_test_support(name)``: ``tests/support/<name>.py`` loaded from its file (no ``sys.path`` edit).
- ``read_jsonl(path)``: a JSONL file's objects, blank lines skipped; ``user_turn(text)``: ``text`` as one
  ChatML user turn with no system prompt, the assistant's turn opened (the embedded models' template).
- ``SPECBENCH_ENV`` / ``SPECBENCH_DEFAULT``: the variable naming Spec-Bench's question file and the
  shared sample used when it is unset (``../shared/data/specbench-dev.jsonl``, where it exists).
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORPORA = ROOT / "corpora"
CACHE = ROOT / "bench" / ".cache"
RESULTS = ROOT / "bench" / "results"
SPECBENCH_ENV = "SUFFIXSPEC_SPECBENCH"
SPECBENCH_DEFAULT = ROOT.parent / "shared" / "data" / "specbench-dev.jsonl"


def _record_module():
    """`suffixspec.bench.record`; when the `suffixspec` being timed is an older revision without it
    (`PYTHONPATH=` another checkout), this checkout's copy of the file (standard library only)."""
    try:
        from suffixspec.bench import record
    except ImportError:
        spec = importlib.util.spec_from_file_location("suffixspec_bench_record",
                                                      ROOT / "suffixspec" / "bench" / "record.py")
        record = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(record)
    return record


_record = _record_module()
add_record_flag = _record.add_record_flag


def emit(result, args, benchmark: str) -> None:
    """Print `result` as the JSON line last; with `--record`, append it to the results file."""
    _record.emit(result, args, benchmark, RESULTS)


def given(value: str | None, env: str) -> str | None:
    return value or os.environ.get(env) or None


def missing(what: str, flag: str, env: str) -> str:
    return f"{what}: not given (pass {flag} PATH or set {env})"


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]


def user_turn(text: str) -> str:
    return f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(cmd: list[str], port: int, log_path, *, env=None, cwd=None, timeout: float = 900,
                 what: str = "suffixspec serve") -> tuple[subprocess.Popen, str]:
    """Run `cmd` (a server listening on loopback `port`), stderr to `log_path`; (process, URL) once
    `/health` answers 200. Exits naming the log when the process dies or `timeout` seconds pass."""
    import httpx

    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(log_path, "wb"), env=env, cwd=cwd)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited ({proc.returncode}); see {log_path}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    proc.kill()
    proc.wait()
    raise SystemExit(f"{what} was not healthy within {timeout:.0f} s; see {log_path}")


def serve_command(port: int, *flags: str) -> list[str]:
    """`suffixspec serve` of this interpreter on loopback `port` with `flags`."""
    return [sys.executable, "-m", "suffixspec.cli", "serve", "--port", str(port), *flags]


def spawn_server(model, max_batch: int, log_path, extra=(), env=None) -> tuple[subprocess.Popen, str]:
    """`suffixspec serve` of `model` (None: the default) on a free loopback port, once healthy."""
    port = free_port()
    flags = ["--max-batch", str(max_batch), *extra] + (["--model", str(model)] if model else [])
    return start_server(serve_command(port, *flags), port, log_path, env=env)


def load_test_support(name: str):
    """The module `tests/support/<name>.py` of this checkout (its helpers are shared by the tests and the
    harnesses that drive a server as the tests do), imported as the tests import it, `support.<name>`,
    through the package's own location: no ``sys.path`` edit."""
    import importlib

    if "support" not in sys.modules:
        folder = ROOT / "tests" / "support"
        spec = importlib.util.spec_from_file_location("support", folder / "__init__.py",
                                                      submodule_search_locations=[str(folder)])
        package = importlib.util.module_from_spec(spec)
        sys.modules["support"] = package
        spec.loader.exec_module(package)
    return importlib.import_module(f"support.{name}")
