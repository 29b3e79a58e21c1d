#!/usr/bin/env bash
# A non-editable `pip install .` into a fresh venv ships every module and the shipped data:
# each module of the installed package imports (dependencies come from the CI interpreter's
# site-packages through PYTHONPATH, which does not run its .pth files, so the editable install
# there cannot shadow the copy under test).
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${PACKAGE_VENV:-/tmp/suffixspec-package-venv}"
rm -rf "$venv"
python -m venv "$venv"
site="$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
"$venv/bin/pip" install -q --no-deps . 2>&1 | { grep -v "Running pip as the .root. user" || true; }
source_modules="$(python - <<'PY'
from pathlib import Path
root = Path("suffixspec")
mods = []
for p in sorted(root.rglob("*.py")):
    parts = p.with_suffix("").parts
    mods.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
print(" ".join(mods))
PY
)"
cd "$venv"
SOURCE_MODULES="$source_modules" PYTHONPATH="$site" "$venv/bin/python" - <<'PY'
import importlib, pkgutil, sys
import suffixspec
assert suffixspec.__file__.startswith(sys.prefix), f"imported {suffixspec.__file__}, not the installed copy under {sys.prefix}"
import os
names = [m.name for m in pkgutil.walk_packages(suffixspec.__path__, "suffixspec.")]
missing = sorted(set(os.environ["SOURCE_MODULES"].split()) - set(names) - {"suffixspec"})
assert not missing, f"modules of the source tree missing from the installed package (list them in pyproject.toml): {missing}"
optional = {"suffixspec.integrations.vllm", "suffixspec.integrations.vllm_speculator"}  # import vllm (when vLLM calls them); checked in .ci/vllm.sh
failed = []
for name in names:
    try:
        importlib.import_module(name)
    except ImportError as exc:
        if name not in optional:
            failed.append(f"{name}: {exc}")
from importlib.resources import files
data = files("suffixspec.corpora")
assert any(p.name.endswith(".jsonl") for p in data.iterdir()), "shipped corpora missing"
assert not failed, "modules that do not import from the installed package:\n" + "\n".join(failed)
import suffixspec_vllm  # the vLLM entry point ships beside the package and imports nothing heavy
assert suffixspec_vllm.__file__.startswith(sys.prefix), f"imported {suffixspec_vllm.__file__}, not the installed copy"
print(f"package check: {len(names)} modules import from a non-editable install")
PY
