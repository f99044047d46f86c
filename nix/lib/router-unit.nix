# The router in front of a host's instances as systemd sees it, builtins only: the directives of
# dflash-router.service from the data file `dflashctl router-unit` renders from
# (python/dflashctl/service/data/router-unit.json). Not wired into nix/module.nix yet; tier 1
# (tests/test_router.py) evaluates it with plain `nix eval` and compares it, directive by directive,
# with `dflashctl router-unit`'s unit.
#
# `settings` is the router settings file's content (every key, as `dflashctl router-unit` writes it:
# workers, instanceUnits, host, metricsHost, drainSec, apiKeyFile, adminApiKeyFile, ...).
let
  inherit (builtins)
    all
    elem
    filter
    match
    ;

  unitText = import ./unit-text.nix;
  data = builtins.fromJSON (builtins.readFile ../../python/dflashctl/service/data/router-unit.json);
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
    s: all (h: elem h loopback) ([ s.host s.metricsHost ] ++ map urlHost s.workers);

  credentials =
    s:
    optional (
      s.apiKeyFile != null
    ) "${data.apiKeyCredential}:${unitText.specifiers s.apiKeyFile}"
    ++ optional (
      s.adminApiKeyFile != null
    ) "${data.adminApiKeyCredential}:${unitText.specifiers s.adminApiKeyFile}";

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
in
{
  inherit data;

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
      Unit = data.unit // {
        Description = unitText.specifiers data.unit.Description;
        After = data.unit.After ++ s.instanceUnits;
        Wants = data.unit.Wants ++ s.instanceUnits;
      };
      Service =
        data.service
        // {
          ExecStart = command paths [ ];
          ExecReload = command paths [ "--sync" ];
          TimeoutStopSec = "${toString (s.drainSec + data.stopMarginSec)}s";
        }
        // optionalAttrs (credentials s != [ ]) { LoadCredential = credentials s; }
        // optionalAttrs (loopbackOnly s) (
          removeAttrs data.ipAddress (filter (k: match "_.*" k != null) (builtins.attrNames data.ipAddress))
        );
      Install = data.install;
    };
}
