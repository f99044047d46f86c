# dflashctl from ./python (setuptools pyproject); its one run-time dependency, packaging,
# is the locked wheel when the lock has it, so the environment holds one packaging.
{
  lib,
  python,
  packaging,
}:
python.pkgs.buildPythonPackage {
  pname = "dflashctl";
  version = "0.1.0";
  pyproject = true;
  src = lib.cleanSource ../../python;
  build-system = [ python.pkgs.setuptools ];
  dependencies = [ packaging ];
  pythonImportsCheck = [ "dflashctl" ];
  meta = {
    description = "Lock helper, host doctor, service supervisor and smoke test for the pinned SGLang + DFlash stack";
    mainProgram = "dflashctl";
  };
}
