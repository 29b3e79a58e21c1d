"""A bench script loaded as a module, for tests that drive its harness (it imports its sibling
`common`, so `bench/` is on the path while it loads, and only then)."""

import importlib.util
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent.parent / "bench"


def load_bench_script(name: str):
    """`bench/<name>.py` as the module `name` (registered: its dataclasses look their module up)."""
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCH))
    return module
