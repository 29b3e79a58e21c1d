"""`suffixspec bench --url`: the HTTP backend against a fake OpenAI-compatible server on loopback.

The fake server (Starlette + uvicorn, in a thread) streams server-sent events with known timing: the
first chunk `PREFILL_S` after the request, then one chunk every `CHUNK_S`; one word per chunk at
`suffixspec.budget` 0, three otherwise, so every count and the speed-up are predictable."""

import asyncio
import json
import threading
import time

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from suffixspec.bench import BenchSettings, Request, Workload, run_benchmark, summarize
from suffixspec.bench.remote import HTTPBackend, default_modes, list_models, parse_modes, request_prompts
from suffixspec.errors import BadInputError

PREFILL_S, CHUNK_S, KEY = 0.02, 0.01, "sekret"


def answer_words(prompt: str, n: int) -> list[str]:
    return [f" w{(len(prompt) * 7 + 3 * i) % 53}" for i in range(n)]


class FakeOpenAI:
    def __init__(self):
        self.bodies = []
        self.open = 0
        self.max_open = 0
        self.app = Starlette(routes=[Route("/v1/models", self.models),
                                     Route("/v1/completions", self.completions, methods=["POST"]),
                                     Route("/v1/chat/completions", self.chat, methods=["POST"])])

    @staticmethod
    def error(status, message, param=None):
        return JSONResponse({"error": {"message": message, "type": "invalid_request_error", "param": param,
                                       "code": None}}, status_code=status)

    def authorized(self, request):
        return request.headers.get("authorization") == f"Bearer {KEY}"

    async def models(self, request):
        if not self.authorized(request):
            return self.error(401, "invalid API key")
        return JSONResponse({"object": "list", "data": [{"id": "fake-model", "object": "model"}]})

    async def completions(self, request):
        return await self.generate(request, chat=False)

    async def chat(self, request):
        return await self.generate(request, chat=True)

    async def generate(self, request, chat):
        if not self.authorized(request):
            return self.error(401, "invalid API key")
        body = await request.json()
        self.bodies.append(body)
        if body.get("fail"):
            return self.error(400, "fail requested", "fail")
        prompt = body["messages"][-1]["content"] if chat else body["prompt"]
        n = int(body["max_tokens"])
        words = answer_words(prompt if isinstance(prompt, str) else json.dumps(prompt), n)
        if body.get("diverge"):
            words = [w.upper() for w in words]
        per = 1 if (body.get("suffixspec") or {}).get("budget") == 0 else 3
        rounds = -(-n // per)
        kind = "chat.completion" if chat else "text_completion"
        usage = {"prompt_tokens": 5, "completion_tokens": n, "total_tokens": 5 + n,
                 "suffixspec": {"rounds": rounds, "tokens_per_round": n / rounds, "drafted": 0 if per == 1 else 3 * rounds,
                                "accepted": n - rounds if per > 1 else 0, "acceptance_rate": 0.0,
                                "proposer_ms": 1.5, "verifier_ms": 4.0}}
        if not body.get("stream"):
            text = "".join(words)
            choice = {"index": 0, "finish_reason": "length",
                      **({"message": {"role": "assistant", "content": text}} if chat else {"text": text})}
            return JSONResponse({"id": "x", "object": kind, "model": body.get("model"), "choices": [choice], "usage": usage})

        def chunk(text, reason=None):
            choice = {"index": 0, "finish_reason": reason,
                      **({"delta": {"content": text}} if chat else {"text": text})}
            return "data: " + json.dumps({"id": "x", "object": kind + ".chunk", "choices": [choice]}) + "\n\n"

        async def stream():
            self.open += 1
            self.max_open = max(self.max_open, self.open)
            try:
                await asyncio.sleep(PREFILL_S)
                for i in range(0, n, per):
                    if i:
                        await asyncio.sleep(CHUNK_S)
                    yield chunk("".join(words[i:i + per]))
                yield chunk("", "length")
                if (body.get("stream_options") or {}).get("include_usage"):
                    yield "data: " + json.dumps({"id": "x", "object": kind + ".chunk", "choices": [], "usage": usage}) + "\n\n"
                yield "data: [DONE]\n\n"
            finally:
                self.open -= 1

        return StreamingResponse(stream(), media_type="text/event-stream")


@pytest.fixture(scope="module")
def fake_server():
    fake = FakeOpenAI()
    server = uvicorn.Server(uvicorn.Config(fake.app, host="127.0.0.1", port=0, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the fake server did not start"
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    yield fake, f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)


def text_workload(n=3):
    from suffixspec.bench import chatml, user_turn

    qs = [f"question number {i} " + "x" * i for i in range(n)]
    return Workload("fake", [Request(f"r{i}", prompt=chatml(q), messages=user_turn(q)) for i, q in enumerate(qs)], "test")


def backends_for(url, modes, **kw):
    return {name: HTTPBackend(url, body=body, api_key=KEY, model="fake-model", **kw) for name, body in modes.items()}


def test_stream_timing_counts_and_speedup(fake_server):
    fake, url = fake_server
    fake.bodies.clear()
    fake.max_open = 0
    wl = text_workload(4)
    # three repeats: the figures below are medians, robust to one repeat stalled by a busy machine
    settings = BenchSettings(concurrency=[1, 2], max_new_tokens=12, modes=("plain", "speculative"), repeat=3)
    backends = backends_for(url, default_modes("auto"))
    runs = run_benchmark(wl, request_prompts(wl), backends, settings, progress=False)
    records = summarize(runs, settings)
    by = {(r["mode"], r["concurrency"]): r for r in records}
    assert set(by) == {("plain", 1), ("speculative", 1), ("plain", 2), ("speculative", 2)}
    for (mode, c), rec in by.items():
        assert rec["failures"] == 0 and rec["mismatches"] == 0 and rec["new_tokens"] == 3 * 48, rec
        # from usage.suffixspec: 12 rounds of 1 token (plain), 4 rounds of 3 (3 drafted, 2 accepted each)
        assert rec["mean_accepted_tokens"] == pytest.approx(1.0 if mode == "plain" else 3.0)
        assert rec["acceptance_rate"] == pytest.approx(0.0 if mode == "plain" else 8 / 12)
        assert rec["drafted_per_round"] == pytest.approx(0.0 if mode == "plain" else 3.0)
        assert rec["proposer_s"] == pytest.approx(4 * 0.0015) and rec["verifier_s"] == pytest.approx(4 * 0.004)
        # the client's clock: the first chunk after PREFILL_S, then one every CHUNK_S
        assert rec["ttft_ms"] >= 0.9e3 * PREFILL_S
        expected_tpot = CHUNK_S * (11 if mode == "plain" else 3) / 11
        # the server's sleeps bound it below; above, a busy machine only adds (no timing bound but a
        # sanity one: the per-token clock is pinned by the ratio of the two modes below)
        assert 0.9 * expected_tpot * 1e3 <= rec["tpot_ms"] <= 1e3 * (5 * expected_tpot + 0.2), (mode, c, rec["tpot_ms"])
    for c in (1, 2):  # per token, not per chunk: speculative chunks carry 3 tokens (3/11 of plain's time a token)
        ratio = by[("speculative", c)]["tpot_ms"] / by[("plain", c)]["tpot_ms"]
        assert 0.1 < ratio < 0.6, (c, ratio)
    # plain takes 20 + 110 ms a request, speculative 20 + 30 ms: 2.6x (client overhead shrinks it)
    for c in (1, 2):
        assert by[("speculative", c)]["speedup"] > 1.5, (c, by[("speculative", c)]["speedup_runs"])
    # two clients: twice the throughput of one (two waves of two requests against four one by one),
    # never more than two streams open
    assert by[("plain", 2)]["throughput_tok_s"] > 1.5 * by[("plain", 1)]["throughput_tok_s"], (
        by[("plain", 2)]["throughput_tok_s_runs"], by[("plain", 1)]["throughput_tok_s_runs"])
    assert fake.max_open == 2
    # what went over the wire
    timed = [b for b in fake.bodies if b["max_tokens"] == 12]
    assert len(timed) == 3 * 4 * 4
    for body in timed:
        assert body["model"] == "fake-model" and body["stream"] is True and body["temperature"] == 0.0
        assert body["stream_options"] == {"include_usage": True}
        assert body["prompt"] in [r.prompt for r in wl.requests]
        assert body["suffixspec"]["budget"] in (0, "auto")
    # keyed by (seed + repeat, request): the same in every mode
    assert {b["seed"] for b in timed} == {r * 1_000_003 + q for r in range(3) for q in range(4)}
    assert all(b["max_tokens"] == 8 for b in fake.bodies if b not in timed)  # warm-ups: short, untimed


def test_mismatches_and_failing_mode(fake_server):
    fake, url = fake_server
    wl = text_workload(3)
    modes = {"plain": {"suffixspec": {"budget": 0}}, "diverge": {"diverge": True}, "broken": {"fail": True}}
    settings = BenchSettings(concurrency=[2], max_new_tokens=4, modes=tuple(modes), warmup=False)
    runs = run_benchmark(wl, request_prompts(wl), backends_for(url, modes), settings, progress=False)
    by = {r["mode"]: r for r in summarize(runs, settings)}
    assert [r["mode"] for r in summarize(runs, settings)] == ["plain", "diverge", "broken"]  # the modes' order
    assert by["plain"]["failures"] == 0
    assert by["diverge"]["mismatches"] == 3 and by["diverge"]["failures"] == 3
    assert by["diverge"]["mismatched_requests"][0]["first_difference"] == 1  # " w.." vs " W..": the 'w'
    broken = by["broken"]
    assert broken["failures"] == 3 + 3  # each request failed, and its empty output differs from plain
    assert all("HTTP 400: fail requested" in e for e in broken["errors"])
    assert broken["new_tokens"] == 0


def test_chat_endpoint_messages_and_tokens_counted_by_chunks(fake_server):
    fake, url = fake_server
    fake.bodies.clear()
    wl = text_workload(2)
    modes = {"plain": {"suffixspec": {"budget": 0}, "stream_options": {"include_usage": False}}}
    backends = backends_for(url, modes, endpoint="chat")
    settings = BenchSettings(concurrency=[1], max_new_tokens=5, modes=("plain",), warmup=False)
    runs = run_benchmark(wl, request_prompts(wl), backends, settings, progress=False)
    (rec,) = summarize(runs, settings)
    assert rec["failures"] == 0 and rec["new_tokens"] == 10  # one word per chunk, no usage: 5 chunks each
    assert rec["mean_accepted_tokens"] is None and rec["acceptance_rate"] is None  # no rounds reported
    assert backends["plain"].counted_by == {"usage": 0, "chunks": 2}
    assert [b["messages"] for b in fake.bodies] == [r.messages for r in wl.requests]
    assert runs[0].outputs == ["".join(answer_words(r.messages[-1]["content"], 5)) for r in wl.requests]


def test_poisson_arrivals_through_http(fake_server):
    _, url = fake_server
    wl = text_workload(4)
    settings = BenchSettings(concurrency=[2], qps=40.0, max_new_tokens=6, modes=("plain", "speculative"), warmup=False)
    runs = run_benchmark(wl, request_prompts(wl), backends_for(url, default_modes(8)), settings, progress=False)
    for run in runs:
        assert not run.errors
        for q in run.requests:
            assert q["new_tokens"] == 6 and q["queue_s"] >= 0 and q["ttft_s"] >= q["queue_s"] + 0.9 * PREFILL_S
    assert all(r["mismatches"] == 0 for r in summarize(runs, settings))


def test_modes_and_models_errors(fake_server, tmp_path):
    _, url = fake_server
    assert list_models(url, KEY) == ["fake-model"]
    with pytest.raises(BadInputError, match="401"):
        list_models(url, "wrong")
    with pytest.raises(BadInputError, match="no answer"):
        list_models("http://127.0.0.1:9", KEY, timeout=2)
    assert parse_modes('{"a": {"x": 1}, "b": {}}') == {"a": {"x": 1}, "b": {}}
    path = tmp_path / "modes.json"
    path.write_text('{"plain": {"base_url": "http://other:1"}}')
    assert parse_modes(f"@{path}") == {"plain": {"base_url": "http://other:1"}}
    assert HTTPBackend(url, body={"base_url": "http://other:1/", "x": 1}).url == "http://other:1"
    for bad in ("[1]", "{}", '{"a": 3}', "nope", '{"a": {"base_url": 3}}', "@/no/such/file"):
        with pytest.raises(BadInputError, match="url-modes|modes|file"):
            parse_modes(bad)


def test_cli_against_the_fake_server(fake_server, tmp_path, capsys):
    from suffixspec.cli import main

    _, url = fake_server
    path = tmp_path / "w.jsonl"
    path.write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"hello {i}", "chat": True}) + "\n" for i in range(2)))
    out = tmp_path / "out"
    code = main(["bench", "--url", url, "--api-key", KEY, "--workload", str(path), "--concurrency", "1,2",
                 "--max-new-tokens", "6", "--repeat", "3", "--out", str(out)])  # medians of 3: robust to a stall
    printed = capsys.readouterr().out
    assert code == 0, printed
    report = json.loads((out / "report.json").read_text())
    assert report["settings"]["url"] == url and report["settings"]["model"] == "fake-model"
    assert report["settings"]["modes"] == ["plain", "speculative"] and report["settings"]["baseline"] == "plain"
    assert report["settings"]["mode_bodies"] == {"plain": {"suffixspec": {"budget": 0}}, "speculative": {"suffixspec": {"budget": "auto"}}}
    assert report["settings"]["token_counts"]["speculative"]["usage"] > 0
    spec = [r for r in report["records"] if r["mode"] == "speculative"]
    assert len(spec) == 2 and all(r["mean_accepted_tokens"] == pytest.approx(3.0) for r in spec)
    assert all(r["speedup"] > 1.2 for r in spec), [r["speedup_runs"] for r in spec]  # 70 ms against 30 ms a request
    assert "speculative" in printed and (out / "speedup_vs_concurrency.png").is_file()
    from suffixspec.bench import chatml

    plain0 = next(r for r in report["runs"] if r["mode"] == "plain" and r["repeat"] == 0)
    assert plain0["outputs"] == ["".join(answer_words(chatml(f"hello {i}"), 6)) for i in range(2)]

    assert main(["bench", "--url", url, "--api-key", "wrong", "--workload", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "401" in err[0] and "invalid API key" in err[0]
    assert main(["bench", "--url", url, "--corpus", "x.idx", "--workload", str(path)]) == 2
    assert "--corpus" in capsys.readouterr().err


def test_cli_grid_against_the_fake_server(fake_server, tmp_path, capsys):
    from suffixspec.bench.grid import verdict
    from suffixspec.cli import main

    _, url = fake_server
    path = tmp_path / "w.jsonl"
    path.write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"hi {i}", "chat": True}) + "\n" for i in range(2)))
    out = tmp_path / "grid"
    code = main(["bench", "--url", url, "--api-key", KEY, "--grid", "--grid-workloads", str(path), "--repeat", "3",
                 "--grid-concurrency", "1,2", "--grid-max-new-tokens", "4,9", "--num-prompts", "2", "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    report = json.loads((out / "grid.json").read_text())
    cells = report["cells"]
    assert [(c["max_new_tokens"], c["concurrency"]) for c in cells] == [(4, 1), (4, 2), (9, 1), (9, 2)]
    # 3 tokens a chunk against 1: the medians pay (the verdict rule itself: test_bench.py, exactly)
    assert all(c["speedup"] > 1.03 and c["repeats"] == 3 for c in cells)
    assert all(c["verdict"] == verdict(c["speedup"], c["speedup_min"], c["drafted_per_round"]) for c in cells)
    assert all(c["drafted_per_round"] == pytest.approx(3.0) for c in cells)  # from usage.suffixspec
    assert all(c["ttft_ratio_paired"] > 0 for c in cells)
    assert all(0 < c["e2e_ratio_paired"] < 1 for c in cells)  # each request ends sooner, paired with itself
    assert "e2e paired" in printed
    counts = {v: sum(c["verdict"] == v for c in cells) for v in ("speculate", "off", "neutral", "loses")}
    assert "verdicts: " + ", ".join(f"{v} {n}" for v, n in counts.items()) in printed
    assert counts["off"] == counts["neutral"] == 0
    assert (out / "grid_speedup.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # every run's requests are kept, so that a cell's modes pair request by request
    for part in report["benchmarks"]:
        runs = part["runs"]
        assert sorted((r["mode"], r["concurrency"], r["repeat"]) for r in runs) == sorted(
            (m, c, k) for m in ("plain", "speculative") for c in (1, 2) for k in range(3))
        assert all(sorted(q["id"] for q in r["requests"]) == ["q0", "q1"] for r in runs)
        assert all(q["ttft_s"] > 0 and q["new_tokens"] == part["max_new_tokens"] for r in runs for q in r["requests"])


def test_second_turns_are_answered_through_the_baseline_mode(fake_server):
    from suffixspec._commands.bench import RemoteTarget, settings_from_args
    from suffixspec.bench import FIRST_TURN_TOKENS, chatml_followup, load_workload
    from suffixspec.cli import build_parser

    fake, url = fake_server
    fake.bodies.clear()
    args = build_parser().parse_args(["bench", "--url", url, "--api-key", KEY, "--endpoint", "chat"])
    target = RemoteTarget(args, settings_from_args(args))
    first = load_workload("mtbench_turn2", 2)
    workload, prompts = target.prompts(first)
    assert len(fake.bodies) == 2  # one untimed, non-streaming greedy answer per first turn
    for body, req, new, prompt in zip(fake.bodies, first.requests, workload.requests, prompts):
        assert not body.get("stream") and body["temperature"] == 0.0 and body["max_tokens"] == FIRST_TURN_TOKENS
        assert body["suffixspec"] == {"budget": 0} and body["model"] == "fake-model" and "base_url" not in body
        answer = "".join(answer_words(req.messages[-1]["content"], FIRST_TURN_TOKENS))
        assert new.prompt == chatml_followup(req.prompt, answer, req.followup) and new.followup is None
        assert new.messages == [*req.messages, {"role": "assistant", "content": answer},
                                {"role": "user", "content": req.followup}]
        assert prompt == {"prompt": new.prompt, "messages": new.messages}
