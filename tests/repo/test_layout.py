"""The package's architecture: five capabilities whose imports run one way, and no circles.

smoke -> operations -> service -> host -> lock: each subpackage imports only those after it and the shared
top-level modules. Imports under `if TYPE_CHECKING:` are annotations only and do not count.
"""

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent.parent / "python" / "dflashctl"
ORDER = ["smoke", "operations", "service", "host", "lock"]  # each may import those after it
SHARED = {"cli", "cli_help", "errors", "exit_codes", "inputs", "output", "stop_signals", "systems", "__init__", "__main__"}


def module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def runtime_imports(path: Path) -> set[str]:
    """Modules of dflashctl imported when `path` runs (TYPE_CHECKING blocks skipped)."""
    tree = ast.parse(path.read_text())
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for n in ast.walk(node))
    found = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("dflashctl"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("dflashctl"):
            for a in node.names:  # `from dflashctl.lock import lockfile` imports a module
                sub = f"{node.module}.{a.name}"
                found.add(sub if (PKG.parent / sub.replace(".", "/")).with_suffix(".py").exists() else node.module)
    return found


def graph() -> dict[str, set[str]]:
    return {module_name(p): runtime_imports(p) for p in PKG.rglob("*.py")}


def capability(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in ORDER else None


def test_tree_has_the_five_capabilities():
    for sub in ORDER:
        init = PKG / sub / "__init__.py"
        assert init.exists(), f"dflashctl/{sub}/ is missing"
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc and "entry point" in doc.lower(), f"dflashctl/{sub}/__init__.py must say its entry points"
    loose = sorted(p.stem for p in PKG.glob("*.py") if p.stem not in SHARED)
    assert not loose, f"modules outside a capability: {loose}"


def test_imports_run_one_way():
    wrong = []
    for mod, deps in graph().items():
        src = capability(mod)
        for dep in deps:
            dst = capability(dep)
            if dst is None or src is None:
                if src is None and dst is not None and mod.split(".")[-1] in SHARED - {"cli"}:
                    wrong.append(f"{mod} (shared) imports {dep}")
                continue
            if ORDER.index(dst) < ORDER.index(src):
                wrong.append(f"{mod} ({src}) imports {dep} ({dst}): against " + " -> ".join(ORDER))
    assert not wrong, "\n".join(wrong)


def find_cycle(g: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for d in sorted(g.get(n, ())):
            if d not in g:
                continue
            if state.get(d) == 1:
                return stack[stack.index(d):] + [d]
            if d not in state and (c := visit(d)):
                return c
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(g):
        if n not in state and (c := visit(n)):
            return c
    return None


def test_no_import_circle():
    cycle = find_cycle(graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle)


@pytest.mark.parametrize("g, expected", [
    ({"a": {"b"}, "b": {"a"}}, ["a", "b", "a"]),
    ({"a": {"b"}, "b": {"c"}, "c": set()}, None),
])
def test_cycle_finder_finds_circles(g, expected):
    assert find_cycle(g) == expected


def test_type_checking_imports_do_not_count(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("from typing import TYPE_CHECKING\nfrom dflashctl.service import settings_schema\n"
                 "if TYPE_CHECKING:\n    from dflashctl.service.config import InstanceConfig\n")
    assert runtime_imports(f) == {"dflashctl.service.settings_schema"}
    # the settings type is annotated in sglang_args, which config no longer imports (it read the flags)
    assert "dflashctl.service.config" not in runtime_imports(PKG / "service" / "sglang_args.py")
    assert "dflashctl.service.sglang_args" not in runtime_imports(PKG / "service" / "config.py")


def test_internals_names_every_module():
    """docs/INTERNALS.md follows the tree: each module is named in its capability's section."""
    doc = (PKG.parent.parent / "docs" / "INTERNALS.md").read_text()
    missing = sorted(str(p.relative_to(PKG)) for p in PKG.rglob("*.py")
                     if p.stem not in SHARED and p.name != "__init__.py" and p.name not in doc)
    assert not missing, f"docs/INTERNALS.md does not mention: {missing}"


LONGEST_FUNCTION = 60  # lines, decorators excluded; argparse set-up (`register`) excepted


def long_functions(root: Path) -> list[str]:
    """Every function of the package longer than LONGEST_FUNCTION lines, as `path:line name (N lines)`;
    a subcommand's `register(sub)` is a list of add_argument calls and may run longer."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name != "register":
                length = node.end_lineno - node.lineno + 1
                if length > LONGEST_FUNCTION:
                    found.append(f"{path.relative_to(root)}:{node.lineno} {node.name} ({length} lines)")
    return found


def test_no_function_is_longer_than_sixty_lines():
    assert long_functions(PKG) == [], "split these into functions that each do one thing"


def test_the_length_rule_sees_a_long_function(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(LONGEST_FUNCTION))
    (tmp_path / "long.py").write_text(f"def too_long():\n{body}\n\n\ndef register(sub):\n{body}\n")
    assert long_functions(tmp_path) == [f"long.py:1 too_long ({LONGEST_FUNCTION + 1} lines)"]


# --- the tests' own layout: shared helpers in support modules, no test module imports another ------

REPO = PKG.parent.parent


def imported_modules(path: Path) -> set[str]:
    """The top-level name of every module `path` imports, inside functions too."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module.split(".")[0])
    return found


def test_no_module_imports_a_test_module():
    """What several tests share lives in a support module at tests/ root (serve_fixture.py,
    smoke_runner.py, ...; fixtures registered in conftest.py), so a test module can move to any
    folder of tests/ and nothing that imported it breaks."""
    test_modules = {p.stem for p in (REPO / "tests").rglob("test_*.py") if "data" not in p.parts}
    assert "test_layout" in test_modules
    found = []
    for p in sorted([*(REPO / "tests").rglob("*.py"), *(REPO / "benchmarks").rglob("*.py")]):
        if names := sorted(imported_modules(p) & test_modules):
            found.append(f"{p.relative_to(REPO)} imports {', '.join(names)}")
    assert not found, "move what they import to a support module: " + "; ".join(found)


def test_an_import_inside_a_function_counts(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("import os.path\nfrom . import sibling\n\ndef test_x():\n    from test_smoke import smoke\n")
    assert imported_modules(f) == {"os", "test_smoke"}


# --- the package's data ships with it ----------------------------------------------------------------

def shipped(path: Path, package_data: dict[str, list[str]]) -> bool:
    """Whether setuptools' package-data globs (relative to their package's directory) take `path`."""
    rel = path.relative_to(PKG.parent)
    for package, globs in package_data.items():
        base = Path(*package.split("."))
        if base in rel.parents and any(rel.relative_to(base).match(g) and
                                       len(rel.relative_to(base).parts) == len(Path(g).parts) for g in globs):
            return True
    return False


def test_every_data_file_of_the_package_is_in_its_wheel():
    """A data file the wheel leaves out works from a checkout and fails where dflashctl is installed
    (the Nix package, pip install ./python): host/data/sglang-models.json was such a file."""
    import tomllib
    package_data = tomllib.loads((PKG.parent / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    data = [p for p in PKG.rglob("*") if p.is_file() and "data" in p.relative_to(PKG).parts[:-1]
            and "__pycache__" not in p.parts]
    assert len(data) >= 10
    assert [str(p.relative_to(PKG)) for p in data if not shipped(p, package_data)] == []
    assert not shipped(PKG / "host" / "data" / "x.txt", package_data)  # the rule can say no
