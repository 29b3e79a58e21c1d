"""`suffixspec serve`: the OpenAI-compatible HTTP server (`suffixspec.http`) on uvicorn.

The process listens at once (loopback by default) and loads the model in a background thread:
`/health` answers 503 until the model is loaded, warmed up and the engine thread runs, then 200; the
objects alive by then are frozen out of the garbage collector (`gc.freeze`), so no full collection
walks the model's objects while requests are served. Logs go to
stderr through a bounded queue and a writer thread, so no request or engine round ever blocks on the
process's own output (records beyond the bound are dropped and counted). The API key comes from
`--api-key` or the environment variable `SUFFIXSPEC_API_KEY`. SIGTERM drains: new requests get 503,
requests already accepted finish (or are cancelled after `--grace-period` seconds), then the process
exits with status 0. A second SIGTERM, or SIGINT, stops at once.
"""

from __future__ import annotations

import argparse
import gc
import logging
import logging.handlers
import os
import queue
import signal
import sys
import threading
import time

from ..engine.prefill import DEFAULT_MAX_STEP_TOKENS
from ..errors import BadInputError
from ..http.limits import Limits
from .args import (
    add_cost_flags,
    add_prefix_cache_flags,
    cost_options,
    open_corpora,
    open_recycle_table,
    parse_budget,
    prefix_cache_bytes,
    recycle_default,
    recycle_help,
    save_recycle_table,
)

ENV_KEY = "SUFFIXSPEC_API_KEY"
DEFAULT_LIMITS = Limits()
LOG_QUEUE = 10000


def add_parser(sub) -> None:
    p = sub.add_parser("serve", help="serve an OpenAI-compatible HTTP API (completions, chat, FIM, predicted outputs)")
    p.add_argument("--model", default=None, metavar="PATH",
                   help="local transformers model directory or .gguf (default: embedded SmolLM2-135M-Instruct)")
    p.add_argument("--corpus", action="append", default=[], metavar="INDEX", help="corpus index to draft from (repeatable; default: none)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback only)")
    p.add_argument("--port", type=int, default=8000, help="TCP port to listen on (default 8000; 0: any free port)")
    p.add_argument("--max-batch", type=int, default=8, metavar="N", help="most requests decoded together (default 8)")
    p.add_argument("--max-step-tokens", type=int, default=DEFAULT_MAX_STEP_TOKENS, metavar="N",
                   help="most prompt tokens one engine step reads; a longer prompt is read in chunks over several "
                        f"steps, the running requests decoding between them (default {DEFAULT_MAX_STEP_TOKENS})")
    p.add_argument("--max-queue", type=int, default=256, metavar="N",
                   help="most requests waiting for a slot; beyond it the answer is 429 (default 256)")
    p.add_argument("--max-new-tokens-limit", type=int, default=2048, metavar="N",
                   help="largest max_tokens a request may ask for (default 2048)")
    p.add_argument("--api-key", default=None, metavar="KEY",
                   help=f"require 'Authorization: Bearer KEY' (default: ${ENV_KEY} if set, else no key)")
    p.add_argument("--served-model-name", action="append", default=[], metavar="NAME",
                   help="model name(s) clients use (default: the model's name; repeatable)")
    p.add_argument("--budget", default="auto", metavar="N|auto",
                   help="draft nodes per request and round (0: plain decoding; default auto)")
    p.add_argument("--chat-template", default=None, metavar="FILE", help="jinja2 chat template (default: the model's)")
    p.add_argument("--recycle", action=argparse.BooleanOptionalAction, default=None,
                   help=recycle_help())
    p.add_argument("--recycle-table", default=None, metavar="FILE",
                   help="keep the recycled predictions in FILE: read at start when it exists (a damaged or foreign "
                        "file is refused), written at shutdown (default: none, the table starts empty)")
    p.add_argument("--no-response-cache", action="store_true",
                   help="do not draft from earlier requests' outputs (by default finished outputs join a cache every "
                        "later request drafts from)")
    add_prefix_cache_flags(p)
    p.add_argument("--threads", type=int, default=None, metavar="N",
                   help="torch CPU threads (default: one per usable core, idle threads sleeping: OMP_WAIT_POLICY=PASSIVE; "
                        "the log says what was chosen)")
    p.add_argument("--grace-period", type=float, default=30.0, metavar="S",
                   help="on SIGTERM, how long accepted requests may run before they are cancelled (default 30)")
    p.add_argument("--max-body-bytes", type=int, default=DEFAULT_LIMITS.max_body_bytes, metavar="N",
                   help="largest request body; a larger one answers 413 without being read "
                        f"(default {DEFAULT_LIMITS.max_body_bytes}, 4 MiB)")
    p.add_argument("--read-timeout", type=float, default=DEFAULT_LIMITS.read_timeout_s, metavar="S",
                   help="most seconds a client may take to send a request's head, and again its body; then 408 "
                        f"and the connection closes (default {DEFAULT_LIMITS.read_timeout_s:g})")
    p.add_argument("--keep-alive", type=float, default=5.0, metavar="S",
                   help="an idle keep-alive connection is closed after S seconds (default 5)")
    p.add_argument("--max-connections", type=int, default=1000, metavar="N",
                   help="open connections beyond which new requests answer 503 (default 1000)")
    add_cost_flags(p)
    p.set_defaults(func=run)


class DroppingQueueHandler(logging.handlers.QueueHandler):
    """Never blocks: a record that does not fit the queue is dropped (and counted)."""

    dropped = 0

    def enqueue(self, record):
        try:
            self.queue.put_nowait(record)
        except queue.Full:
            DroppingQueueHandler.dropped += 1


def setup_logging() -> logging.handlers.QueueListener:
    stream = logging.StreamHandler(sys.stderr)
    stream.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    records: queue.Queue = queue.Queue(LOG_QUEUE)
    root = logging.getLogger()
    root.handlers[:] = [DroppingQueueHandler(records)]
    root.setLevel(logging.INFO)
    listener = logging.handlers.QueueListener(records, stream, respect_handler_level=False)
    listener.start()
    return listener


def _check(args) -> None:
    for name in ("max_batch", "max_queue", "max_new_tokens_limit", "max_body_bytes", "max_connections",
                 "max_step_tokens"):
        if getattr(args, name) < 1:
            flag = f"--{name.replace('_', '-')}"
            raise BadInputError(f"{flag}: expected >= 1, got {getattr(args, name)}", param=flag)
    if not 0 <= args.port <= 65535:
        raise BadInputError(f"--port: expected 0..65535, got {args.port}", param="--port")
    if args.threads is not None and args.threads < 1:
        raise BadInputError(f"--threads: expected >= 1, got {args.threads}", param="--threads")
    if args.grace_period < 0:
        raise BadInputError(f"--grace-period: expected >= 0, got {args.grace_period}", param="--grace-period")
    for flag, value in (("--read-timeout", args.read_timeout), ("--keep-alive", args.keep_alive)):
        if not value > 0:
            raise BadInputError(f"{flag}: expected seconds > 0, got {value}", param=flag)


def run(args) -> int:
    _check(args)
    args.prefix_cache_bytes = prefix_cache_bytes(args)
    budget = parse_budget(args.budget)
    args.cost_options = cost_options(args)  # a bad --cost-curve is refused before the model loads
    api_key = args.api_key if args.api_key is not None else os.environ.get(ENV_KEY) or None

    from ..http.chat import find_chat_template  # chat templates need no web stack

    template = find_chat_template(args.model, args.chat_template)

    from ..threads import ThreadPlan

    plan = ThreadPlan.start(args.threads)  # before torch is imported (OpenMP reads its settings once)
    import uvicorn

    from ..http.app import AppState, create_app
    from ..http.connection import head_deadline_protocol

    listener = setup_logging()
    log = logging.getLogger("suffixspec.serve")
    names = list(args.served_model_name) or [_default_name(args.model)]
    state = AppState(names, api_key=api_key, limits=Limits(args.max_body_bytes, args.read_timeout))
    config = uvicorn.Config(create_app(state), host=args.host, port=args.port, log_config=None, access_log=False,
                            timeout_graceful_shutdown=max(1.0, args.grace_period), lifespan="off",
                            http=head_deadline_protocol(args.read_timeout), timeout_keep_alive=args.keep_alive,
                            limit_concurrency=args.max_connections)
    server = DrainingServer(config, state, args.grace_period)

    loaded = []  # the generator, once built

    def load() -> None:
        try:
            loaded.append(_load(args, budget, template, state, log, plan))
            log.info("ready: serving %s on http://%s:%d", ", ".join(names), args.host, args.port)
        except Exception as exc:  # noqa: BLE001 - reported by /health and the log, then the process exits
            if getattr(exc, "param", None) in ("--corpus", "--recycle-table"):  # names the file, not the model
                state.load_error = str(exc)
            else:
                state.load_error = f"the model failed to load: {type(exc).__name__}: {exc}"
            log.error("%s", state.load_error)
            server.should_exit = True

    threading.Thread(target=load, name="suffixspec-load", daemon=True).start()
    try:
        server.run()
    finally:
        if state.engine is not None:
            state.engine.stop()
            save_recycle_table(loaded[0] if loaded else None, args.recycle_table, log)
        listener.stop()
    if state.load_error is not None:
        print(f"suffixspec serve: error: {state.load_error}", file=sys.stderr)
        return 2
    return 0


def _default_name(model) -> str:
    if model is None or str(model).strip().lower() in ("default", "smollm2"):
        return "SmolLM2-135M-Instruct"
    from pathlib import Path

    path = Path(model)
    return path.stem if path.suffix.lower() == ".gguf" else path.resolve().name


def _load(args, budget, template, state, log, plan):
    """Load the model, build the engine and start its thread; then `state` is ready. Returns the generator."""
    from ..draft.proposer import Proposer
    from ..engine.options import DecodeOptions
    from ..generate import SpeculativeGenerator
    from ..http.chat import chat_template_for
    from ..http.engine_loop import EngineLoop
    from ..http.fim import fim_end_tokens, fim_tokens
    from ..http.protocol import ModelContext
    from ..models import load_model

    t0 = time.perf_counter()
    model, tokenizer = load_model(args.model)
    log.info("%s", plan.finish().describe())
    if tokenizer is None:
        raise BadInputError(f"model {args.model!r} has no tokenizer.json; the server needs one", param="--model")
    corpora = open_corpora(args.corpus, tokenizer)
    for ix in corpora:
        info = ix.tokenizer_info
        log.info("corpus %s: %d documents (%d deleted), %d tokens, tokenizer %s (%s)", ix.path, ix.n_documents,
                 len(ix.deleted), ix.n_tokens, info.get("name"), str(info.get("fingerprint", ""))[:12])
    state.metrics.corpora(corpora)
    proposer = Proposer(corpus=corpora or None, global_cache=not args.no_response_cache,
                        cache_upkeep="background")  # a cache merge never stalls a round of the batch
    gen = SpeculativeGenerator(model, tokenizer, proposer=proposer, recycle=recycle_default(args.recycle),
                               prefix_cache_bytes=args.prefix_cache_bytes, **args.cost_options)
    open_recycle_table(gen, args.recycle_table, log)
    pool = gen.prefix_pool
    log.info("prefix cache: %s", f"up to {pool.max_bytes / 2**20:.0f} MiB of keys and values" if pool is not None
             else "off (--no-prefix-cache)")
    engine = gen.serve(options=DecodeOptions(budget=budget), max_batch=args.max_batch,
                       max_step_tokens=args.max_step_tokens)
    chat, where = chat_template_for(template, tokenizer)
    log.info("chat template: %s", where or "none (chat completions answer 400)")
    ctx = ModelContext(names=state.names, tokenizer=tokenizer, vocab_size=engine.vocab_size,
                       max_positions=engine.max_positions, max_new_tokens_limit=args.max_new_tokens_limit,
                       eos=frozenset(engine.decoding.eos), chat=chat, fim_ids=fim_tokens(tokenizer),
                       fim_end_ids=fim_end_tokens(tokenizer) if fim_tokens(tokenizer) else (), budget=budget,
                       has_corpus=bool(corpora), corpora=tuple(corpora))
    _warm_up(engine, tokenizer, proposer)
    if pool is not None:  # the warm-up's request is not a client's
        pool.clear()
        pool.counters = type(pool.counters)()
    state.metrics.prefix_cache(pool)
    if corpora:
        state.metrics.sources(proposer)  # counted from here: the warm-up's drafts are not a client's
        _prepare_filters(corpora, log)
    _freeze_heap()
    loop = EngineLoop(engine, max_queue=args.max_queue, metrics=state.metrics)
    loop.start()
    state.ctx = ctx
    state.engine = loop
    log.info("model loaded in %.1f s (vocabulary %s, context %s, fill-in-the-middle %s, recycled predictions %s)",
             time.perf_counter() - t0, engine.vocab_size, engine.max_positions, "yes" if ctx.fim_ids else "no",
             "on" if gen.recycle else "off")
    return gen


def _warm_up(engine, tokenizer, proposer) -> None:
    """Before the first client's request: every kernel a round can reach compiles or loads
    (`warm_kernels`, on a scratch proposer over the same corpora), then one short request runs the
    model's first passes and its output's cache upkeep. Its statistics are forgotten."""
    from ..engine.warmup import warm_kernels

    seconds = warm_kernels(proposer.corpora or None)
    logging.getLogger("suffixspec.serve").info("kernels ready in %.1f s", seconds)
    text = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n"
    index = engine.add(tokenizer.encode(text), max_new_tokens=8)
    while not engine.idle:
        engine.step()
    engine.release(index)
    proposer.wait_cache(60)
    engine.stats.forget_rounds()


def _prepare_filters(corpora, log) -> None:
    """Compute each shard's occurrence layout (what filtered queries read) on a background thread, so
    the first filtered request does not wait for it; the computation releases the GIL."""

    def run() -> None:
        t = time.perf_counter()
        try:
            for ix in corpora:
                for shard in ix.shards:
                    shard.layout()
        except Exception as exc:  # noqa: BLE001 - a filtered query computes it (and reports the damage) itself
            log.warning("preparing the corpus filters failed: %r", exc)
            return
        log.info("corpus filters ready in %.1f s", time.perf_counter() - t)

    threading.Thread(target=run, name="suffixspec-corpus-layout", daemon=True).start()


def _freeze_heap() -> None:
    """Move every object alive now (the model, the libraries, the warm-up's caches) out of the garbage
    collector's reach: a full collection walks every tracked object, and over a loaded model's many
    objects it holds the interpreter long enough to stall the engine's round and every handler at
    once. Later objects are collected as before."""
    gc.collect()
    gc.freeze()


class DrainingServer:
    """uvicorn's `Server` whose first SIGTERM drains instead of closing the listening socket: the
    engine refuses new requests (503) while accepted ones finish, for at most `grace` seconds (then
    they are cancelled); only then does uvicorn shut down. The signal is not re-raised at exit, so
    the process exits with status 0."""

    def __new__(cls, config, state, grace: float):
        import uvicorn

        class _Server(uvicorn.Server):
            def handle_exit(self, sig, frame):
                if sig == signal.SIGTERM and not self._draining_started:
                    self._draining_started = True
                    threading.Thread(target=self._drain, name="suffixspec-drain", daemon=True).start()
                    return
                super().handle_exit(sig, frame)

            def _drain(self) -> None:
                log = logging.getLogger("suffixspec.serve")
                engine = state.engine
                if engine is None:  # still loading: nothing to drain
                    self.should_exit = True
                    return
                engine.draining = True
                log.info("SIGTERM: draining (%d requests in flight, grace %.0f s)", engine.live, grace)
                deadline = time.monotonic() + grace
                while (engine.live or state.inflight) and time.monotonic() < deadline:
                    time.sleep(0.02)
                if engine.live or state.inflight:
                    log.warning("grace period over: cancelling %d requests", engine.live)
                    engine.cancel_all()
                    end = time.monotonic() + 5.0
                    while (engine.live or state.inflight) and time.monotonic() < end:
                        time.sleep(0.02)
                log.info("drained; shutting down")
                self.should_exit = True

        server = _Server(config)
        server._draining_started = False
        return server
