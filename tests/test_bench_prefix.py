"""The prefix-cache measuring scripts' own parts, without a server: `bench/bench_agent.py --ttft`
(a stream read into a turn, a conversation's history, the turns summarised against the targets, the
refusal to measure on a server without the cache's flags) and `bench/bench_prefix_memory.py` (the
prompts, /proc and /metrics read, the readings summarised against the bound)."""

import importlib.util
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def load(name, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "bench"))  # its sibling modules, as `python bench/x.py` finds them
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, mod)  # (its dataclasses look their module up)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def agent(monkeypatch):
    return load("bench_agent", monkeypatch)


@pytest.fixture
def memory(monkeypatch):
    return load("bench_prefix_memory", monkeypatch)


def chunk(delta=None, reason=None, usage=None):
    return {"choices": [] if delta is None and reason is None else
            [{"index": 0, "delta": delta or {}, "finish_reason": reason}], "usage": usage}


USAGE = {"prompt_tokens": 900, "completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": 640},
         "suffixspec": {"ttft_ms": 120.5}}


def test_a_stream_reads_into_its_turn(agent):
    events = [(0.01, chunk({"role": "assistant", "content": ""})),
              (0.30, chunk({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                            "function": {"name": "read_file", "arguments": ""}}]})),
              (0.35, chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"path":'}}]})),
              (0.40, chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"a.py"}'}}]})),
              (0.41, chunk(reason="tool_calls")), (0.42, chunk(usage=USAGE))]
    r = agent.read_stream(events)
    assert (r.prompt_tokens, r.completion_tokens, r.cached_tokens, r.ttft_ms) == (900, 5, 640, 120.5)
    assert r.first_out_s == 0.30 and r.e2e_s == 0.42 and r.finish_reason == "tool_calls" and r.content == ""
    assert r.calls == [{"id": "call_1", "name": "read_file", "arguments": '{"path":"a.py"}'}]
    text = agent.read_stream([(0.0, chunk({"role": "assistant", "content": ""})), (0.2, chunk({"content": "It "})),
                              (0.3, chunk({"content": "wraps."}, "stop")),
                              (0.4, chunk(usage={"prompt_tokens": 3, "completion_tokens": 2}))])
    assert text.content == "It wraps." and text.first_out_s == 0.2 and text.cached_tokens is None
    assert text.ttft_ms is None and text.calls == []
    with pytest.raises(ValueError, match="include_usage"):
        agent.read_stream([(0.1, chunk({"content": "x"}, "stop"))])


def test_a_conversation_follows_its_script(agent):
    script = agent.agent_script("fnmatch.py", "fnmatchcase")
    assert [s.tool_choice for s in script.steps] == ["read_file", "write_file", "run_tests", "auto"]
    assert "def fnmatchcase" in script.steps[0].then and "def translate" in script.steps[0].then
    body = agent.turn_body("m", script, script.messages, script.steps[0])
    assert body["tool_choice"] == {"type": "function", "function": {"name": "read_file"}} and body["temperature"] == 0
    assert agent.turn_body("m", script, [], script.steps[3])["tool_choice"] == "auto"
    call = agent.Reading(1, 1, None, None, None, 0.1, "tool_calls", "", [{"id": "c1", "name": "read_file",
                                                                           "arguments": '{"path":"fnmatch.py"}'}])
    messages = list(script.messages)
    assert agent.follow(messages, script.steps[0], call) is None
    assert messages[-2]["tool_calls"][0]["function"]["arguments"] == '{"path":"fnmatch.py"}'
    assert messages[-1] == {"role": "tool", "tool_call_id": "c1", "content": script.steps[0].then}
    call.finish_reason = "length"  # a forced call cut short: nothing valid to send back
    assert "cut at max_tokens" in agent.follow(list(script.messages), script.steps[1], call)
    chat = agent.chat_script()
    assert len(chat.steps) == 5 and [s.then for s in chat.steps[:4]] == list(agent.FOLLOW_UPS)
    assert "class Repr" in chat.messages[0]["content"] and "tools" not in agent.turn_body("m", chat, [], chat.steps[0])
    messages = list(chat.messages)
    answer = agent.Reading(1, 1, None, None, 0.1, 0.2, "stop", "It shortens reprs.")
    assert agent.follow(messages, chat.steps[0], answer) is None
    assert messages[-2:] == [{"role": "assistant", "content": "It shortens reprs."},
                             {"role": "user", "content": agent.FOLLOW_UPS[0]}]
    assert agent.follow(messages, chat.steps[-1], answer) == "done"


def reading(agent, prompt, cached, ttft, answer="x"):
    return agent.Reading(prompt, 4, cached, ttft, ttft / 1e3 + 0.01, 0.5, "stop", answer)


def test_turns_summarise_against_the_targets(agent):
    rows, prev = [], None
    for turn, (prompt, cached, on, off) in enumerate([(500, 0, 400.0, 410.0), (900, 480, 150.0, 700.0),
                                                      (1000, 890, 60.0, 800.0), (1100, 990, 70.0, 850.0)], 1):
        rows.append(agent.turn_row("agent:x.py", turn, reading(agent, prompt, cached, on),
                                   reading(agent, prompt, 0, off), prev))
        prev = prompt
    rows.append(agent.turn_row("chat:y.py", 1, reading(agent, 1500, 0, 900.0), reading(agent, 1500, 0, 1000.0), None))
    rows.append(agent.turn_row("chat:y.py", 2, reading(agent, 1600, 1500, 100.0, "a"),
                               reading(agent, 1600, 0, 1000.0, "b"), 1500))
    assert rows[1]["cached_share"] == pytest.approx(480 / 500) and rows[0]["cached_share"] is None
    assert rows[2]["ttft_ratio"] == pytest.approx(60 / 800) and rows[5]["same_answer"] is False
    s = agent.summarise(rows)
    ratios = sorted([150 / 700, 60 / 800, 70 / 850])
    assert s["agent"]["ttft_ratio"] == {"median": pytest.approx(ratios[1]), "min": pytest.approx(ratios[0]),
                                        "max": pytest.approx(ratios[2]), "n": 3}
    assert s["agent"]["ttft_target_met"] is True and s["agent"]["cached_target_met"] is True
    assert s["agent"]["first_turn_ttft_ratio"]["median"] == pytest.approx(400 / 410)
    assert s["chat"]["later_turns"] == 1 and s["chat"]["answers_differing"] == 1
    assert s["all"]["later_turns"] == 4 and s["all"]["cached_share"]["min"] == pytest.approx(480 / 500)
    rows[2]["cached_share"] = 0.5  # one turn under 80%: the target fails, whatever the median
    assert agent.summarise(rows)["agent"]["cached_target_met"] is False
    for r in rows:  # a server that reports no cached tokens: no verdict on them, never a made-up one
        r["cached_tokens"] = None
        r["cached_share"] = None if r["turn"] >= 2 else r["cached_share"]
    s = agent.summarise(rows)
    assert s["all"]["cached_reported"] is False and s["all"]["cached_target_met"] is None
    assert any("not reported" in line for line in agent.format_summary(s))
    assert all(agent.format_row(r) for r in rows)


def test_no_measurement_without_the_cache_flags(agent, monkeypatch):
    help_text = "usage: serve [--port PORT] [--no-response-cache]"
    monkeypatch.setattr(agent.common, "serve_command", lambda port, *flags: [sys.executable, "-c",
                                                                            f"print({help_text!r})"])
    with pytest.raises(SystemExit, match="does not take --no-prefix-cache.*nothing was measured"):
        agent.require_serve_flags(("--no-prefix-cache",))
    monkeypatch.setattr(agent.common, "serve_command", lambda port, *flags: [
        sys.executable, "-c", "print('--prefix-cache-bytes N  --no-prefix-cache')"])
    agent.require_serve_flags(agent.FLAGS)


def test_memory_prompts_and_readings(memory):
    prompts = memory.distinct_prompts(70, 5000)
    assert len(prompts) == 70 and len({p[:40] for p in prompts}) == 70
    assert all(4000 < len(p) <= 5000 and p.endswith("\n") for p in prompts)
    with pytest.raises(SystemExit, match="at most"):
        memory.distinct_prompts(10_000, 100)
    assert memory.parse_vmrss("Name:\tx\nVmRSS:\t  2048 kB\nVmSwap: 0 kB\n") == 2048 * 1024
    with pytest.raises(ValueError):
        memory.parse_vmrss("Name:\tx\n")
    assert memory.tree_rss(os.getpid()) >= memory.parse_vmrss(Path("/proc/self/status").read_text()) // 2
    text = ("# HELP suffixspec_prefix_cache_bytes pool\n# TYPE suffixspec_prefix_cache_bytes gauge\n"
            "suffixspec_prefix_cache_bytes 1.5e+08\nsuffixspec_prefix_cache_evictions_total 3.0\n"
            "suffixspec_prefix_cache_evictions_created 1.7e9\n"
            'suffixspec_http_requests_total{path="/v1/completions",status="200"} 4\n'
            'suffixspec_http_requests_total{path="/metrics",status="200"} 2\n')
    metrics = memory.parse_metrics(text)
    assert metrics["suffixspec_http_requests_total"] == 6
    assert memory.cache_series(metrics) == {"pool_bytes": 1.5e8, "evictions": 3.0}
    assert memory.cache_series({"suffixspec_rounds_total": 1.0}) == {"pool_bytes": None, "evictions": None}


def test_memory_summary_against_the_bound(memory):
    mib = memory.MIB
    base = 900 * mib

    def readings(per_prompt, evict_from):
        out = []
        for n in range(71):
            rss = base + min(n, 30) * per_prompt * mib + (n % 3) * mib  # grows until the pool fills at 30
            out.append({"prompts": n, "rss": rss, "pool_bytes": None, "evictions": 1.0 if n >= evict_from else 0.0})
        return out

    s = memory.summarise(readings(30, 31), bound=900 * mib, flat_bytes=64 * mib)
    assert [m["prompts"] for m in s["phases"]] == [20, 70]
    assert s["phases"][0]["growth"] == 20 * 30 * mib + 2 * mib and s["allowed_growth"] == 900 * mib + memory.GIB // 2
    assert s["bound_met"] is True and s["full_at"] == 31 and s["flat_met"] is True
    assert s["growth_after_full"] == readings(30, 31)[70]["rss"] - readings(30, 31)[31]["rss"]
    over = memory.summarise(readings(60, 31), bound=900 * mib, flat_bytes=64 * mib)
    assert over["bound_met"] is False  # 30 x 60 MiB > 900 + 512 MiB
    late = memory.summarise(readings(30, 10), bound=900 * mib, flat_bytes=64 * mib)
    assert late["full_at"] == 10 and late["flat_met"] is False  # it still grew after its first eviction
    never = memory.summarise(readings(30, 99), bound=None, flat_bytes=64 * mib)
    assert never["full_at"] is None and never["flat_met"] is None and never["bound_met"] is None
    arms = {"on": readings(30, 31), "off": readings(30, 99)}
    lines = memory.table(arms) + memory.verdicts({"on": s, "off": never, "flat_bytes": 64 * mib})
    assert len(lines) == 1 + 2 * 3 + 1 and "met" in lines[-1]
