"""The OpenAI protocol: request bodies in, response objects, stream chunks and errors out.

Contract:

* `parse_request(body, kind, ctx) -> GenerationRequest` checks one decoded JSON body of
  `/v1/completions` (`kind` "completion") or `/v1/chat/completions` ("chat") against the model
  (`ModelContext`: served names, tokenizer, vocabulary, context length, the token limit, the chat
  template, the FIM tokens) and returns everything the engine needs: prompt token ids, `DecodeOptions`,
  the token limit, the prediction's token ids, the corpus filter. Every problem raises `APIError` with
  status 400 and an OpenAI-style error object naming the parameter; nothing else escapes.
* Every field is implemented, a bookkeeping field ignored (`IGNORED`), or a 400 naming it (`REFUSED`:
  known and not implemented yet; any other: unknown). A field sent as null counts as absent.
* `completions` prompts are raw text encoded exactly as `SpeculativeGenerator.generate([text])`
  encodes it (no template), or token ids, or a list of either (a batch: one prompt each, at most
  `MAX_PROMPTS`); `chat` messages go through the chat template; `suffix` builds the model's
  fill-in-the-middle prompt (`fim`). `temperature` 0 is greedy decoding; OpenAI's default temperature
  is 1 (sampling). `max_tokens` defaults to 16 for completions and to the room left in the context
  (at most the server's limit) for chat; completions take 0 (with `echo` and `logprobs`: the prompt
  scored, nothing generated).
* `n` (1..16) choices per prompt, `best_of` (completions, n..16) samples to choose them from; `echo`
  (completions); `logprobs` (completions: 0..20 alternatives; chat: true with `top_logprobs` 0..20);
  `frequency_penalty`, `presence_penalty` (-2..2); `response_format` text / json_object / json_schema
  (compiled here, so a schema that cannot be compiled is a 400).
* Extensions (as vLLM names them): `top_k`, `min_p`, `repetition_penalty`, `min_tokens`,
  `stop_token_ids`, `ignore_eos`; and a `suffixspec` object with `filter` (corpus document tags),
  `budget` ("auto" or an integer >= 0; 0 is plain decoding) and `recycle` (true / false / null:
  draft from the model's own past predictions too; null: the server's default).
* `completion_chunk`, `chat_chunk`, `usage` build the stream chunks and the usage object (`answer`
  builds whole responses); `APIError.body()` the error object `{"error": {"message", "type", "param", "code"}}`.
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

from ..engine.options import DecodeOptions
from ..errors import BadInputError, BadInputTypeError
from . import fim
from .fields import APIError, bad, fits, text_content

__all__ = ["APIError", "ModelContext", "GenerationRequest", "PromptInput", "parse_request", "completion_chunk",
           "chat_chunk", "usage", "LogitBias"]

MAX_STOPS = 4
MAX_N = 16
MAX_LOGPROBS = 20
MAX_PROMPTS = 64
MAX_CHOICES = 128  # engine requests one HTTP request may make: prompts x best_of
DEFAULT_COMPLETION_TOKENS = 16
# the fields each endpoint implements (OpenAI's, then the extensions as vLLM names them, then ours)
COMMON_FIELDS = frozenset({
    "model", "max_tokens", "temperature", "top_p", "n", "stream", "stream_options", "stop", "presence_penalty",
    "frequency_penalty", "logit_bias", "logprobs", "seed", "response_format", "prediction",
    "top_k", "min_p", "repetition_penalty", "min_tokens", "stop_token_ids", "ignore_eos", "suffixspec"})
COMPLETION_FIELDS = frozenset({"prompt", "suffix", "echo", "best_of"})
CHAT_FIELDS = frozenset({"messages", "max_completion_tokens", "top_logprobs", "tools", "tool_choice",
                         "parallel_tool_calls", "continue_final_message", "add_generation_prompt"})
# bookkeeping fields that change nothing about the answer: accepted and ignored (docs/serving.md)
IGNORED = frozenset({"user", "metadata", "store", "service_tier", "prompt_cache_key", "safety_identifier"})
# fields a client may send that this server does not implement yet: refused by name unless empty
REFUSED = ("functions", "function_call", "audio", "modalities", "reasoning_effort", "web_search_options")


@dataclass
class ModelContext:
    """What request checking needs to know about the served model."""

    names: list[str]
    tokenizer: Any
    vocab_size: int | None
    max_positions: int | None
    max_new_tokens_limit: int
    eos: frozenset = frozenset()
    chat: Any = None  # a chat.ChatTemplate, or None when the model has none
    fim_ids: tuple[int, int, int] | None = None
    fim_end_ids: tuple[int, ...] = ()  # a FIM request also stops at these (`fim.fim_end_tokens`)
    budget: Any = "auto"  # the server's default budget
    has_corpus: bool = False  # a corpus index to draft from (`suffixspec.filter` needs one)
    corpora: tuple = ()  # the opened `CorpusIndex`es, to count what a filter selects

    def corpus_documents(self, flt: dict | None) -> int | None:
        """Live documents of the corpora that `flt` selects (all of them without a filter); None
        without a corpus."""
        if not self.corpora:
            return None
        if not flt:
            return sum(ix.n_documents - len(ix.deleted) for ix in self.corpora)
        return sum(len(ix.subset(tags=flt)) for ix in self.corpora)


@dataclass
class PromptInput:
    """One prompt of a request: its token ids and, when it came as text, that text (what `echo` repeats)."""

    ids: list[int]
    text: str | None


@dataclass
class GenerationRequest:
    kind: str  # "completion" | "chat"
    model: str
    prompts: list[PromptInput]  # one for chat; a completions batch has several
    max_tokens: int
    options: DecodeOptions  # every choice's (a choice's sampling key is its sample number)
    stream: bool = False
    include_usage: bool = False
    stops: list[str] = field(default_factory=list)
    prediction_ids: list[int] | None = None
    filter: dict | None = None
    seeded: bool = False
    corpus_documents: int | None = None  # corpus documents its filter selected (None: no corpus)
    n: int = 1  # choices per prompt
    best_of: int = 1  # samples drawn per prompt (>= n; the n with the highest cumulative logprob are answered)
    echo: bool = False  # completions: the prompt's text in front of each choice's
    logprobs: int | None = None  # top alternatives per position to report; None: no logprobs
    tools: Any = None  # chat: the `tools.ToolSpec` whose calls are parsed from the answer (None: no tools)

    @property
    def prompt_ids(self) -> list[int]:
        return self.prompts[0].ids

    @property
    def prompt_tokens(self) -> int:
        """Every prompt counted once, however many samples it has (as OpenAI counts)."""
        return sum(len(p.ids) for p in self.prompts)


class LogitBias:
    """A logits processor adding OpenAI's `logit_bias` (token id -> bias in [-100, 100]) to the scores."""

    def __init__(self, bias: dict[int, float]):
        self.bias = dict(bias)
        self._ids = None
        self._values = None

    def __call__(self, input_ids, scores):
        import torch

        if self._ids is None or self._ids.device != scores.device:
            self._ids = torch.tensor(list(self.bias), dtype=torch.long, device=scores.device)
            self._values = torch.tensor(list(self.bias.values()), dtype=scores.dtype, device=scores.device)
        scores = scores.clone()
        scores[:, self._ids] += self._values.to(scores.dtype)
        return scores


# ----------------------------------------------------------------------------------- field checks

def _number(body: dict, name: str, ok: Callable[[float], bool], expected: str, default=None):
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise bad(f"{name}: expected {expected}, got {value!r}", name, "invalid_type")
    if not ok(value):
        raise bad(f"{name}: expected {expected}, got {value!r}", name)
    return value


def _integer(body: dict, name: str, low: int | None = None, high: int | None = None, default=None):
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad(f"{name}: expected an integer, got {value!r}", name, "invalid_type")
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise bad(f"{name}: expected an integer {bounds}, got {value}", name)
    return value


def _stops(body: dict) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise bad(f"stop: expected a string or a list of strings, got {stop!r}", "stop", "invalid_type")
    if len(stops) > MAX_STOPS:
        raise bad(f"stop: expected at most {MAX_STOPS} stop sequences, got {len(stops)}", "stop")
    if any(not s for s in stops):
        raise bad("stop: stop sequences must not be empty", "stop")
    return list(stops)


def _token_ids(value, name: str, ctx: ModelContext) -> list[int]:
    if not value:
        raise bad(f"{name}: the prompt is empty", name)
    for t in value:
        if isinstance(t, bool) or not isinstance(t, int):
            raise bad(f"{name}: expected token ids (integers), got {t!r}", name, "invalid_type")
        if t < 0 or (ctx.vocab_size is not None and t >= ctx.vocab_size):
            raise bad(f"{name}: token id {t} is outside the model's vocabulary [0, {ctx.vocab_size})", name)
    return list(value)


def _prompts(body: dict, ctx: ModelContext) -> list[PromptInput]:
    """The completion's prompts: a string, token ids, or a list of either (a batch, one prompt each)."""
    if "prompt" not in body:
        raise bad("prompt: required", "prompt", "missing_required_parameter")
    prompt = body["prompt"]
    suffix = body.get("suffix")
    if suffix is not None:
        if not isinstance(suffix, str):
            raise bad(f"suffix: expected a string, got {type(suffix).__name__}", "suffix", "invalid_type")
        if ctx.fim_ids is None:
            raise bad(fim.missing_message(), "suffix", "fim_unsupported")
    batch = isinstance(prompt, list) and bool(prompt) and all(isinstance(p, (str, list)) for p in prompt)
    items = prompt if batch else [prompt]
    if len(items) > MAX_PROMPTS:
        raise bad(f"prompt: expected at most {MAX_PROMPTS} prompts in one request, got {len(items)}", "prompt")
    return [_one_prompt(item, suffix, ctx, f"prompt[{i}]" if batch else "prompt") for i, item in enumerate(items)]


def _one_prompt(prompt, suffix: str | None, ctx: ModelContext, name: str) -> PromptInput:
    if suffix is not None:
        if not isinstance(prompt, str):
            raise bad(f"{name}: with suffix (fill-in-the-middle), the prompt must be text", name, "invalid_type")
        fits(ctx, prompt, name)
        fits(ctx, suffix, "suffix")
        return PromptInput(fim.fim_prompt(ctx.tokenizer, ctx.fim_ids, prompt, suffix), prompt)
    if isinstance(prompt, str):
        if not prompt:
            raise bad(f"{name}: the prompt is empty", name)
        fits(ctx, prompt, name)
        ids = list(ctx.tokenizer.encode(prompt))
        if not ids:
            raise bad(f"{name}: the prompt encodes to no tokens", name)
        return PromptInput(ids, prompt)
    if isinstance(prompt, list):
        ids = _token_ids(prompt, name, ctx)
        return PromptInput(ids, None)
    raise bad(f"{name}: expected a string or a list of token ids, got {type(prompt).__name__}", name, "invalid_type")


def _prediction(body: dict, ctx: ModelContext) -> list[int] | None:
    pred = body.get("prediction")
    if pred is None:
        return None
    if not isinstance(pred, dict) or pred.get("type") != "content" or "content" not in pred:
        raise bad('prediction: expected {"type": "content", "content": "..."}', "prediction", "invalid_type")
    text = text_content(pred["content"], "prediction.content")
    return list(ctx.tokenizer.encode(text)) if text else []


@dataclass(frozen=True)
class Extension:
    """The request's `suffixspec` object, checked: what the engine takes from it."""

    filter: dict | None
    budget: Any
    recycle: bool | None


def _extension(body: dict, ctx: ModelContext) -> Extension:
    ext = body.get("suffixspec")
    if ext is None:
        return Extension(None, ctx.budget, None)
    if not isinstance(ext, dict):
        raise bad(f"suffixspec: expected an object, got {type(ext).__name__}", "suffixspec", "invalid_type")
    unknown = sorted(set(ext) - {"filter", "budget", "recycle"})
    if unknown:
        raise bad(f"suffixspec: unknown field(s) {', '.join(unknown)} (expected filter, budget, recycle)", "suffixspec")
    flt = ext.get("filter")
    if flt is not None and (not isinstance(flt, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                                for k, v in flt.items())):
        raise bad(f"suffixspec.filter: expected an object of string tags, got {flt!r}", "suffixspec.filter", "invalid_type")
    if flt and not ctx.has_corpus:
        raise bad("suffixspec.filter: document filters need a corpus index; start the server with --corpus INDEX",
                  "suffixspec.filter")
    budget = ext.get("budget", ctx.budget)
    if budget is None:
        budget = ctx.budget
    if budget != "auto" and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 0):
        raise bad(f"suffixspec.budget: expected 'auto' or an integer >= 0, got {budget!r}", "suffixspec.budget")
    recycle = ext.get("recycle")
    if recycle is not None and not isinstance(recycle, bool):
        raise bad(f"suffixspec.recycle: expected true, false or null, got {_short(recycle)}", "suffixspec.recycle",
                  "invalid_type")
    return Extension(flt or None, budget, recycle)


def _logit_bias(body: dict, ctx: ModelContext):
    raw = body.get("logit_bias")
    if raw is None or raw == {}:
        return None
    if not isinstance(raw, dict):
        raise bad(f"logit_bias: expected an object of token id -> bias, got {type(raw).__name__}", "logit_bias",
                  "invalid_type")
    bias = {}
    for key, value in raw.items():
        try:
            tok = int(key)
        except (TypeError, ValueError):
            raise bad(f"logit_bias: expected token ids as keys, got {key!r}", "logit_bias", "invalid_type") from None
        if tok < 0 or (ctx.vocab_size is not None and tok >= ctx.vocab_size):
            raise bad(f"logit_bias: token id {tok} is outside the model's vocabulary [0, {ctx.vocab_size})",
                      "logit_bias")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not -100 <= value <= 100:
            raise bad(f"logit_bias: expected biases in [-100, 100], got {value!r} for token {tok}", "logit_bias")
        bias[tok] = float(value)
    return [LogitBias(bias)]


def _check_fields(body: dict, kind: str) -> None:
    """Every field is one we implement, a bookkeeping field we ignore, or a 400 naming it."""
    for name in sorted(REFUSED):
        value = body.get(name)
        if value is not None and value != [] and value is not False:
            raise bad(f"{name}: not supported by this server yet (got {_short(value)})", name, "unsupported_parameter")
    known = COMMON_FIELDS | (CHAT_FIELDS if kind == "chat" else COMPLETION_FIELDS) | IGNORED | set(REFUSED)
    unknown = sorted(set(body) - known)
    if unknown:
        raise bad(f"{unknown[0]}: unknown parameter for /v1/{'chat/completions' if kind == 'chat' else 'completions'} "
                  f"(see docs/serving.md for the supported ones)", unknown[0], "unsupported_parameter")


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _stream_flags(body: dict) -> tuple[bool, bool]:
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise bad(f"stream: expected true or false, got {stream!r}", "stream", "invalid_type")
    include_usage = False
    opts = body.get("stream_options")
    if opts is not None:
        if not isinstance(opts, dict):
            raise bad("stream_options: expected an object", "stream_options", "invalid_type")
        include_usage = opts.get("include_usage", False)
        if include_usage is None:
            include_usage = False
        if not isinstance(include_usage, bool):
            raise bad("stream_options.include_usage: expected true or false", "stream_options.include_usage",
                      "invalid_type")
    return stream, include_usage


def _boolean(body: dict, name: str) -> bool:
    value = body.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise bad(f"{name}: expected true or false, got {value!r}", name, "invalid_type")
    return value


def _samples(body: dict, kind: str, stream: bool) -> tuple[int, int]:
    """(n, best_of): choices per prompt, and samples drawn per prompt to choose them from."""
    n = _integer(body, "n", low=1, high=MAX_N, default=1)
    best_of = n if kind == "chat" else _integer(body, "best_of", low=1, high=MAX_N, default=n)
    if best_of < n:
        raise bad(f"best_of: expected an integer >= n ({n}), got {best_of}", "best_of")
    if best_of > n and stream:
        raise bad("best_of: cannot be streamed when it exceeds n (the best samples are known only at the end)",
                  "best_of")
    return n, best_of


def _logprobs(body: dict, kind: str) -> int | None:
    """Top alternatives per position (0..20), or None when no logprobs are asked for."""
    if kind == "completion":
        if body.get("top_logprobs") is not None:
            raise bad("top_logprobs: a chat parameter; completions take logprobs as an integer", "top_logprobs")
        return _integer(body, "logprobs", low=0, high=MAX_LOGPROBS)
    wanted = _boolean(body, "logprobs")
    top = _integer(body, "top_logprobs", low=0, high=MAX_LOGPROBS)
    if top is not None and not wanted:
        raise bad("top_logprobs: needs logprobs set to true", "top_logprobs")
    return (top or 0) if wanted else None


def _structure(body: dict, ctx: ModelContext):
    fmt = body.get("response_format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or not isinstance(fmt.get("type"), str):
        raise bad('response_format: expected {"type": "text" | "json_object" | "json_schema", ...}',
                  "response_format", "invalid_type")
    from ..verify.structured import Structure

    kind = fmt["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        structure = Structure.json_object()
    elif kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
            raise bad('response_format.json_schema: expected {"name": "...", "schema": {...}, "strict": true}',
                      "response_format.json_schema", "invalid_type")
        schema = spec.get("schema", {"type": "object"})
        try:
            structure = Structure.json_schema(schema)
        except BadInputError as exc:
            raise bad(str(exc), "response_format.json_schema") from None
    else:
        raise bad(f"response_format.type: expected text, json_object or json_schema, got {kind!r}",
                  "response_format.type")
    try:
        structure.compile(ctx.tokenizer)
    except BadInputError as exc:
        raise bad(str(exc), "response_format") from None
    return structure


def _stop_token_ids(body: dict, ctx: ModelContext) -> tuple:
    raw = body.get("stop_token_ids")
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise bad(f"stop_token_ids: expected a list of token ids, got {_short(raw)}", "stop_token_ids", "invalid_type")
    return tuple(_token_ids(raw, "stop_token_ids", ctx)) if raw else ()


def _decode_options(body: dict, ctx: ModelContext, max_tokens: int, budget, stops: list[str], logprobs,
                    best_of: int, n: int) -> DecodeOptions:
    temperature = _number(body, "temperature", lambda t: t >= 0, "a number >= 0", default=1.0)
    top_p = _number(body, "top_p", lambda p: 0 < p <= 1, "a number in (0, 1]")
    top_k = _integer(body, "top_k", low=-1)
    seed = _integer(body, "seed", low=0, high=2**63 - 1)
    do_sample = temperature > 0
    penalty = {name: _number(body, name, lambda v: -2 <= v <= 2, "a number in [-2, 2]", default=0.0)
               for name in ("frequency_penalty", "presence_penalty")}
    min_tokens = _integer(body, "min_tokens", low=0, high=max_tokens, default=0)
    ranked = best_of > n  # choosing the best samples needs each token's logprob
    try:
        return DecodeOptions(max_new_tokens=max_tokens, do_sample=do_sample,
                             temperature=float(temperature) if do_sample else 1.0,
                             top_k=None if top_k is None or top_k <= 0 else top_k,
                             top_p=None if top_p is None else float(top_p), seed=seed,
                             stop=stops or None, logits_processor=_logit_bias(body, ctx), budget=budget,
                             frequency_penalty=float(penalty["frequency_penalty"]),
                             presence_penalty=float(penalty["presence_penalty"]),
                             repetition_penalty=float(_number(body, "repetition_penalty", lambda v: v > 0,
                                                              "a number > 0", default=1.0)),
                             min_p=_number(body, "min_p", lambda p: 0 <= p <= 1, "a number in [0, 1]"),
                             min_tokens=min_tokens, ignore_eos=_boolean(body, "ignore_eos"),
                             stop_token_ids=_stop_token_ids(body, ctx)
                             + (ctx.fim_end_ids if body.get("suffix") is not None else ()),
                             logprobs=(logprobs or 0) if ranked else logprobs, structure=_structure(body, ctx))
    except (BadInputError, BadInputTypeError) as exc:
        raise bad(str(exc), exc.param) from None


def _max_tokens(body: dict, kind: str, ctx: ModelContext, prompts: list[PromptInput]) -> int:
    longest = max(len(p.ids) for p in prompts)
    room = None if ctx.max_positions is None else int(ctx.max_positions) - longest
    if room is not None and room < 1:
        raise bad(f"prompt: {longest} prompt tokens leave no room in the model's context of "
                  f"{ctx.max_positions} positions", "messages" if kind == "chat" else "prompt", "context_length_exceeded")
    name = "max_completion_tokens" if kind == "chat" and body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _integer(body, name, low=0 if kind == "completion" else 1)
    if max_tokens is None:
        default = DEFAULT_COMPLETION_TOKENS if kind == "completion" else ctx.max_new_tokens_limit
        return min(default, ctx.max_new_tokens_limit, room if room is not None else default)
    if max_tokens > ctx.max_new_tokens_limit:
        raise bad(f"{name}: {max_tokens} exceeds this server's limit of {ctx.max_new_tokens_limit}", name)
    if room is not None and max_tokens > room:
        raise bad(f"{name}: {longest} prompt tokens plus {max_tokens} new tokens exceed the model's "
                  f"context of {ctx.max_positions} positions", name, "context_length_exceeded")
    return max_tokens


def parse_request(body, kind: str, ctx: ModelContext) -> GenerationRequest:
    if not isinstance(body, dict):
        raise bad(f"the request body must be a JSON object, got {type(body).__name__}", None, "invalid_type")
    body = {k: v for k, v in body.items() if v is not None}  # a field sent as null counts as absent
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad("model: required (a string; see GET /v1/models)", "model", "missing_required_parameter")
    if model not in ctx.names:
        raise bad(f"model: {model!r} is not served here (served: {', '.join(ctx.names)})", "model", "model_not_found")
    _check_fields(body, kind)
    stream, include_usage = _stream_flags(body)
    n, best_of = _samples(body, kind, stream)
    logprobs = _logprobs(body, kind)
    echo = kind == "completion" and _boolean(body, "echo")
    stops = _stops(body)
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise bad("user: expected a string", "user", "invalid_type")
    tools = None
    if kind == "chat":
        from .conversation import chat_prompt, check_tools

        tools = check_tools(body)
        prompts = [PromptInput(chat_prompt(body, ctx, tools), None)]
    else:
        prompts = _prompts(body, ctx)
        if echo and logprobs is not None and body.get("suffix") is not None:
            raise bad("echo: prompt logprobs of a fill-in-the-middle prompt are not supported (drop echo or "
                      "logprobs)", "echo")
    if len(prompts) * best_of > MAX_CHOICES:
        name = "best_of" if best_of > n else "n"
        raise bad(f"{name}: {len(prompts)} prompts x {best_of} samples make {len(prompts) * best_of} generations, more "
                  f"than the {MAX_CHOICES} one request may ask for", name)
    max_tokens = _max_tokens(body, kind, ctx, prompts)
    prediction_ids = _prediction(body, ctx)
    ext = _extension(body, ctx)
    flt = ext.filter
    options = _decode_options(body, ctx, max_tokens, ext.budget, stops, logprobs, best_of, n).replace(
        recycle=ext.recycle)
    if tools is not None and tools.forced:
        if options.structure is not None:
            raise bad("response_format: cannot be combined with a forced tool call (tool_choice)", "response_format")
        from ..verify.structured import Structure

        options = options.replace(structure=Structure.from_lark(tools.grammar()))
    return GenerationRequest(kind, model, prompts, max_tokens, options, stream, include_usage, stops,
                             prediction_ids, flt, options.seed is not None, ctx.corpus_documents(flt),
                             n=n, best_of=best_of, echo=echo, logprobs=logprobs,
                             tools=tools if tools is not None and tools.choice != "none" else None)


# ----------------------------------------------------------------------------------- responses

def finish_reason(reason: str) -> str:
    """The engine's finish reason as OpenAI's: an EOS token or a stop string is "stop"."""
    return "length" if reason == "length" else "stop"


def new_id(kind: str) -> str:
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex


def usage(prompt_tokens: int, completion_tokens: int, prediction: tuple[int, int] | None, stats: dict,
          cached_tokens: int = 0) -> dict:
    out = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
           "total_tokens": prompt_tokens + completion_tokens,
           "prompt_tokens_details": {"cached_tokens": cached_tokens}}
    accepted, rejected = prediction if prediction is not None else (0, 0)
    out["completion_tokens_details"] = {"accepted_prediction_tokens": accepted, "rejected_prediction_tokens": rejected}
    out["suffixspec"] = stats
    return out


def completion_chunk(rid: str, model: str, created: int, text: str | None, reason: str | None = None,
                     use: dict | None = None, choices: bool = True, index: int = 0, logprobs: dict | None = None) -> dict:
    chunk = {"id": rid, "object": "text_completion", "created": created, "model": model,
             "choices": [{"index": index, "text": text or "", "logprobs": logprobs, "finish_reason": reason}]
             if choices else []}
    if use is not None:
        chunk["usage"] = use
    return chunk


def chat_chunk(rid: str, model: str, created: int, delta: dict | None, reason: str | None = None,
               use: dict | None = None, choices: bool = True, index: int = 0, logprobs: dict | None = None) -> dict:
    chunk = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
             "choices": [{"index": index, "delta": delta or {}, "logprobs": logprobs, "finish_reason": reason}]
             if choices else []}
    if use is not None:
        chunk["usage"] = use
    return chunk
