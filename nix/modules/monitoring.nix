# services.dflash.prometheus and .grafana: where the host runs Prometheus and Grafana, every instance
# with enableMetrics and the router scraped, the alert rules with this host's thresholds, the
# dashboard. The scrape configurations and rules are pure functions in ../lib/monitoring.nix over the
# data `dflashctl monitoring` writes the same files from, for other hosts.
args@{
  config,
  lib,
  pkgs,
  ...
}:
let
  inherit (lib) mkOption types literalExpression;
  inherit (import ./shared.nix args)
    cfg
    instances
    unitStr
    routerSettings
    ;
  monitoring = import ../lib/monitoring.nix;

  pcfg = cfg.prometheus;
  exporters = config.services.prometheus.exporters or { };
  gpuTargets = lib.optionals pcfg.gpuExporters (
    lib.concatLists (
      map (
        e: lib.optional (exporters.${e}.enable or false) "127.0.0.1:${toString exporters.${e}.port}"
      ) monitoring.gpuExporterOptions
    )
  );
  ruleFile = pkgs.writeText "dflash.rules.json" (
    builtins.toJSON (
      monitoring.ruleFile {
        inherit instances;
        inherit (pcfg) minAcceptLength ttftP99Sec alertFor;
      }
    )
  );
  dashboards = pkgs.runCommand "dflash-grafana-dashboards" { } ''
    mkdir $out
    cp ${monitoring.dashboardFile} $out/dflash-host.json
  '';
  names = l: builtins.concatStringsSep ", " l;
  # What Prometheus would refuse in these options (bad durations), or what makes an alert
  # meaningless: refused here as `dflashctl monitoring` refuses it.
  problems = monitoring.problems {
    inherit (pcfg) alertFor minAcceptLength ttftP99Sec;
    intervalSec = pcfg.scrapeIntervalSec;
  };
in
{
  options.services.dflash = {
    prometheus = {
      enable = mkOption {
        type = types.bool;
        default = config.services.prometheus.enable or false;
        defaultText = literalExpression "config.services.prometheus.enable";
        description = ''
          Add to this host's Prometheus (`services.prometheus`) a scrape configuration for every
          instance with {option}`enableMetrics` (its own port, where SGLang serves `/metrics`;
          label `dflash_instance`), for the router's metrics port, and for the host's
          dcgm-exporter or nvidia_gpu_exporter ({option}`gpuExporters`), and the alert rules
          (`dflash.rules.json`, with this host's thresholds). `dflashctl monitoring` writes the same
          files for other hosts; docs/monitoring.md lists the alerts and what each asks you to do.
        '';
      };
      scrapeIntervalSec = mkOption {
        type = types.ints.positive;
        default = monitoring.data.scrapeIntervalSec;
        description = "Scrape interval of the instances, the router and the GPU exporters, in seconds.";
      };
      minAcceptLength = mkOption {
        type = types.attrsOf types.numbers.positive;
        default = { };
        example = {
          qwen3 = 5.0;
        };
        description = ''
          Per speculative instance, the acceptance length below which DflashAcceptanceLow fires (after
          10 minutes while it decodes); at least 1 (SGLang's acceptance length counts the bonus token).
          Default: a quarter of its block ({option}`speculative.numDraftTokens`, else 16 for DFLASH and
          DDTREE, 4 for EAGLE3), at least 1.5.
        '';
      };
      ttftP99Sec = mkOption {
        type = types.numbers.positive;
        default = monitoring.data.thresholds.ttftP99Sec.default;
        description = "Time to first token p99 (over 5 minutes) above which DflashTimeToFirstTokenHigh fires.";
      };
      alertFor = mkOption {
        type = types.attrsOf unitStr;
        default = { };
        example = {
          DflashAcceptanceLow = "30m";
        };
        description = "Another `for:` (how long a condition must hold) for an alert, by name: a Prometheus duration (units y, w, d, h, m, s, ms, largest first: 30m, 1h30m); one Prometheus does not read fails an assertion, as `dflashctl monitoring --alert-for` refuses it.";
      };
      gpuExporters = mkOption {
        type = types.bool;
        default = true;
        description = ''
          Also scrape `services.prometheus.exporters.dcgm` and `.nvidia-gpu` where the host enables
          them (job `dflash-gpus`): the GPU rules read their XID, ECC, row-remapping, throttling and
          memory metrics. Turn it off when the host scrapes them in a job of its own.
        '';
      };
    };
    grafana.enable = mkOption {
      type = types.bool;
      default = config.services.grafana.enable or false;
      defaultText = literalExpression "config.services.grafana.enable";
      description = ''
        Provision the "DFlash host" dashboard in this host's Grafana (`services.grafana`): per instance
        tokens/s, time to first token and inter-token latency, acceptance length, running and queued
        requests, KV-cache usage; the router's requests, retries, responses and workers. It asks for a
        Prometheus data source that scrapes what {option}`services.dflash.prometheus` configures.
      '';
    };
  };

  config = lib.mkMerge [
    (lib.mkIf (pcfg.enable && (instances != { } || cfg.router.enable)) {
      assertions = [
        {
          assertion = builtins.all (n: builtins.elem n monitoring.alertNames) (
            builtins.attrNames pcfg.alertFor
          );
          message = "services.dflash.prometheus.alertFor names an alert that dflash.rules.json does not have; the alerts are ${names monitoring.alertNames}";
        }
        {
          assertion = problems == [ ];
          message = "services.dflash.prometheus: ${builtins.concatStringsSep "; " problems}";
        }
        {
          assertion = builtins.all (n: instances ? ${n}) (builtins.attrNames pcfg.minAcceptLength);
          message = "services.dflash.prometheus.minAcceptLength names an instance that is not enabled here (the instances: ${names (builtins.attrNames instances)})";
        }
      ];
      services.prometheus.scrapeConfigs = monitoring.scrapeConfigs {
        inherit instances gpuTargets;
        router = if cfg.router.enable then routerSettings else null;
        intervalSec = pcfg.scrapeIntervalSec;
      };
      services.prometheus.ruleFiles = [ ruleFile ];
    })
    (lib.mkIf cfg.grafana.enable {
      services.grafana.provision.enable = lib.mkDefault true;
      services.grafana.provision.dashboards.settings.providers = [
        {
          name = "dflash";
          options.path = dashboards;
        }
      ];
    })
  ];
}
