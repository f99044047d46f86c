"""`dflashctl router-unit --instance FILE ...`: the router's systemd unit and settings (hosts without NixOS).

The workers are the instances whose settings files are given (this host's enabled ones), plus any
`remoteWorkers` of other hosts in `--settings`. The directives come from data/router-unit.json (the
Nix twin, nix/lib/router-unit.nix, reads the same file). The unit names no instance: each
instance's unit (`dflashctl unit`) orders itself Before= this one, so the router starts after them
and stops before them, depends on none (it keeps serving while some are down), and its text stays
the same when instances come and go: re-run this for the new settings file, then `systemctl reload`.
"""

import json
import shlex
import sys
from urllib.parse import urlsplit

from dflashctl import cli_help, output
from dflashctl.cli_help import positive_int
from dflashctl.errors import CONFIG, OK, USAGE, DflashError
from dflashctl.operations import router
from dflashctl.operations.unit_data import router_unit_data
from dflashctl.service import config, unit, unit_paths, unit_text

UNIT_NAME = "dflash-router.service"


def _refuse(what: str, why: str, fix: str) -> DflashError:
    return DflashError(what, why, fix, CONFIG)


def settings_for(instances: list[config.InstanceConfig], given: dict) -> dict:
    """The router settings: `given` (any router key, plus remoteWorkers) over the defaults, with the
    instances as workers and their units to order after. Raises DflashError(CONFIG)."""
    given = dict(given)
    remote = given.pop("remoteWorkers", [])
    if "workers" in given:
        raise _refuse("--settings must not list workers", "they are the instances given with --instance",
                      "pass each instance's settings file with --instance; other hosts' workers go in "
                      "remoteWorkers")
    if not isinstance(remote, list):
        raise _refuse("remoteWorkers must be a list of URLs", f"got {json.dumps(remote)[:80]}",
                      'write e.g. "remoteWorkers": ["http://10.0.0.2:30000"]')
    names = [c.name for c in instances]
    if len(set(names)) != len(names):
        raise _refuse("two --instance files name the same instance", ", ".join(sorted(names)),
                      "give each instance once")
    by_url: dict[str, str] = {}
    for c in instances:
        if c.base_url in by_url:
            raise _refuse(f"instances {by_url[c.base_url]!r} and {c.name!r} both listen on {c.base_url}",
                          "the router would send one worker's requests to the other",
                          "give each instance its own port (`dflashctl validate` checks them together)")
        by_url[c.base_url] = c.name
    keys = sorted({c.api_key_file for c in instances if c.api_key_file})
    if len(keys) > 1 or (keys and given.get("apiKeyFile") not in (None, keys[0])):
        raise _refuse("the instances' API keys differ from each other or from the router's",
                      "sglang-router 0.3.2 checks clients against one key (apiKeyFile) and sends that same "
                      f"key to every worker; the files are {', '.join(keys + [given.get('apiKeyFile') or ''])}",
                      "give every instance and the router one apiKeyFile")
    if keys and "apiKeyFile" not in given:
        given["apiKeyFile"] = keys[0]
    settings = {**given, "workers": [c.base_url for c in instances] + remote,
                "instanceUnits": [unit.unit_name(c) for c in instances]}
    cfg = router.from_dict(settings)
    taken = {p: c.name for c in instances for p in (c.port, c.port + config.GRPC_PORT_OFFSET)}
    for key, port in (("port", cfg.port), ("metricsPort", cfg.metrics_port)):
        if port in taken:
            raise _refuse(f"the router's {key} {port} clashes with instance {taken[port]!r}",
                          "an instance uses its port and, for SGLang's gRPC server, port + 10000",
                          f"set {key} in --settings to a free port (default 30080 / 30081)")
    return router.to_dict(cfg)


def _loopback_only(cfg: router.RouterConfig) -> bool:
    hosts = [cfg.host, cfg.metrics_host] + [urlsplit(u).hostname for u in cfg.workers]
    return all(h in router.LOOPBACK for h in hosts)


def render(settings: dict, settings_path: str, dflashctl: str, python: str, systemd: int | None = None) -> str:
    """The unit text of dflash-router.service for `settings` (from settings_for)."""
    data = router_unit_data()
    cfg = router.from_dict(settings)
    unit.check_exec_start({"--dflashctl": dflashctl, "--python": python}, "--settings-path", settings_path)
    unit_section = dict(data["unit"])  # no instance: each orders itself Before= the router
    service = dict(data["service"])
    service["ExecStart"] = unit_text.command_line([dflashctl, "router", "--config", settings_path,
                                                   "--python", python])
    service["ExecReload"] = unit_text.command_line([dflashctl, "router", "--config", settings_path,
                                                    "--python", python, "--sync"])
    service["TimeoutStopSec"] = f"{cfg.drain_sec + data['stopMarginSec']}s"
    service.update(unit.credentials(unit_text.unit_data(), [(data["apiKeyCredential"], cfg.api_key_file),
                                                            (data["adminApiKeyCredential"], cfg.admin_api_key_file)]))
    if _loopback_only(cfg):
        service.update({k: v for k, v in data["ipAddress"].items() if not k.startswith("_")})
    head = ["# Rendered by `dflashctl router-unit` from dflashctl/operations/data/router-unit.json.",
            "# Settings: " + settings_path,
            "# Workers: " + " ".join(cfg.workers)]
    unit_section["Description"] = unit_text.specifiers(unit_section["Description"])
    lines = head + unit._section("Unit", unit_section, data["why"]) + [""] \
        + unit._section("Service", service, data["why"]) + [""] \
        + unit._section("Install", data["install"], data["why"])
    return "\n".join(lines) + "\n"


def register(subparsers) -> None:
    p = subparsers.add_parser("router-unit", help="render the router's unit and settings (hosts without NixOS)",
                              **cli_help.texts("router-unit", __doc__))
    p.add_argument("--instance", action="append", default=[], metavar="FILE",
                   help="an instance's settings JSON (repeat for each instance behind the router; a file "
                        'of {"instances": {...}} gives each of them)')
    p.add_argument("--settings", metavar="FILE",
                   help="router settings JSON to start from (port, keys, policy, remoteWorkers, ...)")
    p.add_argument("--dflashctl", default=None, metavar="PATH",
                   help="absolute path of dflashctl on the host (default: this one)")
    p.add_argument("--python", required=True, metavar="PATH",
                   help="the router environment's interpreter (sglang-router 0.3.2, nix/router-lock.json)")
    p.add_argument("--settings-path", metavar="PATH",
                   help=f"where the router settings will live (default: {router_unit_data()['settingsPath']})")
    p.add_argument("--systemd", type=positive_int, metavar="VERSION",
                   help="target systemd version (default: this host's)")
    p.add_argument("--output", "-o", metavar="PATH", help="write the unit here instead of stdout")
    p.add_argument("--settings-output", metavar="PATH", help="write the router settings here")
    p.set_defaults(func=run)


def run(args) -> int:
    # Every check before anything is written: both outputs, then the settings, then the paths.
    out = output.check(args.output, "--output")
    settings_out = output.check(args.settings_output, "--settings-output")
    if out is not None and settings_out is not None and out.absolute() == settings_out.absolute():
        raise DflashError("--output and --settings-output name the same file", str(out),
                          "give the unit and the router settings a file each", USAGE)
    if not args.instance:
        raise _refuse("no instance given", "the router needs at least one worker",
                      "pass --instance /etc/dflash/<name>.json for each instance of this host")
    instances = [c for f in args.instance for c in config.load_all(f)]
    given = config.read_json(args.settings) if args.settings else {}
    if not isinstance(given, dict):
        raise _refuse(f"{args.settings} is not a JSON object", "router settings are an object",
                      "write e.g. {\"port\": 30080}")
    settings = settings_for(instances, given)
    settings_path = args.settings_path or router_unit_data()["settingsPath"]
    dflashctl, python = unit.host_paths(args.dflashctl, args.python)
    text = render(settings, settings_path, dflashctl, python, args.systemd)
    body = json.dumps(settings, indent=2) + "\n"
    cfg = router.from_dict(settings)
    for w in unit_paths.missing_credentials({"apiKeyFile": cfg.api_key_file,
                                             "adminApiKeyFile": cfg.admin_api_key_file}):
        print(f"dflashctl router-unit: warning: {w}", file=sys.stderr)
    output.write_all([(p, t, flag) for p, t, flag in ((settings_out, body, "--settings-output"),
                                                      (out, text, "--output")) if p is not None])
    if out is None:
        output.emit(text)
    q = shlex.quote
    print("\nInstall on the host (as root):\n"
          + (f"  install -D -m 0644 {q(str(settings_out))} {q(settings_path)}\n" if settings_out else
             f"  install -D -m 0644 /dev/stdin {q(settings_path)} <<'JSON'\n{body}JSON\n")
          + f"  install -m 0644 {q(str(out) if out else UNIT_NAME)} {q('/etc/systemd/system/' + UNIT_NAME)}\n"
          f"  systemctl daemon-reload && systemctl enable --now {UNIT_NAME}\n"
          f"  curl -s {q(cfg.url + '/workers')}   # each instance, is_healthy once it answers /health",
          file=sys.stderr)
    return OK
