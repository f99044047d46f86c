# Values that reach a systemd unit, refused or escaped by systemd's rules: the Nix twin of
# python/dflashctl/service/unit_text.py, which explains each rule (tests/test_unit_text.py checks
# that both give the same text and the same messages). Builtins only.
let
  inherit (builtins)
    any
    attrNames
    elemAt
    filter
    fromJSON
    genList
    head
    isString
    match
    replaceStrings
    split
    stringLength
    substring
    ;

  hexDigit = i: elemAt (genList (n: substring n 1 "0123456789ABCDEF") 16) i;
  hex4 = i: "00${hexDigit (i / 16)}${hexDigit (i - 16 * (i / 16))}";
  # U+0001..U+001F and U+007F (Nix strings cannot hold U+0000).
  controlCodes = genList (i: i + 1) 31 ++ [ 127 ];
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
  plainRelative =
    s: match "[A-Za-z0-9_+@-][A-Za-z0-9._+@-]*(/[A-Za-z0-9_+@-][A-Za-z0-9._+@-]*)*" s != null;
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
    if !hasPrefix "/" path || any (p: p == "." || p == "..") parts || contains "//" path then
      "must be an absolute path without '.', '..' or '//' components"
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
      "${path} is hidden from the service by ${hidden.${head prefixes}}";
in
rec {
  inherit specifiers pathWord;

  # null, or why the value cannot go into a unit (the same sentence as Python's control_problem).
  controlProblem =
    s:
    let
      found = filter (c: contains c.char s) controls;
    in
    if found == [ ] then
      null
    else
      "contains the control character U+${hex4 (head found).code} (a newline, tab, NUL or similar would end or corrupt a line of the systemd unit); remove it";

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

  # "{name}" placeholders of a data-file template, replaced as Python's unit_text.fill does.
  fill =
    template: values:
    replaceStrings (map (k: "{${k}}") (attrNames values)) (map (k: values.${k}) (
      attrNames values
    )) template;

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
      "${hiddenBy hidden path}; use a directory under /var/cache (systemd creates and owns it), or one like /srv/hf with a static user"
    else if owned != null && !plainRelative owned.rel then
      "${path}: below ${owned.prefix} it becomes ${owned.directive}=${owned.rel}, which takes plain names only (letters, digits, '.', '_', '-', '+', '@', '/')"
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

  cacheDirNeedsUser =
    path:
    "${path} is outside /var/cache and /var/lib, so under DynamicUser nothing can own it; put it under /var/cache (e.g. /var/cache/hf, created by systemd for the service), or run the instance as a static user (NixOS: the instance's user option; systemd-tmpfiles then creates it for that user)";

  tmpfilesLine =
    rules: path: user: group:
    "d ${pathWord path} ${rules.mode} ${user} ${group} -";
}
