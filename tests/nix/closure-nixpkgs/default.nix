# A stand-in for nixpkgs (`import nixpkgs { system; config; overlays; }`) whose packages are
# derivations that are never built: each names, as its inputs, every derivation its arguments
# mention (build inputs, dependencies, the text of its scripts), so `nix-store --query --requisites`
# on a check's .drv lists what a real build of it would need. The flake's overlay is applied for
# real (every locked wheel a buildPythonPackage over a fetchPypi derivation named after its file;
# dflash-env, dflashctl, dflash-kernels, the router's environment from nix/packages/), over a base
# like nix/audit.nix's; testers.runNixOSTest evaluates each node with tests/nix/harness/nixos-lite.nix.
# tests/nix/test_nix_checks.py reads the checks' closures through it (tests/nix/harness/checks-closure.nix).
{
  system,
  config ? { },
  overlays ? [ ],
}:
let
  inherit (builtins)
    attrNames
    concatMap
    concatStringsSep
    isAttrs
    isFunction
    isList
    isPath
    isString
    removeAttrs
    ;

  # Every string an argument holds, derivations as their output paths: the inputs of a stand-in.
  mentioned =
    v:
    if isString v then
      [ v ]
    else if isPath v then
      [ (toString v) ] # a path's name only: nothing of it is copied into the store
    else if isList v then
      concatMap mentioned v
    else if isAttrs v && v.type or null == "derivation" then
      [ "${v}" ]
    else if isAttrs v then
      concatMap (n: mentioned v.${n}) (
        attrNames (
          removeAttrs v [
            "passthru"
            "meta"
          ]
        )
      )
    else
      [ ];
  # A package: `attrs` are its arguments (name, inputs, scripts, passthru).
  package =
    attrs:
    let
      drv = derivation {
        inherit (attrs) name;
        inherit system;
        builder = "/bin/sh";
        args = [
          "-c"
          "echo 'a stand-in of tests/nix/closure-nixpkgs: never built' >&2; exit 1"
        ];
        inputs = concatStringsSep " " (mentioned (removeAttrs attrs [ "name" ]));
      };
    in
    drv
    // (attrs.passthru or { })
    // {
      inherit (attrs) name;
      meta = attrs.meta or { };
      overrideAttrs = f: package (attrs // (if isFunction f then f attrs else f));
      override = more: package (attrs // more);
    };
  named = name: package { inherit name; };

  lib = import ../../../nix/stand-in-lib.nix // {
    concatStringsSep = builtins.concatStringsSep;
    concatMapStringsSep =
      sep: f: list:
      concatStringsSep sep (map f list);
    hasInfix = infix: s: builtins.match ".*${infix}.*" s != null;
    cleanSource = src: src;
  };

  pythonPackages = python: {
    buildPythonPackage =
      args:
      package {
        name = "python3.12-${args.pname}-${args.version}";
        inherit (args) pname version;
        arguments = removeAttrs args [
          "passthru"
          "meta"
        ];
        passthru = (args.passthru or { }) // {
          inherit (args) pname version;
          dependencies = args.dependencies or [ ];
        };
      };
    # nixpkgs follows propagated Python dependencies; here, each package's `dependencies`.
    requiredPythonModules =
      deps:
      map (x: x.package) (
        builtins.genericClosure {
          startSet = map (p: {
            key = p.name;
            package = p;
          }) deps;
          operator =
            x:
            map (p: {
              key = p.name;
              package = p;
            }) (x.package.dependencies or [ ]);
        }
      );
    wheelUnpackHook = named "wheel-unpack-hook";
    pypaInstallHook = named "pypa-install-hook";
    # nixpkgs' own Python packages the checks and the VM test use.
    setuptools = named "python3.12-setuptools";
    wheel = named "python3.12-wheel";
    packaging = named "python3.12-packaging";
    pytest = named "python3.12-pytest";
    tokenizers = named "python3.12-tokenizers";
    openai = named "python3.12-openai";
    numpy = named "python3.12-numpy";
  };
  python312 =
    let
      self = named "python3-3.12" // {
        sitePackages = "lib/python3.12/site-packages";
        interpreter = "${named "python3-3.12"}/bin/python3.12";
        pkgs = pythonPackages self;
        withPackages =
          f:
          package {
            name = "python3-3.12-env";
            paths = f self.pkgs;
          };
        buildEnv.override =
          { extraLibs }:
          package {
            name = "python3-3.12-env";
            paths = extraLibs;
          };
      };
    in
    self;

  base = {
    inherit lib config python312;
    python3 = python312;
    stdenv.hostPlatform.system = system;
    stdenv.cc = named "gcc-wrapper" // {
      cc.lib = named "gcc-lib";
    };
    gcc14 = named "gcc-wrapper-14";
    zlib = named "zlib";
    numactl = named "numactl";
    rdma-core = named "rdma-core";
    ffmpeg = named "ffmpeg";
    git = named "git";
    curl = named "curl";
    nixfmt = named "nixfmt";
    nixfmt-tree = named "nixfmt-tree";
    autoPatchelfHook = named "auto-patchelf-hook";
    autoAddDriverRunpath = named "auto-add-driver-runpath-hook";
    addDriverRunpath.driverLink = "/run/opengl-driver";
    fetchPypi = args: named ((import ../../../nix/lib/wheel.nix).fetchedName args);
    runCommand =
      name: env: script:
      package (env // { inherit name script; });
    writeText = name: text: package { inherit name text; };
    writeShellScript = name: text: package { inherit name text; };
    writeShellScriptBin = name: text: package { inherit name text; };
    callPackage =
      fn: args:
      let
        f = import fn;
      in
      f (builtins.intersectAttrs (builtins.functionArgs f) final // args);
    testers.runNixOSTest =
      test:
      package {
        name = "vm-test-run-${test.name}";
        inherit (test) testScript;
        nodes = map (
          node:
          let
            host = import ../harness/nixos-lite.nix {
              pkgs = final;
              modules = [ node ];
            };
          in
          if host.failedAssertions != [ ] then
            throw "a VM node fails NixOS's assertions: ${concatStringsSep "; " host.failedAssertions}"
          else
            concatStringsSep " " host.strings
        ) (builtins.attrValues test.nodes);
      };
  };
  final = builtins.foldl' (acc: overlay: acc // overlay final acc) base overlays;
in
final
