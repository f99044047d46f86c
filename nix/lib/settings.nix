# An instance's settings as dflashctl's schema lists them (python/dflashctl/service/data/settings.json,
# which dflashctl's parser, its argv mapping and docs/service.md's table read too): the settings
# file's keys and content (builtins only, for nix/lib/service-unit.nix) and the options of
# services.dflash.instances.<name> (`options`, given a nixpkgs-like `lib`). Tier 1 evaluates both:
# tests/nix/harness/module-options.nix with a recording `lib`, tests/service/test_settings_schema.py over a
# copy of the schema with a throw-away setting.
let
  inherit (builtins)
    elemAt
    filter
    fromJSON
    listToAttrs
    match
    readFile
    replaceStrings
    ;

  read = path: fromJSON (readFile path);
  shipped = read ../../python/dflashctl/service/data/settings.json;

  # { group, name } of a key: "speculative.algorithm" is algorithm in the group speculative.
  split =
    key:
    let
      m = match "([^.]+)[.](.+)" key;
    in
    if m == null then
      {
        group = null;
        name = key;
      }
    else
      {
        group = elemAt m 0;
        name = elemAt m 1;
      };
  inGroup = group: s: filter (e: (split e.key).group == group) s.settings;
  namesIn = group: s: map (e: (split e.key).name) (inGroup group s);
  pick =
    keys: attrs:
    listToAttrs (
      map (k: {
        name = k;
        value = attrs.${k};
      }) keys
    );

  # The option type of one entry's `type` (settings.json's _comment lists them). Bounds beyond
  # these types (tpSize <= 64, a revision's form) are dflashctl's, checked at build time.
  typeOf =
    types: unitStr: e:
    let
      base =
        {
          text = unitStr;
          revision = unitStr;
          path = unitStr;
          bool = types.bool;
          port = types.port;
          fraction = types.numbers.between 0 1;
          gpus = types.listOf types.ints.unsigned;
          environment = types.attrsOf unitStr;
          args = types.listOf unitStr;
          choice = types.enum (e.choices or [ ]);
          int =
            if (e.min or null) == 0 then
              types.ints.unsigned
            else if (e.min or null) == 1 then
              types.ints.positive
            else
              throw "settings.json: ${e.key}: no option type for an int with min ${toString (e.min or null)}";
        }
        .${e.type} or (throw "settings.json: ${e.key}: unknown type ${e.type}");
    in
    if e.null or false then types.nullOr base else base;

  optionOf =
    lib: unitStr: instance: e:
    lib.mkOption (
      {
        type = typeOf lib.types unitStr e;
        description = replaceStrings [ "{name}" ] [ instance ] e.description;
      }
      // (if e ? default then { inherit (e) default; } else { })
      // (if e ? example then { inherit (e) example; } else { })
    );

  optionsIn =
    lib: unitStr: instance: group: s:
    listToAttrs (
      map (e: {
        inherit ((split e.key)) name;
        value = optionOf lib unitStr instance e;
      }) (inGroup group s)
    );
in
{
  inherit read;
  schema = shipped;

  # The top-level keys of the settings file, and a group's, in the schema's order.
  keys = s: namesIn null s;
  groupKeys = group: s: namesIn group s;
  groups = s: builtins.attrNames s.groups;

  # The settings file of instance `name` from its option values (module-only options left out).
  settingsFile =
    s: name: i:
    {
      inherit name;
    }
    // builtins.mapAttrs (group: _: pick (namesIn group s) i.${group}) s.groups
    // pick (namesIn null s) i;

  # The options of one instance named `instance` that dflashctl reads: each group a submodule.
  # `unitStr`: the module's string type without control characters.
  options =
    {
      lib,
      unitStr,
      schema ? shipped,
    }:
    instance:
    optionsIn lib unitStr instance null schema
    // builtins.mapAttrs (
      group: g:
      lib.mkOption {
        type = lib.types.submodule { options = optionsIn lib unitStr instance group schema; };
        default = { };
        inherit (g) example description;
      }
    ) schema.groups;
}
