"""The `suffixspec` command line: the only place library errors become messages and exit codes.

Each subcommand lives in `suffixspec/_commands/<name>.py`, which exposes
`add_parser(subparsers)`; the parser it adds sets `func(args) -> int`. Commands print their
results; a `SuffixSpecError` (or an OSError on a user-given path) becomes one line on stderr
and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys

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


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except SuffixSpecError as exc:
        print(f"suffixspec {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"suffixspec {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"suffixspec {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
