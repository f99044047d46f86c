# Just enough of NixOS's module system to evaluate services.dflash on a host without nixpkgs: what
# the closure of checks.nixos-vm holds (tests/nix/closure-nixpkgs gives runNixOSTest this).
#
# The host's modules (its own, the flake's nixosModules.dflash, nix/module.nix through imports)
# are loaded as NixOS loads them: a path is imported, a function is called with { config, lib,
# pkgs }, a module without `options`/`config` is all config. Only the options nix/module.nix
# declares get values, and the few of NixOS's own it reads (`nixosOptions` below: services.prometheus
# and services.grafana, declared as the NixOS manual does), as NixOS gives them: the definitions of the highest priority win (a plain
# one is 100, mkDefault 1000, mkForce 50), mkIf drops a definition whose condition is false, mkMerge
# splits one; lists concatenate, attribute sets merge, a submodule (and each attribute of an
# attrsOf submodule) is evaluated from its own definitions with its options' defaults; no
# definition: the option's default. Types are not checked (NixOS's job, tier 2 and
# tests/nix/test_module_eval.py). `lib` has what nix/module.nix calls; a function it starts to call
# fails here as a missing attribute, and belongs below.
#
# `strings`: every string the host's configuration ends in, with its context (so, its store
# dependencies): the module's outputs (units, settings files, system.checks, /etc, ...) evaluated
# with those values, and every other option the host's modules define, mkIf conditions honoured.
# services.dflash's own definitions are left out (their effect is in the module's outputs), so a
# package the host overrides (the flake's mkDefault dflash-env) is not counted. `failedAssertions`
# are NixOS's assertions that fail, which would stop a real evaluation.
{ pkgs, modules }:
let
  inherit (builtins)
    all
    attrNames
    attrValues
    concatLists
    concatMap
    filter
    foldl'
    head
    isAttrs
    isFunction
    isList
    isPath
    isString
    listToAttrs
    mapAttrs
    stringLength
    substring
    ;

  type = name: extra: { inherit name; } // extra;
  lib = pkgs.lib // rec {
    mkOption = decl: decl // { _type = "option"; };
    mkEnableOption =
      description:
      mkOption {
        type = types.bool;
        default = false;
        inherit description;
      };
    mkPackageOption =
      set: name: _:
      mkOption {
        type = types.package;
        default = set.${name};
      };
    literalExpression = text: {
      _type = "literalExpression";
      inherit text;
    };
    types = {
      str = type "str" { };
      bool = type "bool" { };
      package = type "package" { };
      port = type "port" { };
      unspecified = type "unspecified" { };
      int = type "int" { };
      float = type "float" { };
      path = type "path" { };
      lines = type "str" { };
      attrs = type "attrs" { };
      ints.positive = type "int" { };
      numbers.positive = type "number" { };
      ints.unsigned = type "int" { };
      ints.between = _: _: type "int" { };
      either = _: _: type "either" { };
      oneOf = _: type "either" { };
      numbers.between = _: _: type "number" { };
      strMatching = _: type "str" { };
      enum = values: type "enum" { inherit values; };
      nullOr = elemType: type "nullOr" { inherit elemType; };
      listOf = elemType: type "listOf" { inherit elemType; };
      attrsOf = elemType: type "attrsOf" { inherit elemType; };
      submodule = module: type "submodule" { inherit module; };
      addCheck = t: _: t;
      # systemd.services' serviceConfig and unitConfig values: lists merge, anything else is one.
      unitOption = type "unitOption" { };
    };
    mkOverride = priority: content: {
      _type = "override";
      inherit priority content;
    };
    mkDefault = mkOverride 1000;
    mkForce = mkOverride 50;
    mkIf = condition: content: {
      _type = "if";
      inherit condition content;
    };
    mkMerge = contents: {
      _type = "merge";
      inherit contents;
    };
    inherit mapAttrs concatLists;
    filterAttrs =
      pred: set:
      listToAttrs (
        concatMap (
          n:
          if pred n set.${n} then
            [
              {
                name = n;
                value = set.${n};
              }
            ]
          else
            [ ]
        ) (attrNames set)
      );
    nameValuePair = name: value: { inherit name value; };
    mapAttrs' = f: set: listToAttrs (map (n: f n set.${n}) (attrNames set));
    mapAttrsToList = f: set: map (n: f n set.${n}) (attrNames set);
    optional = cond: x: if cond then [ x ] else [ ];
    optionals = cond: xs: if cond then xs else [ ];
    optionalAttrs = cond: set: if cond then set else { };
    hasPrefix = prefix: s: substring 0 (stringLength prefix) s == prefix;
    removePrefix =
      prefix: s:
      let
        n = stringLength prefix;
      in
      if substring 0 n s == prefix then substring n (stringLength s - n) s else s;
    getExe' = package: exe: "${package}/bin/${exe}";
    # As NixOS's: the old option stays declared (without effect) and defining it fails an assertion
    # that names it and says what to use instead.
    mkRemovedOptionModule =
      path: replacement:
      { config, ... }:
      let
        name = builtins.concatStringsSep "." path;
        at = builtins.foldl' (v: k: v.${k}) config path;
        # the path's names, innermost first: the option is wrapped in one set per name
        reversed = builtins.genList (i: builtins.elemAt path (builtins.length path - 1 - i)) (
          builtins.length path
        );
      in
      {
        options = builtins.foldl' (inner: k: { ${k} = inner; }) (mkOption {
          type = types.unspecified;
          default = null;
        }) reversed;
        config.assertions = [
          {
            assertion = at == null;
            message = ''
              The option definition `${name}' no longer has any effect; please remove it.
              ${replacement}'';
          }
        ];
      };
  };

  isDerivation = v: isAttrs v && v.type or null == "derivation";
  kind = v: if isAttrs v && !isDerivation v then v._type or null else null;
  unique =
    list:
    attrNames (
      listToAttrs (
        map (name: {
          inherit name;
          value = null;
        }) list
      )
    );

  args = {
    inherit lib pkgs config;
    modulesPath = "/stand-in/nixos/modules";
  };
  load = m: if isFunction m then m args else m;
  # A systemd.services entry as NixOS declares it, with the one definition NixOS makes in every
  # entry that the module reads back: PATH from `path`, bin then sbin (NixOS also appends its
  # default tools to `path`; left out here, nothing reads them).
  serviceEntry =
    { config, ... }:
    let
      list = lib.mkOption {
        type = lib.types.listOf lib.types.unspecified;
        default = [ ];
      };
      directives = lib.mkOption {
        type = lib.types.attrsOf lib.types.unitOption;
        default = { };
      };
    in
    {
      options = {
        description = lib.mkOption {
          type = lib.types.str;
          default = "";
        };
        after = list;
        wants = list;
        before = list;
        wantedBy = list;
        path = list;
        reloadTriggers = list;
        restartTriggers = list;
        restartIfChanged = lib.mkOption {
          type = lib.types.bool;
          default = true;
        };
        environment = lib.mkOption {
          type = lib.types.attrsOf lib.types.str;
          default = { };
        };
        unitConfig = directives;
        serviceConfig = directives;
      };
      config.environment.PATH = lib.mkIf (config.path != [ ]) (
        builtins.concatStringsSep ":" (map (p: "${p}/bin") config.path ++ map (p: "${p}/sbin") config.path)
      );
    };
  # NixOS's options the module reads (services.prometheus.enable, its exporters, services.grafana.enable,
  # each unit's entry as NixOS completes it, systemd.globalEnvironment).
  nixosOptions = {
    options.systemd = {
      services = lib.mkOption {
        type = lib.types.attrsOf (lib.types.submodule serviceEntry);
        default = { };
      };
      globalEnvironment = lib.mkOption {
        type = lib.types.attrsOf lib.types.str;
        default = { };
      };
    };
    options.services = {
      prometheus.enable = lib.mkEnableOption "Prometheus";
      prometheus.port = lib.mkOption {
        type = lib.types.port;
        default = 9090;
      };
      prometheus.scrapeConfigs = lib.mkOption {
        type = lib.types.listOf lib.types.attrs;
        default = [ ];
      };
      prometheus.ruleFiles = lib.mkOption {
        type = lib.types.listOf lib.types.path;
        default = [ ];
      };
      prometheus.exporters = lib.mkOption {
        type = lib.types.attrsOf lib.types.attrs;
        default = { };
      };
      grafana.enable = lib.mkEnableOption "Grafana";
      grafana.provision.enable = lib.mkEnableOption "provisioning";
      grafana.provision.dashboards.settings.providers = lib.mkOption {
        type = lib.types.listOf lib.types.attrs;
        default = [ ];
      };
    };
  };
  # A module and what it imports (paths imported, functions called), depth first.
  expand =
    m:
    let
      r = load (if isPath m || isString m then import m else m);
    in
    [ r ] ++ concatMap expand (r.imports or [ ]);
  parts = map (
    r:
    if r ? options || r ? config then
      {
        options = r.options or { };
        config = r.config or { };
      }
    else
      {
        options = { };
        config = removeAttrs r [
          "imports"
          "_file"
          "key"
        ];
      }
  ) (concatMap expand (modules ++ [ nixosOptions ]));

  # Option declarations of all modules, merged (only nix/module.nix declares any).
  mergeOptions =
    a: b: a // mapAttrs (n: v: if a ? ${n} && kind v != "option" then mergeOptions a.${n} v else v) b;
  options = foldl' mergeOptions { } (map (p: p.options) parts);

  # A definition with the mkIf conditions and priority that apply to it, pushed down from
  # wherever they were written (as NixOS pushes properties down).
  top = {
    conds = [ ];
    priority = 100;
  };
  plain =
    props: v:
    if kind v == "merge" then
      concatMap (plain props) v.contents
    else if kind v == "if" then
      plain (props // { conds = props.conds ++ [ v.condition ]; }) v.content
    else if kind v == "override" then
      plain (props // { inherit (v) priority; }) v.content
    else
      [
        {
          inherit props;
          value = v;
        }
      ];
  defsAt =
    name: defs:
    concatMap (
      d:
      if isAttrs d.value && !isDerivation d.value && d.value ? ${name} then
        plain d.props d.value.${name}
      else
        [ ]
    ) defs;
  active = filter (d: all (c: c) d.props.conds);

  resolveSet =
    opts: defs:
    mapAttrs (
      name: o:
      if kind o == "option" then resolveOption o (defsAt name defs) else resolveSet o (defsAt name defs)
    ) opts;
  submodule =
    module: name: defs:
    let
      evaluated =
        if isFunction module then
          module (
            args
            // {
              inherit name;
              config = result;
            }
          )
        else
          module;
      # the submodule's own definitions (NixOS's in every systemd.services entry) beside the host's
      result = resolveSet evaluated.options (defs ++ plain top (evaluated.config or { }));
    in
    result;
  resolveOption =
    o: defs:
    let
      t = o.type;
      live = active defs;
      best = foldl' (m: d: if d.props.priority < m then d.props.priority else m) 1500 live;
      values = map (d: d.value) (filter (d: d.props.priority == best) live);
      orDefault = if live == [ ] then plain top (o.default or { }) else live;
    in
    if t.name == "submodule" then
      submodule t.module "submodule" orDefault
    else if t.name == "attrsOf" && t.elemType.name == "submodule" then
      listToAttrs (
        map (n: {
          name = n;
          value = submodule t.elemType.module n (defsAt n orDefault);
        }) (unique (concatMap (d: attrNames d.value) orDefault))
      )
    else if t.name == "attrsOf" then
      # each attribute on its own, as NixOS merges them: a host's value for one wins over the
      # module's mkDefault one, and the others stay
      let
        liveAt = n: active (defsAt n orDefault);
        names = filter (n: liveAt n != [ ]) (unique (concatMap (d: attrNames d.value) orDefault));
      in
      listToAttrs (
        map (n: {
          name = n;
          value = resolveOption { type = t.elemType; } (liveAt n);
        }) names
      )
    else if values == [ ] then
      o.default or (throw "nixos-lite: an option nix/module.nix reads has no value and no default")
    else if t.name == "listOf" || (t.name == "unitOption" && all isList values) then
      concatLists values
    else
      head values;

  config = resolveSet options (concatMap (p: plain top p.config) parts);

  # Every string under `v`, walking through mkMerge/mkOverride and into true mkIfs only; a
  # derivation counts as its output path (its context).
  strings =
    v:
    if isString v then
      [ v ]
    else if isList v then
      concatMap strings v
    else if isDerivation v then
      [ "${v}" ]
    else if kind v == "if" then
      (if v.condition then strings v.content else [ ])
    else if kind v == "merge" then
      concatMap strings v.contents
    else if kind v == "override" then
      strings v.content
    else if isAttrs v then
      concatMap strings (attrValues v)
    else
      [ ];
  defined = map (d: d.value) (active (concatMap (p: plain top p.config) parts));
  # What reaches the system: not services.dflash's definitions, not NixOS's assertions and
  # warnings (messages printed at evaluation; a message is read only when it applies).
  outside =
    v:
    removeAttrs v [
      "services"
      "assertions"
      "warnings"
    ]
    // {
      services = removeAttrs (v.services or { }) [ "dflash" ];
    };
  assertions = concatMap (v: if v ? assertions then plainList v.assertions else [ ]) defined;
  plainList = v: concatMap (d: if all (c: c) d.props.conds then d.value else [ ]) (plain top v);
in
{
  inherit config lib;
  strings = concatMap (v: strings (outside v)) defined;
  failedAssertions = map (a: a.message) (filter (a: !a.assertion) assertions);
}
