# Per-package fix-ups are files named after the package they fix (overlays/fixups/torch.nix
# fixes the lock's `torch`); this finds them. Names here are canonical lock names.
{
  discover =
    dir:
    let
      entries = builtins.readDir dir;
      isFixup = name: entries.${name} == "regular" && builtins.match ".+\\.nix" name != null;
      packageName = file: builtins.head (builtins.match "(.+)\\.nix" file);
    in
    builtins.listToAttrs (
      map (file: {
        name = packageName file;
        value = dir + "/${file}";
      }) (builtins.filter isFixup (builtins.attrNames entries))
    );
}
