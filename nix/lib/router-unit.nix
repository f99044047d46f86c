# The router in front of a host's instances as systemd sees it, builtins only: the directives of
# dflash-router.service from the data file `dflashctl router-unit` renders from
# (python/dflashctl/operations/data/router-unit.json), the router settings file for a host's
# instances and the refusals that need no package, for nix/modules/router.nix (services.dflash.router).
# Tier 1 (tests/operations/test_router.py) evaluates it with plain `nix eval` and compares the settings with
# `dflashctl router-unit`'s and the directives, directive by directive, with its unit.
#
# A settings file's content holds every key, as `dflashctl router-unit` writes it: workers,
# instanceUnits, host, metricsHost, drainSec, apiKeyFile, adminApiKeyFile, ...
#
# The unit's text depends on the router's settings and packages only, never on which instances
# there are (they order themselves Before= it, nix/lib/service-unit.nix): instances added or
# removed change the workers alone, which `triggers` makes a reload.
let
  inherit (builtins)
    all
    attrNames
    concatMap
    elem
    filter
    head
    listToAttrs
    match
    ;

  unitText = import ./unit-text.nix;
  serviceEntry = import ./service-entry.nix;
  data = builtins.fromJSON (
    builtins.readFile ../../python/dflashctl/operations/data/router-unit.json
  );
  # The sandbox's hidden directories and the credential fallback: one text for both units.
  serviceData = builtins.fromJSON (
    builtins.readFile ../../python/dflashctl/service/data/service-unit.json
  );
  loopback = [
    "127.0.0.1"
    "localhost"
    "::1"
  ];
  optional = cond: x: if cond then [ x ] else [ ];
  optionalAttrs = cond: attrs: if cond then attrs else { };

  # The host of "http://HOST:PORT" or "http://[V6]:PORT" (router.py checks the form).
  urlHost =
    url:
    let
      v6 = match "https?://\\[([^]]+)].*" url;
      v4 = match "https?://([^/:]+).*" url;
    in
    if v6 != null then builtins.head v6 else builtins.head v4;

  loopbackOnly =
    s:
    all (h: elem h loopback) (
      [
        s.host
        s.metricsHost
      ]
      ++ map urlHost s.workers
    );

  credentials =
    s:
    unitText.credentials serviceData.credentialFallback [
      {
        id = data.apiKeyCredential;
        path = s.apiKeyFile;
      }
      {
        id = data.adminApiKeyCredential;
        path = s.adminApiKeyFile;
      }
    ];

  command =
    {
      dflashctl,
      python,
      settingsFile,
    }:
    extra:
    unitText.commandLine (
      [
        dflashctl
        "router"
        "--config"
        settingsFile
        "--python"
        python
      ]
      ++ extra
    );
  # The settings a host sets (router-unit.json's defaults name them); workers come from instances.
  settingKeys = attrNames data.defaults ++ [
    "apiKeyFile"
    "adminApiKeyFile"
    "logLevel"
    "extraArgs"
  ];
  # An instance's URL as the router reaches it (config.InstanceConfig.base_url).
  baseUrl =
    i:
    let
      host =
        {
          "0.0.0.0" = "127.0.0.1";
          "::" = "::1";
        }
        .${i.host} or i.host;
    in
    if match ".*:.*" host != null then
      "http://[${host}]:${toString i.port}"
    else
      "http://${host}:${toString i.port}";
  instanceKeys =
    instances:
    builtins.sort (a: b: a < b) (
      attrNames (
        listToAttrs (
          concatMap (
            n:
            optional (instances.${n}.apiKeyFile != null) {
              name = instances.${n}.apiKeyFile;
              value = null;
            }
          ) (attrNames instances)
        )
      )
    );
in
rec {
  inherit data;

  # The router settings file in front of `instances` (the enabled ones: name -> options), from
  # `router` (services.dflash.router: every setting, plus remoteWorkers), as `dflashctl router-unit`
  # writes it: the instances' URLs then the remote workers, their units to order after, and the
  # instances' API key (sglang-router 0.3.2 sends the one key it checks to every worker).
  settings =
    router: instances:
    let
      keys = instanceKeys instances;
    in
    listToAttrs (
      map (k: {
        name = k;
        value = router.${k};
      }) settingKeys
    )
    // {
      workers = map (n: baseUrl instances.${n}) (attrNames instances) ++ router.remoteWorkers;
      instanceUnits = map (n: "dflash-${n}.service") (attrNames instances);
      apiKeyFile =
        if router.apiKeyFile != null then
          router.apiKeyFile
        else if keys != [ ] then
          head keys
        else
          null;
    };

  # NixOS assertions of the router in front of `instances` (the rules of `dflashctl router-unit`).
  assertions =
    router: instances:
    let
      keys = instanceKeys instances;
      taken = concatMap (
        n:
        map
          (port: {
            inherit port;
            name = n;
          })
          [
            instances.${n}.port
            (instances.${n}.port + 10000)
          ]
      ) (attrNames instances);
      clash = key: filter (t: t.port == router.${key}) taken;
    in
    [
      {
        assertion = instances != { } || router.remoteWorkers != [ ];
        message = "services.dflash.router: no workers; enable an instance (services.dflash.instances) or list remoteWorkers";
      }
      {
        assertion =
          builtins.length keys <= 1
          && (
            keys == [ ]
            || elem router.apiKeyFile [
              null
              (head keys)
            ]
          );
        message = "services.dflash.router.apiKeyFile: the instances' API keys differ from each other or from the router's (${toString keys}); sglang-router 0.3.2 checks clients against one key and sends that same key to every worker, so give every instance and the router one apiKeyFile";
      }
    ]
    ++
      map
        (key: {
          assertion = clash key == [ ];
          message = "services.dflash.router.${key}: ${toString router.${key}} clashes with instance '${(head (clash key)).name}' (an instance uses its port and, for SGLang's gRPC server, port + 10000); choose a free port";
        })
        [
          "port"
          "metricsPort"
        ];

  # What a running router takes without a restart: `systemctl reload` (ExecReload, `dflashctl
  # router --sync`) makes its workers the settings' workers through the admin API. Everything else
  # in the settings it reads at start. instanceUnits (which unit serves which worker, for tools)
  # neither reads, so it triggers nothing. `entry` gives these as the unit's reloadTriggers and
  # restartTriggers: NixOS restarts a unit whose file changed, unless only X-Reload-Triggers did.
  triggers = settings: {
    reload = [ (builtins.toJSON settings.workers) ];
    restart = [
      (builtins.toJSON (
        removeAttrs settings [
          "workers"
          "instanceUnits"
        ]
      ))
    ];
  };

  # NixOS assertions that the unit can run what ExecStart names (`dflashctl router-unit`'s rule).
  execAssertions =
    paths: unitText.pathAssertions serviceData.hidden "services.dflash.router (ExecStart)" paths;

  # { Unit, Service, Install }: directive -> value (a list is one line per element). `dflashctl`,
  # `python` (the router environment's interpreter) and `settingsFile` are absolute paths.
  directives =
    {
      settings,
      dflashctl,
      python,
      settingsFile,
    }:
    let
      s = settings;
      paths = { inherit dflashctl python settingsFile; };
    in
    {
      # No instance here: each instance's unit orders itself Before= the router.
      Unit = data.unit // {
        Description = unitText.specifiers data.unit.Description;
      };
      Service =
        data.service
        // {
          ExecStart = command paths [ ];
          ExecReload = command paths [ "--sync" ];
          TimeoutStopSec = "${toString (s.drainSec + data.stopMarginSec)}s";
        }
        // credentials s
        // optionalAttrs (loopbackOnly s) (
          removeAttrs data.ipAddress (filter (k: match "_.*" k != null) (builtins.attrNames data.ipAddress))
        );
      Install = data.install;
    };

  # The whole systemd.services entry of dflash-router.service (nix/modules/router.nix defines
  # nothing else for it): the directives and the triggers. Same arguments as `directives`.
  entry =
    args:
    serviceEntry.fromSections (directives args)
    // {
      reloadTriggers = (triggers args.settings).reload;
      restartTriggers = (triggers args.settings).restart;
    };
}
