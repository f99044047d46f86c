"""What the import fix-up tests share (tests/nix/test_sglang_import_fixup.py,
test_transformers_import_fixup.py; overlays/fixups/sglang.nix and transformers.nix): each fix-up's
install script as Nix evaluates it, modules of the shapes they edit built around the fix-ups' own
texts, and a reader of the modules a file imports when it is imported."""

import ast
import subprocess
import sys
import warnings
from pathlib import Path

from conftest import REPO, nix_or_skip
from dflashctl.lock.fixup_scripts import effects
from fixup_shell import SITE, run_script
from nixeval import eval_expr

# The two lines the fix-up looks for, in a module of our own with utils.py's shape.
SHAPED_UTILS = '''import json
from IPython.display import HTML, display
from json import dumps


def is_in_ci():
    return True


def print_highlight(html_content: str):
    if is_in_ci():
        display(HTML(f"<b>{html_content}</b>"))
    else:
        print(html_content)
'''


# The lines promptReadiness looks for (overlays/fixups/sglang.nix), in functions of our own with the
# shapes of http_server.py's two waits: a health handler that asks the scheduler for a token and
# looks for an answer, and the warm-up's wait for the server to answer. Both read the clock and sleep
# through the module's `time` and `asyncio`, which the tests replace with a virtual clock.
SHAPED_HTTP_SERVER = '''import asyncio
import time

HEALTH_CHECK_TIMEOUT = 20


class Scheduler:
    answered_at = None  # when the answer to a health request comes back; None: never


scheduler = Scheduler()


async def health():
    asked = time.time()
    while time.time() < asked + HEALTH_CHECK_TIMEOUT:
        await asyncio.sleep(1)
        if scheduler.answered_at is not None and time.time() >= scheduler.answered_at:
            return 200
    return 503


def wait_for_server(try_once):
    for _ in range(120):
        time.sleep(1)
        if try_once():
            return True
    return False
'''
HTTP_SERVER = "sglang/srt/entrypoints/http_server.py"


def sglang_post_install(patches: str = "[ ]", src: str = "null") -> str:
    expr = (f'let lib = import {REPO}/tests/nix/stub-nixpkgs/lib.nix; in ((import {REPO}/overlays/fixups/sglang.nix '
            f'{{ inherit lib; python = {{ sitePackages = "{SITE}"; interpreter = "python3.12"; }}; packages = {{ }}; '
            f'options = {{ sglangPatches = {patches}; sglangPatchFlags = [ "-p2" ]; sglangSrc = {src}; }}; }}) '
            f'{{ }}).postInstall or ""')
    return eval_expr(nix_or_skip(), expr)


def frontend_edit():
    """The fix-up's edit of sglang/__init__.py: the published import block and its replacement."""
    (edit,) = [r for r in effects(sglang_post_install()).replacements if r.path.endswith("sglang/__init__.py")]
    return edit


def imported_names(block: str) -> dict[str, list[str]]:
    """module -> the names a block of `from M import (...)` statements binds, in order."""
    return {n.module: [a.name for a in n.names] for n in ast.parse(block).body if isinstance(n, ast.ImportFrom)}


def shaped_sglang_site(tmp_path: Path) -> Path:
    """A package of the shapes the fix-ups edit: utils.py's and http_server.py's (above), __init__.py's
    around the published block (the fix-up's own OLD text), and frontend modules that bind each name
    to an object of their own and record their import."""
    site = tmp_path / "out" / SITE
    old = frontend_edit().old
    (site / "sglang/lang/backend").mkdir(parents=True)
    (site / "sglang/utils.py").write_text(SHAPED_UTILS)
    (site / "sglang/global_config.py").write_text("global_config = object()\n")
    (site / "sglang/srt/entrypoints").mkdir(parents=True)
    (site / HTTP_SERVER).write_text(SHAPED_HTTP_SERVER)
    init = ("from sglang.global_config import global_config\n" + old
            + 'Engine = "the package\'s own lazy Engine"\n'
            + f"__all__ = {sorted({n for names in imported_names(old).values() for n in names})!r}\n")
    (site / "sglang/__init__.py").write_text(init)
    for part in ("sglang/lang/__init__.py", "sglang/lang/backend/__init__.py"):
        (site / part).write_text("")
    for module, names in imported_names(old).items():
        body = 'import os\nif "FRONTEND_IMPORTED" in os.environ:\n'
        body += '    open(os.environ["FRONTEND_IMPORTED"], "a").write(__name__ + "\\n")\n'
        body += "".join(f"class {n}:\n    pass\n" for n in names)
        (site / (module.replace(".", "/") + ".py")).write_text(body)
    return site


QUANTIZER = "transformers/quantizers/quantizer_torchao.py"
STAND_IN_SUPPORT = '''import os
open(os.environ["TORCHAO_IMPORTED"], "a").write("imported\\n")


def flatten_tensor_state_dict(state):
    return {"flattened": sorted(state)}
'''


def transformers_post_install() -> str:
    expr = (f'((import {REPO}/overlays/fixups/transformers.nix {{ python = {{ sitePackages = "{SITE}"; '
            f'interpreter = "python3.12"; }}; }}) {{ }}).postInstall')
    return eval_expr(nix_or_skip(), expr)


def shaped_transformers_site(tmp_path: Path) -> Path:
    """quantizer_torchao.py's shape: the fix-up's first OLD at module level, its second as the body
    of the method, and a stand-in torchao beside it."""
    import_block, method_body = [r.old for r in effects(transformers_post_install()).replacements]
    site = tmp_path / "out" / SITE
    (site / "transformers/quantizers").mkdir(parents=True)
    (site / "transformers/__init__.py").write_text("")
    (site / "transformers/quantizers/__init__.py").write_text("")
    (site / QUANTIZER).write_text(
        "def is_torchao_available():\n    return True\n" + import_block
        + "\n\nclass TorchAoHfQuantizer:\n    def get_state_dict_and_metadata(self, model):" + method_body)
    support = site / "torchao/prototype/safetensors"
    support.mkdir(parents=True)
    for init in ("torchao", "torchao/prototype", "torchao/prototype/safetensors"):
        (site / init / "__init__.py").write_text("")
    (support / "safetensors_support.py").write_text(STAND_IN_SUPPORT)
    return site


def imports_at_module_level(tree: ast.Module) -> list[str]:
    """The modules a file imports when it is imported: its top level, the branches of its ifs,
    trys and withs, and class bodies; not function bodies."""
    found, todo = [], list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append(node.module)
        elif not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            todo += [c for c in ast.iter_child_nodes(node) if isinstance(c, ast.stmt)]
            for handler in getattr(node, "handlers", []):
                todo += handler.body
    return found


def parse(path: Path) -> ast.Module:
    with warnings.catch_warnings():  # SGLang's own invalid escapes are not ours to report
        warnings.simplefilter("ignore", SyntaxWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        return ast.parse(path.read_bytes(), str(path))


def run_recording(code: str, pythonpath: list[Path], record: Path, variable: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    """`code` in a fresh interpreter with `pythonpath`, `variable` naming the file the stand-ins append
    to when imported; the run and that file's lines."""
    record.unlink(missing_ok=True)
    env = {"PATH": "/usr/bin:/bin", variable: str(record), "PYTHONPATH": ":".join(map(str, pythonpath))}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    return done, record.read_text().splitlines() if record.exists() else []


def before_and_after(script: str, out: Path, probe):
    """probe() on the published shape, the fix-up's script run over `out` as the build runs it, then
    probe() again."""
    before = probe()
    done = run_script(script, out)
    assert done.returncode == 0, done.stderr
    return before, probe()


def check_import_moved(before_and_after_runs, said_after: list[str], byte_code: Path) -> None:
    """What each import fix-up must show: before it, the module imported the library when it was
    imported; after it, not, the caller said `said_after`, the library came once (with the call),
    and the edited file's byte code was rebuilt."""
    (before, imported_before), (after, imported) = before_and_after_runs
    assert before.returncode == 0, before.stderr
    assert before.stdout.splitlines()[0] == "at import: True" and imported_before == ["imported"]
    assert after.returncode == 0, after.stderr
    assert after.stdout.splitlines() == ["at import: False", *said_after]
    assert imported == ["imported"]  # by the call, once
    assert list(byte_code.parent.glob(byte_code.name))
