# checks.<system>: what `nix flake check` builds (it evaluates the packages but builds none of them).
# Each check is small and none needs the CUDA stack: no check's closure holds dflash-env,
# dflash-kernels or a wheel of nix/python-lock.json (tests/nix/test_nix_checks.py proves it offline).
# What needs the stack is a test of the package that builds it anyway:
# packages.<system>.dflash-env.tests.bytecode (the workflow's build-env job builds it).
# The names are literal so the flake's output names can be listed without nixpkgs.
{
  pkgs,
  nixpkgs,
  system,
  self,
  nixLib,
}:
let
  inherit (pkgs) lib;
in
{
  # Tier 1's pytest suite, offline, with the tests that need the index, a GPU or a booted container
  # (systemd tier: root and systemd-nspawn) deselected, and those that need the nix binary skipped:
  # there is no store inside a build.
  pytest =
    pkgs.runCommand "dflash-check-pytest"
      {
        nativeBuildInputs = [
          (pkgs.python312.withPackages (p: [
            p.pytest
            p.packaging
            p.tokenizers # smoke's grammar phase builds the synthetic tokenizer
            p.openai # and sends chat requests through the OpenAI client
            p.numpy # the oracle pair's reference forward (tests/oracle_reference.py)
          ]))
          pkgs.git
        ];
      }
      ''
        cp -r ${self} source
        chmod -R u+w source
        cd source/tests
        export HOME=$TMPDIR PYTHONPATH=$PWD/../python DFLASH_OFFLINE=1
        python -m pytest -m "not network and not gpu and not systemd" -p no:cacheprovider -q
        touch $out
      '';

  lock-matches-spec =
    let
      result = nixLib.spec.check {
        lockFile = ./python-lock.json;
        specFile = ./stack.toml;
      };
    in
    pkgs.runCommand "dflash-check-lock-matches-spec" { } (
      if result.ok then
        "echo ${lib.escapeShellArg result.message}; touch $out"
      else
        "echo ${lib.escapeShellArg result.message} >&2; exit 1"
    );

  # Evaluates (does not build) a NixOS host that imports the module with one DFlash instance:
  # the module, the overlay and the environment derivation must all evaluate.
  nixos-example =
    let
      host = nixpkgs.lib.nixosSystem {
        inherit system;
        modules = [
          self.nixosModules.dflash
          ./example-host.nix
          {
            nixpkgs.overlays = [ self.overlays.default ];
            nixpkgs.config.allowUnfree = true;
          }
        ];
      };
      services = builtins.attrNames host.config.systemd.services;
      dflashUnits = builtins.filter (lib.hasInfix "qwen3") services;
      toplevel = builtins.unsafeDiscardStringContext host.config.system.build.toplevel.drvPath;
    in
    if dflashUnits == [ ] then
      throw "the example host's instance `qwen3` produced no systemd service (services: ${toString services})"
    else
      pkgs.writeText "dflash-check-nixos-example" ''
        units: ${toString dflashUnits}
        toplevel: ${toplevel}
      '';

  # services.dflash booted in a NixOS VM with a stand-in SGLang: ready, restart, stop, broken host.
  nixos-vm = import ./vm-test.nix { inherit pkgs self; };

  # nixfmt (RFC 166 style; named nixfmt-rfc-style before 2025) over every tracked .nix file.
  formatting = pkgs.runCommand "dflash-check-formatting" { nativeBuildInputs = [ pkgs.nixfmt ]; } ''
    cd ${self}
    nixfmt --check $(find . -name '*.nix' | sort)
    touch $out
  '';
}
