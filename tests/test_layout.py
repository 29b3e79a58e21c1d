"""The package's layout rules, read from its source with `ast` (nothing is imported):

1. no import cycle between suffixspec modules, counting imports inside functions and
   `TYPE_CHECKING` blocks (a cycle hidden behind a lazy import is still a cycle);
2. no module imports an underscore name, or from an underscore module, of another suffixspec
   module (the `_kernels` package of numba kernels aside; dunders such as `__version__` aside;
   modules inside a private package may import each other's public names);
3. no module of `suffixspec/` is over 650 lines, and at most 16 modules sit at the package root (the
   stages live in `draft/`, `verify/` and `engine/`);
4. no function is over 100 lines outside `_kernels/`, nor over 150 inside it, a function's length
   being its whole `def` span (docstring and nested functions included, decorators not);
5. no function outside `_kernels/` takes more than 12 parameters besides `self`/`cls`, except a public
   facade that mirrors an options dataclass as keywords (`FACADES`), which may take up to 16;
6. every module has a docstring of at most 30 lines (a summary and its contract; rationale goes to
   `docs/`);
7. the README and `docs/` name no path of the machine they were written on.

A package's `__init__` re-exporting its submodules does not count as an edge back from them: a
submodule that imports its parent package's names would (`from . import x` of a name, not a module).
"""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "suffixspec"
MAX_LINES = 650
MAX_ROOT_MODULES = 16
MAX_DOCSTRING_LINES = 30
MAX_FUNCTION_LINES, MAX_KERNEL_FUNCTION_LINES = 100, 150
MAX_PARAMS, MAX_FACADE_PARAMS = 12, 16
# mirror DecodeOptions' fields as keywords; SpeculativeGenerator's constructor mirrors BudgetPolicy's
FACADES = {"suffixspec/generate.py:generate", "suffixspec/generate.py:__init__"}
PRIVATE_OK = ("suffixspec._kernels",)


def module_name(path: Path) -> str:
    parts = ["suffixspec", *path.relative_to(ROOT).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def imports(name: str, path: Path, known: set[str]):
    """(target module, imported name or None, line) for every suffixspec import in the file."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "suffixspec" or alias.name.startswith("suffixspec."):
                    yield alias.name, None, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not (target == "suffixspec" or target.startswith("suffixspec.")):
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                if sub in known:
                    yield sub, None, node.lineno  # a submodule
                else:
                    yield target, alias.name, node.lineno


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        for target, _, _ in imports(name, path, known):
            while target not in known and "." in target:
                target = target.rsplit(".", 1)[0]
            if target != name and not name.startswith(target + "."):  # a parent package's __init__ is no edge
                edges[name].add(target)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan's algorithm)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def private(part: str) -> bool:
    return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))


def test_the_cycle_finder_finds_cycles():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle():
    found = cycles(graph())
    assert not found, f"import cycles between suffixspec modules: {found}"


def test_no_underscore_import_across_modules():
    mods = modules()
    known = set(mods)
    bad = []
    for name, path in mods.items():
        for target, imported, line in imports(name, path, known):
            if target.startswith(PRIVATE_OK) or target == name:
                continue
            parts = target.split(".") + ([imported] if imported else [])
            own = name.split(".")
            shared = 0  # components of the importer's own package path: a private package's modules see each other
            while shared < min(len(own), len(parts)) and own[shared] == parts[shared]:
                shared += 1
            if any(private(p) for p in parts[max(shared, 1):]):
                bad.append(f"{path.relative_to(ROOT.parent)}:{line} imports {target}{'.' + imported if imported else ''}")
    assert not bad, "underscore names imported across modules:\n" + "\n".join(bad)


def test_no_module_over_650_lines():
    long = {str(p.relative_to(ROOT.parent)): n for p in ROOT.rglob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def test_the_top_level_stays_light():
    """Every public name of the package resolves without importing torch, transformers or the web stack."""
    import subprocess
    import sys

    code = ("import sys, suffixspec\n"
            "for n in ['Engine', 'Server', 'Event', 'Step', 'SpeculativeGenerator', 'DecodeOptions', 'CostModel',"
            " 'BudgetPolicy', 'GenerationStats', 'Proposer', 'CorpusIndex']:\n"
            "    getattr(suffixspec, n)\n"
            "heavy = [m for m in ('torch', 'transformers', 'starlette', 'uvicorn', 'fastapi', 'vllm') if m in sys.modules]\n"
            "print(','.join(heavy))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"importing suffixspec's names imported {out.stdout.strip()}"


def function_rules(path: Path, source: str, rel: str) -> list[str]:
    """Rules 4 and 5 over one module's source: a line per function that breaks one."""
    kernel = "_kernels" in Path(rel).parts
    bad = []
    for node in ast.walk(ast.parse(source, rel)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        where = f"{rel}:{node.name} (line {node.lineno})"
        length = node.end_lineno - node.lineno + 1
        limit = MAX_KERNEL_FUNCTION_LINES if kernel else MAX_FUNCTION_LINES
        if length > limit:
            bad.append(f"{where}: {length} lines (at most {limit})")
        a = node.args
        names = [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg) if x is not None]
        params = len([n for n in names if n not in ("self", "cls")])
        most = MAX_FACADE_PARAMS if f"{rel}:{node.name}" in FACADES else MAX_PARAMS
        if not kernel and params > most:
            bad.append(f"{where}: {params} parameters (at most {most})")
    return bad


def test_the_function_rules_catch_long_and_wide_functions():
    long_body = "\n".join(f"    x{i} = {i}" for i in range(100))
    wide = ", ".join(f"a{i}" for i in range(13))
    source = (f"def long():\n{long_body}\n\n"
              f"def wide(self, {wide}):\n    pass\n\n"
              f"def fine(self, {', '.join(f'a{i}' for i in range(12))}):\n    def inner():\n        pass\n")
    found = function_rules(Path("x.py"), source, "suffixspec/x.py")
    assert found == ["suffixspec/x.py:long (line 1): 101 lines (at most 100)",
                     "suffixspec/x.py:wide (line 103): 13 parameters (at most 12)"]
    assert function_rules(Path("x.py"), source, "suffixspec/_kernels/x.py") == []  # the kernels' own limits


def test_no_function_too_long_or_too_wide():
    bad = []
    for p in sorted(ROOT.rglob("*.py")):
        bad += function_rules(p, p.read_text(encoding="utf-8"), str(p.relative_to(ROOT.parent)))
    assert not bad, "functions breaking the layout rules:\n" + "\n".join(bad)


def test_at_most_16_modules_at_the_package_root():
    root = sorted(p.name for p in ROOT.glob("*.py") if p.name != "__init__.py")
    assert len(root) <= MAX_ROOT_MODULES, f"{len(root)} modules at the package root (at most {MAX_ROOT_MODULES}): {root}"


def docstring_rule(source: str, rel: str) -> str | None:
    doc = ast.get_docstring(ast.parse(source, rel), clean=False)
    if doc is None:
        return f"{rel}: no module docstring"
    lines = len(doc.strip("\n").splitlines())
    return f"{rel}: a {lines}-line docstring (at most {MAX_DOCSTRING_LINES})" if lines > MAX_DOCSTRING_LINES else None


def test_the_docstring_rule_counts_lines():
    assert docstring_rule("x = 1\n", "m.py") == "m.py: no module docstring"
    assert docstring_rule('"""' + "line\n" * 30 + '"""\n', "m.py") is None
    assert docstring_rule('"""' + "line\n" * 31 + '"""\n', "m.py") == "m.py: a 31-line docstring (at most 30)"


def test_every_module_has_a_docstring_of_at_most_30_lines():
    bad = [found for p in sorted(ROOT.rglob("*.py"))
           if (found := docstring_rule(p.read_text(encoding="utf-8"), str(p.relative_to(ROOT.parent))))]
    assert not bad, "module docstrings:\n" + "\n".join(bad)


# an absolute path into a home, a checkout or a mount of one machine (temporary files aside)
MACHINE_PATH = re.compile(r"(?<![\w.$~])/(?:work|root|home|Users|mnt|data|srv|opt|var/lib)/[\w.-]+")


def test_the_machine_path_finder():
    assert MACHINE_PATH.findall("--specbench /work/shared/data/x.jsonl and /home/me/x") == ["/work/shared",
                                                                                          "/home/me"]
    assert not MACHINE_PATH.findall("bench/results/x.jsonl, $SUFFIXSPEC_SPECBENCH, /tmp/grid, https://a.b/work/x")


def test_the_readme_and_docs_name_no_machine_path():
    docs = [ROOT.parent / "README.md", *sorted((ROOT.parent / "docs").glob("*.md"))]
    bad = [f"{p.name}:{n}: {m}" for p in docs for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
           for m in MACHINE_PATH.findall(line)]
    assert not bad, "machine paths in the README or docs:\n" + "\n".join(bad)
