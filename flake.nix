{
  description = "Pinned SGLang 0.5.11 + DFlash speculative decoding stack, NixOS service and smoke test";

  inputs.nixpkgs.url = "github:NixOS/nixpkgs/nixos-unstable";

  outputs =
    { self, nixpkgs }:
    let
      systems = [
        "x86_64-linux"
        "aarch64-linux"
      ];
      # builtins only, so the output names can be listed without nixpkgs (tests/nix/flake-outputs.nix).
      forAllSystems =
        f:
        builtins.listToAttrs (
          map (system: {
            name = system;
            value = f system;
          }) systems
        );

      # nixpkgs, imported once per system and shared by every output of that system (an import
      # per output would evaluate nixpkgs and the overlay again for each).
      # Unfree: only the locked wheels whose licence is (NVIDIA's CUDA licence, per the lock).
      pkgsBySystem = forAllSystems (
        system:
        import nixpkgs {
          inherit system;
          config.allowUnfreePredicate = self.lib.allowUnfreePredicate;
          overlays = [ self.overlays.default ];
        }
      );

      lock = nixLib.lock.read ./nix/python-lock.json;
      unfreePackages = builtins.concatMap (
        system: nixLib.license.unfreeNames (nixLib.lock.packagesFor lock system)
      ) (nixLib.lock.systems lock);
      pkgsFor = system: pkgsBySystem.${system};

      nixLib = import ./nix/lib;
    in
    {
      lib = nixLib // {
        # An overlay with other arguments, e.g. mkOverlay { sglangPatches = [ ./ddtree.patch ]; }.
        mkOverlay = args: import ./overlays args;
        # For a host's nixpkgs.config: allows exactly the locked wheels with an unfree licence.
        allowUnfreePredicate = pkg: builtins.elem (pkg.pname or "") unfreePackages;
      };

      overlays.default = import ./overlays { };

      # The module defaults to this flake's packages, built from this flake's nixpkgs: every host of
      # one system gets the same store paths whatever nixpkgs the host itself follows.
      nixosModules.dflash =
        { lib, pkgs, ... }:
        let
          flakePackages = self.packages.${pkgs.stdenv.hostPlatform.system};
        in
        {
          imports = [ ./nix/module.nix ];
          services.dflash.package = lib.mkDefault flakePackages.dflash-env;
          services.dflash.dflashctlPackage = lib.mkDefault flakePackages.dflashctl;
          services.dflash.hostCompilerPackage = lib.mkDefault flakePackages.dflash-host-compiler;
          services.dflash.kernelsPackage = lib.mkDefault flakePackages.dflash-kernels;
          services.dflash.router.package = lib.mkDefault flakePackages.dflash-router-env;
        };
      nixosModules.default = self.nixosModules.dflash;

      packages = forAllSystems (
        system:
        let
          pkgs = pkgsFor system;
        in
        {
          dflash-env = pkgs.dflash-env;
          dflashctl = pkgs.dflashctl;
          # The C/C++ compiler SGLang's JIT kernels are built with (pinned: nvcc 13.0 takes GCC <= 15).
          dflash-host-compiler = pkgs.dflashHostCompiler;
          # SGLang's JIT kernels for sm90, sm100, sm120, built without a GPU (nix/packages/dflash-kernels.nix).
          dflash-kernels = pkgs.dflash-kernels;
          # SGLang's router in its own environment (nix/router-lock.json; no torch, no CUDA).
          dflash-router-env = pkgs.dflash-router-env;
          default = pkgs.dflash-env;
        }
      );

      apps = forAllSystems (
        system:
        let
          pkgs = pkgsFor system;
          # SGLang's first start compiles kernels with nvcc, which calls gcc/c++: the pinned one.
          smoke = pkgs.writeShellScript "dflash-smoke" ''
            export PATH=${pkgs.dflashHostCompiler}/bin''${PATH:+:$PATH}
            export DFLASH_PREBUILT_KERNELS=''${DFLASH_PREBUILT_KERNELS-${pkgs.dflash-kernels}}
            exec ${pkgs.dflash-env}/bin/dflashctl smoke "$@"
          '';
        in
        {
          dflash-smoke = {
            type = "app";
            program = "${smoke}";
            meta.description = "Prove this GPU host serves SGLang with DFlash speculative decoding";
          };
        }
      );

      devShells = forAllSystems (system: {
        default = (pkgsFor system).callPackage ./nix/dev-shell.nix { };
      });

      checks = forAllSystems (
        system:
        import ./nix/checks.nix {
          pkgs = pkgsFor system;
          inherit
            nixpkgs
            system
            self
            nixLib
            ;
        }
      );

      formatter = forAllSystems (system: (pkgsFor system).nixfmt-tree);
    };
}
