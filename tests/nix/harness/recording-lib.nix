# A `lib` of our own for reading option declarations without nixpkgs: mkOption and the types only
# record what they are given (no merging, no type checks; those are NixOS's and run in tier 2).
let
  type = name: extra: { inherit name; } // extra;
in
{
  mkOption = decl: decl;
  mkPackageOption = _: name: _: { default = "<package ${name}>"; };
  literalExpression = text: { literal = text; };
  types = {
    str = type "str" { };
    bool = type "bool" { };
    package = type "package" { };
    port = type "port" { };
    float = type "float" { };
    ints.positive = type "positive" { };
    ints.unsigned = type "unsigned" { };
    ints.between = lo: hi: type "intBetween" { inherit lo hi; };
    numbers.between = lo: hi: type "between" { inherit lo hi; };
    numbers.positive = type "positiveNumber" { };
    strMatching = pattern: type "strMatching" { inherit pattern; };
    enum = values: type "enum" { inherit values; };
    nullOr = t: type "nullOr" { of = t; };
    listOf = t: type "listOf" { of = t; };
    attrsOf = t: type "attrsOf" { of = t; };
    submodule = m: type "submodule" { module = m; };
    addCheck = t: _: t;
  };
  # NixOS's removed options: what it was and what to use instead, recorded
  mkRemovedOptionModule = path: replacement: {
    removed = path;
    inherit replacement;
  };
}
