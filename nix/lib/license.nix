# Licences recorded in the lock (SPDX expressions, python/dflashctl/lock/licenses.py) -> what
# nixpkgs' meta.license and its unfree check need.
rec {
  # "Apache-2.0 OR (MIT WITH X)" -> [ "Apache-2.0" "MIT" ]; an exception is not a licence.
  ids =
    expression:
    let
      tokens = builtins.filter (t: builtins.isString t && t != "") (
        builtins.split "[[:space:]()]+" expression
      );
      step =
        acc: t:
        if acc.skip then
          acc // { skip = false; }
        else if t == "WITH" then
          acc // { skip = true; }
        else if t == "AND" || t == "OR" then
          acc
        else
          acc // { ids = acc.ids ++ [ t ]; };
    in
    (builtins.foldl' step {
      ids = [ ];
      skip = false;
    } tokens).ids;

  # What an id means to nixpkgs: NVIDIA's CUDA licence, another unfree one, unknown (no
  # meta.license), or an SPDX id nixpkgs looks up (an unknown one stays free, as nixpkgs has it).
  kind =
    id:
    if builtins.match "LicenseRef-NVIDIA.*" id != null then
      "nvidia"
    else if id == "LicenseRef-Proprietary" then
      "unfree"
    else if id == "LicenseRef-Unknown" then
      "unknown"
    else
      "spdx";

  isUnfree =
    expression: builtins.any (id: kind id == "nvidia" || kind id == "unfree") (ids expression);

  # meta.license for a lock entry, given nixpkgs' lib.
  meta =
    lib: expression:
    map (
      id:
      {
        nvidia = lib.licenses.nvidiaCudaRedist;
        unfree = lib.licenses.unfree;
        spdx = lib.getLicenseFromSpdxIdOr id { shortName = id; };
      }
      .${kind id}
    ) (builtins.filter (id: kind id != "unknown") (ids expression));

  # Names of the packages (lock.packagesFor's values) whose licence nixpkgs counts as unfree.
  unfreeNames =
    packages:
    builtins.filter (name: isUnfree (packages.${name}.license or "")) (builtins.attrNames packages);

  # Why a host that does not allow them cannot build the stack, and the two ways to allow them.
  refusal =
    names:
    "dflash: ${toString (builtins.length names)} locked wheels carry a licence nixpkgs counts as unfree (NVIDIA's CUDA licence or another): ${builtins.concatStringsSep ", " names}. Allow them in the nixpkgs that builds the stack: nixpkgs.config.allowUnfreePredicate = dflash.lib.allowUnfreePredicate; (only these) or nixpkgs.config.allowUnfree = true;";
}
