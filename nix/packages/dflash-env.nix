# The Python environment a host runs: every locked wheel of this system plus dflashctl.
# tests.bytecode: its big packages import from byte code, never compiled at each start (their store
# paths are read-only): doctor's bytecode check on the environment's own Python. It needs the whole
# stack, so it is a test of this package (built where the stack is built: the workflow's build-env
# job, `nix build .#dflash-env.tests.bytecode`), not a flake check.
{
  python,
  stack,
  dflashctl,
  runCommand,
  extraLibs ? [ ],
}:
let
  env =
    (python.buildEnv.override { extraLibs = stack ++ [ dflashctl ] ++ extraLibs; }).overrideAttrs
      (old: {
        name = "dflash-env";
        meta = (old.meta or { }) // {
          description = "Python 3.12 with the locked SGLang + DFlash stack and dflashctl";
          mainProgram = "dflashctl";
        };
        passthru = (old.passthru or { }) // {
          tests.bytecode = runCommand "dflash-env-bytecode" { } ''
            ${env}/bin/python3 ${../check-bytecode.py}
            touch $out
          '';
        };
      });
in
env
