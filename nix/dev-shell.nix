# `nix develop`: the locked stack plus its dev group (pytest, locked in nix/stack.toml with the
# stack, so one `packaging` and nothing borrowed from nixpkgs' Python set), dflashctl from the
# working tree (editable through PYTHONPATH), the pinned host compiler, the prebuilt SGLang kernels
# (DFLASH_PREBUILT_KERNELS), uv and the Nix formatter.
{
  mkShell,
  writeShellScriptBin,
  dflashPython,
  dflashDevStack,
  dflashHostCompiler,
  dflash-kernels,
  uv,
  nixfmt,
  git,
}:
let
  devPython = dflashPython.buildEnv.override { extraLibs = dflashDevStack; };
  # `dflashctl` runs the working tree's code with the shell's Python.
  dflashctl = writeShellScriptBin "dflashctl" ''exec python -m dflashctl "$@"'';
in
mkShell {
  packages = [
    devPython
    dflashctl
    dflashHostCompiler # gcc/c++ for SGLang's JIT kernels, the one nvcc 13.0 accepts
    uv
    nixfmt
    git
  ];
  shellHook = ''
    root=$(git rev-parse --show-toplevel 2>/dev/null || pwd)
    export PYTHONPATH="$root/python''${PYTHONPATH:+:$PYTHONPATH}"
    # read-only prebuilt SGLang kernels; set it empty to measure a first start that compiles
    export DFLASH_PREBUILT_KERNELS=''${DFLASH_PREBUILT_KERNELS-${dflash-kernels}}
  '';
}
