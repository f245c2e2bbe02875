"""Every module imports on its own terms, and dependencies point one way.

Layers, top to bottom: `__main__` → entry (the console script) → cli → commands → config → hostkeys → sentinel →
analysis | remote → report → agent → bounds → model | errors.
A module imports its own area and areas below it, never one beside it (analysis and remote know nothing of each
other) or above it. agent/ runs inside the container, from the agent archive: it imports nothing from dflashctl
outside agent/ (the archive also carries the sentinel, which does). trainer/ is deployed on its own: it imports
nothing from dflashctl. No module imports a `__main__` (an entry point is a top, never a library). Imports inside
functions count: a lazy import is still a dependency, and within the packages in ACYCLIC no two modules depend on
each other, however lazily.

Beyond the layers, a few imports are ruled out by name (NEVER), directly or through any chain of imports: config
reads hosts.toml without the sentinel program; report.py parses the probe's reply without the probe; commands/ and
cli/ read events and specs through analysis/, never sentinel/ (the program that runs in the container). A module
that others import is not named private (`_runs.py`).

Each check also runs against a small package with a deliberate circle / upward / forbidden import, so each is shown
to fail.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("dflashctl", "trainer")

LAYERS: list[set[str]] = [{"__main__"}, {"entry"}, {"cli"}, {"commands"}, {"config"}, {"hostkeys"}, {"sentinel"},
                          {"analysis", "remote"}, {"report"}, {"agent"}, {"bounds"},
                          {"model", "errors", "__init__"}]
ISOLATED = {"dflashctl.agent": "dflashctl.agent", "trainer": "trainer"}  # package -> the only dflashctl part it may use
ACYCLIC = ("dflashctl", "trainer")  # no two modules depend on each other anywhere
# importer prefix -> module prefixes it must not reach, directly or through others (lazy imports count)
NEVER = {
    "dflashctl.config": ("dflashctl.sentinel",),
    "dflashctl.report": ("dflashctl.agent.probe",),
    "dflashctl.commands": ("dflashctl.sentinel",),
    "dflashctl.cli": ("dflashctl.sentinel",),
}


def modules(root: Path, package: str) -> list[str]:
    """Dotted names of every module of `package` under root (an `__init__` as its package's name)."""
    names = []
    for path in sorted((root / package).rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        parts = path.relative_to(root).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def import_failures(root: Path, names: list[str]) -> str:
    """Import `names` in this order in one fresh interpreter (cwd = root); '' on success, else which one failed
    and why. `__main__` modules are left out: importing one runs its program."""
    code = textwrap.dedent("""
        import importlib, sys, traceback
        for name in sys.argv[1:]:
            try:
                importlib.import_module(name)
            except BaseException:
                print(f"import {name} failed (after {sys.argv[1:].index(name)} others):")
                traceback.print_exc(limit=-3, file=sys.stdout)
                sys.exit(1)
    """)
    names = [n for n in names if not n.endswith("__main__")]
    done = subprocess.run([sys.executable, "-c", code, *names], cwd=root, capture_output=True, text=True,
                          timeout=300)
    return "" if done.returncode == 0 else (done.stdout + done.stderr).strip()


def _imported(tree: ast.AST, module: str, is_package: bool, root: Path) -> list[tuple[int, str]]:
    """(line, dotted module) for every import in the tree, relative ones resolved, `from P import m` as P.m when m
    is a module of P."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                sub = root.joinpath(*base.split("."), alias.name)
                found.append((node.lineno, f"{base}.{alias.name}" if sub.is_dir() or sub.with_suffix(".py").is_file()
                              else base))
    return found


def _area(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _upward(importer: str, target: str) -> str | None:
    """Why importer must not import target (both dotted), or None."""
    if target.endswith(".__main__") or target == "__main__":
        return "imports an entry point (__main__)"
    for package, allowed in ISOLATED.items():
        if (importer == package or importer.startswith(package + ".")) and target.split(".")[0] == "dflashctl" \
                and not (target == allowed or target.startswith(allowed + ".")):
            return f"{package} may import nothing from dflashctl outside {allowed}"
    if importer.split(".")[0] != "dflashctl" or target.split(".")[0] != "dflashctl":
        return None
    src, dst = _area(importer), _area(target)
    if src == dst:
        return None
    rank = {area: i for i, layer in enumerate(LAYERS) for area in layer}
    if dst not in rank or src not in rank:
        return f"area {dst if dst not in rank else src!r} is in no layer: add it to LAYERS"
    if rank[dst] <= rank[src]:
        return f"{src} imports {dst}, which is {'beside' if rank[dst] == rank[src] else 'above'} it"
    return None


def layering_violations(root: Path, packages: tuple[str, ...] = PACKAGES) -> list[str]:
    problems = []
    for package in packages:
        for path, module, is_package in _sources(root, package):
            for line, target in _imported(ast.parse(path.read_text(), str(path)), module, is_package, root):
                why = _upward(module, target)
                if why:
                    problems.append(f"{path.relative_to(root)}:{line}: imports {target}: {why}")
    return problems


def _sources(root: Path, package: str):  # noqa: ANN202 - yields (path, module, is_package)
    for path in sorted((root / package).rglob("*.py")):
        if "__pycache__" not in path.parts:
            parts = path.relative_to(root).with_suffix("").parts
            is_package = parts[-1] == "__init__"
            yield path, ".".join(parts[:-1] if is_package else parts), is_package


def circles(root: Path, packages: tuple[str, ...]) -> list[list[str]]:
    """Groups of modules (of `packages`, given by dotted name) that import each other, directly or through others,
    top-level or lazily: each group sorted, the groups too."""
    graph: dict[str, set[str]] = {}
    for package in packages:
        for path, module, is_package in _sources(root, package.replace(".", "/")):
            graph[module] = {t for _, t in _imported(ast.parse(path.read_text(), str(path)), module, is_package, root)}
    reach: dict[str, set[str]] = {}
    for start in graph:
        seen, todo = set(), [start]
        while todo:
            for nxt in graph.get(todo.pop(), ()):
                if nxt in graph and nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        reach[start] = seen
    groups = {tuple(sorted(m for m in reach[s] if s in reach[m])) for s in graph if s in reach[s]}
    return sorted(list(g) for g in groups)


def every_module() -> list[str]:
    return [name for package in PACKAGES for name in modules(REPO, package)]


def test_every_module_imports_in_a_fresh_interpreter_in_sorted_order() -> None:
    names = sorted(every_module())
    assert len(names) > 50
    assert import_failures(REPO, names) == ""


def test_every_module_imports_in_a_fresh_interpreter_in_reverse_order() -> None:
    assert import_failures(REPO, sorted(every_module(), reverse=True)) == ""


def test_no_module_imports_upward_beside_itself_or_an_entry_point() -> None:
    assert layering_violations(REPO) == []


def test_no_two_modules_of_remote_or_trainer_import_each_other_even_lazily() -> None:
    assert circles(REPO, ACYCLIC) == []


# ---- the checks can fail ------------------------------------------------------------------------------------
def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def test_a_circle_that_imports_in_one_order_only_fails_the_other(tmp_path: Path) -> None:
    _write(tmp_path, {"circ/__init__.py": "",
                      "circ/a.py": "import circ.b\n\nA = 1\n",
                      "circ/b.py": "from circ.a import A\n\nB = A + 1\n"})
    names = modules(tmp_path, "circ")
    assert names == ["circ", "circ.a", "circ.b"]
    failed = import_failures(tmp_path, sorted(names))  # circ.a first: b wants A before a has defined it
    assert "import circ.a failed" in failed and "ImportError" in failed, failed
    assert import_failures(tmp_path, sorted(names, reverse=True)) == ""  # circ.b first: the circle goes unseen


def test_upward_sideways_and_entry_point_imports_are_each_reported(tmp_path: Path) -> None:
    _write(tmp_path, {
        "dflashctl/__init__.py": "",
        "dflashctl/errors.py": "",
        "dflashctl/cli/__init__.py": "",
        "dflashctl/commands/__init__.py": "",
        "dflashctl/commands/ok.py": "from dflashctl.errors import x\nfrom dflashctl.remote import ssh\n",
        "dflashctl/remote/__init__.py": "",
        "dflashctl/remote/ssh.py": "def f():\n    from dflashctl.cli import main\n",
        "dflashctl/analysis/__init__.py": "",
        "dflashctl/analysis/scan.py": "from ..remote import ssh\n",
        "dflashctl/agent/__init__.py": "",
        "dflashctl/agent/probe.py": "from dflashctl import errors\nfrom dflashctl.agent import probe\n",
        "trainer/__init__.py": "",
        "trainer/__main__.py": "",
        "trainer/eval.py": "from trainer.__main__ import device_problem\nimport dflashctl.model\n",
    })
    found = layering_violations(tmp_path)
    assert found == [
        "dflashctl/agent/probe.py:1: imports dflashctl.errors: dflashctl.agent may import nothing from dflashctl "
        "outside dflashctl.agent",
        "dflashctl/analysis/scan.py:1: imports dflashctl.remote.ssh: analysis imports remote, which is beside it",
        "dflashctl/remote/ssh.py:2: imports dflashctl.cli: remote imports cli, which is above it",
        "trainer/eval.py:1: imports trainer.__main__: imports an entry point (__main__)",
        "trainer/eval.py:2: imports dflashctl.model: trainer may import nothing from dflashctl outside trainer",
    ], found


def test_a_circle_closed_by_a_lazy_import_is_reported_with_every_module_on_it(tmp_path: Path) -> None:
    _write(tmp_path, {"pkg/__init__.py": "",
                      "pkg/top.py": "def main():\n    from pkg import middle\n",
                      "pkg/middle.py": "from pkg.bottom import x\n",
                      "pkg/bottom.py": "from pkg.top import main\nx = 1\n",
                      "pkg/leaf.py": "from pkg import bottom\n"})
    assert circles(tmp_path, ("pkg",)) == [["pkg.bottom", "pkg.middle", "pkg.top"]]


MAX_MODULE_LINES = 400  # issue "One house": a module is read in one sitting


def test_every_module_reads_in_one_sitting() -> None:
    """No module of dflashctl or trainer grows past MAX_MODULE_LINES: split it along its seams instead."""
    long = {str(path.relative_to(REPO)): n for package in PACKAGES
            for path in sorted((REPO / package).rglob("*.py")) if "__pycache__" not in path.parts
            and (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES}
    assert long == {}


def _graph(root: Path, packages: tuple[str, ...]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for package in packages:
        for path, module, is_package in _sources(root, package):
            graph[module] = {t for _, t in _imported(ast.parse(path.read_text(), str(path)), module, is_package, root)}
    return graph


def forbidden_reaches(root: Path, never: dict[str, tuple[str, ...]], packages: tuple[str, ...] = PACKAGES) -> list[str]:
    """'importer -> a -> b -> target' for every module under a NEVER prefix that reaches a module it must not."""
    graph = _graph(root, packages)

    def under(module: str, prefix: str) -> bool:
        return module == prefix or module.startswith(prefix + ".")

    found = []
    for start in sorted(graph):
        banned = [b for prefix, bs in never.items() if under(start, prefix) for b in bs]
        if not banned:
            continue
        seen, todo = {start: [start]}, [start]
        while todo:
            here = todo.pop(0)
            for nxt in sorted(graph.get(here, ())):
                if nxt in seen:
                    continue
                seen[nxt] = [*seen[here], nxt]
                if any(under(nxt, b) for b in banned):
                    found.append(" -> ".join(seen[nxt]))
                elif nxt in graph:
                    todo.append(nxt)
    return found


def test_config_report_commands_and_cli_never_reach_what_they_must_not() -> None:
    assert forbidden_reaches(REPO, NEVER) == []


def test_a_forbidden_import_through_another_module_is_reported(tmp_path: Path) -> None:
    _write(tmp_path, {"dflashctl/__init__.py": "",
                      "dflashctl/config.py": "def f():\n    from dflashctl import hostkeys\n",
                      "dflashctl/hostkeys.py": "from dflashctl.sentinel import spec\n",
                      "dflashctl/sentinel/__init__.py": "",
                      "dflashctl/sentinel/spec.py": "",
                      "dflashctl/report.py": "from dflashctl.agent.lib import frame\n",
                      "dflashctl/agent/__init__.py": "",
                      "dflashctl/agent/lib/__init__.py": "",
                      "dflashctl/agent/lib/frame.py": ""})
    assert forbidden_reaches(tmp_path, NEVER, ("dflashctl",)) == [
        "dflashctl.config -> dflashctl.hostkeys -> dflashctl.sentinel.spec"]


def test_no_module_is_named_private() -> None:
    """A helper module that other modules import has a public name (commands/_runs.py became runlookup.py)."""
    private = [str(p.relative_to(REPO)) for package in PACKAGES for p in sorted((REPO / package).rglob("_*.py"))
               if not p.name.startswith("__") and "__pycache__" not in p.parts]
    assert private == []
