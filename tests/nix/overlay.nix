# overlays/default.nix applied to a stand-in nixpkgs (callPackage, buildPythonPackage returning
# its arguments, buildEnv listing what it gets) over the fixture lock: what dflash-env and the
# dev shell hold, each package's meta.license, and the refusal a host that allows no unfree
# package gets (`--arg config '{ }'` evaluates the stack under that nixpkgs config instead).
{
  config ? null,
}:
let
  stubLib = import ./stub-nixpkgs/lib.nix;
  lib = stubLib // {
    licenses = {
      nvidiaCudaRedist = {
        shortName = "CUDA EULA";
        free = false;
      };
      unfree = {
        shortName = "unfree";
        free = false;
      };
    };
    getLicenseFromSpdxIdOr =
      id: default:
      {
        MIT.shortName = "mit";
        BSD-3-Clause.shortName = "bsd3";
      }
      .${id} or default;
  };
  pkgsWith =
    config:
    let
      overlay = import ../../overlays { lockFile = ../data/nix/lock.json; };
      final = base // overlay final base;
      base = {
        inherit lib config;
        stdenv.hostPlatform.system = "x86_64-linux";
        stdenv.cc = {
          cc.lib = "libstdc++";
          outPath = "/stub/cc";
        };
        numactl = "numactl";
        zlib = "zlib";
        autoPatchelfHook = "autoPatchelfHook";
        autoAddDriverRunpath = "autoAddDriverRunpath";
        addDriverRunpath.driverLink = "/run/opengl-driver";
        fetchPypi = args: "fetchPypi ${args.pname}";
        mkShell = args: args;
        writeShellScriptBin = name: _: name;
        uv = "uv";
        nixfmt = "nixfmt";
        git = "git";
        runCommand =
          name: _: _:
          "/stub/${name}";
        callPackage =
          fn: args:
          let
            f = import fn;
          in
          f (builtins.intersectAttrs (builtins.functionArgs f) final // args);
        python312 = {
          sitePackages = "lib/python3.12/site-packages";
          pkgs = {
            buildPythonPackage = args: args;
            requiredPythonModules = deps: deps;
            wheelUnpackHook = "wheelUnpackHook";
            pypaInstallHook = "pypaInstallHook";
            setuptools = "setuptools";
          };
          buildEnv.override = args: {
            extraLibs = map (p: p.pname) args.extraLibs;
            overrideAttrs = f: { inherit (args) extraLibs; } // f { outPath = "/stub/env"; };
          };
        };
      };
    in
    final;
  allowedNames = [ "nvidia-cuda-runtime" ];
  pkgs = pkgsWith { allowUnfreePredicate = p: builtins.elem p.pname allowedNames; };
  refusedPkgs = pkgsWith { };
  tried = builtins.tryEval (builtins.deepSeq refusedPkgs.dflashStack true);
in
if config != null then
  map (p: p.pname) (pkgsWith config).dflashStack
else
  {
    stack = map (p: p.pname) pkgs.dflashStack;
    devStack = map (p: p.pname) pkgs.dflashDevStack;
    envLibs = map (p: p.pname or p) pkgs.dflash-env.extraLibs;
    # Its byte-code test: doctor's check on the environment's own Python (not a flake check).
    envTests = builtins.attrNames pkgs.dflash-env.passthru.tests;
    # The router's environment from its own lock (nix/router-lock.json, x86_64-linux).
    routerEnvLibs = map (p: p.pname or p) pkgs.dflash-router-env.extraLibs;
    # nix/dev-shell.nix: its Python environment is the first of the shell's packages.
    devShellLibs = (builtins.head (pkgs.callPackage ../../nix/dev-shell.nix { }).packages).extraLibs;
    unfree = pkgs.dflashUnfreePackages;
    licenses = builtins.mapAttrs (_: p: p.meta.license) pkgs.dflashPythonPackages;
    refusedWithoutAllowUnfree = !tried.success;
    allowedWithAllowUnfree = builtins.length (pkgsWith { allowUnfree = true; }).dflashStack;
  }
