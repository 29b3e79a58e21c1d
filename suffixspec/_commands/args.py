"""Argument parsing shared by the subcommands (budgets, tag filters, corpus indexes)."""

from __future__ import annotations

from ..errors import BadInputError


def parse_budget(value: str):
    if value == "auto":
        return "auto"
    try:
        budget = int(value)
    except ValueError:
        raise BadInputError(f"--budget: expected an integer or 'auto', got {value!r}") from None
    if budget < 0:
        raise BadInputError(f"--budget: expected >= 0, got {budget}")
    return budget


def parse_filters(items) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise BadInputError(f"--filter: expected K=V, got {item!r}")
        out[key] = value
    return out


def open_corpora(paths, tokenizer=None):
    """The corpus indexes at `paths`; one that is missing, damaged or built with another tokenizer is
    a `BadInputError` naming it (param "--corpus")."""
    if not paths:
        return []
    from ..corpus import CorpusIndex
    from ..errors import SuffixSpecError

    out = []
    for p in paths:
        try:
            out.append(CorpusIndex.open(p, tokenizer=tokenizer))
        except (SuffixSpecError, OSError) as exc:
            raise BadInputError(f"--corpus {p}: cannot open the corpus index: {exc}", param="--corpus") from None
    return out


def check_writer_args(args) -> None:
    """`--shard-tokens` / `--jobs` (where the command has them) positive, `--wait` finite and >= 0."""
    for name in ("shard_tokens", "jobs"):
        value = getattr(args, name, None)
        if value is not None and value < 1:
            raise BadInputError(f"--{name.replace('_', '-')}: expected a positive integer, got {value}")
    if not args.wait >= 0 or args.wait == float("inf"):
        raise BadInputError(f"--wait: expected a number of seconds >= 0, got {args.wait}")


def load_writer_modules() -> None:
    """Import, with SIGINT and SIGTERM held back, the extension modules the index writers would load
    lazily mid-command: pyroaring's (Cython) initialisation swallows any exception raised inside it,
    so an interrupt handled there was lost and the command ran on to its end (see interrupts.py)."""
    from ..interrupts import signals_deferred

    with signals_deferred():
        import pyroaring  # noqa: F401


def check_threads(threads) -> None:
    """`--threads`: None (chosen at start-up, `suffixspec.threads`) or a positive count."""
    if threads is not None and threads < 1:
        raise BadInputError(f"--threads: expected >= 1, got {threads}", param="--threads")


def recycle_help() -> str:
    """The help of `--recycle` / `--no-recycle`: the default rule (`options.recycle_by_default`)."""
    from ..engine.options import RECYCLE_FLAT_AT, RECYCLE_PROBE_TOKENS

    return (f"also draft from the model's own past predictions (recycled top-k; default: on where the measured or "
            f"pinned pass-cost curve is flat, a {RECYCLE_PROBE_TOKENS}-token pass at most {RECYCLE_FLAT_AT:g} "
            "one-token steps, else off)")


def recycle_default(flag: bool | None) -> bool | None:
    """`--recycle` / `--no-recycle`; None when neither was given: the generator decides from the cost
    curve (`options.recycle_by_default`)."""
    return None if flag is None else bool(flag)


def open_recycle_table(gen, path, log) -> None:
    """`--recycle-table FILE`: the generator's table read from FILE when it exists; a damaged or
    foreign file is a `BadInputError` naming the flag."""
    if path is None:
        return
    from pathlib import Path

    from ..draft.recycle import RecycleTable, model_identity
    from ..errors import IndexFormatError

    if not Path(path).exists():
        log.info("recycle table %s: none yet, starting empty (written at shutdown)", path)
        return
    try:
        table = RecycleTable.load(path, identity=model_identity(gen.model), vocab_size=gen.recycle_table.vocab_size)
    except IndexFormatError as exc:
        raise BadInputError(f"--recycle-table: {exc}", param="--recycle-table") from None
    gen.recycle_table = table
    log.info("recycle table %s: %d tokens and %d pairs seen", path, int((table.table[:, 0] >= 0).sum()),
             int((table.pair_keys >= 0).sum()))


def save_recycle_table(gen, path, log) -> None:
    """`--recycle-table FILE` at shutdown: the table written atomically (a failure is logged)."""
    if path is None or gen is None:
        return
    try:
        gen.recycle_table.save(path)
        log.info("recycle table written to %s", path)
    except OSError as exc:
        log.error("could not write the recycle table to %s: %s", path, exc)


_BYTE_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "ki": 2**10, "mi": 2**20, "gi": 2**30}


def parse_bytes(value: str, flag: str) -> int:
    """A byte count: digits with an optional unit (k, M, G, Ki, Mi, Gi; a trailing B is allowed)."""
    import re

    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgG]i?)?[bB]?\s*", str(value))
    if m is None:
        raise BadInputError(f"{flag}: expected a number of bytes such as 536870912, 512Mi or 1G, got {value!r}",
                            param=flag)
    return int(float(m.group(1)) * _BYTE_UNITS[(m.group(2) or "").lower()])


def prefix_cache_bytes(args) -> int | None:
    """The prefix cache's bound from `--prefix-cache-bytes` / `--no-prefix-cache` (None: the default)."""
    if getattr(args, "no_prefix_cache", False):
        if getattr(args, "prefix_cache_bytes", None) is not None:
            raise BadInputError("--no-prefix-cache and --prefix-cache-bytes: give one of them",
                                param="--prefix-cache-bytes")
        return 0
    value = getattr(args, "prefix_cache_bytes", None)
    return None if value is None else parse_bytes(value, "--prefix-cache-bytes")


def add_prefix_cache_flags(p) -> None:
    p.add_argument("--prefix-cache-bytes", default=None, metavar="N",
                   help="keep the attention cache of prompts and outputs read, up to N bytes (such as 512Mi or "
                        "2G), so a prompt that starts like an earlier one reads only the rest (default: a quarter "
                        "of the GPU memory left after loading the model; on a CPU an eighth of the memory, at "
                        "most 1 GiB)")
    p.add_argument("--no-prefix-cache", action="store_true",
                   help="read every prompt from its first token (no prefix cache)")


def add_cost_flags(p) -> None:
    """`--cost-curve FILE` and `--no-learn-cost` (generate, bench, serve)."""
    p.add_argument("--cost-curve", default=None, metavar="FILE",
                   help="pin the automatic budget's pass-cost curve: a JSON object of tree size -> cost relative to "
                        "a one-token step (the cost_curve object of generate --json; default: measured at start)")
    p.add_argument("--no-learn-cost", action="store_true",
                   help="keep the cost curve as given or measured: no online correction, no exploring")


def cost_options(args) -> dict:
    """`SpeculativeGenerator` keywords from `--cost-curve` / `--no-learn-cost`; a file that cannot be
    read or is not a valid curve is a `BadInputError` naming `--cost-curve`."""
    import json

    from ..engine.costmodel import check_relative_curve
    from ..textinput import read_utf8

    out: dict = {"learn_cost": not args.no_learn_cost}
    if args.cost_curve is None:
        return out
    try:
        text = read_utf8(args.cost_curve, "--cost-curve")
    except BadInputError as exc:
        raise BadInputError(str(exc), param="--cost-curve") from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise BadInputError(f"--cost-curve {args.cost_curve}: expected a JSON object of tree size -> relative cost, "
                            f"got malformed JSON ({exc})", param="--cost-curve") from None
    try:
        check_relative_curve(data, name=f"--cost-curve {args.cost_curve}")
    except BadInputError as exc:
        raise BadInputError(str(exc), param="--cost-curve") from None
    out["cost_curve"] = data
    return out
