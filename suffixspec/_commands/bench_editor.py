"""`suffixspec bench --workload editor`: editor sessions over a repository, plain against speculative.

Users type functions of the repository's session files line by line (`suffixspec.bench.editor`); at
every debounced keystroke the editor sends a fill-in-the-middle request (the model's FIM tokens; a
model without them runs it as prefix completion) and cancels the request the next keystroke
supersedes (`suffixspec.bench.editor_run`). In process or against `--url`; `--corpus` indexes drafted
from (the rest of the repository: `corpora/editor_corpus.jsonl`), with every request's file tags as its
filter (over `--url`: `--request-filters`, the server having its own `--corpus`).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from ..errors import BadInputError


def add_arguments(p) -> None:
    g = p.add_argument_group("the editor workload (--workload editor)")
    g.add_argument("--editor-files", default=None, metavar="JSONL",
                   help="the files users type functions of (id, text, tags per line; default: the shipped "
                        "markdown-it-py files, corpora/editor_sessions.jsonl); --num-prompts sessions of them")
    g.add_argument("--keystrokes", type=int, default=16, metavar="N",
                   help="end-of-line keystrokes per session (its mid-line ones come on top; default 16)")
    g.add_argument("--request-filters", action="store_true",
                   help="with --url: send every request's file tags as its corpus filter (the server needs --corpus; "
                        "in process they are sent whenever --corpus is given)")
    g.add_argument("--prefix-cache-bytes", default=None, metavar="N",
                   help="in process: every engine's prefix cache bound in bytes, such as 512Mi (default: the "
                        "generator's own, a fresh one per run)")
    g.add_argument("--no-prefix-cache", action="store_true",
                   help="in process: every engine reads each prompt from its first token (no prefix cache)")


def engine_options(args) -> dict:
    """Engine keyword arguments the flags ask for; refused by name where they cannot apply."""
    from .args import prefix_cache_bytes

    bound = prefix_cache_bytes(args)
    if bound is None:
        return {}
    if args.url:
        flag = "--no-prefix-cache" if args.no_prefix_cache else "--prefix-cache-bytes"
        raise BadInputError(f"{flag} applies to a model loaded here; start the server with it instead", param=flag)
    return {"prefix_cache_bytes": bound}


def sessions_from_args(args):
    from ..bench.editor import editor_sessions, load_repo, shipped_repo

    if args.keystrokes <= 0:
        raise BadInputError(f"--keystrokes: expected > 0, got {args.keystrokes}")
    if args.num_prompts <= 0:
        raise BadInputError(f"--num-prompts: expected > 0, got {args.num_prompts}")
    path = Path(args.editor_files) if args.editor_files else shipped_repo()[0]
    if not path.is_file():
        raise BadInputError(f"--editor-files: {path} is not a file")
    sessions = editor_sessions(load_repo(path), sessions=args.num_prompts, max_keystrokes=args.keystrokes,
                               seed=args.seed)
    if not sessions:
        raise BadInputError(f"--editor-files {path}: no function of at least 4 lines to type")
    return path, sessions


# tokens that end a middle or a document in the FIM families' vocabularies (whichever the model has):
# a chat model's end-of-turn token alone would let a completion run on past them
END_TOKENS = ("<|endoftext|>", "<|fim_pad|>", "<|file_sep|>", "<|repo_name|>", "<|fim_prefix|>", "<|fim_suffix|>",
              "<|fim_middle|>", "<fim_pad>", "<file_sep>", "<fim_prefix>", "<fim_suffix>", "<fim_middle>")


def end_token_ids(tokenizer) -> list[int]:
    from ..http.fim import token_id

    return sorted({i for i in (token_id(tokenizer, t) for t in END_TOKENS) if i is not None})


def local_submit(target, limit: int):
    """Requests to an engine in this process: FIM token ids (or the prefix), stop strings, filter."""
    from ..bench.editor import EDITOR_MAX_TOKENS
    from ..http.fim import fim_prompt, fim_tokens

    tok = target.tokenizer
    if tok is None:
        raise BadInputError(f"model {target.args.model!r} has no tokenizer.json; the editor workload needs one")
    fim = fim_tokens(tok)
    use_filter = bool(target.args.corpus)
    ends = end_token_ids(tok)

    def prompt(ks) -> list[int]:
        return fim_prompt(tok, fim, ks.prefix, ks.suffix) if fim else list(tok.encode(ks.prefix))

    def submit(engine, ks, key) -> int:
        return engine.add(prompt(ks), max_new_tokens=min(limit, EDITOR_MAX_TOKENS), key=key,
                          options=engine.options.replace(stop=list(ks.stop), stop_token_ids=ends or None),
                          filter=dict(ks.tags) if use_filter and ks.tags else None)

    return submit, prompt, ("fill-in-the-middle" if fim else "prefix completion (the model has no FIM tokens)")


def remote_submit(target, sessions, limit: int):
    """Requests to an endpoint: `prompt` + `suffix` where the served model takes them (probed once,
    untimed), else the prefix alone; stop strings; the file's tags as filter with --request-filters."""
    from ..bench.editor import EDITOR_MAX_TOKENS

    ks0 = sessions[0].keystrokes[0]
    base = target.backends[target.baseline]
    probe = {"prompt": ks0.prefix, "suffix": ks0.suffix, "max_tokens": 1, "temperature": 0.0, **base.body}
    if target.model is not None:
        probe["model"] = target.model
    try:
        target.remote.complete_text(base.url, probe, target.api_key, target.args.timeout)
        fim = True
    except BadInputError as exc:
        if "suffix" not in str(exc):
            raise
        fim = False
    use_filter = target.args.request_filters

    def submit(engine, ks, key) -> int:
        extra = {"stop": list(ks.stop), **({"suffix": ks.suffix} if fim else {})}
        if use_filter and ks.tags:
            extra["suffixspec"] = {"filter": dict(ks.tags)}
        return engine.add(ks.prefix, max_new_tokens=min(limit, EDITOR_MAX_TOKENS), key=key, extra=extra)

    return submit, (lambda ks: ks.prefix), ("fill-in-the-middle" if fim else "prefix completion (the endpoint refused "
                                            "a suffix)")


def run_editor_bench(args, settings, target, t_start: float, load_s: float) -> int:
    from .. import bench
    from ..bench import BenchSettings
    from ..bench.editor import EditorSession
    from ..bench.editor_run import EditorTiming, run_editor
    from ..bench.editor_summary import format_editor_table, summarize_editor
    from ..bench.record import emit

    path, sessions = sessions_from_args(args)
    settings.modes = tuple(m for m in settings.modes if m != "prompt_lookup")
    if args.url:
        submit, prompt, kind = remote_submit(target, sessions, settings.max_new_tokens)
    else:
        submit, prompt, kind = local_submit(target, settings.max_new_tokens)
    strokes = [ks for s in sessions for ks in s.keystrokes]
    print(f"suffixspec bench: editor, {len(sessions)} sessions, {len(strokes)} keystrokes, {kind}; warming up",
          file=sys.stderr)
    t_warm = time.perf_counter()
    backends = {m: b for m, b in target.backends.items() if m in settings.modes}
    bench.warm_up_all(backends, [prompt(ks) for ks in strokes[:max(2, max(settings.concurrency))]], settings)
    timing = EditorTiming()
    # then the first keystrokes as the timed runs send them (stop strings, filters: a filter's first use
    # sets up its corpus subset), untimed
    first = sessions[0]
    warm = [EditorSession(first.id, first.path, first.function, first.tags, first.keystrokes[:2])]
    warm_settings = BenchSettings(**{**vars(settings), "concurrency": [1], "repeat": 1})
    run_editor(warm, backends, warm_settings, submit, target.decode, timing)
    warmup_s = time.perf_counter() - t_warm
    t_bench = time.perf_counter()
    runs = run_editor(sessions, backends, settings, submit, target.decode, timing)
    records = summarize_editor(runs, settings)
    described = target.describe(settings)
    report = {
        "tool": "suffixspec bench --workload editor", "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": sys.argv,
        "settings": {"workload": {"name": "editor", "files": str(path), "sessions": [s.id for s in sessions],
                                  "keystrokes": len(strokes), "waited": sum(k.waits for k in strokes),
                                  "requests": kind, "timing": vars(timing)},
                     "users": settings.concurrency, "max_new_tokens": settings.max_new_tokens, "budget": settings.budget,
                     "repeat": settings.repeat, "modes": list(settings.modes), "baseline": settings.baseline,
                     "engine_options": engine_options(args),
                     **{k: v for k, v in described.items() if k != "environment"}},
        "environment": described["environment"],
        "timing": {"load_s": load_s, "warmup_s": warmup_s, "bench_s": time.perf_counter() - t_bench,
                   "total_s": time.perf_counter() - t_start},
        "records": records,
        "runs": [{"mode": r.mode, "users": r.users, "repeat": r.repeat, "makespan_s": r.makespan_s, "errors": r.errors,
                  "time_split": r.time_split,
                  "requests": [{"session": s.keystroke.session, "keystroke": s.keystroke.index, "waits": s.keystroke.waits,
                                "sent_s": s.sent_s, "ttft_s": s.ttft_s, "e2e_s": s.e2e_s, "cancelled_s": s.cancelled_s,
                                "finish_reason": s.finish_reason, **q, "text": t}
                               for s, q, t in zip(r.sent, r.requests, r.texts)]} for r in runs],
    }
    out = Path(args.out)
    bench.write_report(out / "report.json", report)
    print(f"workload editor: {len(sessions)} sessions, {len(strokes)} keystrokes, {kind}, "
          f"budget {settings.budget}, repeat {settings.repeat}"
          + (f", corpus {', '.join(args.corpus)}" if getattr(args, "corpus", None) else ""))
    print(format_editor_table(records))
    for rec in records:
        for err in rec["errors"][:3]:
            print(f"  {rec['mode']} users={rec['concurrency']}: {err}")
    print(f"report {out / 'report.json'}  ({report['timing']['total_s']:.0f} s)")
    keys = ("mode", "concurrency", "ttft_ms", "latency_ms_p50", "latency_ms_p90", "mean_accepted_tokens",
            "match_rate", "line_match_rate", "mid_line_answered", "cancelled", "latency_ratio_p50", "speedup",
            "mismatches")
    slim = [{**{k: rec.get(k) for k in keys},
             "time_split": rec["time_split"]["share"] if rec.get("time_split") else None} for rec in records]
    emit({"report": str(out / "report.json"), "workload": "editor", "requests": kind,
          "corpus": list(getattr(args, "corpus", []) or []), "engine_options": engine_options(args), "records": slim},
         args, "suffixspec_bench_editor")
    return 1 if any(rec["failures"] for rec in records) else 0
