# `nix develop`: the locked stack, dflashctl from the working tree (editable through
# PYTHONPATH), pytest, uv and the Nix formatter.
{
  lib,
  mkShell,
  writeShellScriptBin,
  dflashPython,
  dflashPythonPackages,
  dflashStack,
  dflashHostCompiler,
  uv,
  nixfmt,
  git,
}:
let
  python = dflashPython;
  # pytest from nixpkgs, its dependencies swapped for the locked wheels of the same name, so
  # the environment holds one `packaging` (the lock's), not two.
  preferLocked = map (dep: dflashPythonPackages.${dep.pname or ""} or dep);
  pytest = python.pkgs.pytest.overridePythonAttrs (old: {
    dependencies = preferLocked (old.dependencies or [ ]);
  });
  devPython = python.buildEnv.override { extraLibs = dflashStack ++ [ pytest ]; };
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
  '';
}
