# A unit as NixOS holds it (a `systemd.services.<name>` entry) and as NixOS writes it (the unit
# file's [Unit], [Service] and [Install] lines), builtins only. service-unit.nix, router-unit.nix
# and rollout-unit.nix build their directives from data files and return, each, the whole entry
# made here; `written` is the unit file NixOS makes of an entry, which an instance's digest covers
# (service-unit.nix) and the tests render and compare (tests/nix/harness/host-units.nix).
let
  inherit (builtins)
    attrNames
    concatMap
    concatStringsSep
    filter
    isBool
    isList
    mapAttrs
    removeAttrs
    toJSON
    ;

  optionalAttrs = cond: attrs: if cond then attrs else { };
  nonEmpty = key: list: optionalAttrs (list != [ ]) { ${key} = list; };
  # [Unit] keys that NixOS declares as options of their own: lists that merge with a host's.
  listKeys = [
    "After"
    "Wants"
    "Before"
  ];

  renderValue = v: if isBool v then (if v then "true" else "false") else toString v;
  section =
    title: directives:
    [ "[${title}]" ]
    ++ concatMap (
      k:
      let
        v = directives.${k};
      in
      map (line: "${k}=${renderValue line}") (if isList v then v else [ v ])
    ) (attrNames directives);
in
{
  # { Unit, Service, Install } (directive -> value; a list is one line per element) -> the entry.
  fromSections = s: {
    description = s.Unit.Description;
    after = s.Unit.After or [ ];
    wants = s.Unit.Wants or [ ];
    before = s.Unit.Before or [ ];
    wantedBy = s.Install.WantedBy;
    unitConfig = removeAttrs s.Unit ([ "Description" ] ++ listKeys);
    serviceConfig = s.Service;
  };

  # The entry as the module defines it: every directive at `mkDefault` (lib.mkDefault), so a
  # host's own value for one wins; dependency lists and everything else as they are (they merge).
  withDefaults =
    mkDefault: e:
    e
    // {
      description = mkDefault e.description;
      unitConfig = mapAttrs (_: mkDefault) e.unitConfig;
      serviceConfig = mapAttrs (_: mkDefault) e.serviceConfig;
    };

  # The unit file NixOS writes from an entry, as { Unit, Service, Install } (directive -> value or
  # list of values): `environment` (which holds what NixOS makes of `path`, PATH, and
  # systemd.globalEnvironment where the caller merged it in) as the quoted Environment= lines NixOS
  # writes before serviceConfig's own; restartIfChanged = false as X-RestartIfChanged=false; the
  # triggers under the keys NixOS gives them (their list stands for the store path of the file
  # NixOS writes them to: equal exactly when it is). `path` itself is not written: PATH is.
  written =
    e:
    let
      env = e.environment or { };
      # a variable set to null is left out, as NixOS does
      set = filter (n: env.${n} != null) (attrNames env);
      environment = map (n: toJSON "${n}=${env.${n}}") set ++ (e.serviceConfig.Environment or [ ]);
    in
    {
      Unit = {
        Description = e.description;
      }
      // nonEmpty "After" e.after
      // nonEmpty "Wants" e.wants
      // nonEmpty "Before" e.before
      // e.unitConfig
      // nonEmpty "X-Restart-Triggers" (e.restartTriggers or [ ])
      // nonEmpty "X-Reload-Triggers" (e.reloadTriggers or [ ]);
      Service =
        removeAttrs e.serviceConfig [ "Environment" ]
        // nonEmpty "Environment" environment
        // optionalAttrs (!(e.restartIfChanged or true)) { X-RestartIfChanged = false; };
      Install = nonEmpty "WantedBy" e.wantedBy;
    };

  # A unit file's text from { Unit, Service, Install }, lines sorted by key within a section.
  render =
    s:
    concatStringsSep "\n" (
      section "Unit" s.Unit
      ++ [ "" ]
      ++ section "Service" s.Service
      ++ [ "" ]
      ++ section "Install" s.Install
    )
    + "\n";
}
