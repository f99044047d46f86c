# The Python environment a host runs: every locked wheel of this system plus dflashctl.
{
  python,
  stack,
  dflashctl,
  extraLibs ? [ ],
}:
let
  env = python.buildEnv.override { extraLibs = stack ++ [ dflashctl ] ++ extraLibs; };
in
env.overrideAttrs (old: {
  name = "dflash-env";
  meta = (old.meta or { }) // {
    description = "Python 3.12 with the locked SGLang + DFlash stack and dflashctl";
    mainProgram = "dflashctl";
  };
})
