# The overlay: every wheel in nix/python-lock.json for this system becomes a Python 3.12
# package (overlays/build-wheel.nix), fixed up by overlays/fixups/<name>.nix where one exists.
#
#   overlays.default = import ./overlays { };
#   dflash.lib.mkOverlay { sglangPatches = [ ./ddtree.patch ]; }   # a patched SGLang
{
  # The lock to build; another lock gives another stack with the same rules.
  lockFile ? ../nix/python-lock.json,
  # The router's own lock (SGLang's router: no torch, no CUDA), built by the same rules.
  routerLockFile ? ../nix/router-lock.json,
  # Directory of per-package fix-ups, one file per canonical package name.
  fixupsDir ? ./fixups,
  # Patches applied to the installed sglang package (paths inside the wheel are sglang/...;
  # upstream's are python/sglang/..., hence -p2 for patches made in the upstream repo).
  sglangPatches ? [ ],
  sglangPatchFlags ? [ "-p2" ],
  # Another SGLang to build instead of the locked wheel: a source tree of the upstream repo
  # (its python/ directory is built with its pyproject) or a wheel file.
  sglangSrc ? null,
}:
final: prev:
let
  nixLib = import ../nix/lib;
  inherit (final) lib;
  system = final.stdenv.hostPlatform.system;
  lock = nixLib.lock.read lockFile;
  locked = nixLib.lock.packagesFor lock system;
  python = final.python312;

  # A lock whose dependencies a package set can be built from, or why not.
  consistent =
    locked:
    let
      cyclic = nixLib.graph.cyclic locked;
      missing = nixLib.graph.missingDependencies locked;
    in
    if cyclic != [ ] then
      throw "dflash: the lock's dependencies form a cycle through ${lib.concatStringsSep ", " cyclic}; buildPythonPackage cannot build a cycle"
    else if missing != { } then
      throw "dflash: the lock names dependencies it does not contain: ${builtins.toJSON missing}; run `dflashctl lock`"
    else
      true;

  fixupFiles = nixLib.fixups.discover fixupsDir;
  buildWheel = final.callPackage ./build-wheel.nix { inherit python; };

  # One package per locked wheel. makeExtensible: users can `.extend` the set (replace one
  # package) before the env is built.
  packageSet =
    locked:
    lib.makeExtensible (
      self:
      builtins.mapAttrs (
        name: entry:
        assert consistent locked;
        buildWheel {
          inherit entry;
          dependencies = map (dep: self.${dep}) entry.dependencies;
          fixup =
            if fixupFiles ? ${name} then
              import fixupFiles.${name} {
                pkgs = final;
                inherit lib python;
                packages = self;
                driverLink = final.addDriverRunpath.driverLink;
                options = { inherit sglangPatches sglangPatchFlags sglangSrc; };
              }
            else
              (_: { });
        }
      ) locked
    );
  packages = packageSet locked;
  # Without the dev group: what a host runs.
  hostNames = locked: builtins.filter (name: !locked.${name}.dev) (builtins.attrNames locked);
  routerLocked = nixLib.lock.packagesFor (nixLib.lock.read routerLockFile) system;
  routerPackages = packageSet routerLocked;
  names = builtins.attrNames locked;
  # The host's stack leaves out what only the dev group needs; the dev shell has everything.
  stack = map (name: packages.${name}) (hostNames locked);
  devStack = map (name: packages.${name}) names;

  # nixpkgs refuses an unfree package one at a time; name them all at once instead.
  unfree = nixLib.license.unfreeNames locked;
  allowed =
    name:
    final.config.allowUnfree or false
    || (final.config.allowUnfreePredicate or (_: false)) packages.${name}
    || builtins.getEnv "NIXPKGS_ALLOW_UNFREE" == "1";
  refused = builtins.filter (name: !allowed name) unfree;
  licensed = v: if refused == [ ] then v else throw (nixLib.license.refusal refused);
in
{
  dflashPython = python;
  # The host compiler SGLang's JIT (nvcc, tvm-ffi's c++) and triton's launchers run: CUDA 13.0's
  # crt/host_config.h refuses GCC newer than 15, so it is pinned here, not nixpkgs' default gcc.
  # The smoke app, the dev shell and the NixOS module all put this one on PATH.
  dflashHostCompiler = final.gcc14;
  dflashPythonPackages = packages;
  dflashStack = licensed stack;
  dflashDevStack = licensed devStack;
  dflashUnfreePackages = unfree;
  dflashctl = final.callPackage ../nix/packages/dflashctl.nix {
    inherit python lockFile;
    packaging = packages.packaging or python.pkgs.packaging;
  };
  dflash-env = final.callPackage ../nix/packages/dflash-env.nix {
    inherit python;
    inherit (final) dflashctl;
    stack = final.dflashStack;
  };
  # SGLang's JIT kernels built ahead (no GPU), e.g.
  # dflash-kernels.override { cudaArchs = [ "sm120" ]; modelConfigs = [ ./qwen3-8b-config.json ]; }
  dflash-kernels = final.callPackage ../nix/packages/dflash-kernels.nix { };
  # SGLang's router in its own environment (services.dflash.router; no torch, no CUDA).
  dflashRouterPackages = routerPackages;
  dflash-router-env =
    (python.buildEnv.override {
      extraLibs = map (name: routerPackages.${name}) (hostNames routerLocked);
    }).overrideAttrs
      (old: {
        name = "dflash-router-env";
        meta = (old.meta or { }) // {
          description = "Python 3.12 with the locked sglang-router, in front of a host's DFlash instances";
        };
      });
}
