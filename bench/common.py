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
- ``free_port()``, ``spawn_server(model, max_batch, log_path, extra=())``: ``suffixspec serve`` of
  this interpreter on a free loopback port, returned with its URL once ``/health`` answers 200.
"""

from __future__ import annotations

import importlib.util
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn_server(model, max_batch: int, log_path, extra=()) -> tuple[subprocess.Popen, str]:
    """`suffixspec serve` on a free loopback port (stderr to `log_path`), once `/health` answers 200."""
    import httpx

    port = free_port()
    cmd = [sys.executable, "-m", "suffixspec.cli", "serve", "--port", str(port), "--max-batch", str(max_batch),
           *extra]
    if model:
        cmd += ["--model", model]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(log_path, "wb"))
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited ({proc.returncode}); see {log_path}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise SystemExit(f"the server was not healthy within 900 s; see {log_path}")
