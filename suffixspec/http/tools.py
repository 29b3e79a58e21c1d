"""Function tools on chat completions: the request's `tools` and `tool_choice` checked, rendered into the
prompt, forced by a grammar, and the calls parsed back out of the output (whole, or as a stream).

Contract:

* `parse_tools(body) -> ToolSpec | None` checks `tools` (function tools: `name` matching
  `[A-Za-z0-9_-]{1,64}`, an optional `description`, JSON-schema `parameters`), `tool_choice`
  ("none", "auto", "required", or `{"type": "function", "function": {"name": ...}}` naming a listed
  tool) and `parallel_tool_calls` (default true); a bad value raises `BadInputError` naming it.
* The call format is the Hermes one: `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`.
  A template that takes `tools` gets them as its `tools` variable; any other gets `system_prompt(tools)`
  in front of the conversation (merged into a leading system message), describing them and the format.
* `ToolSpec.grammar()` (for "required" and a named function): the Lark grammar, for llguidance, of
  one call (or, with parallel calls, one or more) to an allowed function with arguments valid for its
  schema, compact JSON. "auto" leaves the output free; "none" renders no tools.
* `parse_calls(text, spec)`: `(content, calls)`: every well-formed `<tool_call>` block naming a listed
  tool, or a whole output that is a Llama-3-style JSON call (`{"name": ..., "parameters"|"arguments": {...}}`);
  content is the text outside the calls (None when empty). Anything else stays text. A forced call the
  output ends inside (`max_tokens` cut it; the grammar allows no other end) is a call too, its arguments
  as far as they were written (not valid JSON then; the finish reason says "length"), named by what the
  grammar left possible: its written name, or the one allowed name its written part begins; a cut too
  early to tell which is dropped, never content. Without a forced choice an unclosed call stays text
  (or, after whole calls, is dropped).
* `CallStream` turns a growing output into `delta.tool_calls` fragments: a call's index, id and name
  first, then pieces of its arguments, whose concatenation is the call's arguments string.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field

from ..errors import BadInputError

__all__ = ["Tool", "ToolSpec", "ToolCall", "parse_tools", "parse_calls", "system_prompt", "CallStream",
           "call_text"]

NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
OPEN, CLOSE = "<tool_call>", "</tool_call>"
CALL_HEAD = re.compile(r'<tool_call>\s*\{\s*"name"\s*:\s*"([^"]*)"\s*,\s*"arguments"\s*:\s*')
RAW_ARGS = re.compile(r'^\s*\{\s*"name"\s*:\s*"[^"]*"\s*,\s*"arguments"\s*:\s*(\{.*\})\s*\}\s*$', re.S)
CUT_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"([^"]*)("?)')  # a call's start, its name maybe unfinished
CALL_START = '{"name":"'  # how the grammar (compact JSON) opens a call's body
ARGS_HEAD = re.compile(r'\s*,\s*"arguments"\s*:\s*')
COMPACT = {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}
HOLD = 32  # characters of a call's arguments held back in a stream (they may be the call's closing)


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict

    def as_openai(self) -> dict:
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters}}


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # a JSON object, as text

    def as_openai(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def _call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


@dataclass(frozen=True)
class ToolSpec:
    tools: tuple[Tool, ...]
    choice: str  # "none" | "auto" | "required" | "named"
    named: str | None = None
    parallel: bool = True

    @property
    def forced(self) -> bool:
        return self.choice in ("required", "named")

    @property
    def allowed(self) -> tuple[Tool, ...]:
        return tuple(t for t in self.tools if self.named is None or t.name == self.named)

    def grammar(self) -> str:
        """A Lark grammar (llguidance's dialect) of the calls this choice forces."""
        one_of = [{"type": "object", "properties": {"name": {"const": t.name}, "arguments": t.parameters or
                                                    {"type": "object"}},
                   "required": ["name", "arguments"], "additionalProperties": False} for t in self.allowed]
        schema = dict(one_of[0] if len(one_of) == 1 else {"anyOf": one_of}, **{"x-guidance": COMPACT})
        repeat = "+" if self.parallel and self.choice == "required" else ""
        return (f'start: call{repeat}\ncall: "{OPEN}\\n" body "\\n{CLOSE}\\n"\n'
                f"body: %json {json.dumps(schema)}\n")


def _tool(item, i: int) -> Tool:
    where = f"tools[{i}]"
    if not isinstance(item, dict) or item.get("type", "function") != "function" or not isinstance(
            item.get("function"), dict):
        raise BadInputError(f'{where}: expected {{"type": "function", "function": {{"name": ..., "parameters": '
                            f'{{...}}}}}}, got {str(item)[:80]}', param=where)
    fn = item["function"]
    name = fn.get("name")
    if not isinstance(name, str) or not NAME.match(name):
        raise BadInputError(f"{where}.function.name: expected 1-64 letters, digits, '_' or '-', got {name!r}",
                            param=f"{where}.function.name")
    params = fn.get("parameters")
    if params is None:
        params = {"type": "object", "properties": {}}
    if not isinstance(params, dict):
        raise BadInputError(f"{where}.function.parameters: expected a JSON schema object", param=f"{where}.function.parameters")
    description = fn.get("description") or ""
    if not isinstance(description, str):
        raise BadInputError(f"{where}.function.description: expected a string", param=f"{where}.function.description")
    return Tool(name, description, params)


def parse_tools(body: dict) -> ToolSpec | None:
    raw = body.get("tools")
    choice = body.get("tool_choice")
    parallel = body.get("parallel_tool_calls", True)
    if parallel is None:
        parallel = True
    if not isinstance(parallel, bool):
        raise BadInputError(f"parallel_tool_calls: expected true or false, got {parallel!r}", param="parallel_tool_calls")
    if raw is None or raw == []:
        if choice not in (None, "none", "auto"):
            raise BadInputError("tool_choice: names a tool, but the request lists no tools", param="tool_choice")
        return None
    if not isinstance(raw, list):
        raise BadInputError(f"tools: expected a list of function tools, got {type(raw).__name__}", param="tools")
    tools = tuple(_tool(item, i) for i, item in enumerate(raw))
    names = [t.name for t in tools]
    if len(set(names)) != len(names):
        raise BadInputError(f"tools: function names must be distinct, got {names}", param="tools")
    if choice is None or choice in ("none", "auto", "required"):
        return ToolSpec(tools, choice or "auto", None, parallel)
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict):
        name = choice["function"].get("name")
        if name not in names:
            raise BadInputError(f"tool_choice: names {name!r}, not among the tools ({', '.join(names)})",
                                param="tool_choice")
        return ToolSpec(tools, "named", name, parallel)
    raise BadInputError('tool_choice: expected "none", "auto", "required" or {"type": "function", "function": '
                        f'{{"name": ...}}}}, got {str(choice)[:80]}', param="tool_choice")


def system_prompt(tools: tuple[Tool, ...]) -> str:
    listed = "\n".join(json.dumps(t.as_openai(), ensure_ascii=False) for t in tools)
    return ("You can call functions. Their signatures, one JSON object per line, are inside <tools></tools>:\n"
            f"<tools>\n{listed}\n</tools>\nTo call a function, answer with a JSON object of its name and "
            f"arguments inside {OPEN}{CLOSE} tags, one block per call:\n"
            f'{OPEN}\n{{"name": "<function name>", "arguments": {{<arguments>}}}}\n{CLOSE}')


def call_text(name: str, arguments: str) -> str:
    """A call written in the Hermes format (how an earlier assistant call is rendered for a template
    without tool support)."""
    return f'{OPEN}\n{{"name":"{name}","arguments":{arguments}}}\n{CLOSE}'


def _as_call(obj, names: set[str]) -> ToolCall | None:
    if not isinstance(obj, dict) or obj.get("name") not in names:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return ToolCall(_call_id(), obj["name"], json.dumps(args, ensure_ascii=False, separators=(",", ":")))


def parse_calls(text: str, spec: ToolSpec) -> tuple[str | None, list[ToolCall]]:
    names = {t.name for t in spec.tools}
    calls: list[ToolCall] = []
    rest: list[str] = []
    at = 0
    for m in re.finditer(re.escape(OPEN) + r"(.*?)" + re.escape(CLOSE), text, re.S):
        try:
            call = _as_call(json.loads(m.group(1)), names)
        except ValueError:
            call = None
        raw = RAW_ARGS.match(m.group(1))
        if call is not None and raw is not None:  # the arguments as written (what a stream sent)
            call = ToolCall(call.id, call.name, raw.group(1).strip())
        if call is None:
            continue
        rest.append(text[at:m.start()])
        at = m.end()
        calls.append(call)
    rest.append(text[at:])
    tail = rest[-1]
    cut = tail.find(OPEN)  # where a last call cut short begins (the answer ran out of tokens); not content
    if spec.forced and cut < 0 and tail.strip() and OPEN.startswith(tail.strip()):
        cut = tail.index(tail.strip())  # cut inside its very tag
    if not calls and not (spec.forced and cut >= 0):
        body = text.strip().removeprefix("<|python_tag|>").strip()
        if body.startswith("{"):
            try:
                call = _as_call(json.loads(body), names)
            except ValueError:
                call = None
            if call is not None:
                return None, [call]
        return (text or None), []
    if cut >= 0:
        rest[-1] = tail[:cut]
        partial = _cut_call(tail[cut:], spec) if spec.forced else None
        calls += [partial] if partial is not None else []
    content = "".join(rest).strip()
    return (content or None), calls


def _cut_call(text: str, spec: ToolSpec) -> ToolCall | None:
    """The forced call `text` (from its `<tool_call>` tag on, cut before its end): the allowed function it
    names (the written name, or the only allowed one its written part begins), its arguments as far as
    written. None when that part fits several functions, or is not the forced form."""
    body = text[len(OPEN):] if text.startswith(OPEN) else ""
    head = CUT_HEAD.match(body)
    if head is None and not CALL_START.startswith(body.lstrip()):
        return None
    written, whole = (head.group(1), head.group(2) == '"') if head else ("", False)
    names = [t.name for t in spec.allowed if (t.name == written if whole else t.name.startswith(written))]
    if len(names) != 1:
        return None
    args = ARGS_HEAD.match(body, head.end()) if head is not None and whole else None
    arguments = "" if args is None else body[args.end():]
    try:  # arguments whole, the call cut in its closing: they end where their JSON object does
        value, end = json.JSONDecoder().raw_decode(arguments)
        if isinstance(value, dict):
            arguments = arguments[:end]
    except ValueError:
        pass
    return ToolCall(_call_id(), names[0], arguments)


@dataclass
class _Open:
    index: int
    id: str
    name: str
    start: int  # where its arguments begin in the text
    opened: int  # where its <tool_call> tag is
    sent: int = 0  # argument characters sent


@dataclass
class CallStream:
    """Streamed tool-call fragments over a growing output (`feed(text)` with the whole text so far)."""

    spec: ToolSpec
    calls: list[_Open] = field(default_factory=list)
    text: str = ""

    def feed(self, text: str) -> list[dict]:
        self.text = text
        out = []
        names = {t.name for t in self.spec.tools}
        for m in CALL_HEAD.finditer(text):
            # a head counts once its arguments have begun (the blanks before them are all in)
            if m.end() >= len(text) or any(c.opened == m.start() for c in self.calls) or m.group(1) not in names:
                continue
            call = _Open(len(self.calls), _call_id(), m.group(1), m.end(), m.start())
            self.calls.append(call)
            out.append({"index": call.index, "id": call.id, "type": "function",
                        "function": {"name": call.name, "arguments": ""}})
        for i, call in enumerate(self.calls):
            end = self.calls[i + 1].start if i + 1 < len(self.calls) else len(text)
            closing = text.find(CLOSE, call.start, end)
            ready = (closing if closing >= 0 else end) - HOLD
            if ready - call.start > call.sent:
                piece = text[call.start + call.sent: ready]
                call.sent += len(piece)
                out.append({"index": call.index, "function": {"arguments": piece}})
        return out

    def finish(self, calls: list[ToolCall]) -> list[dict]:
        """The fragments that complete `calls` (as `parse_calls` read them from the final text): the
        rest of each streamed call's arguments, and whole the calls not streamed yet."""
        out = []
        for i, call in enumerate(calls):
            if i < len(self.calls):
                opened = self.calls[i]
                sent = self.text[opened.start: opened.start + opened.sent]
                if call.arguments.startswith(sent) and len(call.arguments) > len(sent):
                    out.append({"index": i, "function": {"arguments": call.arguments[len(sent):]}})
                continue
            out.append({"index": i, "id": call.id, "type": "function",
                        "function": {"name": call.name, "arguments": call.arguments}})
        return out


def _content_safe(text: str, forced: bool) -> str:
    """The part of a streamed output that is surely content, not a call: none of a forced call's, and
    none of an output that opens like a JSON call; else the text before the first call tag, less a
    tail that may be the start of one."""
    head = text.lstrip()
    if forced or head.startswith("{") or head.startswith("<|python_tag|>"):
        return ""
    at = text.find(OPEN)
    if at >= 0:
        return text[:at]
    for k in range(min(len(OPEN) - 1, len(text)), 0, -1):
        if text.endswith(OPEN[:k]):
            return text[:-k]
    return text


@dataclass
class ToolStream:
    """One streamed choice of a request with tools: content pieces and call fragments as its text grows."""

    spec: ToolSpec
    calls: CallStream = None
    sent: str = ""  # content sent

    def __post_init__(self):
        self.calls = CallStream(self.spec)

    def _content(self, final: str) -> str:
        piece = final[len(self.sent):] if final.startswith(self.sent) else ""
        self.sent += piece
        return piece

    def feed(self, text: str) -> tuple[str, list[dict]]:
        fragments = self.calls.feed(text)
        return self._content(_content_safe(text, self.spec.forced)), fragments

    def finish(self, text: str) -> tuple[str, list[dict], list[ToolCall]]:
        content, calls = parse_calls(text, self.spec)
        fragments = self.calls.finish(calls)
        return self._content(content or ""), fragments, calls
