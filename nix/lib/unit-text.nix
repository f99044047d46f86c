# Values that reach a systemd unit, refused or escaped by systemd's rules: the Nix twin of
# python/dflashctl/service/unit_text.py, which explains each rule (tests/service/test_unit_text.py checks
# that both give the same text and the same messages). The refusals' data and texts are
# service-unit.json's "controlCharacters", "paths" and "cacheDir", read by both. Builtins only.
let
  inherit (builtins)
    any
    attrNames
    concatMap
    elem
    elemAt
    filter
    fromJSON
    genList
    head
    isString
    match
    readFile
    replaceStrings
    split
    stringLength
    substring
    ;

  # The rules' data and texts (control characters, paths, cacheDir), as unit_text.py reads them.
  data = fromJSON (readFile ../../python/dflashctl/service/data/service-unit.json);
  fill =
    template: values:
    replaceStrings (map (k: "{${k}}") (attrNames values)) (map (k: values.${k}) (
      attrNames values
    )) template;

  hexDigit = i: elemAt (genList (n: substring n 1 "0123456789ABCDEF") 16) i;
  hex4 = i: "00${hexDigit (i / 16)}${hexDigit (i - 16 * (i / 16))}";
  # The data's ranges but U+0000, which Nix strings cannot hold.
  controlCodes = filter (code: code != 0) (
    concatMap (
      r: genList (i: elemAt r 0 + i) (elemAt r 1 - elemAt r 0 + 1)
    ) data.controlCharacters.ranges
  );
  controls = map (code: {
    inherit code;
    char = fromJSON ''"\u${hex4 code}"'';
  }) controlCodes;
  contains = needle: s: replaceStrings [ needle ] [ "" ] s != s;
  hasPrefix = p: s: substring 0 (stringLength p) s == p;

  specifiers = replaceStrings [ "%" ] [ "%%" ];
  plainWord = s: match "[A-Za-z0-9/_.:+=@,%-]+" s != null;
  quoted =
    from: to: s:
    ''"${
      replaceStrings
        (
          [
            "\\"
            ''"''
          ]
          ++ from
        )
        (
          [
            "\\\\"
            ''\"''
          ]
          ++ to
        )
        s
    }"'';
  pathWord = s: if plainWord s then specifiers s else quoted [ "%" ] [ "%%" ] s;
  stripSlash =
    s:
    if s != "" && substring (stringLength s - 1) 1 s == "/" then
      substring 0 (stringLength s - 1) s
    else
      s;
  plainRelative = rules: s: match rules.plainRelative s != null;
  ownedBy =
    rules: path:
    let
      prefixes = filter (p: hasPrefix p path) (attrNames rules.systemdOwned);
    in
    if prefixes == [ ] then
      null
    else
      {
        prefix = head prefixes;
        directive = rules.systemdOwned.${head prefixes};
        rel = stripSlash (substring (stringLength (head prefixes)) (stringLength path) path);
      };
  orElse = a: b: if a != null then a else b;
  componentsProblem =
    path:
    let
      parts = filter isString (split "/" path);
    in
    if !hasPrefix "/" path || contains "//" path || any (p: elem p data.paths.badComponents) parts then
      data.paths.componentsProblem
    else
      null;
  hiddenBy =
    hidden: path:
    let
      prefixes = filter (p: match "_.*" p == null && (path == p || hasPrefix "${p}/" path)) (
        attrNames hidden
      );
    in
    if prefixes == [ ] then
      null
    else
      fill data.paths.hiddenProblem {
        inherit path;
        directive = hidden.${head prefixes};
      };
in
rec {
  inherit specifiers pathWord fill;

  # null, or why the value cannot go into a unit (the same sentence as Python's control_problem).
  controlProblem =
    s:
    let
      found = filter (c: contains c.char s) controls;
    in
    if found == [ ] then
      null
    else
      fill data.controlCharacters.problem { code = hex4 (head found).code; };

  execArg = s: if plainWord s then specifiers s else quoted [ "%" "$" ] [ "%%" "$$" ] s;

  execPathProblem =
    s:
    let
      unsafe = filter (c: contains c s) [
        ''"''
        "'"
        "\\"
        "$"
      ];
    in
    if !hasPrefix "/" s then
      "is not an absolute path (systemd needs one)"
    else if controlProblem s != null then
      controlProblem s
    else if unsafe != [ ] then
      "contains ${
        if head unsafe == "'" then ''"'"'' else "'${replaceStrings [ "\\" ] [ "\\\\" ] (head unsafe)}'"
      }, which systemd refuses or expands in an executable's path; install it under a plain path"
    else
      null;

  execPath = s: if plainWord s then specifiers s else ''"${specifiers s}"'';

  commandLine = argv: toString ([ (execPath (head argv)) ] ++ map execArg (builtins.tail argv));

  # null, or why a unit cannot use `path` (what it runs, its settings file, a model or driver
  # directory): absolute, outside what the sandbox hides (`hidden`: service-unit.json's "hidden").
  unitPathProblem = hidden: path: orElse (componentsProblem path) (hiddenBy hidden path);

  # NixOS assertions that the unit can run and read `paths` (what -> absolute path), under the
  # option path `where` (dflashctl's twin: unit.check_exec_start).
  pathAssertions =
    hidden: where: paths:
    map (what: {
      assertion = unitPathProblem hidden paths.${what} == null;
      message = "${where}: ${what}: ${toString (unitPathProblem hidden paths.${what})}";
    }) (attrNames paths);

  # LoadCredential= for each { id, path } with a path, each with its SetCredential= fallback (the
  # text systemd hands the service where it cannot read the file; dflashctl then names the file):
  # dflashctl's twin is unit.credentials.
  credentials =
    fallback: given:
    let
      set = filter (c: c.path != null) given;
    in
    if set == [ ] then
      { }
    else
      {
        LoadCredential = map (c: "${c.id}:${specifiers c.path}") set;
        SetCredential = map (c: "${c.id}:${fallback}") set;
      };

  cacheDirProblem =
    rules: hidden: path:
    let
      owned = ownedBy rules path;
    in
    if componentsProblem path != null then
      componentsProblem path
    else if hiddenBy hidden path != null then
      fill rules.hiddenProblem { problem = hiddenBy hidden path; }
    else if owned != null && !plainRelative rules owned.rel then
      fill rules.notPlainProblem {
        inherit path;
        inherit (owned) prefix directive rel;
      }
    else
      null;

  # The directives for a cacheDir (checked with cacheDirProblem first); null when it needs a
  # static user and there is none (the module's assertion then says so, as Python's ValueError).
  cacheDirDirectives =
    rules: path: staticUser:
    let
      owned = ownedBy rules path;
    in
    if path == null then
      { }
    else if owned != null then
      {
        ${owned.directive} = owned.rel;
        "${owned.directive}Mode" = rules.mode;
      }
    else if staticUser then
      { ReadWritePaths = pathWord path; }
    else
      null;

  cacheDirNeedsUser = rules: path: fill rules.needsUserProblem { inherit path; };

  tmpfilesLine =
    rules: path: user: group:
    "d ${pathWord path} ${rules.mode} ${user} ${group} -";
}
