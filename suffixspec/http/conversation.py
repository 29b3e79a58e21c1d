"""A chat request's conversation as prompt tokens: messages checked, tools and tool history rendered, an
assistant prefill continued.

Contract of `chat_prompt(body, ctx, tools) -> ids`:

* `messages`: a non-empty list of `{role, content}` (roles system, user, assistant, tool, developer;
  content a string or text parts, or null for an assistant message carrying `tool_calls`). An
  assistant's `tool_calls` (`{id, type: "function", function: {name, arguments}}`) and a tool
  message's `tool_call_id` are kept; every problem is a 400 naming the message and field.
* With tools (`tools.ToolSpec`, whatever the choice, "none" included): a template that takes `tools`
  gets them (and the history as it is); any other gets `tools.system_prompt` merged into a leading
  system message, earlier calls written in the Hermes format and tool results as `tool` turns.
* `continue_final_message: true` with `add_generation_prompt: false` (vLLM's names) continues the final
  assistant message: the prompt ends with its text, no turn is opened, and the answer is only the
  continuation. Both true, or continuing a final message that is not the assistant's, is a 400.
"""

from __future__ import annotations

import json

from ..errors import BadInputError
from .fields import APIError, bad, fits, text_content
from .tools import ToolSpec, call_text, system_prompt

__all__ = ["chat_prompt"]

ROLES = ("system", "user", "assistant", "tool", "developer")


def _tool_calls(raw, i: int) -> list[dict]:
    where = f"messages[{i}].tool_calls"
    if not isinstance(raw, list):
        raise bad(f"{where}: expected a list of tool calls", where, "invalid_type")
    calls = []
    for j, call in enumerate(raw):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not isinstance(
                fn.get("arguments", "{}"), str):
            raise bad(f'{where}[{j}]: expected {{"id", "type": "function", "function": {{"name", "arguments": '
                       f'"<JSON text>"}}}}', f"{where}[{j}]", "invalid_type")
        arguments = fn.get("arguments", "{}")
        try:
            parsed = json.loads(arguments)
        except ValueError:
            raise bad(f"{where}[{j}].function.arguments: expected a JSON object as text, got {arguments[:60]!r}",
                       f"{where}[{j}].function.arguments") from None
        calls.append({"id": call.get("id"), "type": "function",
                      "function": {"name": fn["name"], "arguments": parsed, "arguments_text": arguments}})
    return calls


def _turns(messages) -> list[dict]:
    if messages is None:
        raise bad("messages: required", "messages", "missing_required_parameter")
    if not isinstance(messages, list):
        raise bad(f"messages: expected a list of messages, got {type(messages).__name__}", "messages", "invalid_type")
    if not messages:
        raise bad("messages: the conversation is empty", "messages")
    turns = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise bad(f"messages[{i}]: expected an object with role and content", f"messages[{i}]", "invalid_type")
        role = m.get("role")
        if role not in ROLES:
            raise bad(f"messages[{i}].role: expected one of {', '.join(ROLES)}, got {role!r}", f"messages[{i}].role")
        content = m.get("content")
        turn = {"role": role, "content": "" if content is None else text_content(content, f"messages[{i}].content")}
        if role == "assistant" and m.get("tool_calls"):
            turn["tool_calls"] = _tool_calls(m["tool_calls"], i)
        if role == "tool" and m.get("tool_call_id") is not None:
            turn["tool_call_id"] = str(m["tool_call_id"])
        turns.append(turn)
    if not any(t["content"] or t.get("tool_calls") for t in turns):
        raise bad("messages: every message is empty", "messages")
    return turns


def _plain_history(turns: list[dict], tools: ToolSpec) -> list[dict]:
    """The conversation for a template without tool support: the tools described in the system
    message, earlier calls written out, tool results as `tool` turns."""
    out = []
    for t in turns:
        t = dict(t)
        calls = t.pop("tool_calls", None)
        t.pop("tool_call_id", None)
        if calls:
            written = "\n".join(call_text(c["function"]["name"], json.dumps(c["function"]["arguments"],
                                                                            separators=(",", ":")))
                                for c in calls)
            t["content"] = (t["content"] + "\n" if t["content"] else "") + written
        out.append(t)
    prompt = system_prompt(tools.tools)
    if out and out[0]["role"] == "system":
        out[0] = dict(out[0], content=prompt + "\n\n" + out[0]["content"])
    else:
        out.insert(0, {"role": "system", "content": prompt})
    return out


def _flags(body: dict) -> bool:
    """Whether the final assistant message is continued (vLLM's two flags checked together)."""
    cont = body.get("continue_final_message", False)
    gen = body.get("add_generation_prompt", True)
    for name, value in (("continue_final_message", cont), ("add_generation_prompt", gen)):
        if not isinstance(value, bool):
            raise bad(f"{name}: expected true or false, got {value!r}", name, "invalid_type")
    if cont and gen:
        raise bad("continue_final_message: needs add_generation_prompt set to false (one continues the last "
                   "message, the other opens a new turn)", "continue_final_message")
    if not cont and not gen:
        raise bad("add_generation_prompt: false only with continue_final_message true", "add_generation_prompt")
    return cont


def chat_prompt(body: dict, ctx, tools: ToolSpec | None) -> list[int]:
    from .chat import ChatTemplateError

    turns = _turns(body.get("messages"))
    prefill = _flags(body)
    if prefill and (turns[-1]["role"] != "assistant" or not turns[-1]["content"]):
        raise bad("continue_final_message: the final message must be the assistant's, with text", "messages")
    fits(ctx, "".join(t["content"] for t in turns), "messages")
    if ctx.chat is None:
        raise APIError(400, "messages: this model has no chat template; start the server with --chat-template FILE",
                       param="messages", code="no_chat_template")
    # tools stay in the prompt under tool_choice "none" too (as vLLM and OpenAI keep them): an agent's
    # closing turn then starts like its earlier turns, and the prefix cache finds them
    active = tools is not None and bool(tools.tools)
    takes_tools = active and ctx.chat.takes_tools
    if active and not takes_tools:
        turns = _plain_history(turns, tools)
    try:
        text = ctx.chat.render(turns, tools=[t.as_openai() for t in tools.tools] if takes_tools else None,
                               add_generation_prompt=not prefill)
    except ChatTemplateError as exc:
        raise bad(str(exc), "messages") from None
    if prefill:  # the prompt ends with the final message's text, its end-of-turn cut
        final = turns[-1]["content"]
        at = text.rfind(final)
        if at < 0:
            raise bad("continue_final_message: the chat template does not write the final message as it is",
                       "messages")
        text = text[: at + len(final)]
    ids = list(ctx.tokenizer.encode(text))
    if not ids:
        raise bad("messages: the conversation encodes to no tokens", "messages")
    return ids


def check_tools(body: dict):
    from .tools import parse_tools

    try:
        return parse_tools(body)
    except BadInputError as exc:
        raise bad(str(exc), exc.param) from None
