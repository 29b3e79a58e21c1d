"""The Responses API (`POST /v1/responses`), stateless: a request becomes a chat request, its answer a
response object or the documented stream of response events.

Contract:

* `to_chat(body) -> dict`: `input` (a string: one user message; or a list of message items, with
  `input_text`/`output_text` parts, `function_call` and `function_call_output` items), `instructions`
  (a system message first), `max_output_tokens`, `temperature`, `top_p`, `text.format` (`text`,
  `json_object`, `json_schema` with `name`/`schema`/`strict`), `tools` (function tools) and
  `tool_choice`, `parallel_tool_calls`, `stream`, and the chat extensions (`suffixspec`, `top_k`...)
  become the chat completion body that `protocol.parse_request` checks. The server keeps no
  responses: `previous_response_id`, `store: true`, `background: true`, `conversation` are a 400
  saying so; `user`, `metadata` and other bookkeeping fields are ignored; any other unknown field is
  a 400 naming it.
* `response_object(chat, body)`: the response (`id`, `object: "response"`, `created_at`, `model`,
  `status` "completed", or "incomplete" with `incomplete_details.reason: "max_output_tokens"`,
  `output` message and function-call items, `usage` with input/output/total tokens and, as in chat,
  the engine's statistics under `usage.suffixspec`).
* `ResponseStream(answer, body).events()`: `response.created`, `response.in_progress`, then per output
  item `response.output_item.added`, for a message `response.content_part.added`,
  `response.output_text.delta`..., `response.output_text.done`, `response.content_part.done`, for a
  call `response.function_call_arguments.delta`..., `.done`; `response.output_item.done`; then
  `response.completed` or `response.incomplete`. Every event has its `sequence_number`; one response
  id throughout.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import AsyncIterator

from ..errors import BadInputError
from .engine_loop import Final, Tokens
from .tools import ToolStream

__all__ = ["to_chat", "response_object", "ResponseStream"]

STATELESS = ("previous_response_id", "conversation", "background")
PASSED = ("temperature", "top_p", "stream", "parallel_tool_calls", "suffixspec", "top_k", "min_p",
          "repetition_penalty", "frequency_penalty", "presence_penalty", "seed", "stop", "model")
IGNORED = ("user", "metadata", "truncation", "service_tier", "prompt_cache_key", "safety_identifier", "store",
           "stream_options", "include")
HANDLED = ("input", "instructions", "max_output_tokens", "text", "tools", "tool_choice")


def _bad(message: str, param: str) -> BadInputError:
    return BadInputError(message, param=param)


def _new(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _text(content, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") not in ("input_text", "output_text", "text") or \
                    not isinstance(part.get("text"), str):
                raise _bad(f"{where}[{j}]: expected a text part {{\"type\": \"input_text\", \"text\": ...}}",
                           f"{where}[{j}]")
            parts.append(part["text"])
        return "".join(parts)
    raise _bad(f"{where}: expected a string or a list of text parts", where)


def _messages(body: dict) -> list[dict]:
    raw = body.get("input")
    if raw is None:
        raise _bad("input: required", "input")
    messages = []
    if body.get("instructions") is not None:
        if not isinstance(body["instructions"], str):
            raise _bad("instructions: expected a string", "instructions")
        messages.append({"role": "system", "content": body["instructions"]})
    if isinstance(raw, str):
        return messages + [{"role": "user", "content": raw}]
    if not isinstance(raw, list) or not raw:
        raise _bad("input: expected a string or a non-empty list of items", "input")
    for i, item in enumerate(raw):
        where = f"input[{i}]"
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if kind == "message":
            messages.append({"role": item.get("role"), "content": _text(item.get("content"), f"{where}.content")})
        elif kind == "function_call":
            call = {"id": item.get("call_id"), "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments", "{}")}}
            if messages and messages[-1]["role"] == "assistant" and messages[-1].get("tool_calls"):
                messages[-1]["tool_calls"].append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            messages.append({"role": "tool", "tool_call_id": item.get("call_id"),
                             "content": output if isinstance(output, str) else json.dumps(output)})
        else:
            raise _bad(f"{where}: expected a message, function_call or function_call_output item", where)
    return messages


def _tools(body: dict) -> dict:
    out = {}
    tools = body.get("tools")
    if tools:
        if not isinstance(tools, list):
            raise _bad("tools: expected a list of function tools", "tools")
        out["tools"] = []
        for i, t in enumerate(tools):
            if not isinstance(t, dict) or t.get("type") != "function":
                raise _bad(f"tools[{i}]: expected a function tool {{\"type\": \"function\", \"name\": ...}}",
                           f"tools[{i}]")
            out["tools"].append({"type": "function", "function": {
                k: t[k] for k in ("name", "description", "parameters") if t.get(k) is not None}})
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") == "function":
        out["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
    elif choice is not None:
        out["tool_choice"] = choice
    return out


def _format(body: dict) -> dict:
    text = body.get("text")
    if text is None:
        return {}
    fmt = text.get("format") if isinstance(text, dict) else None
    if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "json_object", "json_schema"):
        raise _bad('text.format: expected {"type": "text" | "json_object" | "json_schema", ...}', "text.format")
    if fmt["type"] == "json_schema":
        return {"response_format": {"type": "json_schema", "json_schema": {
            "name": fmt.get("name", "response"), "schema": fmt.get("schema"), "strict": fmt.get("strict", True)}}}
    return {"response_format": {"type": fmt["type"]}}


def to_chat(body) -> dict:
    if not isinstance(body, dict):
        raise _bad(f"the request body must be a JSON object, got {type(body).__name__}", None)
    body = {k: v for k, v in body.items() if v is not None}
    for name in STATELESS:
        if body.get(name) not in (None, False, ""):
            raise _bad(f"{name}: this server keeps no responses or conversations (send the whole input)", name)
    if body.get("store") is True:
        raise _bad("store: this server keeps no responses (send store: false, or leave it out)", "store")
    unknown = sorted(set(body) - set(PASSED) - set(IGNORED) - set(HANDLED) - set(STATELESS))
    if unknown:
        raise _bad(f"{unknown[0]}: unknown or unsupported parameter for /v1/responses", unknown[0])
    chat = {k: body[k] for k in PASSED if k in body}
    chat["messages"] = _messages(body)
    if "max_output_tokens" in body:
        chat["max_completion_tokens"] = body["max_output_tokens"]
    chat.update(_tools(body))
    chat.update(_format(body))
    return chat


def _usage(chat_usage: dict) -> dict:
    return {"input_tokens": chat_usage["prompt_tokens"], "output_tokens": chat_usage["completion_tokens"],
            "total_tokens": chat_usage["total_tokens"],
            "input_tokens_details": {"cached_tokens": chat_usage.get("prompt_tokens_details", {}).get("cached_tokens", 0)},
            "output_tokens_details": {"reasoning_tokens": 0}, "suffixspec": chat_usage.get("suffixspec")}


def _shell(rid: str, created: int, body: dict, status: str) -> dict:
    """The response object's fields other than its output and usage."""
    return {"id": rid, "object": "response", "created_at": created, "model": body.get("model"), "status": status,
            "error": None, "incomplete_details": None, "instructions": body.get("instructions"),
            "max_output_tokens": body.get("max_output_tokens"), "temperature": body.get("temperature"),
            "top_p": body.get("top_p"), "tools": body.get("tools") or [], "tool_choice": body.get("tool_choice", "auto"),
            "parallel_tool_calls": body.get("parallel_tool_calls", True), "text": body.get("text") or
            {"format": {"type": "text"}}, "metadata": body.get("metadata") or {}, "output": [], "usage": None}


def _message_item(text: str, item_id: str | None = None, status: str = "completed") -> dict:
    return {"type": "message", "id": item_id or _new("msg"), "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}


def _call_item(call_id: str, name: str, arguments: str, item_id: str | None = None, status: str = "completed") -> dict:
    return {"type": "function_call", "id": item_id or _new("fc"), "call_id": call_id, "name": name,
            "arguments": arguments, "status": status}


def response_object(chat: dict, body: dict) -> dict:
    choice = chat["choices"][0]
    message = choice["message"]
    incomplete = choice["finish_reason"] == "length"
    out = _shell(_new("resp"), chat["created"], body, "incomplete" if incomplete else "completed")
    if incomplete:
        out["incomplete_details"] = {"reason": "max_output_tokens"}
    if message.get("content"):
        out["output"].append(_message_item(message["content"], status="incomplete" if incomplete else "completed"))
    for call in message.get("tool_calls") or []:
        out["output"].append(_call_item(call["id"], call["function"]["name"], call["function"]["arguments"],
                                        status="incomplete" if incomplete else "completed"))
    out["usage"] = _usage(chat["usage"])
    return out


class ResponseStream:
    """The event stream of one answer (`answer.Answer` over one choice)."""

    def __init__(self, answer, body: dict):
        self.answer, self.body = answer, body
        self.rid, self.created = _new("resp"), int(time.time())
        self.seq = 0
        self.items: list[dict] = []  # output items, in order
        self.message: dict | None = None  # the message item while its text streams
        self.calls: dict[int, dict] = {}  # call index -> its item
        self.tools = ToolStream(answer.req.tools) if answer.req.tools is not None else None

    def _event(self, kind: str, **fields) -> bytes:
        event = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return f"event: {kind}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n".encode()

    def _response(self, status: str) -> dict:
        out = _shell(self.rid, self.created, self.body, status)
        out["output"] = self.items
        return out

    def _text(self, piece: str) -> list[bytes]:
        out = []
        if self.message is None:
            self.message = _message_item("", status="in_progress")
            self.message["content"] = []
            self.items.append(self.message)
            out.append(self._event("response.output_item.added", output_index=len(self.items) - 1,
                                   item=dict(self.message, content=[])))
            part = {"type": "output_text", "text": "", "annotations": []}
            self.message["content"].append(part)
            out.append(self._event("response.content_part.added", item_id=self.message["id"],
                                   output_index=len(self.items) - 1, content_index=0, part=dict(part)))
        self.message["content"][0]["text"] += piece
        out.append(self._event("response.output_text.delta", item_id=self.message["id"],
                               output_index=self.items.index(self.message), content_index=0, delta=piece))
        return out

    def _fragment(self, frag: dict) -> list[bytes]:
        out = []
        if frag.get("id"):
            item = _call_item(frag["id"], frag["function"]["name"], "", status="in_progress")
            self.calls[frag["index"]] = item
            self.items.append(item)
            out.append(self._event("response.output_item.added", output_index=len(self.items) - 1, item=dict(item)))
        piece = frag["function"].get("arguments") or ""
        if piece:
            item = self.calls[frag["index"]]
            item["arguments"] += piece
            out.append(self._event("response.function_call_arguments.delta", item_id=item["id"],
                                   output_index=self.items.index(item), delta=piece))
        return out

    def _close_items(self, status: str) -> list[bytes]:
        out = []
        for index, item in enumerate(self.items):
            item["status"] = status
            if item["type"] == "message":
                part = item["content"][0]
                out.append(self._event("response.output_text.done", item_id=item["id"], output_index=index,
                                       content_index=0, text=part["text"]))
                out.append(self._event("response.content_part.done", item_id=item["id"], output_index=index,
                                       content_index=0, part=part))
            else:
                out.append(self._event("response.function_call_arguments.done", item_id=item["id"],
                                       output_index=index, arguments=item["arguments"]))
            out.append(self._event("response.output_item.done", output_index=index, item=item))
        return out

    async def events(self) -> AsyncIterator[bytes]:
        yield self._event("response.created", response=self._response("in_progress"))
        yield self._event("response.in_progress", response=self._response("in_progress"))
        answer = self.answer
        async for i, event in answer._events():
            text = answer.texts[i]
            if isinstance(event, Tokens):
                piece = text.feed(event.ids, event.logprobs)
                for chunk in self._pieces(text.asm.text(), piece, final=False):
                    yield chunk
                continue
            final: Final = event
            if final.reason in ("error", "cancelled"):
                err = answer._failure(final)
                answer.metrics.http_request(answer.path, err.status)
                yield self._event("error", code=err.code, message=err.message, param=err.param)
                return
            piece = text.finish(final.reason, final.tokens, final.logprobs)
            for chunk in self._pieces(text.asm.text(), piece, final=True):
                yield chunk
            status = "incomplete" if final.reason == "length" else "completed"
            for chunk in self._close_items(status):
                yield chunk
            response = self._response(status)
            if status == "incomplete":
                response["incomplete_details"] = {"reason": "max_output_tokens"}
            response["usage"] = _usage(answer._usage())
            yield self._event(f"response.{status}", response=response)

    def _pieces(self, whole: str, piece: str, final: bool) -> list[bytes]:
        if self.tools is None:
            return self._text(piece) if piece else []
        if final:
            content, fragments, _ = self.tools.finish(whole)
        else:
            content, fragments = self.tools.feed(whole)
        out = self._text(content) if content else []
        for frag in fragments:
            out.extend(self._fragment(frag))
        return out
