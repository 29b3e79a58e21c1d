"""Every flag of every `suffixspec` subcommand says what it does and what happens when it is left out."""

import argparse

from suffixspec import cli


def missing_help(parser: argparse.ArgumentParser) -> list[str]:
    """Per subcommand: actions with no help, and options (not boolean switches, not required) whose
    help names no default."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    bad = []
    for name, p in sub.choices.items():
        for a in p._actions:
            if isinstance(a, argparse._HelpAction):
                continue
            flag = "/".join(a.option_strings) or a.dest
            switch = isinstance(a, (argparse._StoreTrueAction, argparse._StoreFalseAction, argparse._CountAction))
            if not a.help:
                bad.append(f"{name} {flag}: no help")
            elif a.option_strings and not switch and not a.required and "default" not in a.help.lower() \
                    and "required" not in a.help.lower():
                bad.append(f"{name} {flag}: no default in {a.help!r}")
    return bad


def test_every_flag_has_help_with_its_default():
    assert missing_help(cli.build_parser()) == []


def test_the_check_sees_a_flag_without_a_default():
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    p = sub.add_parser("x")
    p.add_argument("--good", default=3, help="a number (default 3)")
    p.add_argument("--quiet", action="store_true", help="say less")
    p.add_argument("--bad", default=3, help="a number")
    p.add_argument("--none")
    assert missing_help(parser) == ["x --bad: no default in 'a number'", "x --none: no help"]
