"""The benchmark against an OpenAI-compatible HTTP endpoint: modes are request-body extensions.

Contract: `HTTPBackend(url, body=..., ...)` has the backend interface of `suffixspec.bench.runs`:
`serve(max_batch=C, max_new_tokens=, do_sample=, temperature=, top_k=, top_p=, seed=, budget=)`
returns an `HTTPEngine` with the engine interface of `suffixspec.engine.engine.Engine` (`add`, `step`,
`idle`, `now`, `close`, `result`), so the same workloads, arrival processes, statistics and report
run against any server. Every request is one streaming `POST /v1/completions` (`prompt`: the
workload's text, templates already applied, or its token ids) or `/v1/chat/completions`
(`messages`), with `stream_options.include_usage`, `temperature: 0` under greedy decoding, `seed`
keyed by (seed, request) as in-process, and the mode's `body` merged in last (our server's modes:
`{"suffixspec": {"budget": 0}}` for plain, `{"suffixspec": {"budget": "auto"}}` for speculative).
At most C requests are in flight; later ones wait in the engine's FIFO (their wait is queueing).
The `budget` argument of `serve` is ignored: a mode's body says everything.

What is measured, on the client's clock (`time.perf_counter`), from the stream: TTFT (arrival to
the first chunk carrying text), e2e (arrival to the stream's end), tokens (`usage.completion_tokens`
of the final chunk; without usage, the number of chunks that carried text, counted in
`HTTPBackend.counted_by`), so TPOT and throughput follow as in-process. Outputs are texts; greedy
mismatches compare texts across modes. `usage.suffixspec` (our server) adds rounds, drafted and
accepted tokens and proposer/verifier milliseconds (summed over requests). A request that fails
(HTTP error status, an error object in the stream, a broken connection) finishes with reason
"error" and its message; it never stops the run. Requests run on one thread and one connection
each (the standard library's `http.client`: nothing to install); `step()` returns what arrived,
waiting at most `poll_s` (so arrivals are admitted on time); `cancel(index)` drops one request (a
waiting one is never sent, an open stream's connection is shut: the server sees the client leave),
`close()` abandons streams still open. `add(..., extra=)` adds body fields of one request (`suffix`,
`stop`, a `suffixspec` object under the mode's); `time_split()` sums the server's per-request figures.
"""

from __future__ import annotations

import http.client
import json
import queue
import threading
import time
import urllib.parse
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

from ..errors import BadInputError

__all__ = ["HTTPBackend", "HTTPEngine", "parse_modes", "default_modes", "list_models", "complete_text",
           "request_prompts"]

ENDPOINTS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


def default_modes(budget, recycle: bool | None = None) -> dict[str, dict]:
    """suffixspec's own server: plain decoding (budget 0) and speculation at `budget` (with
    `recycle` sent when it is not None)."""
    spec = {"budget": budget} if recycle is None else {"budget": budget, "recycle": recycle}
    return {"plain": {"suffixspec": {"budget": 0}}, "speculative": {"suffixspec": spec}}


def parse_modes(text: str) -> dict[str, dict]:
    """`--url-modes`: a JSON object (or `@FILE` holding one) mapping mode names to objects merged
    into every request body of that mode; the reserved key `base_url` in such an object points that
    mode at another endpoint (no OpenAI request field has that name)."""
    source = "--url-modes"
    if text.startswith("@"):
        source = text[1:]
        try:
            with open(source, encoding="utf-8") as handle:
                text = handle.read()
        except OSError as exc:
            raise BadInputError(f"--url-modes: cannot read {source}: {exc.strerror}") from None
    try:
        modes = json.loads(text)
    except ValueError as exc:
        raise BadInputError(f"{source}: expected a JSON object of mode name -> request-body object ({exc})") from None
    if not isinstance(modes, dict) or not modes:
        raise BadInputError(f"{source}: expected a non-empty JSON object of mode name -> request-body object, "
                            f"got {type(modes).__name__}")
    for name, body in modes.items():
        if not name or not isinstance(body, dict):
            raise BadInputError(f"{source}: mode {name!r}: expected a JSON object, got {type(body).__name__}")
        if "base_url" in body and not isinstance(body["base_url"], str):
            raise BadInputError(f"{source}: mode {name!r}: base_url: expected a string")
    return modes


def _headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def _error_text(status: int, raw: bytes) -> str:
    try:
        data = json.loads(raw)
        message = data["error"]["message"] if isinstance(data.get("error"), dict) else data.get("error", data)
    except (ValueError, AttributeError, KeyError, TypeError):
        message = raw.decode("utf-8", "replace")[:300]
    return f"HTTP {status}: {message}"


def open_request(url: str, method: str, path: str, body: dict | None, api_key: str | None, timeout: float):
    """Send one request to `url` (http or https, optionally with a path prefix) + `path`; returns the
    connection and its response (the caller closes the connection). Raises OSError or
    http.client.HTTPException when the endpoint does not answer."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BadInputError(f"--url: expected http://HOST:PORT (or https://...), got {url!r}")
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = cls(parts.hostname, parts.port, timeout=timeout)
    headers = {"Accept": "application/json, text/event-stream", **_headers(api_key)}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    try:
        conn.request(method, parts.path.rstrip("/") + path, body=data, headers=headers)
        return conn, conn.getresponse()
    except BaseException:
        conn.close()
        raise


def _json_call(url: str, method: str, path: str, body: dict | None, api_key: str | None, timeout: float):
    try:
        conn, resp = open_request(url, method, path, body, api_key, timeout)
        try:
            raw = resp.read()
        finally:
            conn.close()
    except (OSError, http.client.HTTPException) as exc:
        raise BadInputError(f"--url {url}: no answer from {method} {path} ({type(exc).__name__}: {exc})") from None
    if resp.status != 200:
        raise BadInputError(f"--url {url}: {method} {path}: {_error_text(resp.status, raw)}")
    try:
        return json.loads(raw)
    except ValueError:
        raise BadInputError(f"--url {url}: {method} {path}: expected JSON, got {raw[:200]!r}") from None


def list_models(url: str, api_key: str | None = None, timeout: float = 30.0) -> list[str]:
    """Model ids `GET /v1/models` lists; a clear `BadInputError` when the endpoint does not answer."""
    data = _json_call(url, "GET", "/v1/models", None, api_key, timeout)
    try:
        return [str(m["id"]) for m in data["data"]]
    except (KeyError, TypeError):
        raise BadInputError(f"--url {url}: GET /v1/models: expected {{\"data\": [{{\"id\": ...}}]}}, "
                            f"got {json.dumps(data)[:200]}") from None


def complete_text(url: str, body: dict, api_key: str | None = None, timeout: float = 600.0) -> str:
    """One non-streaming request (`body` with `prompt` or `messages`); returns the text."""
    body = dict(body)
    base = body.pop("base_url", None) or url
    chat = "messages" in body
    data = _json_call(base, "POST", ENDPOINTS["chat" if chat else "completions"], body, api_key, timeout)
    try:
        choice = data["choices"][0]
        return choice["message"]["content"] if chat else choice["text"]
    except (KeyError, IndexError, TypeError):
        raise BadInputError(f"--url {base}: expected a completion with choices, got {json.dumps(data)[:200]}") from None


class HTTPBackend:
    """One mode of an OpenAI-compatible endpoint (see the module docstring)."""

    def __init__(self, url: str, *, body: dict | None = None, api_key: str | None = None, model: str | None = None,
                 endpoint: str = "completions", timeout: float = 600.0, poll_s: float = 0.002):
        if endpoint not in ENDPOINTS:
            raise BadInputError(f"--endpoint: expected one of {', '.join(ENDPOINTS)}, got {endpoint!r}")
        body = dict(body or {})
        self.url = str(body.pop("base_url", None) or url).rstrip("/")
        self.body, self.api_key, self.model = body, api_key, model
        self.endpoint, self.timeout, self.poll_s = endpoint, float(timeout), float(poll_s)
        self.counted_by = {"usage": 0, "chunks": 0}  # how each finished request's tokens were counted

    def payload(self, prompt) -> dict:
        """The prompt part of a request body: `prompt` (text or token ids) or `messages`; a request
        given as a dict (see `request_prompts`) picks the part its endpoint takes."""
        if isinstance(prompt, dict):
            if self.endpoint == "chat":
                if prompt.get("messages") is None:
                    raise BadInputError("--endpoint chat: this workload's request has no chat messages (a raw-text "
                                        "prompt); use --endpoint completions")
                return {"messages": prompt["messages"]}
            return {"prompt": prompt["prompt"]}
        if self.endpoint == "chat":
            if isinstance(prompt, str):
                return {"messages": [{"role": "user", "content": prompt}]}
            raise BadInputError("--endpoint chat: token-id prompts need --endpoint completions")
        return {"prompt": prompt if isinstance(prompt, str) else [int(t) for t in prompt]}

    def serve(self, *, max_batch, max_new_tokens, do_sample, temperature, top_k, top_p, seed, budget=None,
              logits_processor=None) -> HTTPEngine:
        if logits_processor is not None:
            raise BadInputError("a logits processor cannot be sent to an HTTP endpoint")
        sampling: dict[str, Any] = {"temperature": float(temperature) if do_sample else 0.0}
        if do_sample and top_p is not None:
            sampling["top_p"] = float(top_p)
        if do_sample and top_k is not None:
            sampling["top_k"] = int(top_k)
        return HTTPEngine(self, int(max_batch), int(max_new_tokens), sampling, int(seed))


@dataclass
class _Stream:
    """One request's state on the client."""

    index: int
    body: dict
    added_s: float
    text: list[str] = field(default_factory=list)
    chunks: int = 0  # chunks that carried text
    usage: dict | None = None
    finish_reason: str = ""
    error: str = ""
    first_s: float | None = None
    done_s: float | None = None
    cancelled: bool = False  # `HTTPEngine.cancel`: the client left it


class HTTPEngine:
    """Continuous batching as a client sees it: at most `max_batch` streams open (module docstring)."""

    def __init__(self, backend: HTTPBackend, max_batch: int, max_new_tokens: int, sampling: dict, seed: int,
                 clock: Callable[[], float] = time.perf_counter):
        self.backend, self.max_batch, self.max_new = backend, max_batch, max_new_tokens
        self.sampling, self.seed = sampling, seed
        self._clock, self._t0 = clock, clock()
        self._connections: dict[int, Any] = {}  # the connections of open streams, closed by close()
        self._lock = threading.Lock()
        self._streams: list[_Stream] = []
        self._waiting: deque[int] = deque()
        self._open = 0  # streams started and not yet reported finished
        self._never_sent: set[int] = set()  # cancelled while waiting, not yet reported finished
        self._inbox: queue.Queue = queue.Queue()
        self._closed = threading.Event()
        self._threads: list[threading.Thread] = []

    def now(self) -> float:
        return self._clock() - self._t0

    @property
    def idle(self) -> bool:
        return not self._waiting and not self._open and not self._never_sent

    def add(self, prompt, *, max_new_tokens: int | None = None, key: int | None = None, extra: dict | None = None,
            **_ignored) -> int:
        """Queue one request; `extra`: more body fields of this request (`suffix`, `stop`, a `suffixspec`
        object, merged under the mode's own `suffixspec` fields)."""
        q = len(self._streams)
        limit = self.max_new if max_new_tokens is None else min(self.max_new, int(max_new_tokens))
        key = q if key is None else int(key)
        body = {**self.backend.payload(prompt), "max_tokens": limit, "stream": True,
                "stream_options": {"include_usage": True}, "seed": self.seed * 1_000_003 + key, **self.sampling}
        if self.backend.model is not None:
            body["model"] = self.backend.model
        body.update(extra or {})
        mode = dict(self.backend.body)
        if isinstance(body.get("suffixspec"), dict) and isinstance(mode.get("suffixspec"), dict):
            mode["suffixspec"] = {**body["suffixspec"], **mode["suffixspec"]}
        body.update(mode)
        self._streams.append(_Stream(q, body, self.now()))
        self._waiting.append(q)
        return q

    def step(self):
        """Admit waiting requests up to `max_batch` open streams, then return the chunks that arrived
        (waiting at most `poll_s` for the first): one `Event` per chunk carrying text, one at the end."""
        from ..engine.engine import Event, Step

        start = self.now()
        admitted = []
        while self._waiting and self._open < self.max_batch:
            q = self._waiting.popleft()
            self._open += 1
            admitted.append(q)
            thread = threading.Thread(target=self._run, args=(self._streams[q],), daemon=True,
                                      name=f"suffixspec-bench-http-{q}")
            self._threads.append(thread)
            thread.start()
        events = []
        try:
            items = [self._inbox.get(timeout=self.backend.poll_s)]
        except queue.Empty:
            items = []
        while True:
            try:
                items.append(self._inbox.get_nowait())
            except queue.Empty:
                break
        for q, at, final in items:
            s = self._streams[q]
            if final and q in self._never_sent:
                self._never_sent.discard(q)
                events.append(Event(q, [], at, "cancelled"))
            elif final:
                self._open -= 1
                events.append(Event(q, [], at, s.finish_reason or "error", s.error))
            else:
                events.append(Event(q, [], at))
        return Step(start, self.now(), admitted, events)

    def _run(self, s: _Stream) -> None:
        """One streaming request, on its own thread: chunks into `_inbox` as (index, time, final)."""
        backend = self.backend
        conn = None
        try:
            conn, resp = open_request(backend.url, "POST", ENDPOINTS[backend.endpoint], s.body, backend.api_key,
                                      backend.timeout)
            with self._lock:
                self._connections[s.index] = conn
            if self._closed.is_set() or s.cancelled:
                s.error = "cancelled: the benchmark closed the engine"
            elif resp.status != 200:
                s.error = _error_text(resp.status, resp.read())
            else:
                self._read(s, resp)
        except Exception as exc:  # noqa: BLE001 - a bad stream fails its request, never the run
            s.error = s.error or f"{type(exc).__name__}: {exc}"
        finally:
            with self._lock:
                self._connections.pop(s.index, None)
            if conn is not None:
                conn.close()
        s.done_s = self.now()
        if s.cancelled:
            s.finish_reason, s.error = "cancelled", ""
        elif s.error:
            s.finish_reason = "error"
        elif not s.finish_reason:
            s.finish_reason, s.error = "error", "the stream ended without a finish_reason"
        self._inbox.put((s.index, s.done_s, True))

    def _read(self, s: _Stream, resp) -> None:
        chat = self.backend.endpoint == "chat"
        while True:
            raw = resp.readline()
            if not raw:
                return  # the connection ended (a stream should end with [DONE] first)
            if self._closed.is_set() or s.cancelled:
                s.error = "cancelled: the benchmark closed the engine"
                return
            line = raw.decode("utf-8", "replace").rstrip("\r\n")
            if not line.startswith("data:"):
                continue  # blank separators, comments, event names
            data = line[5:].strip()
            if data == "[DONE]":
                return
            try:
                chunk = json.loads(data)
            except ValueError:
                s.error = f"not a JSON chunk: {data[:200]!r}"
                return
            if not isinstance(chunk, dict):
                s.error = f"expected a JSON object chunk, got {data[:200]!r}"
                return
            if chunk.get("error"):
                err = chunk["error"]
                s.error = f"error in the stream: {err.get('message', err) if isinstance(err, dict) else err}"
                return
            if chunk.get("usage"):
                s.usage = chunk["usage"]
            for choice in chunk.get("choices") or ():
                text = ((choice.get("delta") or {}).get("content") if chat else choice.get("text")) or ""
                if text:
                    at = self.now()
                    if s.first_s is None:
                        s.first_s = at
                    s.text.append(text)
                    s.chunks += 1
                    self._inbox.put((s.index, at, False))
                if choice.get("finish_reason"):
                    s.finish_reason = str(choice["finish_reason"])

    def cancel(self, index: int) -> bool:
        """Cancel a request as an editor does when the user types on: a waiting one is never sent, an
        open stream's connection is shut (the server sees the client leave and frees its row); it
        finishes with reason "cancelled". False when it already finished."""
        s = self._streams[index]
        if s.done_s is not None or s.cancelled:
            return False
        s.cancelled = True
        if index in self._waiting:
            self._waiting.remove(index)
            s.finish_reason, s.done_s = "cancelled", self.now()
            self._never_sent.add(index)  # reported like a finished stream, by the next step
            self._inbox.put((index, s.done_s, True))
            return True
        with self._lock:
            conn = self._connections.get(index)
        if conn is not None:
            try:
                if conn.sock is not None:
                    conn.sock.shutdown(2)  # SHUT_RDWR: wakes the thread reading it
            except OSError:
                pass
        return True

    def time_split(self) -> dict | None:
        """The server's figures summed over finished requests (approximate): prefill is its time to
        first token less its queueing, draft its proposer time, verify its verifier time less that
        prefill; None without them (an endpoint that is not suffixspec's)."""
        parts = [(s.usage or {}).get("suffixspec") or {} for s in self._streams]
        parts = [p for p in parts if "ttft_ms" in p and "verifier_ms" in p]
        if not parts:
            return None
        prefill = sum(max(0.0, p["ttft_ms"] - p.get("queue_ms", 0.0)) for p in parts) / 1e3
        draft = sum(p.get("proposer_ms", 0.0) for p in parts) / 1e3
        verify = max(0.0, sum(p["verifier_ms"] for p in parts) / 1e3 - prefill)
        return {"prefill_s": prefill, "draft_s": draft, "verify_s": verify, "rest_s": 0.0,
                "busy_s": prefill + draft + verify, "source": "server usage (prefill: time to first token less queueing)"}

    def close(self) -> None:
        """Abandon what has not finished (streams still open end at their next chunk)."""
        self._closed.set()
        self._waiting.clear()
        with self._lock:
            open_now = list(self._connections.values())
        for conn in open_now:  # streams still open fail at once and finish with an error
            try:
                sock = conn.sock
                if sock is not None:
                    sock.shutdown(2)  # SHUT_RDWR: wakes a thread blocked reading it
            except OSError:
                pass
        for thread in self._threads:
            thread.join(timeout=5.0)

    def result(self):
        """Texts and per-request statistics (`suffixspec.engine.stats`) of every request added."""
        from ..engine.stats import GenerationResult, GenerationStats, RequestStats

        stats = GenerationStats(requests=[])
        for s in self._streams:
            use = s.usage or {}
            ext = use.get("suffixspec") or {}
            counted = use.get("completion_tokens")
            if counted is None and s.done_s is not None and not s.error:
                self.backend.counted_by["chunks"] += 1
            elif counted is not None:
                self.backend.counted_by["usage"] += 1
            rs = RequestStats(prompt_tokens=int(use.get("prompt_tokens") or 0),
                              new_tokens=int(counted if counted is not None else s.chunks),
                              rounds=int(ext.get("rounds") or 0), drafted=int(ext.get("drafted") or 0),
                              accepted=int(ext.get("accepted") or 0),
                              finish_reason=s.finish_reason, error=s.error)
            end = s.done_s if s.done_s is not None else self.now()
            rs.e2e_s = end - s.added_s
            rs.ttft_s = (s.first_s if s.first_s is not None else end) - s.added_s
            stats.proposer_s += float(ext.get("proposer_ms") or 0.0) / 1e3
            stats.verifier_s += float(ext.get("verifier_ms") or 0.0) / 1e3
            stats.requests.append(rs)
        stats.e2e_s = self.now()
        return GenerationResult(["".join(s.text) for s in self._streams], stats)


def request_prompts(workload) -> list[dict]:
    """Per request, what an endpoint is sent: `prompt` (text as is, or token ids) and `messages`."""
    return [{"prompt": r.prompt if r.prompt is not None else list(r.prompt_ids), "messages": r.messages}
            for r in workload.requests]
