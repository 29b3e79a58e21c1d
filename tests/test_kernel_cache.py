"""Kernel caches are keyed by every kernel module's source (`suffixspec/_kernels/cachestamp.py`): on a
copy of the package, a kernel compiled once is loaded from its cache in the next process, and after
an edit of *another* kernel module (one it may have inlined code from) it is compiled again instead of
loaded. Numba's own per-file key would load it: the stale inlined code was a heap corruption."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

RUN = """
import json, sys
import numpy as np
sys.path.insert(0, sys.argv[1])
import suffixspec._kernels.propose as pk
assert pk.__file__.startswith(sys.argv[1]), pk.__file__
links, lens = np.array([0, 0, 1], np.int32), np.array([0, 1, 2], np.int32)
pk.normalize_frozen(links, lens, 2, 1)
st = pk.normalize_frozen.stats
print(json.dumps({"hits": sum(st.cache_hits.values()), "misses": sum(st.cache_misses.values())}))
"""


def _run(where: Path) -> dict:
    env = {"PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1", "HOME": str(where)}
    out = subprocess.run([sys.executable, "-c", RUN, str(where)], capture_output=True, text=True, env=env,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_an_edit_of_another_kernel_module_compiles_the_kernel_again(tmp_path):
    shutil.copytree(ROOT / "suffixspec", tmp_path / "suffixspec", ignore=shutil.ignore_patterns("__pycache__"))
    assert _run(tmp_path) == {"hits": 0, "misses": 1}  # compiled, written to the cache
    assert _run(tmp_path) == {"hits": 1, "misses": 0}  # loaded from it
    lct = tmp_path / "suffixspec" / "_kernels" / "lct.py"
    lct.write_text(lct.read_text() + "\n# an edit elsewhere in the kernels\n")
    assert _run(tmp_path) == {"hits": 0, "misses": 1}  # propose.py itself is unchanged: compiled again
    assert _run(tmp_path) == {"hits": 1, "misses": 0}
