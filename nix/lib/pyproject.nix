# What building a Python source tree needs from its pyproject.toml (overlays/fixups/sglang.nix
# builds `sglangSrc` when it is a source tree rather than a wheel).
rec {
  # PEP 508 requirement -> PEP 503 name: "setuptools>=61.0" -> "setuptools", "Foo_Bar[x]" -> "foo-bar".
  requirementName =
    requirement:
    let
      name = builtins.head (builtins.match "[[:space:]]*([A-Za-z0-9._-]+).*" requirement);
      parts = builtins.split "[-_.]+" (
        builtins.replaceStrings
          [
            "A"
            "B"
            "C"
            "D"
            "E"
            "F"
            "G"
            "H"
            "I"
            "J"
            "K"
            "L"
            "M"
            "N"
            "O"
            "P"
            "Q"
            "R"
            "S"
            "T"
            "U"
            "V"
            "W"
            "X"
            "Y"
            "Z"
          ]
          [
            "a"
            "b"
            "c"
            "d"
            "e"
            "f"
            "g"
            "h"
            "i"
            "j"
            "k"
            "l"
            "m"
            "n"
            "o"
            "p"
            "q"
            "r"
            "s"
            "t"
            "u"
            "v"
            "w"
            "x"
            "y"
            "z"
          ]
          name
      );
    in
    builtins.concatStringsSep "-" (builtins.filter builtins.isString parts);

  # { version = the static [project] version, or null when it is dynamic; buildSystem = names
  #   of [build-system] requires (PEP 518's default when the table is absent); rustExtensions =
  #   the targets of [[tool.setuptools-rust.ext-modules]] (sglang 0.5.11 has one). }
  read =
    path:
    let
      doc = builtins.fromTOML (builtins.readFile path);
    in
    {
      version = doc.project.version or null;
      buildSystem = map requirementName (
        doc.build-system.requires or [
          "setuptools"
          "wheel"
        ]
      );
      rustExtensions = map (m: m.target) (doc.tool.setuptools-rust.ext-modules or [ ]);
    };
}
