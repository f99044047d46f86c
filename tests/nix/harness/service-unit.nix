# nix/lib/service-unit.nix over configurations in a JSON file, as nix/modules/instances.nix applies it
# to a host's enabled instances (tests/nix_unit.py writes the file and reads the result):
#   nix-instantiate --eval --strict --json tests/nix/harness/service-unit.nix --argstr casesFile cases.json
# A case is { instances = { <name> = <every option's value>; }; dflashctl; python; [settingsFiles];
# [path]; [nixos] }: `path` the entry's (the module's: the host compiler; default none), `nixos` what
# NixOS makes of each entry beside it, as the module reads it back (default: PATH from `path` as
# NixOS writes it, restartIfChanged, no systemd.globalEnvironment; a case may set each). As in NixOS,
# failed assertions stop the rest: such a case gives only its messages.
{ casesFile }:
let
  s = import ../../../nix/lib/service-unit.nix;
  serviceEntry = import ../../../nix/lib/service-entry.nix;
  cases = builtins.fromJSON (builtins.readFile casesFile);
  failed = l: map (a: a.message) (builtins.filter (a: !a.assertion) l);
  # NixOS's PATH of a unit's `path`: each package's bin, then each one's sbin.
  pathOf =
    path: builtins.concatStringsSep ":" (map (p: "${p}/bin") path ++ map (p: "${p}/sbin") path);
  one =
    c:
    let
      names = builtins.attrNames c.instances;
      perInstance = f: builtins.concatLists (map (n: f n c.instances.${n}) names);
      failedAssertions = failed (perInstance s.assertions ++ s.sharedCacheAssertions c.instances);
      path = c.path or [ ];
      nixos = {
        environment =
          (if path == [ ] then { } else { PATH = pathOf path; }) // (c.nixos.environment or { });
        restartIfChanged = c.nixos.restartIfChanged or true;
        globalEnvironment = c.nixos.globalEnvironment or { };
      };
      unitOf =
        name: i:
        let
          args = {
            inherit name;
            instance = i;
            inherit (c) dflashctl python;
            # a case may name each settings file (a store path, as the module's writeText gives)
            settingsFile = (c.settingsFiles or { }).${name} or "/etc/dflash/${name}.json";
          };
          entry = s.entry (args // { inherit path nixos; });
          # the unit file NixOS writes from the entry: what it made of it merged in
          written = serviceEntry.written (
            entry
            // {
              environment = nixos.globalEnvironment // nixos.environment;
              inherit (nixos) restartIfChanged;
            }
          );
        in
        {
          directives = s.directives args;
          inherit entry written;
          text = serviceEntry.render written;
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
