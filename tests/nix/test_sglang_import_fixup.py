"""The sglang fix-ups that keep what a server never uses out of its imports (overlays/fixups/sglang.nix;
issue 44's first import), their install script evaluated by Nix and run as the build runs it:
`lazyIPython` moves sglang/utils.py's module-level IPython import into the one helper that uses it;
`lazyFrontend` makes the package's frontend-language names (sglang.lang) resolve at their first use.

Offline: over modules of the same shape written here, with stand-ins that record their import. With
network: over the locked wheel, where no module of the sglang package imports IPython any more when
it is imported, the package's __init__ no longer imports sglang.lang, and its table names exactly
what the published import block did."""

import ast
import subprocess
from pathlib import Path

import pytest

from fixup_shell import locked_wheel, run_script, unpack
from import_fixups import (check_import_moved, SHAPED_UTILS, before_and_after, frontend_edit, imported_names, imports_at_module_level, parse,
                           run_recording,
                           shaped_sglang_site as shaped_site, sglang_post_install as post_install)

pytestmark = pytest.mark.nix

STAND_IN_IPYTHON = '''import os
with open(os.environ["IPYTHON_IMPORTED"], "a") as f:
    f.write("imported\\n")

def HTML(text):
    return "HTML:" + text

def display(obj):
    print("displayed", obj)
'''


def stand_in_ipython(tmp_path: Path) -> Path:
    root = tmp_path / "ipython"
    (root / "IPython").mkdir(parents=True, exist_ok=True)
    (root / "IPython/__init__.py").write_text("")
    (root / "IPython/display.py").write_text(STAND_IN_IPYTHON)
    return root


def import_then_call(site: Path, tmp_path: Path) -> tuple[subprocess.CompletedProcess, list[str]]:
    """Import sglang.utils (the shaped one), note whether IPython came with it, then call the helper."""
    code = ("import sys, sglang.utils as u; print('at import:', 'IPython' in sys.modules); "
            "u.print_highlight('hello')")
    return run_recording(code, [site, stand_in_ipython(tmp_path)], tmp_path / "ipython-imported", "IPYTHON_IMPORTED")


def test_the_helper_imports_ipython_when_called_not_the_module(tmp_path):
    site = shaped_site(tmp_path)
    runs = before_and_after(post_install(), tmp_path / "out", lambda: import_then_call(site, tmp_path))
    check_import_moved(runs, ["displayed HTML:<b>hello</b>"], site / "sglang/__pycache__/utils.*.pyc")


def test_a_wheel_without_the_line_stops_the_build(tmp_path):
    """--replace-fail: a re-lock to an SGLang whose utils.py changed fails the build (and `dflashctl
    audit`) instead of leaving the import silently in place."""
    site = shaped_site(tmp_path)
    assert run_script(post_install(), tmp_path / "out").returncode == 0
    again = run_script(post_install(), tmp_path / "out")
    assert again.returncode != 0 and "not found" in again.stderr
    assert "from IPython.display" in (site / "sglang/utils.py").read_text()  # the helper's own import


def test_after_patches_a_moved_line_only_warns(tmp_path):
    """sglangPatches are applied first and may have changed utils.py: the edit then warns."""
    patch = tmp_path / "noop.patch"
    patch.write_text("")
    site = shaped_site(tmp_path)
    (site / "sglang/utils.py").write_text(SHAPED_UTILS.replace("from IPython.display import HTML, display\n", ""))
    script = post_install(f"[ {patch} ]")
    assert "--replace-warn" in script and "--replace-fail" not in script
    done = run_script(script, tmp_path / "out")
    assert done.returncode == 0, done.stderr
    assert "warning" in done.stderr


def test_another_sglang_is_left_as_it_is():
    assert "substituteInPlace" not in post_install(src='"/store/sglang-0.5.12-cp312-cp312-manylinux_2_34_x86_64.whl"')


# ---------------------------------------------------------------- lazyFrontend, offline

def run_frontend_probe(site: Path, tmp_path: Path, code: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    return run_recording(code, [site], tmp_path / "frontend-imported", "FRONTEND_IMPORTED")


def test_the_frontend_is_imported_at_first_use_not_with_the_package(tmp_path):
    site = shaped_site(tmp_path)
    at_import = "import sys, sglang; print(sorted(m for m in sys.modules if m.startswith('sglang.lang')))"
    before, imported = run_frontend_probe(site, tmp_path, at_import)
    assert before.returncode == 0, before.stderr
    assert set(imported) == {"sglang.lang.api", "sglang.lang.backend.runtime_endpoint", "sglang.lang.choices"}

    done = run_script(post_install(), tmp_path / "out")
    assert done.returncode == 0, done.stderr
    after, imported = run_frontend_probe(site, tmp_path, at_import)
    assert after.returncode == 0, after.stderr
    assert after.stdout.split() == ["[]"] and imported == []
    assert list((site / "sglang/__pycache__").glob("__init__.*.pyc"))  # byte code of the edited file

    # each name the block bound is the frontend module's own object, imported once at its first use
    names = imported_names(frontend_edit().old)
    same = ("import importlib, sglang\n"
            f"names = {names!r}\n"
            "for module, ns in names.items():\n"
            "    for n in ns:\n"
            "        if n != 'Engine':\n"
            "            assert getattr(sglang, n) is getattr(importlib.import_module(module), n), n\n"
            "print(sglang.Engine, sglang.lang.__name__)")
    used, imported = run_frontend_probe(site, tmp_path, same)
    assert used.returncode == 0, used.stderr
    assert used.stdout.strip() == "the package's own lazy Engine sglang.lang"  # defined after the block, as before
    assert sorted(imported) == sorted(m for m in names)  # each module once

    star, _ = run_frontend_probe(site, tmp_path, "from sglang import *; print(gen.__module__, RuntimeEndpoint.__module__)")
    assert star.returncode == 0, star.stderr
    assert star.stdout.split() == ["sglang.lang.api", "sglang.lang.backend.runtime_endpoint"]
    wrong, imported = run_frontend_probe(site, tmp_path, "import sglang; sglang.no_such_name")
    assert wrong.returncode == 1 and "AttributeError: sglang has no attribute 'no_such_name'" in wrong.stderr
    assert imported == []


def test_the_frontend_table_names_what_the_block_imported():
    """The replacement's table is the published block's names, module by module (Engine aside: the
    package rebinds it after the block), so no name is lost or gained."""
    edit = frontend_edit()
    published = imported_names(edit.old)
    table = {}
    for node in ast.parse(edit.new).body:
        if isinstance(node, ast.Assign) and node.targets[0].id == "_FRONTEND_MODULES":
            table = ast.literal_eval(node.value)
    assert {m: list(ns) for m, ns in table.items()} == {
        m: [n for n in ns if n != "Engine"] for m, ns in published.items()}


# ---------------------------------------------------------------- the locked wheel, with network

def ipython_importers(package: Path) -> list[str]:
    out = []
    for path in sorted(package.rglob("*.py")):
        tree = parse(path)
        if any(m == "IPython" or m.startswith("IPython.") for m in imports_at_module_level(tree)):
            out.append(str(path.relative_to(package.parent)))
    return out


def names_taken_from(package: Path, module: str) -> list[tuple[str, set[str]]]:
    """(file, names) of each `from MODULE import names` anywhere in the package."""
    out = []
    for path in sorted(package.rglob("*.py")):
        tree = parse(path)
        out += [(str(path), {a.name for a in n.names}) for n in ast.walk(tree)
                if isinstance(n, ast.ImportFrom) and n.module == module]
    return out


@pytest.mark.network
def test_no_module_of_the_locked_sglang_imports_ipython_when_imported(tmp_path):
    wheel = locked_wheel("sglang", tmp_path)
    site = unpack(wheel, tmp_path / "out")
    assert ipython_importers(site / "sglang") == ["sglang/utils.py"]
    done = run_script(post_install(), tmp_path / "out")
    assert done.returncode == 0, done.stderr
    assert ipython_importers(site / "sglang") == []
    tree = ast.parse((site / "sglang/utils.py").read_text())
    helper = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "print_highlight")
    first = helper.body[0]
    assert isinstance(first, ast.ImportFrom) and first.module == "IPython.display"
    assert {a.name for a in first.names} == {"HTML", "display"}
    # no other module takes those names from sglang.utils, and nothing else in it used them
    assert [f for f in names_taken_from(site / "sglang", "sglang.utils") if {"HTML", "display"} & f[1]] == []
    others = [n for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id in ("HTML", "display")]
    assert {n.lineno for n in others} <= {n.lineno for n in ast.walk(helper) if isinstance(n, ast.Name)}


@pytest.mark.network
def test_the_locked_sglang_package_no_longer_imports_its_frontend(tmp_path):
    wheel = locked_wheel("sglang", tmp_path)
    site = unpack(wheel, tmp_path / "out")
    init = site / "sglang/__init__.py"

    def frontend_imports() -> list[str]:
        return [m for m in imports_at_module_level(parse(init)) if m == "sglang.lang" or m.startswith("sglang.lang.")]

    assert sorted(frontend_imports()) == sorted(imported_names(frontend_edit().old))
    done = run_script(post_install(), tmp_path / "out")
    assert done.returncode == 0, done.stderr
    assert frontend_imports() == []
    # a server never needed them: no module of sglang.srt imports the frontend
    srt = [str(p) for p in sorted((site / "sglang/srt").rglob("*.py"))
           if any(m == "sglang.lang" or m.startswith("sglang.lang.") for m in imports_at_module_level(parse(p)))]
    assert srt == []
