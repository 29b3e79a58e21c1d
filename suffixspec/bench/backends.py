"""In-process backends of the benchmark: this package's engine, and transformers' prompt lookup.

Contract: a backend's `serve(max_batch=, max_new_tokens=, do_sample=, temperature=, top_k=, top_p=,
seed=, budget=, logits_processor=, clock=)` returns an engine with the interface of
`suffixspec.engine.engine.Engine` (`add`, `step`, `idle`, `now`, `close`, `result`), timed on `clock` when
one is given. `SpeculativeBackend` wraps `SpeculativeGenerator` (`fresh()`: a new generator with a
new proposer, sharing the measured cost model; `engine_options`: more keyword arguments of every
engine it serves); plain mode is the same backend at budget 0.
`PromptLookupBackend` runs transformers' `generate(prompt_lookup_num_tokens=)` one request at a time
behind `OneAtATime`. torch and transformers are imported only when used. `keep_freed_memory()` makes
the process's allocator keep what it frees, `reserve_memory()` faults in room on top (for timed runs).
"""

from __future__ import annotations

import time
from typing import Any, Callable

from ..errors import BadInputError

__all__ = ["SpeculativeBackend", "PromptLookupBackend", "OneAtATime", "keep_freed_memory", "reserve_memory"]

# glibc's mallopt parameters
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4


def keep_freed_memory() -> str | None:
    """Make this process's allocator (glibc) keep the memory it frees instead of handing it back to
    the system: no allocation is served by its own mmap (each would be unmapped on free), and the
    heap's top is trimmed only past 1 GiB. A pass then reuses pages an earlier pass faulted in,
    whichever engine's they were; otherwise every large temporary of a pass can be faulted in anew,
    and with two engines alive at once (interleaved runs) the second one's prefill pays for fresh
    pages the first one's did not. Returns what was set, or None where there is no glibc `mallopt`."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        mallopt = getattr(libc, "mallopt", None) if libc is not None else None
    except OSError:
        mallopt = None
    if mallopt is None:
        return None
    if not (mallopt(_M_MMAP_MAX, 0) and mallopt(_M_TRIM_THRESHOLD, 1 << 30)):
        return None
    if not _kept:
        _kept.append(libc)
    return "glibc mallopt: M_MMAP_MAX 0, M_TRIM_THRESHOLD 1 GiB (freed memory stays with the process)"


_kept: list = []  # the C library, once `keep_freed_memory` has set it up
RESERVE_BYTES = 256 << 20


def reserve_memory(nbytes: int = RESERVE_BYTES) -> bool:
    """After `keep_freed_memory`: fault in `nbytes` at the top of the heap and free them there (they
    stay, below the trim threshold), so that a pass which outgrows the heap's free chunks lands on
    pages already faulted in rather than paying for fresh ones inside a timed run. False where it
    does nothing."""
    import ctypes

    if not _kept:
        return False
    libc = _kept[0]
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    block = libc.malloc(ctypes.c_size_t(nbytes))
    if not block:
        return False
    ctypes.memset(block, 0, nbytes)
    libc.free(block)
    return True


class SpeculativeBackend:
    """`SpeculativeGenerator` behind the benchmark's backend interface; `fresh()` makes a new generator
    with a new proposer (so no run learns from an earlier run's responses), sharing the cost model."""

    def __init__(self, model, tokenizer, make_proposer: Callable[[], Any], cost_model=None, filter=None,
                 recycle: bool | None = False, learn_cost: bool = True, engine_options: dict | None = None):
        self.model, self.tokenizer, self.make_proposer = model, tokenizer, make_proposer
        self.learn_cost = learn_cost  # False: the cost curve stays as given (`--no-learn-cost`)
        self.cost_model = cost_model
        self.recycle = recycle  # the generator's default for drawing on recycled predictions (None: by its curve)
        self.filter = filter  # corpus document filter of every request
        self.engine_options = dict(engine_options or {})  # more keyword arguments of every engine (`Engine`)
        self._gen = None

    def fresh(self) -> SpeculativeBackend:
        from ..generate import SpeculativeGenerator

        backend = SpeculativeBackend(self.model, self.tokenizer, self.make_proposer, self.cost_model, self.filter,
                                     self.recycle, self.learn_cost, self.engine_options)
        backend._gen = SpeculativeGenerator(self.model, self.tokenizer, proposer=self.make_proposer(),
                                            cost_model=self.cost_model, recycle=self.recycle,
                                            learn_cost=self.learn_cost,
                                            prefix_cache_bytes=self.engine_options.get("prefix_cache_bytes"))
        return backend

    def serve(self, *, max_batch, max_new_tokens, do_sample, temperature, top_k, top_p, seed, budget,
              logits_processor=None, clock=None):
        """A continuous-batching engine (`suffixspec.engine.engine.Engine`, on `clock` when given); draws keyed
        by the `key` given to `add`."""
        if self._gen is None:
            self._gen = self.fresh()._gen
        extra = dict(self.engine_options) if clock is None else {**self.engine_options, "clock": clock}
        engine = self._gen.serve(max_batch=max_batch, max_new_tokens=max_new_tokens, do_sample=do_sample,
                                 temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, budget=budget,
                                 logits_processor=logits_processor, filter=self.filter, **extra)
        if self.cost_model is None:
            self.cost_model = self._gen.cost_model
        return engine

    def generate(self, prompts, *, max_new_tokens, do_sample, temperature, top_k, top_p, seed, budget,
                 request_offset=0, logits_processor=None):
        if self._gen is None:
            self._gen = self.fresh()._gen
        # sampling draws are keyed by (seed, request index in the batch, position): shift the seed by
        # the batch's first request so that requests in different batches get different draws
        result = self._gen.generate(prompts, max_new_tokens=max_new_tokens, do_sample=do_sample,
                                    temperature=temperature, top_k=top_k, top_p=top_p,
                                    seed=seed * 1_000_003 + request_offset, budget=budget,
                                    logits_processor=logits_processor, filter=self.filter)
        if self.cost_model is None:
            self.cost_model = self._gen.cost_model
        return result


class PromptLookupBackend:
    """transformers' `generate(prompt_lookup_num_tokens=N)`, one request at a time (batch size 1)."""

    def __init__(self, model, num_tokens: int = 10, eos_token_id=None):
        self.model, self.num_tokens = model, num_tokens
        self.eos = eos_token_id

    def serve(self, *, max_batch, max_new_tokens, do_sample, temperature, top_k, top_p, seed, budget=None,
              logits_processor=None, clock=None):
        """An engine that serves one request per step (batch size 1) whatever `max_batch` is (on `clock`
        when given)."""
        return OneAtATime(lambda prompt, limit, key: self.generate(
            [prompt], max_new_tokens=limit, do_sample=do_sample, temperature=temperature, top_k=top_k, top_p=top_p,
            seed=seed, request_offset=key), max_new_tokens, clock=clock or time.perf_counter)

    def generate(self, prompts, *, max_new_tokens, do_sample, temperature, top_k, top_p, seed, budget=None,
                 request_offset=0):
        import torch
        from transformers.generation.streamers import BaseStreamer

        from ..engine.stats import GenerationResult, GenerationStats, RequestStats, peak_memory

        if len(prompts) != 1:
            raise BadInputError("prompt_lookup runs at batch size 1 only")
        prompt = prompts[0]

        class Clock(BaseStreamer):
            def __init__(self):
                self.times = []
                self.sizes = []

            def put(self, value):
                self.times.append(time.perf_counter())
                self.sizes.append(int(value.numel()))

            def end(self):
                pass

        clock = Clock()
        eos = self.eos if self.eos is not None else getattr(self.model.generation_config, "eos_token_id", None)
        kwargs = dict(max_new_tokens=max_new_tokens, do_sample=do_sample, prompt_lookup_num_tokens=self.num_tokens,
                      pad_token_id=(eos if isinstance(eos, int) else (eos[0] if eos else 0)), streamer=clock)
        if eos is not None:
            kwargs["eos_token_id"] = eos
        if do_sample:
            torch.manual_seed(seed * 1_000_003 + request_offset)
            kwargs.update(temperature=temperature, top_k=top_k or 0, top_p=top_p if top_p is not None else 1.0)
        device = next(self.model.parameters()).device
        ids = torch.tensor([prompt], device=device)
        with torch.inference_mode():
            t0 = time.perf_counter()
            seq = self.model.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)[0, len(prompt):].tolist()
            t1 = time.perf_counter()
        rs = RequestStats(prompt_tokens=len(prompt), new_tokens=len(seq))
        steps = clock.times[1:]  # the first put is the prompt
        rs.rounds = len(steps) or (1 if seq else 0)
        rs.committed_per_round = clock.sizes[1:]
        rs.ttft_s = (steps[0] - t0) if steps else t1 - t0
        rs.e2e_s = t1 - t0
        rs.finish_reason = "eos" if seq and eos is not None and seq[-1] in ([eos] if isinstance(eos, int) else eos) else "length"
        stats = GenerationStats(requests=[rs], rounds=rs.rounds, verifier_s=t1 - t0, e2e_s=t1 - t0,
                                peak_memory_bytes=peak_memory(device))
        return GenerationResult([seq], stats)


class OneAtATime:
    """The engine interface of `suffixspec.engine.engine.Engine` over a batch-1 `generate(prompt, limit, key)
    -> GenerationResult`: each step serves the oldest waiting request from start to finish."""

    def __init__(self, generate_one: Callable[[list[int], int, int], Any], max_new_tokens: int,
                 clock: Callable[[], float] = time.perf_counter):
        from ..engine.stats import GenerationStats

        self._generate_one, self.max_new = generate_one, int(max_new_tokens)
        self._clock, self._t0 = clock, clock()
        self._waiting: list[tuple[int, list[int], int, int]] = []
        self.stats = GenerationStats(requests=[])
        self.outputs: list[list[int]] = []

    def now(self) -> float:
        return self._clock() - self._t0

    @property
    def idle(self) -> bool:
        return not self._waiting

    def add(self, prompt, *, max_new_tokens=None, key=None, **_ignored) -> int:
        from ..engine.stats import RequestStats

        q = len(self.outputs)
        limit = self.max_new if max_new_tokens is None else min(self.max_new, int(max_new_tokens))
        self.outputs.append([])
        self.stats.requests.append(RequestStats(prompt_tokens=len(prompt)))
        self._waiting.append((q, list(prompt), limit, q if key is None else int(key)))
        return q

    def step(self):
        from ..engine.engine import Event, Step

        q, prompt, limit, key = self._waiting.pop(0)
        start = self.now()
        result = self._generate_one(prompt, limit, key)
        rs, seq = result.stats.requests[0], list(result.sequences[0])
        self.stats.requests[q] = rs
        self.outputs[q] = seq
        for name in ("proposer_s", "verifier_s", "rounds", "plain_rounds"):
            setattr(self.stats, name, getattr(self.stats, name) + getattr(result.stats, name))
        self.stats.peak_memory_bytes = max(self.stats.peak_memory_bytes, result.stats.peak_memory_bytes)
        end = self.now()
        events = [Event(q, seq[:1], start + rs.ttft_s)] if len(seq) > 1 else []
        events.append(Event(q, seq[1:] if len(seq) > 1 else seq, max(end, start + rs.e2e_s), rs.finish_reason or "length"))
        return Step(start, end, [q], events)

    def close(self) -> None:
        self._waiting = []

    def result(self):
        from ..engine.stats import GenerationResult

        self.stats.e2e_s = self.now()
        return GenerationResult([list(o) for o in self.outputs], self.stats)
