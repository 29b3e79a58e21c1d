"""Build `bench_prompts.jsonl`, the Spec-Bench prompts behind `suffixspec bench`'s named workloads.

Source: Spec-Bench (github.com/hemingkx/Spec-Bench, `data/spec_bench/question.jsonl`, Apache-2.0;
Copyright the Spec-Bench authors). We keep, per workload (deterministic, in file order):

- `chat`: every MT-bench question (first turn), 8 categories;
- `math_reasoning`: every GSM8K question (Spec-Bench ships no reference answers);
- `summarization`: the first 12 CNN/DailyMail articles ("Summarize: ...");
- `long_context`: the first 12 retrieval-augmented QA prompts (`rag`, ~3 KB of passages each);
- `qa`: every Natural Questions question (`qa`, short factual questions with short answers).

    python corpora/make_bench_prompts.py ../shared/data/specbench-dev.jsonl -o corpora/bench_prompts.jsonl
"""

import argparse
import json

MT_BENCH = {"writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"}
KEEP = {"summarization": ("summarization", 12), "rag": ("long_context", 12), "math_reasoning": ("math_reasoning", 10**6),
        "qa": ("qa", 10**6)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("source")
    ap.add_argument("-o", "--output", required=True)
    args = ap.parse_args(argv)
    counts: dict[str, int] = {}
    rows = []
    with open(args.source, encoding="utf-8") as handle:
        for line in handle:
            rec = json.loads(line)
            cat = rec["category"]
            if cat in MT_BENCH:
                workload, limit = "chat", 10**6
            elif cat in KEEP:
                workload, limit = KEEP[cat]
            else:
                continue
            if counts.get(workload, 0) >= limit:
                continue
            counts[workload] = counts.get(workload, 0) + 1
            rows.append({"id": f"specbench-{rec['question_id']}", "workload": workload, "category": cat,
                         "turns": rec["turns"][:1]})
    with open(args.output, "w", encoding="utf-8") as out:
        for row in rows:
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(counts)


if __name__ == "__main__":
    main()
