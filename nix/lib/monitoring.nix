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

  # Prometheus' durations as prometheus/common's ParseDuration reads them (operations/promcheck.py
  # is the twin): units y w d h m s ms, largest first, each at most once, whole numbers, "0" alone,
  # at most 2^63-1 ns. The parts are summed without a Nix integer ever overflowing.
  maxNs = 9223372036854775807;
  unitNs = [
    31536000000000000
    604800000000000
    86400000000000
    3600000000000
    60000000000
    1000000000
    1000000
  ];
  partNs =
    digits: ns:
    let
      d = builtins.head (builtins.match "0*([0-9]+)" digits);
      n = builtins.fromJSON d;
    in
    if builtins.stringLength d > 13 || n > maxNs / ns then null else n * ns;
  addNs = acc: x: if acc == null || x == null || acc > maxNs - x then null else acc + x;
  durationProblem =
    d:
    let
      m = builtins.match "(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?" d;
      digits = builtins.genList (i: builtins.elemAt m (2 * i + 1)) 7;
      total = builtins.foldl' addNs 0 (
        builtins.genList (
          i:
          let
            g = builtins.elemAt digits i;
          in
          if g == null then 0 else partNs g (builtins.elemAt unitNs i)
        ) 7
      );
    in
    if d == "0" then
      null
    else if d == "" then
      "an empty duration"
    else if m == null then
      "\"${d}\" is not a duration Prometheus reads (whole numbers with the units y, w, d, h, m, s, ms, largest first, each once: 30s, 10m, 1h30m)"
    else if total == null then
      "\"${d}\" is out of range (Prometheus' durations end at about 292 years)"
    else
      null;
in
{
  inherit data alertRules durationProblem;
  dashboardFile = dataDir + "/grafana-dashboard.json";
  # NixOS's exporter modules the GPU rules read (services.prometheus.exporters.<name>).
  gpuExporterOptions = [
    "dcgm"
    "nvidia-gpu"
  ];
  alertNames = concatMap (g: concatMap (r: optional (r ? alert) r.alert) g.rules) alertRules.groups;

  # What Prometheus would refuse, or what would make an alert meaningless, in the module's
  # options (the module asserts it is empty; `dflashctl monitoring` refuses the same values).
  problems =
    {
      alertFor ? { },
      minAcceptLength ? { },
      ttftP99Sec ? null,
      intervalSec ? null,
    }:
    concatMap (
      n:
      let
        p = durationProblem alertFor.${n};
      in
      optional (p != null) "alertFor.${n}: ${p}"
    ) (builtins.attrNames alertFor)
    ++ concatMap (
      n:
      optional (minAcceptLength.${n} < 1)
        "minAcceptLength.${n}: ${number minAcceptLength.${n}} is below 1 (SGLang's acceptance length counts the bonus token)"
    ) (builtins.attrNames minAcceptLength)
    ++ optional (
      ttftP99Sec != null && number ttftP99Sec == number 0
    ) "ttftP99Sec: ${toString ttftP99Sec} rounds to 0 at six decimals"
    ++ optional (
      intervalSec != null && durationProblem "${toString intervalSec}s" != null
    ) "scrapeIntervalSec: ${durationProblem "${toString intervalSec}s"}";

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
