# nix/lib/service-unit.nix over configurations in a JSON file, as nix/module.nix applies it to a
# host's enabled instances (tests/nix_unit.py writes the file and reads the result):
#   nix-instantiate --eval --strict --json tests/nix/harness/service-unit.nix --argstr casesFile cases.json
# A case is { instances = { <name> = <every option's value>; }; dflashctl; python; [settingsFiles]; }. As in NixOS,
# failed assertions stop the rest: such a case gives only its messages.
{ casesFile }:
let
  s = import ../../../nix/lib/service-unit.nix;
  cases = builtins.fromJSON (builtins.readFile casesFile);
  failed = l: map (a: a.message) (builtins.filter (a: !a.assertion) l);
  one =
    c:
    let
      names = builtins.attrNames c.instances;
      perInstance = f: builtins.concatLists (map (n: f n c.instances.${n}) names);
      failedAssertions = failed (perInstance s.assertions ++ s.sharedCacheAssertions c.instances);
      unitOf =
        name: i:
        let
          d = s.directives {
            inherit name;
            instance = i;
            inherit (c) dflashctl python;
            # a case may name each settings file (a store path, as the module's writeText gives)
            settingsFile = (c.settingsFiles or { }).${name} or "/etc/dflash/${name}.json";
          };
        in
        {
          directives = d;
          text = s.render d;
          settings = s.settings name i;
          withKernels = s.settings name (s.withPrebuiltKernels "/nix/store/kernels" i);
        };
      # The module's default group for a static user: its own name.
      groupOf = i: if (i.group or null) != null then i.group else i.user;
    in
    if failedAssertions != [ ] then
      { inherit failedAssertions; }
    else
      {
        failedAssertions = [ ];
        units = builtins.mapAttrs unitOf c.instances;
        warnings = perInstance s.warnings;
        tmpfiles = perInstance (_: i: s.tmpfiles i (groupOf i));
      };
in
{
  inherit (s) settingsKeys;
  results = map one cases;
}
