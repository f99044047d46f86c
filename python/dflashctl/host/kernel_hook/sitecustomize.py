"""Python imports this at start-up because dflashctl put its directory first on PYTHONPATH.

It installs the prebuilt-kernel hook (dflash_kernel_hook.py: `install` patches what this process's
settings ask for, nothing when none do), runs the interpreter's own sitecustomize, which this file
shadows (nixpkgs' Python has one: it reads NIX_PYTHONPATH), then starts the template SGLang's
children fork from (dflash_faststart.py: only in the instance's server process, only with
$DFLASH_FASTSTART). The template comes after the interpreter's own start-up: an image's
sitecustomize may change what the loader reads at exec (LD_LIBRARY_PATH, say), and
the template must start from the environment the server's children would be spawned with.
"""
import importlib.machinery
import importlib.util
import os
import sys

_here = os.path.dirname(os.path.abspath(__file__))

try:
    import dflash_kernel_hook
    dflash_kernel_hook.install()
except Exception as e:  # never stop SGLang: without the hook it compiles as it always did
    print(f"[dflash kernels] hook not installed ({type(e).__name__}: {e}); SGLang compiles its "
          "kernels itself", file=sys.stderr)


def _run_the_shadowed_one() -> None:
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != _here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


_run_the_shadowed_one()

try:
    import dflash_faststart
    dflash_faststart.install()
except Exception as e:  # never stop SGLang: without the template it spawns its children as always
    print(f"[dflash faststart] off ({type(e).__name__}: {e}); SGLang spawns its children as before",
          file=sys.stderr)
