"""Run one vLLM engine in this process and print one JSON line (used through a subprocess).

    python tests_vllm/engine.py REQUEST.json

REQUEST: {"model": dir, "prompts": [[token ids]...] or null, "chat": [user message...] or null,
"max_tokens": int, "method": "plain" | "ngram" | "suffixspec" | "suffix", "k": int,
"suffixspec": {options} (additional_config["suffixspec"]), "max_num_seqs": int,
"max_model_len": int, "repeats": int}. Chat messages are templated with the model's tokenizer.

Prints {"outputs": [[token ids]...], "seconds": [per repeat], "tokens": generated tokens of one
repeat, "accepted": ..., "drafts": ..., "draft_tokens": ... (vLLM's spec-decode counters, summed
over the repeats), "proposer_stats": {...} (SuffixSpecProposer.stats when it ran in this process)}.
vLLM runs its engine in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0), so one engine per process.
"""

from __future__ import annotations

import json
import os
import sys
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

PROPOSER = "suffixspec.integrations.vllm.SuffixSpecProposer"


def speculative_config(method: str, k: int):
    if method == "plain":
        return None
    if method == "ngram":
        return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": 1, "prompt_lookup_max": 4}
    if method == "suffixspec":
        return {"model": PROPOSER, "num_speculative_tokens": k}
    if method == "suffix":
        return {"method": "suffix", "num_speculative_tokens": k}
    raise SystemExit(f"unknown method {method!r}: expected plain, ngram, suffixspec or suffix")


def counters(llm) -> dict:
    out = {"accepted": 0, "drafts": 0, "draft_tokens": 0}
    names = {"vllm:spec_decode_num_accepted_tokens": "accepted", "vllm:spec_decode_num_drafts": "drafts",
             "vllm:spec_decode_num_draft_tokens": "draft_tokens"}
    for metric in llm.get_metrics():
        key = names.get(metric.name)
        if key is not None:
            out[key] += int(metric.value)
    return out


def find_proposer(llm):
    """The SuffixSpecProposer instance inside the in-process engine, if any (for its stats)."""
    from suffixspec.integrations.vllm import instances

    found = instances()
    return found[0] if found else None


def main(path: str) -> None:
    req = json.load(open(path))
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    kw = {}
    extra = req.get("suffixspec")
    if extra is not None:
        kw["additional_config"] = {"suffixspec": extra}
    llm = LLM(model=req["model"], dtype="float32", max_model_len=int(req.get("max_model_len", 2048)),
              max_num_seqs=int(req.get("max_num_seqs", 8)), speculative_config=speculative_config(req["method"], int(req.get("k", 8))),
              disable_log_stats=False, enforce_eager=True, seed=0, skip_tokenizer_init=req.get("chat") is None, **kw)
    if req.get("chat") is not None:
        tok = llm.get_tokenizer()
        prompts = [tok.apply_chat_template([{"role": "user", "content": m}], add_generation_prompt=True, tokenize=True)
                   for m in req["chat"]]
        prompts = [list(p["input_ids"]) if isinstance(p, dict) or hasattr(p, "keys") else list(p) for p in prompts]
    else:
        prompts = req["prompts"]
    params = SamplingParams(temperature=0.0, max_tokens=int(req["max_tokens"]), ignore_eos=bool(req.get("ignore_eos", False)),
                            detokenize=False)
    seconds, outputs = [], None
    for _ in range(int(req.get("repeats", 1))):
        t0 = time.perf_counter()
        res = llm.generate([TokensPrompt(prompt_token_ids=list(map(int, p))) for p in prompts], params, use_tqdm=False)
        seconds.append(time.perf_counter() - t0)
        outs = [list(r.outputs[0].token_ids) for r in res]
        if outputs is not None and outs != outputs:
            raise SystemExit("engine: a repeat's greedy outputs differ from the first repeat's")
        outputs = outs
    result = {"outputs": outputs, "seconds": seconds, "tokens": sum(len(o) for o in outputs), "prompts": prompts, **counters(llm)}
    proposer = find_proposer(llm) if req["method"] == "suffixspec" else None
    result["proposer_stats"] = dict(proposer.stats) if proposer is not None else None
    sys.stdout.write("\nRESULT " + json.dumps(result) + "\n")
    sys.stdout.flush()
    os._exit(0)  # the CPU engine's shutdown can hang or print noise: the result is out


if __name__ == "__main__":
    main(sys.argv[1])
