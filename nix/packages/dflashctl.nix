# dflashctl from ./python (setuptools pyproject); its one run-time dependency, packaging,
# is the locked wheel when the lock has it, so the environment holds one packaging.
# It carries the lock the environment is built from (python/setup.py copies $DFLASHCTL_LOCK into
# the package), so `dflashctl doctor` compares the host with it from any directory.
{
  lib,
  python,
  packaging,
  lockFile,
}:
python.pkgs.buildPythonPackage {
  pname = "dflashctl";
  version = "0.1.0";
  pyproject = true;
  src = lib.cleanSource ../../python;
  build-system = [ python.pkgs.setuptools ];
  dependencies = [ packaging ];
  env.DFLASHCTL_LOCK = "${lockFile}";
  pythonImportsCheck = [ "dflashctl" ];
  postInstall = ''
    cmp ${lockFile} $out/${python.sitePackages}/dflashctl/lock/data/python-lock.json
  '';
  meta = {
    description = "Lock helper, host doctor, service supervisor and smoke test for the pinned SGLang + DFlash stack";
    mainProgram = "dflashctl";
  };
}
