# nix/lib/settings.nix over a settings schema the test gives (tests/service/test_settings_schema.py adds a
# throw-away setting to a copy of settings.json): the options it declares, read with the recording
# lib, the settings file's keys, and the settings file of one instance's option values.
#   nix-instantiate --eval --strict --json tests/nix/harness/settings-schema.nix \
#     --argstr schemaFile settings.json --argstr instanceJSON '{...every option...}'
{ schemaFile, instanceJSON }:
let
  lib = import ./recording-lib.nix;
  settings = import ../../../nix/lib/settings.nix;
  schema = settings.read schemaFile;
  options = settings.options {
    inherit lib schema;
    unitStr = lib.types.str // {
      name = "unitStr";
    };
  } "x";
  # "nullOr positive", "listOf unitStr", "enum": a type as the words of its constructors.
  describe = t: if t ? of then "${t.name} ${describe t.of}" else t.name;
  declared = d: {
    type = describe d.type;
    default = d.default or null;
    hasDefault = d ? default;
    values = d.type.values or d.type.of.values or null;
    inherit (d) description;
  };
in
{
  options = builtins.mapAttrs (
    _: d:
    if d.type.name == "submodule" then
      builtins.mapAttrs (_: declared) d.type.module.options
    else
      declared d
  ) options;
  keys = settings.keys schema;
  settingsFile = settings.settingsFile schema "a" (builtins.fromJSON instanceJSON);
}
