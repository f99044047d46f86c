# The options nix/lib/settings.nix declares from a settings schema the test gives, through the module
# system of a nixpkgs lib found outside the repository (tests/service/test_settings_schema.py skips without
# one): the values one instance's definitions come out as, defaults filled in, or the type's refusal.
{
  lib,
  schemaFile,
  instanceJSON,
}:
let
  settings = import ../../../nix/lib/settings.nix;
in
(lib.evalModules {
  modules = [
    {
      options = settings.options {
        inherit lib;
        unitStr = lib.types.str;
        schema = settings.read schemaFile;
      } "a";
    }
    { config = builtins.fromJSON instanceJSON; }
  ];
}).config
