# services.dflash.router: SGLang's router (sglang-router, pinned in nix/router-lock.json) in front of
# every enabled instance, as dflash-router.service. Its unit, its settings file and its refusals are
# pure functions in ../lib/router-unit.nix (tier 1 evaluates them without nixpkgs); its settings
# live in /etc, so a change of workers alone reloads it (`dflashctl router --sync`), anything else
# restarts it; `dflashctl router --dry-run` checks them at build time.
args@{
  config,
  lib,
  pkgs,
  ...
}:
let
  inherit (lib) mkOption types;
  inherit (import ./shared.nix args)
    cfg
    instances
    dflashctl
    unitStr
    routerSettings
    routerSettingsPath
    ;
  routerUnit = import ../lib/router-unit.nix;
  serviceEntry = import ../lib/service-entry.nix;

  rcfg = cfg.router;
  python = "${rcfg.package}/bin/python";
  settingsFile = pkgs.writeText "dflash-router.json" (builtins.toJSON routerSettings);
  check = pkgs.runCommand "dflash-validate-router" { } ''
    ${dflashctl} router --config ${settingsFile} --python ${python} --dry-run >/dev/null
    touch $out
  '';
  paths = {
    inherit dflashctl python;
    settingsFile = routerSettingsPath;
  };

  # A setting with the measured default of the data file (docs/service.md, "Router").
  setting =
    type: key: description:
    mkOption {
      inherit type description;
      default = routerUnit.data.defaults.${key};
    };
in
{
  options.services.dflash.router = {
    enable = mkOption {
      type = types.bool;
      default = false;
      description = ''
        Run SGLang's router (sglang-router, pinned in nix/router-lock.json) as
        `dflash-router.service`: one endpoint in front of every enabled instance, which health-checks
        them, retries a request on another instance and re-admits a restarted one. Its defaults
        were chosen by measurement (docs/service.md, "Router").
      '';
    };
    package = lib.mkPackageOption pkgs "dflash-router-env" { } // {
      description = "Python environment with the pinned router (this flake's `dflash-router-env`).";
    };
    host = setting unitStr "host" "Address clients connect to (`--host`).";
    port = setting types.port "port" "Port clients connect to; not an instance's port.";
    metricsHost = setting unitStr "metricsHost" "Address of the Prometheus metrics.";
    metricsPort = setting types.port "metricsPort" "Port of the Prometheus metrics.";
    policy = setting (types.enum [
      "round_robin"
      "cache_aware"
      "power_of_two"
      "random"
    ]) "policy" "How requests are spread over the workers (`--policy`).";
    healthCheckIntervalSec =
      setting types.ints.positive "healthCheckIntervalSec"
        "Seconds between health checks of each worker.";
    healthCheckTimeoutSec =
      setting types.ints.positive "healthCheckTimeoutSec"
        "Seconds a worker's `/health` may take (at least 2: SGLang's takes about 1 s under load).";
    healthFailureThreshold =
      setting types.ints.positive "healthFailureThreshold"
        "Failed checks in a row that take a worker out.";
    healthSuccessThreshold =
      setting types.ints.positive "healthSuccessThreshold"
        "Passed checks in a row that bring a worker back.";
    circuitBreakerFailures =
      setting types.ints.positive "circuitBreakerFailures"
        "Failed requests in a row that open a worker's circuit breaker.";
    circuitBreakerOpenSec =
      setting types.ints.positive "circuitBreakerOpenSec"
        "Seconds an open circuit breaker keeps a worker out.";
    retries = setting types.ints.unsigned "retries" "Retries of a failed request on other workers.";
    requestTimeoutSec =
      setting types.ints.positive "requestTimeoutSec"
        "Seconds a request may take before the router gives up on it (a hung GPU).";
    workerStartupTimeoutSec =
      setting types.ints.positive "workerStartupTimeoutSec"
        "Seconds a worker down at the router's start is waited for (after that 0.3.2 never adds it).";
    drainSec =
      setting types.ints.unsigned "drainSec"
        "Seconds the router lets requests in flight finish when stopped (`TimeoutStopSec` is above it).";
    apiKeyFile = mkOption {
      type = types.nullOr unitStr;
      default = null;
      example = "/run/secrets/dflash-api-key";
      description = ''
        Clients' API key (`Authorization: Bearer`), read through `LoadCredential`. `null`: the
        instances' own apiKeyFile if they have one (they must share it: sglang-router 0.3.2 sends
        the key it checks to every worker).
      '';
    };
    adminApiKeyFile = mkOption {
      type = types.nullOr unitStr;
      default = null;
      example = "/run/secrets/dflash-router-admin";
      description = ''
        Key of the router's admin API (`/workers`: adding and removing workers), read through
        `LoadCredential`. Required when {option}`host` is not a loopback address.
      '';
    };
    logLevel = mkOption {
      type = types.enum [
        "debug"
        "info"
        "warn"
        "error"
      ];
      default = "info";
      description = "The router's log level.";
    };
    remoteWorkers = mkOption {
      type = types.listOf unitStr;
      default = [ ];
      example = [ "http://10.0.0.2:30000" ];
      description = "Instances of other hosts to route to as well, as `http://HOST:PORT`.";
    };
    extraArgs = mkOption {
      type = types.listOf unitStr;
      default = [ ];
      description = "Further sglang-router flags; flags a setting above owns are refused at build time.";
    };
    openFirewall = mkOption {
      type = types.bool;
      default = false;
      description = "Open {option}`port` in `networking.firewall.allowedTCPPorts`.";
    };
  };

  config = lib.mkIf rcfg.enable {
    assertions = routerUnit.assertions rcfg instances ++ routerUnit.execAssertions paths;
    system.checks = [ check ];
    environment.etc.${lib.removePrefix "/etc/" routerSettingsPath}.source = settingsFile;
    # The whole unit, its triggers included: workers added or removed (instances, their ports,
    # remoteWorkers) reload it, with no dropped request; any other setting restarts it.
    systemd.services.dflash-router = serviceEntry.withDefaults lib.mkDefault (
      routerUnit.entry (paths // { settings = routerSettings; })
    );
    networking.firewall.allowedTCPPorts = lib.optional rcfg.openFirewall rcfg.port;
  };
}
