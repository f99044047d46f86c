# overlays/build-wheel.nix and the sglang fix-up called with stand-ins for nixpkgs (strings for
# packages and hooks, buildPythonPackage returning its arguments): what every locked wheel hands
# to buildPythonPackage, and what each form of `sglangSrc` changes.
let
  nixLib = import ../../nix/lib;
  lib = import ./stub-nixpkgs/lib.nix;
  packages = nixLib.lock.packagesFor (nixLib.lock.read ../data/nix/lock.json) "x86_64-linux";
  python = {
    sitePackages = "lib/python3.12/site-packages";
    interpreter = "python3.12";
    pkgs = {
      buildPythonPackage = args: args;
      requiredPythonModules = deps: deps;
      wheelUnpackHook = "wheelUnpackHook";
      pypaInstallHook = "pypaInstallHook";
      setuptools = "setuptools";
      setuptools-scm = "setuptools-scm";
      setuptools-rust = "setuptools-rust";
      wheel = "wheel";
    };
  };
  buildWheel = import ../../overlays/build-wheel.nix {
    inherit lib python;
    fetchPypi = args: "fetchPypi ${args.pname}-${args.version}";
    stdenv.cc.cc.lib = "libstdc++";
    zlib = "zlib";
    autoPatchelfHook = "autoPatchelfHook";
    autoAddDriverRunpath = "autoAddDriverRunpath";
  };
  sglang =
    sglangSrc:
    buildWheel {
      entry = packages.sglang-kernel // {
        name = "sglang";
      };
      dependencies = [ "/store/torch" ];
      fixup = import ../../overlays/fixups/sglang.nix {
        inherit lib python;
        # The lock's packages a tree's build requirements may come from (the fixture lock has no
        # setuptools; the real lock's is setuptools 81.0.0).
        packages.setuptools = "locked setuptools";
        options = {
          sglangPatches = [ ];
          sglangPatchFlags = [ "-p2" ];
          inherit sglangSrc;
        };
      };
    };
  # What the tests look at; paths become base names (fixtures are not copied into the store).
  show = args: {
    inherit (args)
      pname
      version
      nativeBuildInputs
      preFixup
      ;
    src = baseNameOf (toString args.src);
    format = args.format or null;
    pyproject = args.pyproject or null;
    postPhases = args.postPhases or null;
    postUnpack = args.postUnpack or null;
    postPatch = args.postPatch or null;
    build-system = args.build-system or null;
    env = args.env or null;
    pythonRelaxDeps = args.pythonRelaxDeps or null;
  };
in
{
  torch = show (buildWheel {
    entry = packages.torch;
    dependencies = [ "/store/triton" ];
  });
  sglang = {
    locked = show (sglang null);
    wheelFile = show (
      sglang ../data/nix/sglang-tree/sglang-0.5.12.dev1-cp312-cp312-manylinux_2_34_x86_64.whl
    );
    fetchedWheel = show (sglang {
      name = "sglang-0.5.12-cp312-cp312-manylinux_2_34_x86_64.whl";
      outPath = "/store/0000-sglang-0.5.12-cp312-cp312-manylinux_2_34_x86_64.whl";
    });
    sourceTree = show (sglang ../data/nix/sglang-tree);
  };
}
