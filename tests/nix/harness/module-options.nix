# The option declarations of nix/module.nix, read without nixpkgs: each module it imports is called
# with a `lib` of our own (recording-lib.nix) whose mkOption and types only record what they are
# given, and their declarations merged. tests/nix/test_unit_nix.py compares the defaults and
# choices with dflashctl's settings schema.
let
  lib = import ./recording-lib.nix;
  modules = map (
    m:
    import m {
      inherit lib;
      config = throw "the option declarations must not read the configuration";
      pkgs = { };
    }
  ) (import ../../../nix/module.nix).imports;
  declarations = map (m: m.options or { }) modules;
  # Each module declares its own part of services.dflash; none declares a part another does.
  module.options.services.dflash = builtins.foldl' (a: b: a // b) { } (
    map (o: o.services.dflash or { }) declarations
  );
  # A submodule's options; a function module is called as NixOS calls it, for an instance "x".
  submoduleOptions =
    t:
    (
      if builtins.isFunction t.module then
        t.module {
          name = "x";
          config = { };
        }
      else
        t.module
    ).options;
  declared = decl: {
    type = decl.type.name;
    default = decl.default or null;
    hasDefault = decl ? default;
    values = decl.type.values or decl.type.of.values or null;
  };
  instance = submoduleOptions module.options.services.dflash.instances.type.of;
in
{
  top = builtins.attrNames module.options.services.dflash;
  # what each imported module declares, in import order
  byModule = map (o: builtins.attrNames (o.services.dflash or { })) declarations;
  kernels = declared module.options.services.dflash.kernelsPackage;
  instance = builtins.mapAttrs (
    k: decl: if k == "speculative" then { type = "submodule"; } else declared decl
  ) (removeAttrs instance [ "package" ]);
  speculative = builtins.mapAttrs (_: declared) (submoduleOptions instance.speculative.type);
  router = builtins.mapAttrs (_: declared) (
    removeAttrs module.options.services.dflash.router [ "package" ]
  );
  # Its default depends on router.enable (config): the text NixOS shows for it, and its choices.
  upgrade = {
    values = module.options.services.dflash.upgrade.type.values;
    defaultText = module.options.services.dflash.upgrade.defaultText.literal;
  };
  rollout = builtins.mapAttrs (_: declared) (
    removeAttrs module.options.services.dflash.rollout [ "canary" ]
  );
  canary = builtins.mapAttrs (
    _: decl:
    declared decl
    // {
      bounds =
        if decl.type ? lo then
          [
            decl.type.lo
            decl.type.hi
          ]
        else
          null;
    }
  ) module.options.services.dflash.rollout.canary;
  # mkRemovedOptionModule's (recording-lib.nix): each removed option's path and what it says instead
  removed = builtins.concatMap (m: m.imports or [ ]) modules;
  # Their `enable` defaults read the host's services.prometheus / services.grafana: the text shown.
  prometheus = builtins.mapAttrs (_: declared) (
    removeAttrs module.options.services.dflash.prometheus [ "enable" ]
  );
  prometheusEnable = module.options.services.dflash.prometheus.enable.defaultText.literal;
  grafanaEnable = module.options.services.dflash.grafana.enable.defaultText.literal;
}
