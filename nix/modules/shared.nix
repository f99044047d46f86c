# Not a module: the values several of services.dflash's modules derive from the same options,
# named once. Each module imports it with its own arguments, `import ./shared.nix args`; every
# value is evaluated where it is read, so the option declarations read none of the configuration.
{
  config,
  lib,
  pkgs,
  ...
}:
let
  serviceUnit = import ../lib/service-unit.nix;
  unitText = import ../lib/unit-text.nix;
  routerUnit = import ../lib/router-unit.nix;
in
rec {
  cfg = config.services.dflash;
  # The enabled instances (name -> options): the units, checks and files are made for these.
  instances = lib.filterAttrs (_: i: i.enable) cfg.instances;
  dflashctl = lib.getExe' cfg.dflashctlPackage "dflashctl";
  pythonOf = i: "${i.package}/bin/python";
  unitName = name: "dflash-${name}";

  # Every string option that reaches a unit or a settings file: no newline or other control
  # character (`dflashctl validate` refuses the same; the message names the option).
  unitStr = lib.types.addCheck lib.types.str (s: unitText.controlProblem s == null) // {
    name = "unitStr";
    description = "string without newlines or other control characters";
  };

  # What `dflashctl serve --config` reads, per instance, and every instance's in one file (the
  # rollout's and `dflashctl status`'s list of instances).
  settingsOf =
    name: i: serviceUnit.settings name (serviceUnit.withPrebuiltKernels cfg.kernelsPackage i);
  settingsFile = name: i: pkgs.writeText "dflash-${name}.json" (builtins.toJSON (settingsOf name i));
  allSettings = pkgs.writeText "dflash-instances.json" (
    builtins.toJSON { instances = lib.mapAttrs settingsOf instances; }
  );

  # An instance's whole systemd.services entry (nix/lib/service-unit.nix), its digest included.
  instanceEntry =
    name: i:
    serviceUnit.entry {
      inherit name dflashctl;
      instance = i;
      python = pythonOf i;
      settingsFile = "${settingsFile name i}";
      # SGLang's first start compiles JIT kernels: nvcc comes from the stack's own wheels (serve
      # points CUDA_HOME at them), the host compiler it and tvm-ffi call (gcc, c++) from here.
      path = [ cfg.hostCompilerPackage ];
      # What NixOS writes into the unit beside the entry, read back from the host's configuration
      # (none of it depends on the digest): the unit's environment (PATH, which NixOS makes of
      # `path` and its default tools; a host's own variables), ./rollout.nix's restartIfChanged,
      # systemd.globalEnvironment. The digest covers the unit as NixOS writes it.
      nixos = {
        inherit (config.systemd.services.${unitName name}) environment restartIfChanged;
        inherit (config.systemd) globalEnvironment;
      };
    };

  # The router's settings for these instances, in /etc (a stable path: a change of workers alone
  # reloads the router instead of restarting it).
  routerSettings = routerUnit.settings cfg.router instances;
  routerSettingsPath = routerUnit.data.settingsPath;
}
