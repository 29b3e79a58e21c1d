"""Recipe: a real model's own greedy outputs on the shared Spec-Bench prompts, as id traces.

For each chosen prompt (first user turn, ChatML as SmolLM2-Instruct expects), the embedded
default model decodes greedily with plain `model.generate`; the trace holds the prompt ids and
the output ids, so `suffixspec simulate` replays exactly what that model would have produced.

    python corpora/make_chat_traces.py --per-category 4 --max-new-tokens 128 -o chat.jsonl

The shipped `chat_traces_smollm2.jsonl` was made with that command on the Spec-Bench sample
in `../shared/data/specbench-dev.jsonl` (Apache-2.0, github.com/hemingkx/Spec-Bench).
"""

import argparse
import json
import os
import tempfile
import time
from collections import defaultdict
from pathlib import Path

SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def chatml(question: str) -> str:
    return (f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{question}<|im_end|>\n"
            "<|im_start|>assistant\n")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", default=str(Path(__file__).resolve().parents[1].parent / "shared/data/specbench-dev.jsonl"))
    ap.add_argument("--per-category", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--max-prompt-tokens", type=int, default=1500)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("-o", "--output", required=True)
    args = ap.parse_args(argv)

    import torch

    from suffixspec.models import load_model

    torch.set_num_threads(args.threads)
    model, tok = load_model(None)
    chosen = defaultdict(list)
    with open(args.prompts, encoding="utf-8") as f:
        for line in f:
            rec = json.loads(line)
            if len(chosen[rec["category"]]) < args.per_category:
                chosen[rec["category"]].append(rec)
    out = Path(args.output)
    fd, tmp = tempfile.mkstemp(dir=out.parent, suffix=".tmp")
    t0 = time.time()
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        for cat, recs in chosen.items():
            for rec in recs:
                prompt_ids = tok.encode(chatml(rec["turns"][0]))[-args.max_prompt_tokens:]
                with torch.no_grad():
                    gen = model.generate(torch.tensor([prompt_ids]), max_new_tokens=args.max_new_tokens,
                                         do_sample=False, attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long))
                output_ids = gen[0, len(prompt_ids):].tolist()
                f.write(json.dumps({"id": f"{cat}-{rec['question_id']}", "category": cat,
                                    "prompt_ids": prompt_ids, "output_ids": output_ids}) + "\n")
                f.flush()
                print(f"{cat}-{rec['question_id']}: {len(prompt_ids)} + {len(output_ids)} tokens, {time.time() - t0:.0f} s", flush=True)
    os.chmod(tmp, 0o644)
    os.replace(tmp, out)


if __name__ == "__main__":
    main()
