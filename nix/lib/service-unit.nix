# One dflash instance as systemd sees it, builtins only: the settings file's content, the unit's
# directives (from the data file `dflashctl unit` renders from), the refusals and warnings that need
# no package, the tmpfiles line of a static user's cache, and the unit's whole systemd.services entry
# with its digest. nix/modules/instances.nix only wires these into NixOS; tier 1
# (tests/nix/test_unit_nix.py) evaluates them with plain `nix eval` and compares each unit, directive
# by directive, with `dflashctl unit`'s.
#
# An instance is the attribute set of its option values (every option set, as the module passes
# them); `user` and `group` (module-only) may be missing, which means DynamicUser.
let
  inherit (builtins)
    attrNames
    concatLists
    concatMap
    concatStringsSep
    elemAt
    filter
    genList
    groupBy
    isAttrs
    isList
    isString
    length
    mapAttrs
    match
    substring
    stringLength
    ;

  unitText = import ./unit-text.nix;
  serviceEntry = import ./service-entry.nix;
  readJSON = path: builtins.fromJSON (builtins.readFile path);
  data = readJSON ../../python/dflashctl/service/data/service-unit.json;
  texts = readJSON ../../python/dflashctl/service/data/warnings.json;

  hasPrefix = p: s: substring 0 (stringLength p) s == p;
  optional = cond: x: if cond then [ x ] else [ ];
  optionalAttrs = cond: attrs: if cond then attrs else { };
  staticUser = i: (i.user or null) != null;
  optionPath = name: "services.dflash.instances.${name}";

  # The settings file's keys and content, from dflashctl's settings schema (settings.json).
  settingsSchema = import ./settings.nix;
  nameRule = settingsSchema.schema.name; # the instance name's pattern, as dflashctl's config.NAME_RE
  # Every string of a value with where it sits ("environment.X", "extraArgs[2]"); names too.
  stringsOf =
    where: v:
    if isString v then
      [
        {
          inherit where;
          value = v;
        }
      ]
    else if isList v then
      concatLists (genList (n: stringsOf "${where}[${toString n}]" (elemAt v n)) (length v))
    else if isAttrs v then
      concatMap (
        k:
        let
          at = if where == "" then k else "${where}.${k}";
        in
        stringsOf "${at} (the name)" k ++ stringsOf at v.${k}
      ) (attrNames v)
    else
      [ ];

  cacheOf = i: unitText.cacheDirDirectives data.cacheDir i.cacheDir (staticUser i);

  credentials =
    i:
    unitText.credentials data.credentialFallback [
      {
        id = data.apiKeyCredential;
        path = i.apiKeyFile;
      }
      {
        id = data.hfTokenCredential;
        path = i.hfTokenFile;
      }
    ];

  # The host directories the service reads (unit.referenced_settings in dflashctl).
  isLocal = model: model != null && builtins.any (p: hasPrefix p model) texts.localModelPrefixes;
  referencedPaths =
    i:
    filter (r: r.path != null) [
      {
        key = "model";
        path = if isLocal i.model then i.model else null;
      }
      {
        key = "draftModel";
        path = if isLocal i.draftModel then i.draftModel else null;
      }
      {
        key = "driverLibraryDir";
        path = i.driverLibraryDir;
      }
    ];

  # A cacheDir directive that the data file also sets (CacheDirectory=%N) gets both values.
  cacheDirectives =
    i:
    mapAttrs (
      k: v:
      if k == "CacheDirectory" then
        [
          data.service.CacheDirectory
          v
        ]
      else
        v
    ) (if cacheOf i == null then { } else cacheOf i);

  # A hub model not pinned to a commit (validate.revision_warnings says the same).
  revisionWarnings =
    name: key: model: rev:
    let
      local = model == null || builtins.any (p: hasPrefix p model) texts.localModelPrefixes;
    in
    if local then
      [ ]
    else if rev == null then
      [
        (unitText.fill texts.revisionMissing {
          inherit name model key;
        })
      ]
    else if match "[0-9a-f]{40}" rev == null then
      [
        (unitText.fill texts.revisionMoves {
          inherit name key rev;
        })
      ]
    else
      [ ];
in
rec {
  inherit data;
  settingsKeys = settingsSchema.keys settingsSchema.schema;

  # The JSON `dflashctl serve --config` reads: the option names as they are, module-only ones out.
  settings = settingsSchema.settingsFile settingsSchema.schema;

  # The instance with the prebuilt kernels (a store path, or null for none) in its environment as
  # DFLASH_PREBUILT_KERNELS, which `dflashctl serve` reads; a value the instance sets itself wins.
  withPrebuiltKernels =
    kernels: i:
    if kernels == null then
      i
    else
      i
      // {
        environment = {
          DFLASH_PREBUILT_KERNELS = "${kernels}";
        }
        // i.environment;
      };

  # { Unit, Service, Install }: directive -> value (a list is one line per element), what
  # `dflashctl unit` writes but its digest line. `dflashctl`, `python` and `settingsFile` are the
  # absolute paths ExecStart runs.
  directives =
    {
      name,
      instance,
      dflashctl,
      python,
      settingsFile,
    }:
    let
      i = instance;
    in
    {
      Unit = {
        Description = unitText.specifiers (
          unitText.fill data.description {
            inherit name;
            inherit (i) model;
          }
        );
      }
      // data.unit;
      Service =
        data.service
        // {
          ExecStart = unitText.commandLine [
            dflashctl
            "serve"
            "--config"
            settingsFile
            "--python"
            python
          ];
          TimeoutStartSec = "${toString (i.startTimeoutSec + data.timeoutStartMarginSec)}s";
        }
        // credentials i
        // cacheDirectives i
        // optionalAttrs (staticUser i) (
          {
            DynamicUser = false;
            User = i.user;
          }
          // optionalAttrs ((i.group or null) != null) { Group = i.group; }
        );
      Install = data.install;
    };

  # The whole systemd.services entry of instance `name`: the directives, `path` (packages whose
  # bin/ NixOS puts on the unit's PATH) and, in its Environment=, the digest of what the unit runs
  # (dflashctl's unit.definition_digest, the same rule): the running process carries it, the unit
  # the current one, and a rollout restarts an instance whose two differ. The digest covers the
  # unit file as NixOS writes it from this entry, so what NixOS itself writes into it is in it
  # too; `nixos` is that, read back from the host's configuration (nix/modules/shared.nix):
  #   environment        the entry's final `environment`: PATH, which NixOS makes of `path` and
  #                      its own default tools, and anything a host adds
  #   restartIfChanged   written as X-RestartIfChanged (nix/modules/rollout.nix decides it)
  #   globalEnvironment  systemd.globalEnvironment, which NixOS writes into every unit
  #                      (LOCALE_ARCHIVE, TZDIR, ...)
  # The settings are in it through settingsFile, a store path that changes with them; the stack
  # through `python`. A host's own definitions of other keys of the unit are not (docs/nix.md).
  entry =
    {
      name,
      instance,
      dflashctl,
      python,
      settingsFile,
      path,
      nixos,
    }:
    let
      own =
        serviceEntry.fromSections (directives {
          inherit
            name
            instance
            dflashctl
            python
            settingsFile
            ;
        })
        // {
          inherit path;
        };
      unit = serviceEntry.written (
        own
        // {
          environment = nixos.globalEnvironment // nixos.environment;
          inherit (nixos) restartIfChanged;
        }
      );
      digest = substring 0 data.digest.hexDigits (builtins.hashString "sha256" (builtins.toJSON unit));
    in
    own
    // {
      serviceConfig = own.serviceConfig // {
        Environment = own.serviceConfig.Environment ++ [ "${data.digest.variable}=${digest}" ];
      };
    };

  # NixOS assertions ({ assertion, message }) of one instance, each naming its option.
  assertions =
    name: i:
    let
      opt = optionPath name;
      inStore = path: path != null && hasPrefix builtins.storeDir path;
    in
    [
      {
        assertion = match nameRule.pattern name != null;
        message = "${opt}: the instance name must be ${nameRule.rule} (it becomes part of the systemd unit name dflash-<name>.service)";
      }
      {
        assertion = !inStore i.apiKeyFile;
        message = "${opt}.apiKeyFile points into the Nix store, which every user can read; keep the key outside the store (e.g. /run/secrets).";
      }
      {
        assertion = !inStore i.hfTokenFile;
        message = "${opt}.hfTokenFile points into the Nix store, which every user can read; keep the token outside the store (e.g. /run/secrets).";
      }
      {
        assertion = (i.user or null) != "root";
        message = "${opt}.user = \"root\" would run SGLang with full privileges; use null (DynamicUser) or an unprivileged user";
      }
    ]
    # What the service reads from the host must be visible in its sandbox (unit_text's rule).
    ++ map (r: {
      assertion = unitText.unitPathProblem data.hidden r.path == null;
      message = "${opt}.${r.key}: ${toString (unitText.unitPathProblem data.hidden r.path)}";
    }) (referencedPaths i)
    # The option types refuse these already; the rule stands here for callers without them.
    ++ map (s: {
      assertion = false;
      message = "${opt}.${s.where}: ${unitText.controlProblem s.value}";
    }) (filter (s: unitText.controlProblem s.value != null) (stringsOf "" (settings name i)))
    ++ (
      if i.cacheDir == null then
        [ ]
      else
        [
          {
            assertion = unitText.cacheDirProblem data.cacheDir data.hidden i.cacheDir == null;
            message = "${opt}.cacheDir: ${
              toString (unitText.cacheDirProblem data.cacheDir data.hidden i.cacheDir)
            }";
          }
          {
            assertion = cacheOf i != null;
            message = "${opt}.cacheDir: ${unitText.cacheDirNeedsUser data.cacheDir i.cacheDir}";
          }
        ]
    );

  # NixOS assertions that the unit can run what ExecStart names (store paths in the module).
  execAssertions =
    name: paths: unitText.pathAssertions data.hidden "${optionPath name} (ExecStart)" paths;

  # systemd chowns a CacheDirectory/StateDirectory to the dynamic user of each start: two
  # DynamicUser instances on one directory would take it from each other. `instances`: the enabled.
  sharedCacheAssertions =
    instances:
    let
      dynamic = filter (n: !staticUser instances.${n} && instances.${n}.cacheDir != null) (
        attrNames instances
      );
      byDir = groupBy (n: instances.${n}.cacheDir) dynamic;
    in
    map (dir: {
      assertion = false;
      message = "services.dflash.instances.{${
        concatStringsSep "," byDir.${dir}
      }}.cacheDir: ${dir} is shared by DynamicUser instances, and systemd gives it to one dynamic user at a time; give each its own cacheDir, or run them as one static user";
    }) (filter (dir: length byDir.${dir} > 1) (attrNames byDir));

  # Allowed but probably unwanted: the texts of `dflashctl validate`'s warnings (warnings.json).
  warnings =
    name: i:
    optional (i.grammarBackend == "none") (unitText.fill texts.grammarNone { inherit name; })
    ++ optional (builtins.elem i.host texts.wildcardHosts && i.apiKeyFile == null) (
      unitText.fill texts.openWithoutKey {
        inherit name;
        inherit (i) host;
      }
    )
    ++ revisionWarnings name "modelRevision" i.model i.modelRevision
    ++ revisionWarnings name "draftModelRevision" i.draftModel i.draftModelRevision;

  # A static user's cacheDir outside /var/cache and /var/lib, created and owned for it by
  # systemd-tmpfiles. `group`: the primary group the user runs with.
  tmpfiles =
    i: group:
    optional (staticUser i && i.cacheDir != null && (cacheOf i) ? ReadWritePaths) (
      unitText.tmpfilesLine data.cacheDir i.cacheDir i.user group
    );
}
