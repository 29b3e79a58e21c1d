"""An agent workload through `suffixspec serve`: scripted tool-using conversations over shipped code.

    python bench/bench_agent.py                       # 4 conversations, chat and Responses APIs, c=1 and 4
    python bench/bench_agent.py --conversations 6 --apis chat --record
    python bench/bench_agent.py --ttft --repeats 2 --record   # prefix cache: TTFT per turn, cached tokens

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

`--ttft`: time to first token turn by turn, with the prefix (KV) cache and without it (issue 53).
Two servers, one with the cache (its bound `--prefix-cache-bytes`, else the server's default) and one
with `--no-prefix-cache`, hear the same conversations in lockstep: each turn's request (streamed,
`stream_options.include_usage`, greedy) goes to both, in alternating order, and both answer the same
prompt (the history carries the cached server's answers; answers that differ are counted: with an
exact cache there are none). The cold reference of a turn is that request on the uncached server: the
same prompt token for token, surely read from its first token, with the same response cache behind it
(a prompt perturbed at its front on the cached server would be another prompt, and would fill its
pool). Conversations: `--agents` agent conversations over a shipped stdlib module read whole
(`read_file`, `write_file` of one function, `run_tests`, a closing answer with `tool_choice` "auto"),
and one chat over `reprlib.py` (about 1,500 tokens) with four follow-up questions. Per turn: the
server's time to first token (`usage.suffixspec.ttft_ms`: from its receipt of the request to the first
token, whatever the answer holds back: a forced call shows nothing until its name is written), the
client's time to the first chunk with output, `prompt_tokens` and
`usage.prompt_tokens_details.cached_tokens`. Targets, from turn 2 on: median TTFT with the cache at
most 0.3x cold; cached tokens at least 80% of the previous turn's prompt on every turn. `--repeats`
runs everything again on fresh servers. Needs a `suffixspec serve` that takes `--no-prefix-cache`;
without it the script stops before measuring anything. Record: bench/results/agent_ttft.jsonl.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
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
        if not msg.tool_calls or r.choices[0].finish_reason == "length":  # (a cut call's arguments are not JSON)
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
        if not calls or r.status == "incomplete":
            break
        items.append({"type": "function_call", "call_id": calls[0].call_id, "name": calls[0].name,
                      "arguments": calls[0].arguments})
        items.append({"type": "function_call_output", "call_id": calls[0].call_id,
                      "output": conv["code"] if turn == 0 else "written"})
    return stats


def run_setting(args, api: str, cache: bool, concurrency: int, convs: list[dict]) -> dict:
    import openai

    extra = ["--threads", str(args.threads or 1)] + ([] if cache else ["--no-response-cache"])
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = common.spawn_server(args.model, max(4, concurrency), Path(tmp) / "server.log", extra)
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


# ----------------------------------------------------------------------------------- --ttft: the prefix cache



def _tool(name: str, description: str, **props) -> dict:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": {k: {"type": "string", "maxLength": n} for k, n in props.items()},
        "required": list(props), "additionalProperties": False}}}


# (string bounds, so that a forced call ends within its turn's tokens: a cut call has no history to send)
AGENT_TOOLS = [_tool("read_file", "Read a file.", path=40), _tool("write_file", "Replace a function in a file.",
                                                                   path=40, function=40, content=900),
               _tool("run_tests", "Run the tests of a file.", path=40)]
AGENT_TASKS = (("fnmatch.py", "fnmatchcase"), ("colorsys.py", "hls_to_rgb"), ("textwrap.py", "indent"),
               ("bisect.py", "insort_left"), ("csv.py", "DictWriter"))
CHAT_FILE = "reprlib.py"
FOLLOW_UPS = ("Which method shortens long strings, and how?", "How would I make it show at most three items of a list?",
              "What does recursive_repr guard against?", "Write a short test for the repr of a deeply nested list.")
TTFT_TARGET, CACHED_TARGET = 0.3, 0.8  # from turn 2 on: median TTFT ratio at most; cached share at least
FLAGS = ("--no-prefix-cache", "--prefix-cache-bytes")


@dataclass(frozen=True)
class Step:
    """One turn of a scripted conversation: its token limit, its tool choice (None: no tools sent), and
    what follows the answer: the tool's result after a call, else the user's next message (None: end)."""

    max_tokens: int
    tool_choice: object = None
    then: str | None = None


@dataclass
class Script:
    name: str
    messages: list
    steps: list
    tools: list | None = None


@dataclass
class Reading:
    """One streamed answer, as its client saw it."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int | None  # usage.prompt_tokens_details.cached_tokens (None: not reported)
    ttft_ms: float | None  # the server's (usage.suffixspec.ttft_ms)
    first_out_s: float | None  # request sent -> first chunk carrying output (None: none did)
    e2e_s: float
    finish_reason: str | None
    content: str = ""
    calls: list = field(default_factory=list)  # {"id", "name", "arguments"}

    def answer(self) -> tuple:
        return self.content, [(c["name"], c["arguments"]) for c in self.calls], self.finish_reason


def stdlib_file(module: str) -> str:
    """A shipped standard-library module as a file: its top-level pieces (corpora/python_stdlib.jsonl)."""
    rows = [json.loads(line) for line in (common.CORPORA / "python_stdlib.jsonl").read_text().splitlines()]
    pieces = [r["text"] for r in rows if r["id"].split(":")[0] == module]
    if not pieces:
        raise SystemExit(f"{module}: not in corpora/python_stdlib.jsonl")
    return "\n\n\n".join(pieces) + "\n"


def agent_script(module: str, function: str) -> Script:
    system = {"role": "system", "content": "You are a coding agent. Work through the tools."}
    task = {"role": "user", "content": f"Add type hints to {function} in {module}: read the file, write the new "
                                       f"{function} back, run the tests, then say what you changed."}
    steps = [Step(96, "read_file", stdlib_file(module)), Step(480, "write_file", "written"),
             Step(96, "run_tests", "4 passed in 0.02s"), Step(64, "auto")]
    return Script(f"agent:{module}", [system, task], steps, AGENT_TOOLS)


def chat_script() -> Script:
    first = (f"Here is {CHAT_FILE}:\n\n```python\n{stdlib_file(CHAT_FILE)}```\n\n"
             "What does this module do? Answer briefly.")
    steps = [Step(64, None, q) for q in FOLLOW_UPS] + [Step(64)]
    return Script(f"chat:{CHAT_FILE}", [{"role": "user", "content": first}], steps)


def read_stream(events) -> Reading:
    """A chat completion stream as `(seconds since the request was sent, chunk as a dict)` pairs, read:
    the text, the calls rebuilt from their fragments, the usage of its last chunk."""
    content, calls, usage, reason, first, last = [], {}, None, None, None, 0.0
    for t, chunk in events:
        last = t
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if first is None and (delta.get("content") or delta.get("tool_calls")):
                first = t
            content.append(delta.get("content") or "")
            for frag in delta.get("tool_calls") or []:
                call = calls.setdefault(frag["index"], {"id": None, "name": None, "arguments": ""})
                fn = frag.get("function") or {}
                call["id"] = frag.get("id") or call["id"]
                call["name"] = fn.get("name") or call["name"]
                call["arguments"] += fn.get("arguments") or ""
            reason = choice.get("finish_reason") or reason
        usage = chunk.get("usage") or usage
    if usage is None:
        raise ValueError("the stream carried no usage (was stream_options.include_usage sent?)")
    details = usage.get("prompt_tokens_details") or {}
    return Reading(usage["prompt_tokens"], usage["completion_tokens"], details.get("cached_tokens"),
                   (usage.get("suffixspec") or {}).get("ttft_ms"), first, last, reason, "".join(content),
                   [calls[k] for k in sorted(calls)])


def timed_turn(oai, body: dict) -> Reading:
    t0 = time.perf_counter()
    stream = oai.chat.completions.create(stream=True, stream_options={"include_usage": True}, **body)
    return read_stream((time.perf_counter() - t0, chunk.model_dump()) for chunk in stream)


def turn_body(model: str, script: Script, messages: list, step: Step) -> dict:
    body = {"model": model, "messages": messages, "max_tokens": step.max_tokens, "temperature": 0}
    if script.tools is not None:
        choice = step.tool_choice
        body.update(tools=script.tools, parallel_tool_calls=False, tool_choice=choice if choice in (
            "auto", "none", "required") else {"type": "function", "function": {"name": choice}})
    return body


def follow(messages: list, step: Step, reading: Reading) -> str | None:
    """The history after a turn (the answer, then the tool's result or the next question), in place; a
    reason to stop instead (a forced call cut short carries no valid arguments to send back)."""
    if reading.calls:
        call = reading.calls[0]
        if reading.finish_reason == "length":
            return f"its {call['name']} call was cut at max_tokens ({step.max_tokens})"
        messages.append({"role": "assistant", "content": reading.content or None, "tool_calls": [
            {"id": call["id"], "type": "function", "function": {"name": call["name"], "arguments": call["arguments"]}}]})
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": step.then or ""})
        return None if step.then is not None else "done"
    if step.tool_choice not in (None, "auto", "none"):
        return "a forced call came back without a call"
    messages.append({"role": "assistant", "content": reading.content})
    if step.then is None:
        return "done"
    messages.append({"role": "user", "content": step.then})
    return None


def converse(servers: dict, model: str, script: Script, flip: int) -> tuple[list[dict], str]:
    """One script through both servers in lockstep; its turns' rows and why it ended."""
    messages, rows, prev = list(script.messages), [], None
    for turn, step in enumerate(script.steps, 1):
        body = turn_body(model, script, messages, step)
        order = ("on", "off") if (turn + flip) % 2 else ("off", "on")
        got = {arm: timed_turn(servers[arm], body) for arm in order}
        on, off = got["on"], got["off"]
        if off.cached_tokens:
            raise SystemExit(f"{script.name} turn {turn}: the --no-prefix-cache server reported "
                             f"{off.cached_tokens} cached tokens: its requests are not cold")
        rows.append(turn_row(script.name, turn, on, off, prev))
        prev = on.prompt_tokens
        end = follow(messages, step, on)
        if end is not None:
            return rows, end
    return rows, "done"


def turn_row(name: str, turn: int, on: Reading, off: Reading, prev_prompt: int | None) -> dict:
    def ratio(a, b):
        return a / b if a is not None and b else None

    cached_share = ratio(on.cached_tokens, prev_prompt) if prev_prompt else None
    return {"conversation": name, "turn": turn, "prompt_tokens": on.prompt_tokens, "cached_tokens": on.cached_tokens,
            "prev_prompt_tokens": prev_prompt, "cached_share": cached_share,
            "ttft_on_ms": on.ttft_ms, "ttft_off_ms": off.ttft_ms, "ttft_ratio": ratio(on.ttft_ms, off.ttft_ms),
            "first_out_on_ms": None if on.first_out_s is None else on.first_out_s * 1e3,
            "first_out_off_ms": None if off.first_out_s is None else off.first_out_s * 1e3,
            "first_out_ratio": ratio(on.first_out_s, off.first_out_s),
            "same_answer": on.answer() == off.answer(), "prompts_equal": on.prompt_tokens == off.prompt_tokens}


def _spread(values: list[float]) -> dict | None:
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def summarise(rows: list[dict]) -> dict:
    """Per kind of conversation (agent, chat) and over all: from turn 2 on, the TTFT ratios (cached
    against cold; the server's, and the client's first output) and the cached shares, with the targets'
    verdicts (None where the server reported no cached tokens); turn 1 alone as a control."""
    out = {}
    for group in ("agent", "chat", "all"):
        mine = [r for r in rows if group == "all" or r["conversation"].startswith(group + ":")]
        later = [r for r in mine if r["turn"] >= 2]
        ratios = [r["ttft_ratio"] for r in later if r["ttft_ratio"] is not None]
        shares = [r["cached_share"] for r in later]
        reported = bool(shares) and all(s is not None for s in shares)
        ttft = _spread(ratios)
        out[group] = {
            "turns": len(mine), "later_turns": len(later),
            "ttft_ratio": ttft,
            "first_out_ratio": _spread([r["first_out_ratio"] for r in later if r["first_out_ratio"] is not None]),
            "first_turn_ttft_ratio": _spread([r["ttft_ratio"] for r in mine
                                              if r["turn"] == 1 and r["ttft_ratio"] is not None]),
            "cached_share": _spread([s for s in shares if s is not None]),
            "cached_reported": reported,
            "ttft_target_met": None if ttft is None else ttft["median"] <= TTFT_TARGET,
            "cached_target_met": (all(s >= CACHED_TARGET for s in shares) if reported else None),
            "answers_differing": sum(not r["same_answer"] for r in mine),
        }
    return out


def require_serve_flags(flags) -> None:
    """Stop, measuring nothing, when `suffixspec serve` does not take every one of `flags`."""
    helped = subprocess.run(common.serve_command(0, "--help"), capture_output=True, text=True, cwd=common.ROOT)
    missing = [f for f in flags if f not in helped.stdout]
    if helped.returncode != 0 or missing:
        raise SystemExit(f"suffixspec serve does not take {', '.join(missing) or 'this'} (the prefix cache of issue "
                         f"53 is not in this build): nothing was measured")


def run_ttft(args) -> dict:
    import openai

    require_serve_flags(FLAGS if args.prefix_cache_bytes is not None else FLAGS[:1])
    scripts = [agent_script(*task) for task in AGENT_TASKS[: args.agents]] + ([chat_script()] if args.chat else [])
    threads = ["--threads", str(args.threads)] if args.threads else []
    on_flags = threads + (
        ["--prefix-cache-bytes", str(args.prefix_cache_bytes)] if args.prefix_cache_bytes is not None else [])
    rows, ends = [], []
    print(f"{'conversation':>18} {'turn':>4} {'prompt':>6} {'cached':>6} {'of prev':>7} {'on ms':>7} "
          f"{'off ms':>7} {'on/off':>6} {'out on/off':>10} {'same':>4}")
    for repeat in range(args.repeats):
        with tempfile.TemporaryDirectory() as tmp:
            procs, servers = [], {}
            try:
                for arm, flags in (("on", on_flags), ("off", threads + ["--no-prefix-cache"])):
                    proc, url = common.spawn_server(args.model, 4, Path(tmp) / f"{arm}.log", flags)
                    procs.append(proc)
                    servers[arm] = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=900)
                model = servers["on"].models.list().data[0].id
                for oai in servers.values():  # warm-up, sharing nothing with the scripts past the template
                    oai.chat.completions.create(model=model, max_tokens=8, temperature=0,
                                                messages=[{"role": "user", "content": "Count to five."}])
                for k, script in enumerate(scripts):
                    got, end = converse(servers, model, script, k + repeat)
                    ends.append({"repeat": repeat, "conversation": script.name, "turns": len(got), "end": end})
                    for r in got:
                        r["repeat"] = repeat
                        print(format_row(r), flush=True)
                    rows += got
            finally:
                for proc in procs:
                    proc.terminate()
                    proc.wait(60)
    return {"mode": "ttft", "model": args.model or "default", "repeats": args.repeats, "threads": args.threads,
            "prefix_cache_bytes": args.prefix_cache_bytes, "targets": {"ttft_ratio_max": TTFT_TARGET,
                                                                       "cached_share_min": CACHED_TARGET},
            "summary": summarise(rows), "conversations": ends, "turns": rows}


def _fmt(value, spec: str, width: int) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:>{width}{spec}}"


def format_row(r: dict) -> str:
    return (f"{r['conversation']:>18} {r['turn']:>4} {r['prompt_tokens']:>6} {_fmt(r['cached_tokens'], 'd', 6)} "
            f"{_fmt(r['cached_share'], '.0%', 7)} {_fmt(r['ttft_on_ms'], '.0f', 7)} {_fmt(r['ttft_off_ms'], '.0f', 7)} "
            f"{_fmt(r['ttft_ratio'], '.2f', 6)} {_fmt(r['first_out_ratio'], '.2f', 10)} "
            f"{'yes' if r['same_answer'] else 'NO':>4}")


def format_summary(summary: dict) -> list[str]:
    lines = []
    for group, s in summary.items():
        if not s["later_turns"]:
            continue
        t, c = s["ttft_ratio"], s["cached_share"]
        ttft = "-" if t is None else f"{t['median']:.2f} ({t['min']:.2f}-{t['max']:.2f}, {t['n']} turns)"
        cached = "not reported" if not s["cached_reported"] else f"min {c['min']:.0%}, median {c['median']:.0%}"
        verdict = {True: "met", False: "NOT met", None: "-"}
        lines.append(f"{group}: from turn 2, TTFT cached/cold median {ttft} [target <= {TTFT_TARGET}: "
                     f"{verdict[s['ttft_target_met']]}]; cached share of the previous prompt {cached} "
                     f"[target >= {CACHED_TARGET:.0%}: {verdict[s['cached_target_met']]}]; "
                     f"answers differing {s['answers_differing']}")
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--conversations", type=int, default=4)
    p.add_argument("--apis", default="chat,responses")
    p.add_argument("--concurrency", default="1,4")
    p.add_argument("--threads", type=int, default=None,
                   help="the servers' torch CPU threads (default: 1; with --ttft the server's own choice)")
    p.add_argument("--model", default=None, help="the served model (default: the embedded default)")
    p.add_argument("--ttft", action="store_true", help="time to first token per turn, prefix cache on and off")
    p.add_argument("--agents", type=int, default=3, help=f"--ttft: agent conversations (at most {len(AGENT_TASKS)})")
    p.add_argument("--no-chat", dest="chat", action="store_false", help="--ttft: leave out the chat conversation")
    p.add_argument("--repeats", type=int, default=2, help="--ttft: runs, each on fresh servers")
    p.add_argument("--prefix-cache-bytes", type=int, default=None,
                   help="--ttft: the cached server's pool bound (default: the server's own)")
    common.add_record_flag(p)
    args = p.parse_args(argv)
    if args.ttft:
        if not 0 <= args.agents <= len(AGENT_TASKS) or args.repeats < 1:
            p.error(f"--agents: expected 0 to {len(AGENT_TASKS)}, --repeats at least 1")
        result = run_ttft(args)
        for line in format_summary(result["summary"]):
            print(line)
        common.emit(result, args, "agent_ttft")
        return 0
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
