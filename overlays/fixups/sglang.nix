# SGLang from the lock, patched, or swapped: overlay arguments sglangPatches, sglangPatchFlags
# and sglangSrc (docs/nix.md shows DDTree as the example). The locked wheel also gets two imports
# that a server never uses made lazy (lazyIPython and lazyFrontend below), and its two idle seconds
# of readiness cut to 50 ms steps (promptReadiness).
{
  lib,
  python,
  options,
  packages,
  ...
}:
let
  inherit (options) sglangPatches sglangPatchFlags sglangSrc;
  nixLib = import ../../nix/lib;
  # A derivation (fetchurl) names its file in `name`; a path is its own name.
  srcName = if sglangSrc ? name then sglangSrc.name else baseNameOf (toString sglangSrc);
  isWheel = sglangSrc != null && lib.hasSuffix ".whl" srcName;
  isTree = sglangSrc != null && !isWheel;
  # Reading a fetched tree's pyproject.toml imports from a derivation (allowed by default).
  tree = nixLib.pyproject.read "${sglangSrc}/python/pyproject.toml";
  # The locked wheel's sglang/utils.py imports IPython at module level for one notebook helper,
  # print_highlight, that a server never calls; that import brings IPython, prompt_toolkit and
  # jedi (about 630 modules, ~4 % of each server process's imports on the H200) into every
  # process of every instance (docs/benchmarks.md, "the first import"). The import moves into
  # the helper, which behaves as before. `dflashctl audit` checks both texts against the locked
  # wheel; another SGLang (sglangSrc) is left as it is, and after sglangPatches (which may have
  # moved the line) a missing text only warns.
  replace = if sglangPatches == [ ] then "--replace-fail" else "--replace-warn";
  # What to compile again: what the patches may have touched, or the edited files.
  editedFiles = "sglang/utils.py sglang/__init__.py sglang/srt/entrypoints/http_server.py";
  edited = if sglangPatches != [ ] then "sglang" else editedFiles;
  lazyIPython = lib.optionalString (sglangSrc == null) ''
    substituteInPlace $out/${python.sitePackages}/sglang/utils.py ${replace} '
    from IPython.display import HTML, display
    ' '
    '
    substituteInPlace $out/${python.sitePackages}/sglang/utils.py ${replace} '
    def print_highlight(html_content: str):
    ' '
    def print_highlight(html_content: str):
        from IPython.display import HTML, display  # dflash fix-up: imported where it is used
    '
  '';
  # The package's __init__ imports the frontend language (sglang.lang: gen, select, Runtime,
  # RuntimeEndpoint, ...) for programs written with it; no module of sglang.srt uses it, yet
  # every server process paid for it (aiohttp and about 90 modules; with the torchao fix-up of
  # transformers.nix, ~0.6 s of a 4.9 s `import sglang.launch_server` on the 2-core development
  # machine). Those names now resolve at their first use (a module __getattr__, PEP 562) to the
  # same objects: `sgl.gen`, `from sglang import gen` and `import *` behave as before.
  # Engine stays the package's own LazyImport, defined after this block as before.
  lazyFrontend = lib.optionalString (sglangSrc == null) ''
    substituteInPlace $out/${python.sitePackages}/sglang/__init__.py ${replace} '
    from sglang.lang.api import (
        Engine,
        Runtime,
        assistant,
        assistant_begin,
        assistant_end,
        flush_cache,
        function,
        gen,
        gen_int,
        gen_string,
        get_server_info,
        image,
        select,
        separate_reasoning,
        set_default_backend,
        system,
        system_begin,
        system_end,
        user,
        user_begin,
        user_end,
        video,
    )
    from sglang.lang.backend.runtime_endpoint import RuntimeEndpoint
    from sglang.lang.choices import (
        greedy_token_selection,
        token_length_normalized,
        unconditional_likelihood_normalized,
    )
    ' '
    # dflash fix-up: the frontend language is imported where a program first uses one of its names
    _FRONTEND_MODULES = {
        "sglang.lang.api": (
            "Runtime", "assistant", "assistant_begin", "assistant_end", "flush_cache", "function",
            "gen", "gen_int", "gen_string", "get_server_info", "image", "select", "separate_reasoning",
            "set_default_backend", "system", "system_begin", "system_end", "user", "user_begin",
            "user_end", "video",
        ),
        "sglang.lang.backend.runtime_endpoint": ("RuntimeEndpoint",),
        "sglang.lang.choices": (
            "greedy_token_selection", "token_length_normalized", "unconditional_likelihood_normalized",
        ),
    }
    _FRONTEND = {name: module for module, names in _FRONTEND_MODULES.items() for name in names}


    def __getattr__(name):
        import importlib

        if name == "lang":
            return importlib.import_module("sglang.lang")
        if name not in _FRONTEND:
            raise AttributeError(f"sglang has no attribute {name!r}")
        value = getattr(importlib.import_module(_FRONTEND[name]), name)
        globals()[name] = value
        return value
    '
  '';
  # Two waits in srt/entrypoints/http_server.py that sleep a whole second before they look, each
  # paid by every start and every instance a rollout puts back (docs/benchmarks.md, issue 44):
  # - /health and /health_generate (one handler; what the router polls before it admits a worker
  #   and every healthCheckIntervalSec after) send the scheduler a one-token request, then sleep
  #   1 s before they look for its answer, so no 200 comes sooner than a second: the router's
  #   admission of a restarted instance took 1.26 s. The handler now looks every 50 ms: the same
  #   answer (200 once anything came back from the scheduler since the request, 503 after
  #   SGLANG_HEALTH_CHECK_TIMEOUT), as soon as it is known.
  # - the warm-up thread, started before the HTTP server listens, sleeps 1 s before each try of
  #   /model_info (120 tries), so SGLang's own warm-up request, and its "fired up" line, come about
  #   a second after the server listens. It now tries every 50 ms until the same 120 s have passed
  #   (a /model_info that hangs each try for its 5 s timeout ends the wait at about 125 s, not 120
  #   tries of 6 s).
  promptReadiness = lib.optionalString (sglangSrc == null) ''
    substituteInPlace $out/${python.sitePackages}/sglang/srt/entrypoints/http_server.py ${replace} '
            await asyncio.sleep(1)
    ' '
            await asyncio.sleep(0.05)  # dflash fix-up: looks for the answer every 50 ms, not after 1 s
    '
    substituteInPlace $out/${python.sitePackages}/sglang/srt/entrypoints/http_server.py ${replace} '
        for _ in range(120):
            time.sleep(1)
    ' '
        deadline = time.monotonic() + 120  # dflash fix-up: the same 120 s, tried every 50 ms
        while time.monotonic() < deadline:
            time.sleep(0.05)
    '
  '';
  # The locked wheel's own edits, in this order, after any sglangPatches.
  edits = lazyIPython + lazyFrontend + promptReadiness;
in
prev:
lib.optionalAttrs isWheel {
  # Another sglang wheel (e.g. built from an upstream pull request with `uv build --wheel
  # python/`); it keeps the lock's dependencies. Its version comes from its file name.
  src = sglangSrc;
  version = (nixLib.wheel.parts srcName).version;
}
// lib.optionalAttrs isTree (
  let
    version = if tree.version != null then tree.version else prev.version;
  in
  {
    # A checkout of the upstream repository: its python/ directory is built with its own
    # pyproject (PEP 517: pypaBuildHook, `python -m build --no-isolation`), keeping the lock's
    # dependencies.
    src = sglangSrc;
    pyproject = true;
    inherit version;
    postUnpack = (prev.postUnpack or "") + ''
      sourceRoot=$sourceRoot/python
    '';
    # A dynamic version (0.5.11: setuptools-scm) cannot be read from a fetched tree, which has no
    # .git: setuptools-scm is given the lock's version, so the wheel, sglang.__version__ and
    # the derivation agree (without it, 0.5.11 builds as its fallback 0.0.0.dev0).
    env =
      (prev.env or { })
      // lib.optionalAttrs (tree.version == null) {
        SETUPTOOLS_SCM_PRETEND_VERSION = version;
      };
    # The build requirements the tree names, the lock's where it has them (setuptools), nixpkgs'
    # otherwise (setuptools-scm, setuptools-rust, wheel); `build` checks their pins.
    build-system = map (name: packages.${name} or python.pkgs.${name}) tree.buildSystem;
    # The runtime-dependency check (pythonRuntimeDepsCheckHook) holds the built wheel's
    # Requires-Dist to the installed versions. The installed ones are the lock's, on purpose: the
    # stack is pinned in nix/stack.toml, and a patched tree that pins other versions (later SGLang
    # requires xgrammar 0.2) gets the lock's anyway. Relaxed, the check still fails for a
    # requirement the lock does not have at all, which is what it can usefully say here.
    pythonRelaxDeps = true;
    # 0.5.11's pyproject also builds a Rust extension (sglang.srt.grpc._core, setuptools-rust)
    # that nothing in 0.5.11 imports; its crate comes without a Cargo.lock, so the build
    # sandbox could not fetch its crates. It is left out of the build.
    postPatch =
      (prev.postPatch or "")
      + lib.optionalString (tree.rustExtensions != [ ]) ''
        echo "sglang: leaving out the Rust extension(s) ${toString tree.rustExtensions} (no Cargo.lock)"
        ${python.interpreter} -c '
        import re
        text = open("pyproject.toml").read()
        kept = re.sub(r"(?ms)^\[\[tool\.setuptools-rust\.ext-modules\]\]\n.*?(?=^\[|\Z)", "", text)
        open("pyproject.toml", "w").write(kept)
        '
      '';
    # pyproject = true brings the PEP 517 build and install hooks; the wheel's unpack hook
    # would copy the tree as if it were a wheel file.
    nativeBuildInputs = lib.remove python.pkgs.wheelUnpackHook (
      lib.remove python.pkgs.pypaInstallHook prev.nativeBuildInputs
    );
  }
)
// lib.optionalAttrs (sglangPatches != [ ] || edits != "") {
  # A wheel has no source tree to patch, so the installed files are patched; upstream patches
  # say a/python/sglang/..., installed files are sglang/..., hence the default -p2. The patches
  # go first (they are made against upstream's text), then the import fix-ups (lazyIPython,
  # lazyFrontend) and promptReadiness.
  postInstall =
    (prev.postInstall or "")
    + lib.optionalString (sglangPatches != [ ]) ''
      pushd $out/${python.sitePackages} >/dev/null
      for p in ${lib.escapeShellArgs (map (p: "${p}") sglangPatches)}; do
        echo "applying $p to sglang"
        patch ${lib.escapeShellArgs sglangPatchFlags} --forward --batch < "$p"
      done
      popd >/dev/null
    ''
    + edits
    + ''
      # Byte code compiled before these edits would be stale; rebuild it from the edited files.
      pushd $out/${python.sitePackages} >/dev/null
      ${python.interpreter} -m compileall -q -f --invalidation-mode checked-hash ${edited} >/dev/null
      popd >/dev/null
    '';
}
