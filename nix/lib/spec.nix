# Lock versus spec: the lock records the sha256 of nix/stack.toml's bytes it was made from.
{
  check =
    { lockFile, specFile }:
    let
      recorded = (builtins.fromJSON (builtins.readFile lockFile)).spec_sha256 or null;
      actual = builtins.hashFile "sha256" specFile;
    in
    {
      ok = recorded == actual;
      inherit recorded actual;
      message =
        if recorded == actual then
          "nix/python-lock.json was made from this nix/stack.toml"
        else
          "nix/python-lock.json was made from another nix/stack.toml (lock has spec_sha256 ${toString recorded}, the file hashes to ${actual}); run `dflashctl lock` and commit both files";
    };
}
