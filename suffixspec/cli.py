"""The `suffixspec` command line: the only place library errors become messages and exit codes.

Each subcommand lives in `suffixspec/_commands/<name>.py`, which exposes
`add_parser(subparsers)`; the parser it adds sets `func(args) -> int`. Commands print their
results; a `SuffixSpecError` (or an OSError on a user-given path) becomes one line on stderr
and exit status 2, never a traceback. SIGINT and SIGTERM (but under `serve`, which drains on its
own) become one line on stderr and exit status 130 / 143: the signal raises an exception in the main
thread, so every `finally` of the command runs (workers stopped, temporary files removed, locks
released), and further signals are ignored meanwhile so that cleanup is not cut short. Should some
code on the way swallow that exception (see interrupts.py), the command's exit status and line are
still the signal's (the command may then have run on to its end); one raised where Python can only
print it (a finalizer, an at-fork hook) is not printed.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import signal
import sys
import threading

from .errors import SuffixSpecError

COMMANDS = ("demo", "index", "info", "delete", "merge", "simulate", "generate", "bench", "serve")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="suffixspec", description="Model-free speculative decoding with suffix automata.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"suffixspec._commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"suffixspec._commands.{name}":
                raise
            continue  # command not shipped in this build
        module.add_parser(sub)
    return parser


class Interrupted(BaseException):
    """SIGINT or SIGTERM arrived (a BaseException, as KeyboardInterrupt: no `except Exception` stops it)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


_RECEIVED: list = []  # signals whose Interrupted was raised (kept in case some code swallowed it)


def _interrupted(signum, frame):
    _RECEIVED.append(signum)
    for sig in (signal.SIGINT, signal.SIGTERM):  # the cleanup this starts runs to its end
        signal.signal(sig, signal.SIG_IGN)
    raise Interrupted(signum)


def _unraisable(hook_args, previous) -> None:
    """`sys.unraisablehook`: an Interrupted raised where Python can only print it (a finalizer, a
    `__del__`, an at-fork hook) is not printed (`main` ends with the signal's line and status anyway,
    from `_RECEIVED`); anything else goes to `previous`, the hook that was there before."""
    if not isinstance(hook_args.exc_value, Interrupted):
        previous(hook_args)


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handle = args.command != "serve" and threading.current_thread() is threading.main_thread()
    _RECEIVED.clear()
    before = {sig: signal.signal(sig, _interrupted) for sig in (signal.SIGINT, signal.SIGTERM)} if handle else {}
    hook = sys.unraisablehook
    if handle:
        sys.unraisablehook = functools.partial(_unraisable, previous=hook)
    try:
        status = int(args.func(args) or 0)
        if before and _RECEIVED:
            # a handler's exception swallowed on its way up (library code that catches everything):
            # the command ran on, but the signal still decides how it ends
            raise Interrupted(_RECEIVED[0])
        return status
    except Interrupted as exc:
        print(f"suffixspec {args.command}: interrupted ({exc})", file=sys.stderr)
        return 128 + exc.signum
    except SuffixSpecError as exc:
        print(f"suffixspec {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"suffixspec {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"suffixspec {args.command}: interrupted", file=sys.stderr)
        return 130
    finally:
        sys.unraisablehook = hook
        for sig, old in before.items():
            # in-process (a test, a script: argv given) the caller's handlers come back; as the command
            # line, a signal after the work is done no longer changes the exit status
            signal.signal(sig, old if argv is not None else signal.SIG_IGN)


if __name__ == "__main__":
    sys.exit(main())
