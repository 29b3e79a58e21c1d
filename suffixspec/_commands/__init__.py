"""Subcommands of the `suffixspec` CLI, one module each (see suffixspec/cli.py)."""
