"""`suffixspec bench`: arrival processes, statistics on a fake generator with known costs, report files, CLI."""

import json
import math

import numpy as np
import pytest

from suffixspec import bench
from suffixspec.bench import BenchSettings, Request, Workload
from suffixspec.errors import BadInputError

from support.fakes import FakeBackend, fake_workload

# ------------------------------------------------------------------------------------------ arrivals


def test_poisson_arrivals_statistics_and_seed():
    a = bench.poisson_arrivals(20000, rate=4.0, seed=7)
    gaps = np.diff(np.concatenate([[0.0], a]))
    assert np.all(gaps > 0)
    assert abs(gaps.mean() - 0.25) < 0.01  # mean 1/rate
    assert abs(gaps.std() - 0.25) < 0.01  # exponential: std == mean
    assert abs(np.mean(gaps > 0.25) - math.exp(-1)) < 0.01  # P(gap > 1/rate) = e^-1
    assert np.array_equal(a, bench.poisson_arrivals(20000, rate=4.0, seed=7))
    assert not np.array_equal(a, bench.poisson_arrivals(20000, rate=4.0, seed=8))
    counts = np.histogram(a, bins=np.arange(0, 4000, 1.0))[0]  # Poisson counts per second: mean == var == 4
    assert abs(counts.mean() - 4) < 0.1 and abs(counts.var() - 4) < 0.3
    with pytest.raises(BadInputError):
        bench.poisson_arrivals(3, rate=0)


def schedule(n, concurrency, arrivals=None, limits=None, budget=0, **kw):
    engine = FakeBackend(**kw).serve(max_batch=concurrency, max_new_tokens=64, do_sample=False, temperature=1.0,
                                      top_k=None, top_p=None, seed=0, budget=budget)
    served, makespan = bench.serve_schedule(engine, [[1, 2, 3]] * n, concurrency, arrivals, limits)
    return {s.index: s for s in served}, makespan, engine


def test_closed_loop_refills_a_slot_as_soon_as_a_request_completes():
    # plain, 2 clients, rounds of 2 rows cost 14 ms, of 1 row 12 ms; limits 2, 6, 3, 6 tokens
    s, makespan, _ = schedule(4, 2, limits=[2, 6, 3, 6])
    ms = lambda x: round(x * 1000, 9)  # noqa: E731
    assert [(ms(s[0].arrival), ms(s[0].ttft), ms(s[0].e2e))] == [(0, 14, 28)]
    assert (ms(s[1].arrival), ms(s[1].ttft), ms(s[1].e2e)) == (0, 14, 84)
    # client 0's next request arrives when request 0 completes (28 ms) and joins the running batch at once
    assert (ms(s[2].arrival), ms(s[2].start), ms(s[2].ttft), ms(s[2].e2e)) == (28, 28, 14, 42)
    # request 3 arrives at 70 ms; request 1 finishes at 84, then request 3 runs alone (12 ms rounds)
    assert (ms(s[3].arrival), ms(s[3].start), ms(s[3].ttft), ms(s[3].e2e)) == (70, 70, 14, 74)
    assert ms(makespan) == 144


def test_poisson_schedule_queues_beyond_max_batch_and_skips_idle_time():
    # max_batch 2; arrivals 0, 1, 2 ms and 1 s; 3 tokens each, plain
    arrivals = [0.0, 0.001, 0.002, 1.0]
    s, makespan, engine = schedule(4, 2, arrivals=arrivals, limits=[3, 3, 3, 3])
    ms = lambda x: round(x * 1000, 9)  # noqa: E731
    # t=0: request 0 alone (12 ms); at 12 ms requests 1 and 2 have arrived, only 1 fits
    assert (ms(s[0].start), ms(s[0].ttft), ms(s[0].e2e)) == (0, 12, 40)  # rounds of 12, 14, 14 ms
    assert (ms(s[1].start), ms(s[1].ttft), ms(s[1].e2e)) == (12, 25, 53)  # rounds end at 26, 40, 54
    assert (ms(s[2].start), ms(s[2].ttft), ms(s[2].e2e)) == (40, 52, 76)  # joins at 40: 54, 66, 78
    # the engine is idle from 80 ms until the arrival at 1 s: the clock jumps, nothing waits
    assert (ms(s[3].arrival), ms(s[3].start), ms(s[3].ttft), ms(s[3].e2e)) == (1000, 1000, 12, 36)
    assert ms(makespan) == 1036  # 0 -> 78 ms, then 1000 -> 1036 ms
    with pytest.raises(BadInputError):
        schedule(1, 0)


# ------------------------------------------------------------------------------------------ fake generator


def run_fake(settings, n=4, fake=None, limits=None, **kw):
    fake = fake or FakeBackend(**kw)
    runs = bench.run_benchmark(fake_workload(n, limits), [[1, 2, 3]] * n, {"plain": fake, "speculative": fake},
                               settings, progress=False)
    return bench.summarize(runs, settings), runs, fake


def test_modes_take_turns_running_first_repeat_by_repeat():
    settings = BenchSettings(concurrency=[1, 2], max_new_tokens=4, budget=8, repeat=3)
    records, runs, _ = run_fake(settings, n=2)
    assert [(run.repeat, run.mode, run.concurrency) for run in runs] == [
        (0, "plain", 1), (0, "speculative", 1), (0, "plain", 2), (0, "speculative", 2),
        (1, "speculative", 1), (1, "plain", 1), (1, "speculative", 2), (1, "plain", 2),
        (2, "plain", 1), (2, "speculative", 1), (2, "plain", 2), (2, "speculative", 2)]
    # speed-ups still pair each run with its own repeat's plain run: three exact ratios per concurrency
    for rec in records:
        if rec["mode"] == "speculative":
            assert len(rec["speedup_runs"]) == 3 and rec["speedup_min"] == pytest.approx(rec["speedup_max"])
    three = [("plain", 1), ("speculative", 1), ("prompt_lookup", 1), ("plain", 4), ("speculative", 4)]
    assert bench.run_order(three, 1) == [("prompt_lookup", 1), ("speculative", 1), ("plain", 1),
                                         ("speculative", 4), ("plain", 4)]
    assert bench.run_order(three, 2) == three


def test_statistics_on_fake_generator_are_exact():
    settings = BenchSettings(concurrency=[1, 2], max_new_tokens=12, budget=8, repeat=2)
    records, runs, fake = run_fake(settings, n=4)
    assert len(runs) == 2 * 2 * 2  # repeats x concurrency x modes
    by = {(r["mode"], r["concurrency"]): r for r in records}
    assert set(by) == {("plain", 1), ("speculative", 1), ("plain", 2), ("speculative", 2)}

    # plain, c=1: a round costs 12 ms, 12 rounds; requests one after another, no waiting (closed loop)
    p1 = by[("plain", 1)]
    assert p1["ttft_ms"] == pytest.approx(12.0)
    assert p1["tpot_ms"] == pytest.approx((12 * 12 - 12) / 11)  # (e2e - ttft) / (n - 1) = 12 ms
    assert p1["e2e_ms_p50"] == pytest.approx(144.0) and p1["e2e_ms_p99"] == pytest.approx(144.0)
    assert p1["throughput_tok_s"] == pytest.approx(4 * 12 / (4 * 0.144))
    assert p1["mean_accepted_tokens"] == pytest.approx(1.0)
    assert p1["acceptance_rate"] == 0.0 and p1["mismatches"] == 0 and "speedup" not in p1

    # speculative, c=1: 3 tokens a round -> 4 rounds of 12 ms
    s1 = by[("speculative", 1)]
    assert s1["e2e_ms_p50"] == pytest.approx(48.0)
    assert s1["tpot_ms"] == pytest.approx((48 - 12) / 11)
    assert s1["mean_accepted_tokens"] == pytest.approx(3.0)
    assert s1["acceptance_rate"] == pytest.approx(1.0)
    assert s1["accepted_by_position"] == pytest.approx([1.0, 1.0])
    assert s1["speedup"] == pytest.approx(3.0) and s1["speedup_min"] == s1["speedup_max"] == pytest.approx(3.0)
    assert s1["speedup_runs"] == pytest.approx([3.0, 3.0]) and s1["speedup_std"] == pytest.approx(0.0)
    assert s1["verdict"] == "pays" and s1["mismatches"] == 0 and s1["failures"] == 0
    assert s1["proposer_s"] == pytest.approx(4 * 0.004)  # 4 requests x 4 rounds x 1 ms, mean over repeats

    # plain, c=2: a round of 2 rows costs 14 ms; wave 2 starts at 168 ms and nobody waits
    p2 = by[("plain", 2)]
    assert p2["ttft_ms"] == pytest.approx(14.0) and p2["e2e_ms_p50"] == pytest.approx(168.0)
    assert p2["throughput_tok_s"] == pytest.approx(48 / 0.336)
    s2 = by[("speculative", 2)]
    assert s2["speedup"] == pytest.approx(3.0)
    assert fake.calls[0][3] == 0 and any(c[3] == 1 for c in fake.calls)  # seed + repeat
    assert {c[0] for c in fake.calls} == {1, 2}


def test_mismatches_count_as_failures_under_greedy_only():
    greedy = BenchSettings(concurrency=[2], max_new_tokens=4, budget=4)
    records, _, _ = run_fake(greedy, n=3, diverge=True)
    spec = next(r for r in records if r["mode"] == "speculative")
    assert spec["mismatches"] == 3 and spec["failures"] == 3
    assert spec["mismatched_requests"][0]["first_difference"] == 0
    sampled = BenchSettings(concurrency=[2], max_new_tokens=4, budget=4, temperature=0.7)
    records, _, _ = run_fake(sampled, n=3, diverge=True)
    spec = next(r for r in records if r["mode"] == "speculative")
    assert spec["mismatches"] == 0 and spec["sampled_identical_to_plain"] == "0/3"
    records, _, _ = run_fake(sampled, n=3)
    assert next(r for r in records if r["mode"] == "speculative")["sampled_identical_to_plain"] == "3/3"


def test_slow_speculation_is_reported_as_slower():
    class Slow(FakeBackend):
        def serve(self, **kw):
            engine = super().serve(**kw)
            if kw["budget"] != 0:  # every round 5x dearer, 3 tokens a round: 0.6x plain
                engine.base, engine.per_row = 5 * engine.base, 5 * engine.per_row
            return engine

    settings = BenchSettings(concurrency=[1], max_new_tokens=12, budget=4)
    records, _, _ = run_fake(settings, n=2, fake=Slow())
    spec = next(r for r in records if r["mode"] == "speculative")
    assert spec["speedup"] == pytest.approx(0.6) and spec["verdict"] == "slower"


def test_poisson_run_accounts_queueing():
    settings = BenchSettings(concurrency=[4], qps=1000.0, max_new_tokens=12, budget=4, seed=3)
    records, runs, _ = run_fake(settings, n=4)
    a = bench.poisson_arrivals(4, 1000.0, seed=3)
    assert a[3] - a[0] < 0.012  # all arrive during request 0's first round
    plain = next(r for r in runs if r.mode == "plain")
    q = plain.requests
    # request 0 runs alone for one 12 ms round, the others join it at a0 + 12 ms: 18 ms rounds; request 0
    # finishes after 11 of those, the others after one more round of 3 rows (16 ms)
    assert q[0]["queue_s"] == 0.0 and q[0]["ttft_s"] == pytest.approx(0.012)
    assert q[0]["e2e_s"] == pytest.approx(0.012 + 11 * 0.018)
    for i in (1, 2, 3):
        assert q[i]["arrival_s"] == pytest.approx(a[i])
        assert q[i]["queue_s"] == pytest.approx(a[0] + 0.012 - a[i])
        assert q[i]["ttft_s"] == pytest.approx(q[i]["queue_s"] + 0.018)
        assert q[i]["e2e_s"] == pytest.approx(q[i]["queue_s"] + 11 * 0.018 + 0.016)
    assert plain.makespan_s == pytest.approx(0.012 + 11 * 0.018 + 0.016)


def test_failed_run_is_a_failure_not_a_crash():
    fake = FakeBackend()

    def boom(engine):
        if engine.budget != 0 and engine.stats.rounds == 2:
            raise RuntimeError("boom")

    fake.on_round = boom
    records, _, _ = run_fake(BenchSettings(concurrency=[1], max_new_tokens=4, budget=4), n=2, fake=fake)
    spec = next(r for r in records if r["mode"] == "speculative")
    assert spec["failures"] >= 1 and "boom" in spec["errors"][0]
    assert next(r for r in records if r["mode"] == "plain")["failures"] == 0


# ------------------------------------------------------------------------------------------ quality, constraint


def test_wilson_interval():
    lo, hi = bench.wilson_interval(5, 10)
    assert lo < 0.5 < hi and lo == pytest.approx(1 - hi)
    assert bench.wilson_interval(0, 0) == (0.0, 1.0)
    assert bench.wilson_interval(0, 20)[0] == 0.0


def test_quality_gate_numeric_and_humaneval():
    check_num = {"kind": "numeric", "answer": 14}
    check_he = {"kind": "humaneval", "prompt": "def add(a, b):\n", "test": "def check(f):\n    assert f(2, 3) == 5\n",
                "entry_point": "add"}
    assert bench.numeric_correct(check_num, "7 + 7 = 14\nThe answer is 14.")
    assert not bench.numeric_correct(check_num, "It is 13")
    assert bench.humaneval_passes(check_he, "    return a + b\n\ndef unrelated():\n    raise SystemExit(1)\n")
    assert not bench.humaneval_passes(check_he, "    return a - b\n")
    assert not bench.humaneval_passes(check_he, "    while True: pass\n", timeout=1.0)

    wl = Workload("w", [Request("a", prompt_ids=[1], check=check_num), Request("b", prompt_ids=[1], check=check_num)], "t")
    runs = [bench.Run("plain", 1, 0, [{"finish_reason": "length"}] * 2, 1.0, outputs=[[1], [2]]),
            bench.Run("speculative", 1, 0, [{"finish_reason": "length"}] * 2, 1.0, outputs=[[1], [1]])]
    q = bench.quality_gate(wl, runs, lambda ids: {1: "so 14", 2: "so 3"}[ids[0]])
    assert q["plain"]["correct"] == 1 and q["speculative"]["correct"] == 2
    assert q["difference"] == pytest.approx(0.5) and q["within_noise"]  # two samples: all noise


def test_charset_constraint():
    torch = pytest.importorskip("torch")

    class Tok:
        vocab_size = 5
        table = [b"12", b"ab", b" ", b"[1,", b"x"]

        def token_bytes(self, t):
            return self.table[t]

    c = bench.CharsetConstraint(Tok(), 6, eos_token_id=5)
    assert c.allowed.tolist() == [True, False, True, True, False, True]
    out = c(None, torch.zeros(1, 6))
    assert torch.isinf(out[0, 1]) and out[0, 0] == 0
    assert c.valid([0, 2, 5]) and not c.valid([0, 1])


def test_named_workloads_load():
    for name in ("code_edit", "chat", "qa", "mtbench", "math", "summarization", "long_context", "math_reasoning",
                 "code_completion"):
        wl = bench.load_workload(name, limit=3)
        assert len(wl.requests) == 3 and all(r.prompt for r in wl.requests), name
    assert bench.load_workload("math").checkable
    assert bench.load_workload("chat", 1).requests[0].prompt.startswith("<|im_start|>system")
    qa = bench.load_workload("qa")
    assert len(qa.requests) == 70 and qa.requests[0].messages == [
        {"role": "user", "content": "When is the figure skating part of the olympics?"}]
    assert qa.requests[0].prompt == bench.chatml(qa.requests[0].messages[0]["content"])
    mt = bench.load_workload("mtbench")
    assert len(mt.requests) == 80 and len({r.id for r in mt.requests}) == 80
    assert "Hawaii" in mt.requests[0].prompt and "<|im_start|>user\n" in mt.requests[0].prompt
    assert len({r.id for r in mt.requests[:8]}) == 8 and mt.requests[1].id != "mtbench-82"  # categories interleaved
    with pytest.raises(BadInputError):
        bench.load_workload("no-such-workload")


def test_second_turns_quote_the_models_first_answer():
    from suffixspec.tokenizer import load_tokenizer

    tok = load_tokenizer("default")
    wl = bench.load_workload("mtbench_turn2", limit=3)
    assert [r.id for r in wl.requests] == [r.id + "-turn2" for r in bench.load_workload("mtbench", 3).requests]
    assert wl.requests[0].followup.startswith("Rewrite your previous response")
    plain = bench.load_workload("chat", 1)
    mixed = bench.Workload("mixed", plain.requests + wl.requests, "test")
    prompts = [list(tok.encode(r.prompt)) for r in mixed.requests]
    asked = []

    def answer(ids, n):
        asked.append((list(ids), n))
        return list(tok.encode(f"Answer number {len(asked)}.")) + [tok.eos_token_id]

    out = bench.prepare_followups(mixed, prompts, tok, answer)
    assert out[0] == prompts[0]  # no followup: unchanged
    assert [a for a, _ in asked] == prompts[1:] and all(n == bench.FIRST_TURN_TOKENS for _, n in asked)
    for i, req in enumerate(wl.requests, start=1):
        text = tok.decode(out[i])
        assert text == bench.chatml_followup(req.prompt, f"Answer number {i}.", req.followup)
        assert text.count("<|im_start|>assistant") == 2 and text.endswith("<|im_start|>assistant\n")


def test_workload_file(tmp_path):
    path = tmp_path / "w.jsonl"
    path.write_text(json.dumps({"id": "x", "prompt": "hello", "max_new_tokens": 5}) + "\n"
                    + json.dumps({"prompt_ids": [1, 2], "answer": 3}) + "\n"
                    + json.dumps({"turns": ["hi"]}) + "\n")
    wl = bench.load_workload(str(path))
    assert [r.id for r in wl.requests] == ["x", "1", "2"]
    assert wl.requests[0].prompt == "hello" and wl.requests[0].max_new_tokens == 5
    assert wl.requests[1].prompt_ids == [1, 2] and wl.requests[1].check == {"kind": "numeric", "answer": 3}
    assert "<|im_start|>user\nhi" in wl.requests[2].prompt
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{nope\n")
    with pytest.raises(BadInputError):
        bench.load_workload(str(bad))


# ------------------------------------------------------------------------------------------ report files


def test_report_table_and_plots(tmp_path):
    settings = BenchSettings(concurrency=[1, 4], max_new_tokens=9, budget=4, repeat=2)
    records, _, fake = run_fake(settings, n=4)
    # warmed up outside the timed runs: 2 rows (kernels), then one batch of the largest concurrency in
    # every mode (plain for two tokens, a drafting mode for eight: its tree passes at that many rows)
    assert fake.calls[:4] == [(2, 8, 0, 0), (2, 8, 4, 0), (4, 2, 0, 0), (4, 8, 4, 0)]
    assert len(fake.calls) == 4 + 2 * 2 * 2  # then the timed runs: repeats x concurrency x modes
    bench.write_report(tmp_path / "report.json", {"records": records})
    data = json.loads((tmp_path / "report.json").read_text())
    required = {"mode", "concurrency", "ttft_ms", "tpot_ms", "e2e_ms_p50", "throughput_tok_s",
                "mean_accepted_tokens", "acceptance_rate", "mismatches"}
    for rec in data["records"]:
        assert required <= set(rec)
        assert ("speedup" in rec) == (rec["mode"] == "speculative")
    table = bench.format_table(records)
    assert "speculative" in table and "3.00x [3.00-3.00]" in table  # 9 tokens: 9 plain rounds vs 3 spec rounds
    plots = bench.write_plots(tmp_path, records, "(fake)")
    assert sorted(p.rsplit("/", 1)[1] for p in plots) == ["accepted_by_position.png", "speedup_vs_concurrency.png",
                                                          "tpot_distribution.png"]
    import matplotlib.image as mpimg

    for p in plots:
        with open(p, "rb") as handle:
            assert handle.read(8) == b"\x89PNG\r\n\x1a\n"
        assert mpimg.imread(p).shape[0] > 100


# ------------------------------------------------------------------------------------------ CLI


def test_cli_parsing():
    from suffixspec._commands.bench import parse_budget, parse_concurrency, settings_from_args
    from suffixspec.cli import build_parser

    args = build_parser().parse_args(["bench"])
    assert args.workload == "code_edit" and args.concurrency == "1,4" and args.budget == "auto"
    s = settings_from_args(args)
    assert s.concurrency == [1, 4] and s.max_new_tokens == 64 and s.repeat == 1 and not s.do_sample and s.qps is None
    assert s.interleave and not settings_from_args(build_parser().parse_args(["bench", "--sequential"])).interleave
    args = build_parser().parse_args(["bench", "--workload", "chat", "--model", "m", "--corpus", "a.idx", "--corpus",
                                      "b.idx", "--filter", "repo=x", "--concurrency", "16,1,4", "--qps", "2.5",
                                      "--max-new-tokens", "32", "--budget", "8", "--temperature", "0.7",
                                      "--repeat", "3", "--out", "d"])
    s = settings_from_args(args)
    assert args.corpus == ["a.idx", "b.idx"] and args.filter == ["repo=x"] and args.out == "d"
    assert s.concurrency == [1, 4, 16] and s.qps == 2.5 and s.budget == 8 and s.do_sample and s.repeat == 3
    assert parse_budget("auto") == "auto"
    for bad in ("x", "-1"):
        with pytest.raises(BadInputError):
            parse_budget(bad)
    for bad in ("", "a,b", "0,4"):
        with pytest.raises(BadInputError):
            parse_concurrency(bad)


def test_cli_errors_are_messages(capsys):
    from suffixspec.cli import main

    assert main(["bench", "--concurrency", "0"]) == 2
    assert "--concurrency" in capsys.readouterr().err
    assert main(["bench", "--workload", "nope", "--max-new-tokens", "4"]) == 2


# ------------------------------------------------------------------------------------------ tiny end-to-end


def test_end_to_end_on_tiny_model(tmp_path):
    pytest.importorskip("transformers")
    from suffixspec.draft.proposer import Proposer

    from support.tiny_models import tiny_model

    model = tiny_model("llama", vocab=97, sharpen=4.0)
    rng = np.random.default_rng(0)
    prompts = [(rng.integers(1, 97, 6).tolist() * 3) for _ in range(3)]
    wl = Workload("tiny", [Request(f"t{i}", prompt_ids=p) for i, p in enumerate(prompts)], "test")
    spec = bench.SpeculativeBackend(model, None, lambda: Proposer())
    backends = {"plain": spec, "speculative": spec, "prompt_lookup": bench.PromptLookupBackend(model, 4)}
    settings = BenchSettings(concurrency=[1, 2], max_new_tokens=12, budget=6)
    runs = bench.run_benchmark(wl, prompts, backends, settings, progress=False)
    records = bench.summarize(runs, settings)
    modes = {(r["mode"], r["concurrency"]) for r in records}
    assert modes == {("plain", 1), ("speculative", 1), ("prompt_lookup", 1), ("plain", 2), ("speculative", 2)}
    for rec in records:
        assert rec["mismatches"] == 0 and rec["failures"] == 0, rec
        assert rec["new_tokens"] == 36
        if rec["mode"] != "plain":
            assert rec["speedup"] > 0
    assert next(r for r in records if r["mode"] == "speculative")["acceptance_rate"] > 0
    bench.write_plots(tmp_path, records)
    # Poisson arrivals through the same engines: outputs still identical, queueing never negative
    poisson = BenchSettings(concurrency=[2], qps=200.0, max_new_tokens=8, budget="auto", modes=("plain", "speculative"))
    runs = bench.run_benchmark(wl, prompts, backends, poisson, progress=False)
    for rec in bench.summarize(runs, poisson):
        assert rec["mismatches"] == 0 and rec["failures"] == 0 and rec["new_tokens"] == 24
    assert all(q["queue_s"] >= 0 and q["ttft_s"] >= q["queue_s"] for run in runs for q in run.requests)


# ------------------------------------------------------------------------------------------ the grid


def test_grid_verdict_rule_boundaries():
    from suffixspec.bench.grid import verdict

    assert verdict(1.03, 1.0, 0.5) == "speculate"  # at the threshold
    assert verdict(1.09, 1.0, 0.0) == "off"  # a gain with next to nothing drafted is the machine's noise
    assert verdict(1.09, 1.0, 0.49) == "off"
    assert verdict(1.09, 1.0, None) == "speculate"  # no draft counts: the speed-up alone
    assert verdict(1.5, 0.93, 5.0) == "speculate"  # the worst repeat exactly at 0.93 is allowed
    assert verdict(1.5, 0.9299, 5.0) == "loses"  # one bad repeat loses the cell whatever the median
    assert verdict(1.0299, 0.99, 0.49) == "off"  # within the band, speculation drafted little
    assert verdict(0.97, 0.95, 0.0) == "off"
    assert verdict(1.0, 0.99, 0.5) == "neutral"  # within the band while still drafting
    assert verdict(1.0, 0.99, None) == "neutral"  # no draft counts (an endpoint that reports none)
    assert verdict(0.9699, 0.95, 0.0) == "loses"


class GridFake(FakeBackend):
    """Speculation that pays at one row (3 tokens a round), is switched off at 2 rows (1 token a round,
    rounds 1% dearer), still drafts without paying at 3 rows (2 tokens a round at twice the cost) and
    loses at 4 rows (1 token a round, rounds 10% dearer)."""

    def serve(self, **kw):
        engine = super().serve(**kw)
        if kw["budget"] != 0:
            k, cost = {1: (3, 1.0), 2: (1, 1.01), 3: (2, 2.0), 4: (1, 1.1)}[kw["max_batch"]]
            engine.k, engine.base, engine.per_row = k, cost * engine.base, cost * engine.per_row
        return engine


def test_grid_cells_verdicts_table_and_heatmap(tmp_path):
    from suffixspec.bench.grid import format_grid, grid_cells, write_heatmap

    results = []
    for name in ("wa", "wb"):
        for max_new in (6, 12):
            settings = BenchSettings(concurrency=[1, 2, 3, 4], max_new_tokens=max_new, budget="auto", repeat=2,
                                     modes=("plain", "speculative"))
            records, _, _ = run_fake(settings, n=4, fake=GridFake())
            results.append((name, max_new, records))
    cells = grid_cells(results)
    assert [(c["workload"], c["max_new_tokens"], c["concurrency"]) for c in cells] == [
        (w, m, c) for w in ("wa", "wb") for m in (6, 12) for c in (1, 2, 3, 4)]
    by_c = {}
    for c in cells:
        by_c.setdefault(c["concurrency"], set()).add(c["verdict"])
    assert by_c == {1: {"speculate"}, 2: {"off"}, 3: {"neutral"}, 4: {"loses"}}
    one = next(c for c in cells if c["concurrency"] == 1 and c["max_new_tokens"] == 12)
    assert one["speedup"] == pytest.approx(3.0) and one["speedup_min"] == pytest.approx(3.0)
    assert one["tokens_per_round"] == pytest.approx(3.0) and one["drafted_per_round"] == pytest.approx(2.0)
    assert one["ttft_ratio"] == pytest.approx(1.0)  # the first round costs the same, commits more
    off = next(c for c in cells if c["concurrency"] == 2 and c["max_new_tokens"] == 12)
    assert off["speedup"] == pytest.approx(1 / 1.01) and off["drafted_per_round"] == 0.0
    table = format_grid(cells)
    assert len(table.splitlines()) == 2 + len(cells) and "3.00x [3.00-3.00]" in table and "loses" in table
    one.update(ttft_ratio_paired=0.91, e2e_ratio_paired=0.37)  # the paired columns, in their order
    row = next(line.split() for line in format_grid(cells).splitlines() if line.split()[:3] == ["wa", "12", "1"])
    assert row[8:10] == ["0.91", "0.37"], row  # after the speed-up (two fields) and the TTFT ratio

    path = write_heatmap(tmp_path / "grid.png", cells, "fake / plain")
    import matplotlib.image as mpimg

    img = mpimg.imread(path)
    assert img.shape[0] > 200 and img.shape[1] > 400
    r, g = img[..., 0], img[..., 1]
    # winning cells are drawn green, losing ones red: both take a visible share of the picture
    assert np.mean(g > r + 0.25) > 0.02 and np.mean(r > g + 0.25) > 0.02


def test_heatmap_colour_bar_spans_extremes_that_round_outward(tmp_path):
    """Extremes whose 2-decimal rounding lies beyond the norm's range (0.8949 -> 0.89, 1.8461 ->
    1.85): the colour bar is still drawn, red to green, with no warning."""
    import warnings

    import matplotlib.image as mpimg

    from suffixspec.bench.grid import write_heatmap

    cells = [{"workload": "w", "max_new_tokens": 4, "concurrency": c, "speedup": v, "speedup_min": v, "verdict": "x"}
             for c, v in ((1, 0.8949), (2, 1.8461))]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        path = write_heatmap(tmp_path / "grid.png", cells, "a / b")
    img = mpimg.imread(path)
    bar = img[:, int(0.85 * img.shape[1]):]  # the colour bar and its labels
    r, g = bar[..., 0], bar[..., 1]
    assert np.mean(g > r + 0.25) > 0.002 and np.mean(r > g + 0.25) > 0.002


def test_paired_ratios_pair_each_request_with_itself():
    from suffixspec.bench.grid import paired_ratios, paired_ttft_ratios

    def run(mode, c, k, ttfts, failed=(), e2e=None):
        e2e = e2e or [10 * t for t in ttfts]
        return {"mode": mode, "concurrency": c, "repeat": k,
                "requests": [{"id": f"q{i}", "ttft_s": t, "e2e_s": e, "finish_reason": "error" if i in failed else "length"}
                             for i, (t, e) in enumerate(zip(ttfts, e2e, strict=True))]}

    # two waves: the medians of either mode sit between them (0.30 against 0.25: 1.2x); paired, each
    # request waited as long in both modes but one (2x) and one that failed in plain mode
    runs = [run("plain", 4, 0, [0.40, 0.40, 0.10, 0.10]),
            run("speculative", 4, 0, [0.40, 0.40, 0.20, 0.10], e2e=[2.0, 2.0, 2.0, 1.0]),
            run("plain", 4, 1, [0.40, 0.40, 0.10, 0.10], failed=(1,)),
            run("speculative", 4, 1, [0.40, 0.44, 0.10, 0.10], e2e=[2.0, 1.0, 0.5, 0.5]),
            run("plain", 1, 0, [0.1, 0.2]), run("speculative", 1, 0, [0.1, 0.3]), run("prompt_lookup", 1, 0, [9, 9])]
    got = paired_ttft_ratios(runs)
    assert got == paired_ratios(runs, "ttft_s")
    assert list(got) == [1, 4]
    assert got[1] == pytest.approx(1.25)  # median of 1.0 and 1.5
    assert got[4] == pytest.approx(1.0)  # 1, 1, 2, 1 then 1, 1, 1 (q1 of repeat 1 has no plain pair)
    assert paired_ttft_ratios(runs, mode="prompt_lookup") == {1: pytest.approx(67.5)}
    # end to end, against plain's 4, 4, 1, 1 and 4, -, 1, 1: 0.5, 0.5, 2, 1 and 0.5, 0.5, 0.5
    assert paired_ratios(runs, "e2e_s") == {1: pytest.approx(1.25), 4: pytest.approx(0.5)}
    # the field read is the one named: same TTFTs, two requests of three finishing in half the time
    two = [run("plain", 2, 0, [0.1, 0.1, 0.1], e2e=[1.0, 2.0, 4.0]),
           run("speculative", 2, 0, [0.1, 0.1, 0.1], e2e=[0.5, 1.0, 4.0])]
    assert paired_ratios(two, "e2e_s") == {2: pytest.approx(0.5)} and paired_ratios(two, "ttft_s") == {2: 1.0}


def test_grid_cli_arguments():
    from suffixspec._commands.bench import grid_from_args, settings_from_args
    from suffixspec.cli import build_parser

    args = build_parser().parse_args(["bench", "--grid"])
    assert grid_from_args(args) == (["code_edit", "chat", "qa"], [1, 4, 16], [48, 128])
    assert "prompt_lookup" not in settings_from_args(args).modes  # the grid compares speculative with plain
    args = build_parser().parse_args(["bench", "--grid", "--grid-workloads", "chat,qa,chat", "--grid-concurrency", "8,2",
                                      "--grid-max-new-tokens", "32"])
    assert grid_from_args(args) == (["chat", "qa"], [2, 8], [32])
    for flag, bad in (("--grid-concurrency", "0"), ("--grid-max-new-tokens", "x"), ("--grid-workloads", ",")):
        with pytest.raises(BadInputError, match=flag):
            grid_from_args(build_parser().parse_args(["bench", "--grid", flag, bad]))
