# The parts of NixOS's systemd library that the dflash module's units go through, written for the
# module tests from reading nixos/lib/systemd-lib.nix and nixos/lib/systemd-unit-options.nix
# (nixpkgs, 2025): the option type of unit directives and its merge, the checks of [Service], the
# unit-name type, and the rendering of a service into its unit file text.
{ lib }:
let
  inherit (lib)
    any
    concatLists
    concatMap
    concatMapStrings
    concatStrings
    concatStringsSep
    elem
    filterOverrides
    isList
    mapAttrs
    mapAttrsToList
    mergeEqualOption
    mkOptionType
    optional
    optionalString
    stringLength
    toList
    types
    ;
in
rec {
  # Directive values: all-list definitions (or any list) concatenate, scalars must agree; only the
  # highest-priority definitions count (filterOverrides), so mkDefault yields to a host's value.
  unitOption = mkOptionType {
    name = "systemd option";
    merge =
      loc: defs:
      let
        defs' = filterOverrides defs;
      in
      if any (def: isList def.value) defs' then
        concatMap (def: toList def.value) defs'
      else
        mergeEqualOption loc defs';
  };

  unitNameType = types.strMatching "[a-zA-Z0-9@%:_.\\-]+[.](service|socket|device|mount|automount|swap|target|path|timer|scope|slice)";

  assertValueOneOf =
    name: values: group: attr:
    optional (
      attr ? ${name} && !elem attr.${name} values
    ) "Systemd ${group} field `${name}' cannot have value `${toString attr.${name}}'.";

  # As NixOS: applied to the merged attrs; mkOverride/mkIf wrappers unwrapped; errors traced.
  checkUnitConfig =
    group: checks: attrs:
    let
      defs = mapAttrs (
        _: v: if v._type or "" == "override" || v._type or "" == "if" then v.content else v
      ) attrs;
      errors = concatMap (c: c group defs) checks;
    in
    if errors == [ ] then true else builtins.trace (concatStringsSep "\n" errors) false;

  checkService = checkUnitConfig "Service" [
    (assertValueOneOf "Type" [
      "exec"
      "simple"
      "forking"
      "oneshot"
      "dbus"
      "notify"
      "notify-reload"
      "idle"
    ])
    (assertValueOneOf "Restart" [
      "no"
      "on-success"
      "on-failure"
      "on-abnormal"
      "on-abort"
      "always"
    ])
  ];

  toOption =
    x:
    if x == true then
      "true"
    else if x == false then
      "false"
    else
      toString x;

  # One `Key=value` line per value; a list gives one line per element (sorted by key, as attrsets are).
  attrsToSection =
    as:
    concatStrings (
      concatLists (
        mapAttrsToList (
          name: value:
          map (x: ''
            ${name}=${toOption x}
          '') (if isList value then value else [ value ])
        ) as
      )
    );

  commonUnitText =
    def: lines:
    ''
      [Unit]
      ${attrsToSection def.unitConfig}
    ''
    + lines
    + optionalString (def.wantedBy != [ ]) ''

      [Install]
      WantedBy=${concatStringsSep " " def.wantedBy}
    '';

  # Environment= lines are JSON strings, as NixOS writes them (systemd unquotes "..." with C escapes).
  serviceToUnitText =
    globalEnvironment: def:
    commonUnitText def (
      ''
        [Service]
      ''
      + (
        let
          env = globalEnvironment // def.environment;
        in
        concatMapStrings (
          n:
          let
            s = optionalString (env.${n} != null) "Environment=${builtins.toJSON "${n}=${env.${n}}"}\n";
          in
          if stringLength s >= 1048576 then
            throw "The value of the environment variable ‘${n}’ is too long."
          else
            s
        ) (builtins.attrNames env)
      )
      + optionalString (!def.restartIfChanged) ''
        X-RestartIfChanged=false
      ''
      + attrsToSection def.serviceConfig
    );
}
