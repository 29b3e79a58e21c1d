"""An accepted request's engine events turned into its HTTP answer: one JSON object or server-sent events.

Contract of `Answer(req, handles, sink, ctx, path, metrics, aborted)`: `handles` are the request's
engine requests (one per prompt and sample, `choices.ChoiceJob` order), whose events arrive on `sink`.

* `collect()`: waits for every choice, then answers the whole response. With `best_of` > `n` the `n`
  samples of each prompt with the highest cumulative logprob are answered, best first. A choice that
  failed inside the engine makes the answer a 500; one cancelled by the server's drain a 503.
* `chunks()`: server-sent events, one choice per chunk (`index` tells which): first, per choice, the
  chat role (`delta.role == "assistant"`) or the echoed prompt; then one chunk per round that made
  text; then per choice exactly one chunk with its `finish_reason`. The usage comes with the last of
  those, or, with `stream_options.include_usage`, in one more chunk with no choices; then `[DONE]`.
  When the drain cuts the stream, every unfinished choice ends with finish reason "abort", then an
  error event and `[DONE]`.
* `usage.prompt_tokens` counts each prompt once; `completion_tokens` every sample generated;
  `prompt_tokens_details.cached_tokens` the prompt tokens read from the prefix cache (once per prompt).
"""

from __future__ import annotations

import json
import time
from typing import Any, AsyncIterator

from starlette.responses import JSONResponse, Response

from ..draft.prediction import prediction_counts
from . import protocol
from .choices import ChoiceText, chat_logprobs, completion_logprobs, merge_stats
from .engine_loop import Final, Handle, Tokens
from .protocol import APIError, GenerationRequest, ModelContext
from .text import TextAssembler
from .tools import ToolStream, parse_calls

__all__ = ["Answer", "sse", "DONE", "ABORT", "error_response"]

DONE = b"data: [DONE]\n\n"
ABORT = "abort"  # the finish reason of a stream the server cut at shutdown (as vLLM names it)


def error_response(err: APIError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


def sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


class Answer:
    def __init__(self, req: GenerationRequest, handles: list[Handle], sink, ctx: ModelContext, path: str, metrics,
                 aborted=lambda: False):
        self.req, self.handles, self.sink, self.ctx = req, handles, sink, ctx
        self.path, self.metrics = path, metrics
        self.aborted = aborted  # () -> whether the server cancelled every request (the drain's grace is over)
        self.rid, self.created = protocol.new_id(req.kind), int(time.time())
        tok = ctx.tokenizer
        ends = set(ctx.eos) | {int(t) for t in req.options.stop_token_ids}
        self.texts = [ChoiceText(TextAssembler(tok.decode, req.stops, ends), tok.decode) for _ in handles]
        self.finals: list[Final | None] = [None] * len(handles)
        self.position = {id(h): i for i, h in enumerate(handles)}

    # ---------------------------------------------------------------- token text

    def token_text(self, tok: int) -> str:
        """A token as text; one that is not whole UTF-8 alone (part of a character) as OpenAI writes
        it, `bytes:\\xNN...`, so distinct tokens stay distinct keys of a top-logprobs dictionary."""
        data = self.token_bytes(tok)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            return "bytes:" + "".join(f"\\x{b:02x}" for b in data)

    def token_bytes(self, tok: int) -> bytes:
        try:
            return self.ctx.tokenizer.token_bytes(tok)
        except (ValueError, AttributeError):
            return self.ctx.tokenizer.decode([tok]).encode()

    def decode(self, ids: list[int]) -> str:
        return self.ctx.tokenizer.decode(ids)

    # ---------------------------------------------------------------- events

    async def _events(self) -> AsyncIterator[tuple[int, Tokens | Final]]:
        left = len(self.handles)
        while left:
            handle, event = await self.sink.get()
            i = self.position[id(handle)]
            if isinstance(event, Final):
                self.finals[i] = event
                left -= 1
            yield i, event

    def _failure(self, final: Final) -> APIError:
        """The error of a request that failed inside the engine (500) or was cancelled: by the server at
        the end of a drain (503), else by its client (499, which nobody reads)."""
        if final.reason == "error":
            return APIError(500, f"the request failed inside the engine: {final.error}", code="engine_error")
        if self.aborted():
            return APIError(503, "the server shut down before the request finished (the drain's grace period "
                                 "ended); retry on another replica", code="aborted")
        return APIError(499, "the request was cancelled", code="cancelled")

    def _answered(self) -> list[tuple[int, int]]:
        """(position among the handles, output index) of the choices answered."""
        req, out = self.req, []
        for p in range(len(req.prompts)):
            samples = [i for i, h in enumerate(self.handles) if h.job.prompt == p]
            if req.best_of > req.n:
                samples.sort(key=lambda i: -sum(e.logprob for e in self.texts[i].logprobs))
                samples = samples[: req.n]
            out.extend((i, p * req.n + rank) for rank, i in enumerate(samples))
        return out

    def _usage(self) -> dict:
        req = self.req
        finals = [f for f in self.finals if f is not None]
        prediction = None
        if req.prediction_ids is not None:
            counts = [prediction_counts(req.prediction_ids, self.ctx.tokenizer.encode(t.asm.text())
                                        if t.asm.text() else []) for t in self.texts]
            prediction = (sum(c[0] for c in counts), sum(c[1] for c in counts))
        stats = merge_stats([f.stats for f in finals], [f.completion_tokens for f in finals])
        if req.corpus_documents is not None:
            stats["corpus_documents"] = req.corpus_documents
        # a prompt counts once: its samples' reuse is what the pool held before the first of them
        cached: dict[int, int] = {}
        for h, f in zip(self.handles, self.finals):
            if f is not None:
                p = h.job.prompt
                cached[p] = min(cached.get(p, f.cached_tokens), f.cached_tokens)
        return protocol.usage(req.prompt_tokens, sum(f.completion_tokens for f in finals), prediction, stats,
                              cached_tokens=sum(cached.values()))

    # ---------------------------------------------------------------- logprobs

    def _echo_text(self, i: int) -> str:
        prompt = self.handles[i].job.input
        return prompt.text if prompt.text is not None else self.decode(prompt.ids)

    def _prompt_scores(self, i: int) -> list:
        job = self.handles[i].job
        first = next(h for h in self.handles if h.job.prompt == job.prompt and h.job.sample == 0)
        return first.prompt_logprobs or [None] * len(job.input.ids)

    def _logprobs(self, i: int, entries: list, with_prompt: bool, offset: int) -> dict | None:
        req = self.req
        if req.logprobs is None:
            return None
        if req.kind == "chat":
            return chat_logprobs(entries, self.token_text, self.token_bytes)
        ids = [e.token for e in entries]
        if with_prompt:
            entries = self._prompt_scores(i) + entries
            ids = list(self.handles[i].job.input.ids) + ids
        return completion_logprobs(entries, ids, self.token_text, offset, self.decode)

    # ---------------------------------------------------------------- whole answers

    async def whole(self) -> dict:
        """The whole response object, once every choice has finished (`APIError` if one failed)."""
        async for i, event in self._events():
            if isinstance(event, Tokens):
                self.texts[i].feed(event.ids, event.logprobs)
        failed = next((f for f in self.finals if f.reason in ("error", "cancelled")), None)
        if failed is not None:
            raise self._failure(failed)
        for text, final in zip(self.texts, self.finals):
            text.finish(final.reason, final.tokens, final.logprobs)
        choices = [self._choice(i, index) for i, index in self._answered()]
        return {"id": self.rid, "object": "chat.completion" if self.req.kind == "chat" else "text_completion",
                "created": self.created, "model": self.req.model, "choices": choices, "usage": self._usage()}

    async def collect(self) -> Response:
        try:
            body = await self.whole()
        except APIError as err:
            self.metrics.http_request(self.path, err.status)
            return error_response(err)
        self.metrics.http_request(self.path, 200)
        return JSONResponse(body)

    def _choice(self, i: int, index: int) -> dict:
        text, reason = self.texts[i], protocol.finish_reason(self.finals[i].reason)
        kept = text.kept_logprobs() if self.req.logprobs is not None else []
        if self.req.kind == "chat":
            message = {"role": "assistant", "content": text.asm.text()}
            if self.req.tools is not None:
                message["content"], calls = parse_calls(text.asm.text(), self.req.tools)
                if calls:
                    message["tool_calls"] = [c.as_openai() for c in calls]
                    reason = "tool_calls" if reason == "stop" else reason
            return {"index": index, "message": message, "logprobs": self._logprobs(i, kept, False, 0),
                    "finish_reason": reason}
        echo = self._echo_text(i) if self.req.echo else ""
        return {"index": index, "text": echo + text.asm.text(),
                "logprobs": self._logprobs(i, kept, self.req.echo, 0), "finish_reason": reason}

    # ---------------------------------------------------------------- streams

    async def chunks(self) -> AsyncIterator[bytes]:
        req = self.req
        self.tool_streams = [ToolStream(req.tools) for _ in self.handles] if req.tools is not None else None
        for i, handle in enumerate(self.handles):  # (streams have best_of == n: output index == position)
            if req.kind == "chat":
                yield self._chunk(i, {"role": "assistant", "content": ""})
            elif req.echo:
                yield self._chunk(i, self._echo_text(i), logprobs=self._logprobs(i, [], True, 0))
        async for i, event in self._events():
            text = self.texts[i]
            before = len(text.asm.text())
            if isinstance(event, Tokens):
                piece = text.feed(event.ids, event.logprobs)
                if self.tool_streams is not None:
                    for chunk in self._tool_chunks(i, *self.tool_streams[i].feed(text.asm.text())):
                        yield chunk
                elif piece:
                    yield self._chunk(i, piece, logprobs=self._stream_logprobs(i, text.unreported(), before))
                continue
            final: Final = event
            if final.reason == "cancelled" and not self.aborted():
                return  # its client went away: nobody reads on
            if final.reason in ("error", "cancelled"):
                async for chunk in self._cut(final):
                    yield chunk
                return
            rest = text.finish(final.reason, final.tokens, final.logprobs)
            reason = protocol.finish_reason(final.reason)
            if self.tool_streams is not None:
                piece, fragments, calls = self.tool_streams[i].finish(text.asm.text())
                for chunk in self._tool_chunks(i, piece, fragments):
                    yield chunk
                rest = None
                reason = "tool_calls" if calls and reason == "stop" else reason
            last = all(f is not None for f in self.finals)
            use = self._usage() if last else None
            yield self._chunk(i, rest, reason,
                              None if req.include_usage else use,
                              logprobs=self._stream_logprobs(i, text.unreported(final=True), before))
            if last:
                if req.include_usage:
                    yield self._chunk(0, None, None, use, choices=False)
                yield DONE

    async def _cut(self, final: Final) -> AsyncIterator[bytes]:
        """A stream that failed (500) or that the drain cut (503): unfinished choices end with "abort"."""
        err = self._failure(final)
        self.metrics.http_request(self.path, err.status)  # (its 200 was counted when the stream began)
        if final.reason == "cancelled":
            for i, done in enumerate(self.finals):
                if done is None or done is final:
                    yield self._chunk(i, None, ABORT)  # (text held back, a partial character, stays unsent)
        yield sse(err.body())
        yield DONE

    def _tool_chunks(self, i: int, content: str, fragments: list[dict]) -> list[bytes]:
        out = [self._chunk(i, content)] if content else []
        out.extend(self._chunk(i, {"tool_calls": [fragment]}) for fragment in fragments)
        return out

    def _stream_logprobs(self, i: int, entries: list, before: int) -> dict | None:
        """The logprobs of a chunk's tokens; `before`: the choice's characters sent before the chunk."""
        if self.req.logprobs is None:
            return None
        if self.req.kind == "chat":
            return chat_logprobs(entries, self.token_text, self.token_bytes)
        echo = len(self._echo_text(i)) if self.req.echo else 0
        return completion_logprobs(entries, [e.token for e in entries], self.token_text, echo + before, self.decode)

    def _chunk(self, i: int, text, reason: str | None = None, use: dict | None = None, choices: bool = True,
               logprobs: dict | None = None) -> bytes:
        req = self.req
        index = self.handles[i].job.index
        if req.kind == "chat":
            delta = text if isinstance(text, dict) else ({"content": text} if text else {})
            return sse(protocol.chat_chunk(self.rid, req.model, self.created, None if not choices else delta,
                                           reason, use, choices, index=index, logprobs=logprobs))
        return sse(protocol.completion_chunk(self.rid, req.model, self.created, text, reason, use, choices,
                                             index=index, logprobs=logprobs))
