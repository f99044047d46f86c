# nix/lib/unit-text.nix over the hostile values in a JSON file (tests/service/test_unit_text.py compares the
# result with Python's unit_text and with the golden file).
#   nix-instantiate --eval --strict --json tests/data/service/unit-text.nix --argstr valuesFile v.json
{ valuesFile }:
let
  u = import ../../../nix/lib/unit-text.nix;
  data = builtins.fromJSON (
    builtins.readFile ../../../python/dflashctl/service/data/service-unit.json
  );
  rules = data.cacheDir;
  values = builtins.fromJSON (builtins.readFile valuesFile);
  one = v: {
    specifiers = u.specifiers v;
    execArg = u.execArg v;
    pathWord = u.pathWord v;
    controlProblem = u.controlProblem v;
    execPathProblem = u.execPathProblem v;
    execPath = if u.execPathProblem v == null then u.execPath v else null;
    cacheDirProblem = u.cacheDirProblem rules data.hidden v;
    cacheDynamic =
      if u.cacheDirProblem rules data.hidden v == null then u.cacheDirDirectives rules v false else null;
    cacheStatic =
      if u.cacheDirProblem rules data.hidden v == null then u.cacheDirDirectives rules v true else null;
    tmpfiles = u.tmpfilesLine rules v "dflash" "dflash";
    unitPathProblem = u.unitPathProblem data.hidden v;
  };
in
map one values
