# What the overlay will ask of each locked wheel, read without nixpkgs (`dflashctl audit`):
# overlays/default.nix and every overlays/fixups/*.nix are applied to a stand-in package set
# whose buildPythonPackage returns its arguments, so the audit sees the real fix-ups' effect
# (added dependencies, nixpkgs libraries, ignored sonames, install scripts) rather than a
# restatement of them.
{
  lockFile ? ./python-lock.json,
  fixupsDir ? ../overlays/fixups,
  system,
}:
let
  # The nixpkgs libraries the generic rule and the fix-ups name, with the sonames each puts in
  # autoPatchelf's search path. A fix-up that names another one fails here with "attribute
  # missing": add it to this table with the sonames its lib output holds.
  library = name: sonames: {
    inherit name sonames;
    outPath = "/stand-in/${name}";
  };
  gccLib = library "gcc-lib" (
    [
      "libstdc++.so.6"
      "libgcc_s.so.1"
      "libgomp.so.1"
      "libatomic.so.1"
      "libitm.so.1"
    ]
    ++ (if system == "x86_64-linux" then [ "libquadmath.so.0" ] else [ ])
  );
  python = library "python3.12" [ "libpython3.12.so.1.0" ] // {
    sitePackages = "lib/python3.12/site-packages";
    interpreter = "/stand-in/python3.12/bin/python3.12";
    pkgs = {
      buildPythonPackage = args: args // { outPath = "/stand-in/${args.pname}"; };
      # nixpkgs follows propagated Python dependencies; here, the `dependencies` each package's
      # (fixed-up) arguments name.
      requiredPythonModules =
        deps:
        map (x: x.package) (
          builtins.genericClosure {
            startSet = map (p: {
              key = p.pname;
              package = p;
            }) deps;
            operator =
              x:
              map (p: {
                key = p.pname;
                package = p;
              }) (x.package.dependencies or [ ]);
          }
        );
      wheelUnpackHook = "wheelUnpackHook";
      pypaInstallHook = "pypaInstallHook";
      setuptools = "setuptools";
      wheel = "wheel";
    };
  };
  lib = import ./stand-in-lib.nix;
  final = base // import ../overlays { inherit lockFile fixupsDir; } final base;
  base = {
    inherit lib;
    config.allowUnfree = true;
    stdenv.hostPlatform.system = system;
    stdenv.cc = {
      cc.lib = gccLib;
      outPath = "/stand-in/cc";
    };
    python312 = python;
    gcc14 = library "gcc14" [ ]; # the pinned host compiler (triton's CC): a tool, no sonames
    zlib = library "zlib" [ "libz.so.1" ];
    numactl = library "numactl" [ "libnuma.so.1" ];
    rdma-core = library "rdma-core" [
      "libibverbs.so.1"
      "librdmacm.so.1"
      "libibumad.so.3"
      "libmlx4.so.1"
      "libmlx5.so.1"
      "libefa.so.1"
      "libhns.so.1"
      "libmana.so.1"
    ];
    # FFmpeg 7, nixpkgs' `ffmpeg` at the pinned revision.
    ffmpeg = library "ffmpeg" [
      "libavcodec.so.61"
      "libavdevice.so.61"
      "libavfilter.so.10"
      "libavformat.so.61"
      "libavutil.so.59"
      "libpostproc.so.58"
      "libswresample.so.5"
      "libswscale.so.8"
    ];
    autoPatchelfHook = "autoPatchelfHook";
    autoAddDriverRunpath = "autoAddDriverRunpath";
    addDriverRunpath.driverLink = "/run/opengl-driver";
    fetchPypi = args: args;
    callPackage =
      fn: args:
      let
        f = import fn;
      in
      f (builtins.intersectAttrs (builtins.functionArgs f) final // args);
  };
  nameOf = p: p.pname or p.name or (toString p);
  describe = _: p: {
    file = p.passthru.lockEntry.file;
    # Wheels whose site-packages autoPatchelf searches (build-wheel.nix's searchPath).
    closure = map nameOf (python.pkgs.requiredPythonModules p.dependencies);
    # autoPatchelf also searches $dep/lib of every host dependency: the buildInputs and what
    # buildPythonPackage propagates, python itself included (libpython3.12.so.1.0).
    sonames = builtins.concatMap (i: i.sonames or [ ]) (p.buildInputs ++ [ python ]);
    ignoreMissing = p.autoPatchelfIgnoreMissingDeps;
    scripts = {
      postInstall = p.postInstall or "";
      preFixup = p.preFixup or "";
      postFixup = p.postFixup or "";
    };
  };
in
{
  packages = builtins.mapAttrs describe final.dflashPythonPackages;
  stack = map nameOf final.dflashStack;
  devStack = map nameOf final.dflashDevStack;
}
