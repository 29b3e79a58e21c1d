"""Build `corpora/copy_edit_prompts.jsonl`: code-edit prompts whose greedy answer, from the
embedded default model (SmolLM2-135M-Instruct, float32, CPU), copies heavily from the prompt.

    python corpora/make_copy_edit_prompts.py                 # writes corpora/copy_edit_prompts.jsonl
    python corpora/make_copy_edit_prompts.py --candidates 60 --keep 12 --min-oracle 8

Code regions: functions and methods of 15-60 lines from the top-level modules of this Python's
standard library (CPython 3.11.7 here; Python Software Foundation License). Each is wrapped in an
edit instruction a small instruct model follows by rewriting the code (add type hints, rename a
variable, add a docstring, remove comments, repeat exactly then add a usage example), as one ChatML
user turn. The model answers greedily (`model.generate(do_sample=False)`, 128 new tokens), and the
answer's copy-oracle is measured with `suffixspec.simulate.oracle_mean_accepted` (budget 64, the
prompt only, no history). Candidates whose oracle reaches `--min-oracle` are kept, round-robin over
the instructions, up to `--keep`.

Each line: `id`, `instruction` (template name), `source` (module:function, first line), `prompt`
(the user text, without ChatML), `chatml` (the exact model input), `prompt_ids`, `output_ids` (the
greedy answer, EOS included when it stopped), `oracle` (copy-oracle, committed tokens per round),
`licence`. Deterministic for a given Python, model and transformers version.
"""

from __future__ import annotations

import argparse
import ast
import json
import random
import sys
import sysconfig
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

OUT = ROOT / "corpora" / "copy_edit_prompts.jsonl"
LICENCE = "code: CPython standard library, Python Software Foundation License Version 2"

TEMPLATES = {
    "type-hints": "Add type hints to this Python function. Return the full function with the type hints added.",
    "rename": "Rename the variable `{old}` to `{new}` in this code and return the full code.",
    "docstring": "Add a docstring to this Python function. Return the full function.",
    "no-comments": "Return the same code with all comments removed. Keep everything else exactly as it is.",
    "repeat": "Repeat this code exactly, then explain in one sentence what it does.",
}


def chatml(text: str) -> str:
    return f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"


def functions(stdlib: Path, lo: int = 15, hi: int = 60):
    """(module, name, source) of every function/method of lo..hi lines, in file order."""
    for path in sorted(stdlib.glob("*.py")):
        try:
            src = path.read_text(encoding="utf-8")
            tree = ast.parse(src)
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        lines = src.splitlines()
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno:
                start = min([node.lineno] + [d.lineno for d in node.decorator_list])
                n = node.end_lineno - start + 1
                if lo <= n <= hi:
                    code = textwrap.dedent("\n".join(lines[start - 1 : node.end_lineno]))
                    if "\t" not in code and len(code) < 2400:
                        yield path.stem, node.name, node.lineno, code, node


def rename_target(node) -> str | None:
    """A local variable name assigned in the function (or else an argument), not self/cls."""
    names = [t.id for n in ast.walk(node) if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)]
    names += [a.arg for a in node.args.args if a.arg not in ("self", "cls")]
    names = [n for n in names if len(n) >= 3 and not n.startswith("_")]
    return names[0] if names else None


def build(text_template: str, code: str, node) -> str | None:
    if "{old}" in text_template:
        old = rename_target(node)
        if old is None:
            return None
        text_template = text_template.format(old=old, new=f"{old}_value")
    return f"{text_template}\n\n```python\n{code}\n```"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--candidates", type=int, default=16, help="functions sampled (each tried with every instruction)")
    ap.add_argument("--keep", type=int, default=12)
    ap.add_argument("--min-oracle", type=float, default=8.0)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--stdlib", default=sysconfig.get_paths()["stdlib"])
    ap.add_argument("--templates", default=",".join(TEMPLATES))
    ap.add_argument("-o", "--output", default=str(OUT))
    args = ap.parse_args(argv)

    import numpy as np
    import torch

    torch.set_num_threads(1)
    from suffixspec.draft.simulate import Trace, oracle_mean_accepted
    from suffixspec.models import load_model

    model, tok = load_model()
    pool = list(functions(Path(args.stdlib)))
    rng = random.Random(args.seed)
    picked = rng.sample(pool, min(args.candidates, len(pool)))
    print(f"{len(pool)} functions of 15-60 lines; trying {len(picked)} x {len(args.templates.split(','))} instructions", flush=True)

    by_template: dict[str, list[dict]] = {name: [] for name in args.templates.split(",")}
    for module, name, lineno, code, node in picked:
        for tname in by_template:
            text = build(TEMPLATES[tname], code, node)
            if text is None:
                continue
            full = chatml(text)
            ids = tok.encode(full)
            t = time.perf_counter()
            with torch.inference_mode():
                x = torch.tensor([ids])
                out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=args.max_new_tokens,
                                     do_sample=False, pad_token_id=model.generation_config.eos_token_id)
            out_ids = out[0, len(ids):].tolist()
            oracle = oracle_mean_accepted([Trace(np.asarray(ids, np.int32), np.asarray(out_ids, np.int32))],
                                          budget=64, use_history=False)
            print(f"{tname:<12} {module}:{name:<28} prompt {len(ids):4d}  out {len(out_ids):3d}  oracle {oracle:5.2f}"
                  f"  ({time.perf_counter() - t:.1f}s)", flush=True)
            by_template[tname].append({
                "id": f"{module}.{name}#{tname}", "instruction": tname, "source": f"{module}.py:{name}:{lineno}",
                "prompt": text, "chatml": full, "prompt_ids": ids, "output_ids": out_ids,
                "oracle": round(oracle, 4), "licence": LICENCE,
            })

    # keep the best candidates, round-robin over the instructions so the set stays varied
    queues = {k: sorted([r for r in v if r["oracle"] >= args.min_oracle], key=lambda r: -r["oracle"])
              for k, v in by_template.items()}
    kept: list[dict] = []
    while len(kept) < args.keep and any(queues.values()):
        for k in list(queues):
            if queues[k] and len(kept) < args.keep:
                kept.append(queues[k].pop(0))
    kept.sort(key=lambda r: r["id"])
    Path(args.output).write_text("".join(json.dumps(r) + "\n" for r in kept), encoding="utf-8")
    allr = [r for v in by_template.values() for r in v]
    for k, v in by_template.items():
        if v:
            ok = sum(r["oracle"] >= args.min_oracle for r in v)
            print(f"{k:<12} tried {len(v):3d}  oracle>={args.min_oracle:g}: {ok:3d}  median oracle "
                  f"{sorted(r['oracle'] for r in v)[len(v) // 2]:.2f}")
    print(f"kept {len(kept)} of {len(allr)}; mean oracle {np.mean([r['oracle'] for r in kept]) if kept else 0:.2f} -> {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
