"""Which model architectures the pinned SGLang loads, and which of them can serve a drafter.

SGLang 0.5.11 registers a model class for every `EntryClass` of the modules in `sglang/srt/models/`
(models/registry.py, keyed by the class's name) and picks the first of a config's `architectures`
it has; one it lacks falls back to its Transformers backend (`TransformersForCausalLM`). A DFLASH
target must implement `set_dflash_layers_to_capture` and an EAGLE3 target
`set_eagle3_layers_to_capture` (model_executor/model_runner.py calls them after the weights have
loaded). Those facts are read here from SGLang's source with `ast`, nothing imported, into
`data/sglang-models.json`, which the model-pair rules (host/model_pair.py) read at run time:

    python -m dflashctl.host.sglang_models /path/to/site-packages/sglang --version 0.5.11 \
        > python/dflashctl/host/data/sglang-models.json

Run it again when the pin in nix/stack.toml moves (a test keeps the file's version equal to it).
"""

import argparse
import ast
import json
import sys
from functools import lru_cache
from pathlib import Path

DATA = Path(__file__).parent / "data" / "sglang-models.json"
DFLASH_HOOK, EAGLE3_HOOK = "set_dflash_layers_to_capture", "set_eagle3_layers_to_capture"
# Drafter modules by SGLang's own file naming: dflash.py holds the DFlash drafter, *_eagle3.py the
# EAGLE3 ones; *_eagle.py, *_nextn.py and *_mtp.py hold drafters of other algorithms.
DRAFTER_SUFFIXES = ("_eagle", "_eagle3", "_nextn", "_mtp")


@lru_cache(maxsize=1)
def load() -> dict:
    return json.loads(DATA.read_text())


class _Module:
    """One model file: its classes (bases as written, methods) and what its names import."""

    def __init__(self, name: str, tree: ast.Module):
        self.name = name
        self.classes: dict[str, tuple[list[ast.expr], set[str]]] = {}
        self.imports: dict[str, tuple[str, str]] = {}  # local name -> (module, name there)
        self.entry: list[str] = []
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                methods = {n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
                self.classes[node.name] = (node.bases, methods)
            elif isinstance(node, ast.ImportFrom) and node.module:
                for a in node.names:
                    self.imports[a.asname or a.name] = (node.module, a.name)
            elif isinstance(node, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == "EntryClass" for t in node.targets):
                values = node.value.elts if isinstance(node.value, (ast.List, ast.Tuple)) else [node.value]
                self.entry = [v.id for v in values if isinstance(v, ast.Name)]


class _Index:
    def __init__(self, models_dir: Path):
        self.modules: dict[str, _Module] = {}
        for path in sorted(models_dir.glob("*.py")):  # pkgutil.iter_modules: modules, not packages
            try:
                tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            except (SyntaxError, UnicodeDecodeError, OSError):
                continue  # SGLang skips a module that does not import, too
            self.modules[path.stem] = _Module(path.stem, tree)

    def resolve(self, module: str, name: str, depth: int = 0) -> tuple[str, str] | None:
        """(module, class) where `name` as seen in `module` is defined, within sglang/srt/models."""
        m = self.modules.get(module)
        if m is None or depth > 20:
            return None
        if name in m.classes:
            return module, name
        if name in m.imports:
            src, there = m.imports[name]
            if src.startswith("sglang.srt.models."):
                return self.resolve(src.rsplit(".", 1)[1], there, depth + 1)
        return None

    def has_method(self, module: str, cls: str, method: str, depth: int = 0) -> bool:
        bases, methods = self.modules[module].classes[cls]
        if method in methods:
            return True
        for b in bases:
            found = None
            if isinstance(b, ast.Name):
                found = self.resolve(module, b.id)
            elif isinstance(b, ast.Attribute) and isinstance(b.value, ast.Name):  # llama.LlamaForCausalLM
                src = self.modules[module].imports.get(b.value.id)
                if src and src[0] == "sglang.srt.models":
                    found = self.resolve(src[1], b.attr)
            if found and depth < 20 and self.has_method(*found, method, depth + 1):
                return True
        return False


def scan(sglang_dir: Path | str, version: str) -> dict:
    """The registry facts of the SGLang source tree at `sglang_dir` (the `sglang` package)."""
    index = _Index(Path(sglang_dir) / "srt" / "models")
    registered: dict[str, tuple[str, str]] = {}  # architecture -> (module, class)
    for m in index.modules.values():
        for name in m.entry:
            where = index.resolve(m.name, name)
            if where:
                registered[where[1]] = where  # the registry keys by the class's own __name__
    def having(hook):
        return sorted(a for a, where in registered.items() if index.has_method(*where, hook))
    drafters = {a for a, (mod, _) in registered.items() if mod == "dflash" or mod.endswith(DRAFTER_SUFFIXES)}
    return {
        "sglang": version,
        "source": "EntryClass of sglang/srt/models/*.py (models/registry.py), read by "
                  "python -m dflashctl.host.sglang_models",
        "architectures": sorted(registered),
        "dflash_drafters": sorted(a for a in drafters if registered[a][0] == "dflash"),
        "eagle3_drafters": sorted(a for a in drafters if registered[a][0].endswith("_eagle3")),
        "drafters": sorted(drafters),
        "dflash_targets": [a for a in having(DFLASH_HOOK) if a not in drafters],
        "eagle3_targets": [a for a in having(EAGLE3_HOOK) if a not in drafters],
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("sglang_dir", help="the installed `sglang` package directory (site-packages/sglang)")
    p.add_argument("--version", required=True, help="the SGLang version that directory holds")
    a = p.parse_args(argv)
    if not (Path(a.sglang_dir) / "srt" / "models").is_dir():
        print(f"{a.sglang_dir} has no srt/models/: pass the `sglang` package directory", file=sys.stderr)
        return 2
    print(json.dumps(scan(a.sglang_dir, a.version), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
