"""An agent workload through `suffixspec serve`: scripted tool-using conversations over shipped code.

    python bench/bench_agent.py                       # 4 conversations, chat and Responses APIs, c=1 and 4
    python bench/bench_agent.py --conversations 6 --apis chat --record

Each conversation edits one shipped function (`corpora/copy_edit_prompts.jsonl`: add a docstring,
drop the comments, ...) with two tools, `read_file` and `write_file`: turn 1 the model must call
`read_file` (a named tool choice), the tool answers with the function's source; turn 2 it must call
`write_file` with the new file content (which copies the source it just read); the tool answers
"written"; turn 3 it answers in text (`tool_choice: "none"`). Later turns repeat earlier content, as
agents' do. Driven through `/v1/chat/completions` with tools and through `/v1/responses`, greedy,
with the response cache on and off (`--no-response-cache`), at concurrency 1 and 4 (conversations in
parallel threads), each setting on a fresh server (so no setting drafts from another's answers):
plain decoding (`suffixspec.budget: 0`, which adds nothing to the cache) first, then speculative.
Reports tokens per round (from `usage.suffixspec`) and the speed-up over plain (wall time of all
conversations). Prints a table, then one JSON line (`--record [PATH]`: bench/results/agent.jsonl).
Run timed benchmarks one at a time (`flock LOCKFILE python bench/bench_agent.py`).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import common

TOOLS = [{"type": "function", "function": {"name": "read_file", "description": "Read a function from a file.",
                                           "parameters": {"type": "object", "properties": {
                                               "path": {"type": "string"}, "function": {"type": "string"}},
                                               "required": ["path", "function"], "additionalProperties": False}}},
         {"type": "function", "function": {"name": "write_file", "description": "Replace a function in a file.",
                                           "parameters": {"type": "object", "properties": {
                                               "path": {"type": "string"}, "content": {"type": "string"}},
                                               "required": ["path", "content"], "additionalProperties": False}}}]
LIMITS = (40, 200, 24)  # tokens per turn: the read call, the write call, the closing text


def conversations(n: int) -> list[dict]:
    rows = [json.loads(line) for line in (common.CORPORA / "copy_edit_prompts.jsonl").read_text().splitlines()]
    out = []
    for r in rows[:n]:
        path, function = r["source"].split(":")[:2]
        task = r["prompt"].split("\n\n```")[0]
        code = re.search(r"```python\n(.*?)```", r["prompt"], re.S).group(1)
        out.append({"task": f"{task} The function is {function} in {path}.", "code": code})
    return out


def chat_conversation(oai, model: str, conv: dict, budget) -> dict:
    messages = [{"role": "system", "content": "You are a coding agent. Work through the tools."},
                {"role": "user", "content": conv["task"]}]
    stats = {"tokens": 0, "rounds": 0}
    for turn, (choice, limit) in enumerate(zip(("read_file", "write_file", None), LIMITS)):
        tool_choice = {"type": "function", "function": {"name": choice}} if choice else "none"
        r = oai.chat.completions.create(model=model, messages=messages, tools=TOOLS, tool_choice=tool_choice,
                                        max_tokens=limit, temperature=0, parallel_tool_calls=False,
                                        extra_body={"suffixspec": {"budget": budget}})
        use = r.usage.model_extra["suffixspec"]
        stats["tokens"] += r.usage.completion_tokens
        stats["rounds"] += use["rounds"]
        msg = r.choices[0].message
        if not msg.tool_calls:
            break
        call = msg.tool_calls[0]
        messages.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": call.id, "type": "function", "function": {"name": call.function.name,
                                                             "arguments": call.function.arguments}}]})
        messages.append({"role": "tool", "tool_call_id": call.id, "content": conv["code"] if turn == 0 else "written"})
    return stats


def responses_conversation(oai, model: str, conv: dict, budget) -> dict:
    items = [{"role": "user", "content": conv["task"]}]
    tools = [{"type": "function", **t["function"]} for t in TOOLS]
    stats = {"tokens": 0, "rounds": 0}
    for turn, (choice, limit) in enumerate(zip(("read_file", "write_file", None), LIMITS)):
        r = oai.responses.create(model=model, input=items, instructions="You are a coding agent. Work through the tools.",
                                 tools=tools, tool_choice={"type": "function", "name": choice} if choice else "none",
                                 max_output_tokens=limit, temperature=0, parallel_tool_calls=False,
                                 extra_body={"suffixspec": {"budget": budget}})
        stats["tokens"] += r.usage.output_tokens
        stats["rounds"] += r.usage.model_extra["suffixspec"]["rounds"]
        calls = [item for item in r.output if item.type == "function_call"]
        if not calls:
            break
        items.append({"type": "function_call", "call_id": calls[0].call_id, "name": calls[0].name,
                      "arguments": calls[0].arguments})
        items.append({"type": "function_call_output", "call_id": calls[0].call_id,
                      "output": conv["code"] if turn == 0 else "written"})
    return stats


def run_setting(args, api: str, cache: bool, concurrency: int, convs: list[dict]) -> dict:
    import openai

    extra = ["--threads", str(args.threads)] + ([] if cache else ["--no-response-cache"])
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = common.spawn_server(None, max(4, concurrency), Path(tmp) / "server.log", extra)
        try:
            oai = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=600)
            model = oai.models.list().data[0].id
            drive = chat_conversation if api == "chat" else responses_conversation
            drive(oai, model, convs[0], 0)  # warm-up (plain: nothing reaches the cache)
            out = {}
            for budget in (0, "auto"):
                t = time.perf_counter()
                with ThreadPoolExecutor(concurrency) as pool:
                    stats = list(pool.map(lambda c: drive(oai, model, c, budget), convs))
                out[budget] = {"s": time.perf_counter() - t, "tokens": sum(s["tokens"] for s in stats),
                               "rounds": sum(s["rounds"] for s in stats)}
        finally:
            proc.terminate()
            proc.wait(60)
    return {"plain_s": out[0]["s"], "spec_s": out["auto"]["s"], "speedup": out[0]["s"] / out["auto"]["s"],
            "tokens_per_round": out["auto"]["tokens"] / max(1, out["auto"]["rounds"]),
            "tokens": out["auto"]["tokens"], "plain_tokens": out[0]["tokens"]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--conversations", type=int, default=4)
    p.add_argument("--apis", default="chat,responses")
    p.add_argument("--concurrency", default="1,4")
    p.add_argument("--threads", type=int, default=1, help="the server's torch CPU threads")
    common.add_record_flag(p)
    args = p.parse_args(argv)
    convs = conversations(args.conversations)
    results = []
    print(f"{'api':>9} {'cache':>5} {'c':>2} {'tokens/round':>12} {'plain s':>8} {'spec s':>7} {'speed-up':>8}")
    for api in args.apis.split(","):
        for cache in (True, False):
            for c in (int(x) for x in args.concurrency.split(",")):
                r = dict(api=api, cache=cache, concurrency=c, **run_setting(args, api, cache, c, convs))
                results.append(r)
                print(f"{api:>9} {str(cache):>5} {c:>2} {r['tokens_per_round']:>12.2f} {r['plain_s']:>8.1f} "
                      f"{r['spec_s']:>7.1f} {r['speedup']:>7.2f}x", flush=True)
    common.emit({"conversations": args.conversations, "turn_limits": LIMITS, "settings": results}, args, "agent")
    return 0


if __name__ == "__main__":
    sys.exit(main())
