# services.dflash.prometheus, builtins only: what a host's Prometheus scrapes and the rules it loads,
# from python/dflashctl/operations/data/monitoring/ (the files `dflashctl monitoring` renders from;
# tests/operations/test_monitoring.py holds this and operations/monitoring.py to one result). `instances`: the
# enabled instances (name -> options); `router`: the router settings or null.
let
  dataDir = ../../python/dflashctl/operations/data/monitoring;
  data = builtins.fromJSON (builtins.readFile (dataDir + "/monitoring.json"));
  alertRules = builtins.fromJSON (builtins.readFile (dataDir + "/dflash.rules.json"));
  accept = data.thresholds.acceptLengthMin;
  label = data.instanceLabel;
  concatMap = f: l: builtins.concatLists (map f l);
  optional = cond: x: if cond then [ x ] else [ ];

  scraped =
    instances: builtins.filter (n: instances.${n}.enableMetrics) (builtins.attrNames instances);
  # As a client on this host reaches it: a wildcard address through loopback.
  target =
    host: port:
    let
      h =
        {
          "0.0.0.0" = "127.0.0.1";
          "::" = "::1";
        }
        .${host} or host;
    in
    if builtins.match ".*:.*" h != null then "[${h}]:${toString port}" else "${h}:${toString port}";
  # Floats as text, as operations/monitoring.py writes them (`%f`).
  number = x: toString (x * 1.0);

  blockSize =
    i: drafterBlock:
    let
      algorithm = i.speculative.algorithm;
    in
    if algorithm == null then
      null
    else if i.speculative.numDraftTokens != null then
      i.speculative.numDraftTokens
    else if
      drafterBlock != null
      && builtins.elem algorithm [
        "DFLASH"
        "DDTREE"
      ]
    then
      drafterBlock
    else
      accept.blockSizeIfUnset.${algorithm};
  defaultMinAcceptLength =
    block:
    let
      v = block * accept.blockFraction;
    in
    if v > accept.floor then v else accept.floor * 1.0;
in
{
  inherit data alertRules;
  dashboardFile = dataDir + "/grafana-dashboard.json";
  # NixOS's exporter modules the GPU rules read (services.prometheus.exporters.<name>).
  gpuExporterOptions = [
    "dcgm"
    "nvidia-gpu"
  ];
  alertNames = concatMap (g: concatMap (r: optional (r ? alert) r.alert) g.rules) alertRules.groups;

  # services.prometheus.scrapeConfigs entries. `gpuTargets`: exporters' host:port to scrape too.
  scrapeConfigs =
    {
      instances,
      router ? null,
      gpuTargets ? [ ],
      intervalSec ? null,
    }:
    let
      interval = "${toString (if intervalSec == null then data.scrapeIntervalSec else intervalSec)}s";
      job = name: staticConfigs: {
        job_name = name;
        scrape_interval = interval;
        metrics_path = "/metrics";
        static_configs = staticConfigs;
      };
      names = scraped instances;
    in
    optional (names != [ ]) (
      job data.jobs.instances (
        map (n: {
          targets = [ (target instances.${n}.host instances.${n}.port) ];
          labels.${label} = n;
        }) names
      )
    )
    ++ optional (router != null) (
      job data.jobs.router [ { targets = [ (target router.metricsHost router.metricsPort) ]; } ]
    )
    ++ optional (gpuTargets != [ ]) (job data.jobs.gpus [ { targets = gpuTargets; } ]);

  # The rule file: the thresholds (one recorded series each, per scraped instance), then
  # dflash.rules.json with `alertFor` (alert name -> duration) as their `for:`.
  ruleFile =
    {
      instances,
      drafterBlocks ? { },
      minAcceptLength ? { },
      ttftP99Sec ? null,
      alertFor ? { },
    }:
    let
      ttft = if ttftP99Sec == null then data.thresholds.ttftP99Sec.default else ttftP99Sec;
      thresholds = concatMap (
        n:
        let
          block = blockSize instances.${n} (drafterBlocks.${n} or null);
        in
        optional (block != null) {
          record = accept.record;
          expr = "vector(${number (minAcceptLength.${n} or (defaultMinAcceptLength block))})";
          labels.${label} = n;
        }
        ++ [
          {
            record = data.thresholds.ttftP99Sec.record;
            expr = "vector(${number ttft})";
            labels.${label} = n;
          }
        ]
      ) (scraped instances);
    in
    {
      groups = [
        {
          name = data.thresholdsGroup;
          rules = thresholds;
        }
      ]
      ++ map (
        g:
        g
        // {
          rules = map (
            r: if r ? alert && alertFor ? ${r.alert} then r // { for = alertFor.${r.alert}; } else r
          ) g.rules;
        }
      ) alertRules.groups;
    };
}
