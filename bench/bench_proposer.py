"""Proposer benchmark: acceptance and latency on real traces, side by side with peers.

Workloads (real data, available offline):
- code_edit: regions of standard-library modules changed between CPython 3.12.1 and 3.13.0
  (`corpora/make_code_edit_traces.py`), old region in the prompt, new region as the output;
- chat: SmolLM2-135M-Instruct's own greedy outputs on Spec-Bench prompts
  (`corpora/chat_traces_smollm2.jsonl`, made by `corpora/make_chat_traces.py`).

Peers, replayed on the same traces and budgets: the vLLM n-gram rule (n in [2, 5], earliest
occurrence), HF transformers' prompt lookup (max n-gram 3), arctic-inference's
SuffixDecodingCache in path and tree modes (when a python with it is given: `--arctic-python PATH`
or $SUFFIXSPEC_ARCTIC_PYTHON, see bench/_peers.py; otherwise that peer is skipped with a warning).
Also: proposer latency per request; a batch of 64 sessions proposed in one call (threads 1
and 2); and a server replay: 64 sessions open at once with the global cache, finished requests
closing and new ones starting, one batch call per round (srv_* columns: ms per batch call).

    python bench/bench_proposer.py [--quick] [--traces N] [--no-arctic | --arctic-python PATH] [--record [PATH]]

Prints a table, then one JSON line last (`--record`: also appended to bench/results/proposer.jsonl
with the date, host and git revision).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

import _peers
import numpy as np

from suffixspec import Proposer
from suffixspec.draft.simulate import load_traces, simulate
from suffixspec.tokenizer import load_tokenizer

import common

ROOT, CACHE = common.ROOT, common.CACHE


def code_edit_traces(tok, n):
    path = CACHE / f"code_edit_{n}.jsonl"
    if not path.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, str(ROOT / "corpora" / "make_code_edit_traces.py"), "--limit", str(n),
                        "--per-file", "2", "-o", str(path)], check=True, stdout=subprocess.DEVNULL)
    return load_traces(path, tok)


def replay_linear(traces, propose, budget):
    """Replay with a linear (context -> token list) proposer; same rules as suffixspec.draft.simulate."""
    rounds = drafted = accepted = total = 0
    for t in traces:
        ctx = list(t.prompt.tolist())
        out = t.output.tolist()
        pos = 0
        while pos < len(out):
            draft = propose(np.asarray(ctx, np.int32), budget)
            draft = list(draft)[:budget]
            a = 0
            while a < len(draft) and pos + a < len(out) and draft[a] == out[pos + a]:
                a += 1
            drafted += len(draft)
            accepted += a
            commit = out[pos : pos + a + 1]
            ctx.extend(commit)
            pos += len(commit)
            rounds += 1
        total += len(out)
    return {"mean_accepted_tokens": total / rounds, "acceptance_rate": accepted / max(drafted, 1),
            "drafted_per_round": drafted / rounds, "rounds": rounds}


def batch_latency(traces, budget, n_sessions=64, repeats=20, threads=1):
    """Median ms of one propose_batch call over `n_sessions` sessions half-way through their traces."""
    prop = Proposer(global_cache=False, threads=threads)
    sessions = []
    for i in range(n_sessions):
        t = traces[i % len(traces)]
        s = prop.start(t.prompt)
        s.extend(t.output[: len(t.output) // 2])
        sessions.append(s)
    prop.propose_batch(sessions, budget)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        prop.propose_batch(sessions, budget)
        times.append((time.perf_counter_ns() - t0) / 1e6)
    return float(np.median(times))


def serve_latency(traces, budget, concurrency=64, threads=1):
    """A server's view: `concurrency` sessions open at once over the traces (a finished request
    closes, its output joins the global cache, the next trace starts), each round one
    propose_batch call for all of them, then each commits its accepted path plus one token.
    Returns the per-round batch time (ms, p50/p99/mean) and the mean accepted tokens."""
    prop = Proposer(threads=threads)
    queue = list(range(len(traces)))
    live = {}  # slot -> (trace, session, position)

    def refill():
        for slot in range(concurrency):
            if slot not in live and queue:
                t = traces[queue.pop(0)]
                live[slot] = [t, prop.start(t.prompt), 0]

    refill()
    times, rounds, total = [], 0, 0
    while live:
        slots = sorted(live)
        t0 = time.perf_counter_ns()
        trees = prop.propose_batch([live[k][1] for k in slots], budget)
        times.append((time.perf_counter_ns() - t0) / 1e6)
        for k, tree in zip(slots, trees):
            t, session, pos = live[k]
            out = t.output
            node = tree.longest_accepted(out[pos : pos + budget + 1]) if len(tree) else -1
            a = int(tree.depths[node]) if node >= 0 else 0
            commit = out[pos : pos + a + 1]
            session.extend(commit)
            live[k][2] = pos + commit.shape[0]
            rounds += 1
            total += commit.shape[0]
            if live[k][2] >= out.shape[0]:
                session.close()
                del live[k]
        refill()
    ms = np.asarray(times)
    return {"batch_ms_p50": float(np.median(ms)), "batch_ms_p99": float(np.percentile(ms, 99)),
            "batch_ms_mean": float(ms.mean()), "batches": len(times), "mean_accepted_tokens": total / rounds}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="few traces, two budgets")
    ap.add_argument("--traces", type=int, default=200, help="code-edit traces")
    ap.add_argument("--no-arctic", action="store_true", help="skip the arctic-inference peer")
    _peers.add_arctic_flag(ap)
    common.add_record_flag(ap)
    args = ap.parse_args(argv)
    budgets = [8, 64] if args.quick else [8, 16, 32, 64]
    tok = load_tokenizer(None)
    workloads = {"code_edit": code_edit_traces(tok, 40 if args.quick else args.traces)}
    chat = ROOT / "corpora" / "chat_traces_smollm2.jsonl"
    if chat.exists():
        workloads["chat"] = load_traces(chat)
    # warm up the kernels
    simulate(workloads["code_edit"][:2], Proposer(), 8)

    rows, record = [], {"budgets": budgets, "workloads": {}}
    for name, traces in workloads.items():
        n_tokens = sum(len(t.output) for t in traces)
        wl = record["workloads"][name] = {"traces": len(traces), "output_tokens": n_tokens, "budgets": {}}
        arctic = None
        if not args.no_arctic:
            arctic = _peers.arctic_replay_bench([(t.prompt, t.output) for t in traces], budgets,
                                                python=args.arctic_python)
        for b in budgets:
            ours = simulate(traces, Proposer(), b)
            peers = {
                "vllm_ngram": replay_linear(traces, _peers.vllm_ngram_propose, b),
                "hf_prompt_lookup": replay_linear(traces, _peers.prompt_lookup_propose, b),
            }
            if arctic:
                for mode in ("path", "tree"):
                    res = arctic.get(mode, {}).get(str(b)) or arctic.get(mode, {}).get(b)
                    if res:
                        peers[f"arctic_{mode}"] = res
            best_name = max(peers, key=lambda k: peers[k]["mean_accepted_tokens"])
            best = peers[best_name]["mean_accepted_tokens"]
            entry = {"suffixspec": {k: ours[k] for k in ("mean_accepted_tokens", "acceptance_rate", "drafted_per_round",
                                                         "rounds", "propose_us_p50", "propose_us_p99",
                                                         "oracle_mean_accepted_tokens")},
                     "peers": peers, "best_peer": best_name,
                     "ratio_vs_best_peer": ours["mean_accepted_tokens"] / best}
            batch = {f"threads{th}": batch_latency(traces, b, threads=th) for th in (1, 2)}
            entry["batch64_ms"] = batch
            entry["serve64"] = serve_latency(traces, b)
            entry["batch64_us_per_request"] = {k: v * 1000 / 64 for k, v in batch.items()}
            if "arctic_tree" in peers and "speculate_us_p50" in peers["arctic_tree"]:
                arc = peers["arctic_tree"]["speculate_us_p50"]
                entry["speedup_vs_arctic_speculate_p50"] = arc / max(ours["propose_us_p50"], 1e-9)
                entry["speedup_vs_arctic_speculate_batched"] = arc / max(entry["batch64_us_per_request"]["threads1"], 1e-9)
            wl["budgets"][b] = entry
            rows.append((name, b, ours, peers, best_name, entry["ratio_vs_best_peer"], batch, entry["serve64"]))

    print(f"{'workload':<10} {'budget':>6} {'ours':>6} {'oracle':>6} {'vllm':>6} {'hf_pl':>6} {'arc_p':>6} {'arc_t':>6} "
          f"{'ratio':>6} {'p50us':>7} {'p99us':>8} {'arc_p50us':>9} {'b64ms_t1':>8} {'b64ms_t2':>8} {'us/req':>6} "
          f"{'srv_p50':>7} {'srv_p99':>7} {'srv_mean':>8}")
    for name, b, ours, peers, best_name, ratio, batch, srv in rows:
        g = lambda k: f"{peers[k]['mean_accepted_tokens']:6.2f}" if k in peers else f"{'-':>6}"  # noqa: E731
        arc_us = peers.get("arctic_tree", {}).get("speculate_us_p50")
        print(f"{name:<10} {b:>6} {ours['mean_accepted_tokens']:6.2f} {ours['oracle_mean_accepted_tokens']:6.2f} "
              f"{g('vllm_ngram')} {g('hf_prompt_lookup')} {g('arctic_path')} {g('arctic_tree')} {ratio:6.2f} "
              f"{ours['propose_us_p50']:7.1f} {ours['propose_us_p99']:8.1f} {arc_us if arc_us is not None else '-':>9} "
              f"{batch['threads1']:8.3f} {batch['threads2']:8.3f} {batch['threads1'] * 1000 / 64:6.2f} "
              f"{srv['batch_ms_p50']:7.3f} {srv['batch_ms_p99']:7.3f} {srv['batch_ms_mean']:8.3f}")
    common.emit(record, args, "proposer")


if __name__ == "__main__":
    main()
