"""`dflashctl unit --config FILE`: the systemd unit of one instance, for hosts without NixOS.

The directives come from data/service-unit.json, the same file the NixOS module reads, so the two
units cannot drift. One unit per instance (dflash-<name>.service), as instances are one per GPU set.
"""

import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys

from dflashctl import cli_help, output
from dflashctl.cli_help import positive_int
from dflashctl.errors import CONFIG, OK, DflashError
from dflashctl.host import hub_cache
from dflashctl.service import config, unit_paths, unit_text
from dflashctl.service.instance_control import DIGEST_VAR
from dflashctl.service.unit_text import unit_data

def unit_name(cfg: config.InstanceConfig) -> str:
    return f"dflash-{cfg.name}.service"


def systemd_version() -> int | None:
    try:
        out = subprocess.run(["systemctl", "--version"], capture_output=True, text=True,
                             timeout=5).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.match(r"systemd (\d+)", out)
    return int(m.group(1)) if m else None


def _value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def _section(name: str, directives: dict, why: dict) -> list[str]:
    lines = [f"[{name}]"]
    for key, value in directives.items():
        if key in why:
            lines.append(f"# {key}: {why[key]}")
        for v in value if isinstance(value, list) else [value]:
            lines.append(f"{key}={_value(v)}")
    return lines


def _refuse(what: str, why: str, fix: str, setting: str | None = None) -> DflashError:
    e = DflashError(what, why, fix, CONFIG)
    e.setting = setting  # the option it names (the module's assertion names the same)
    return e


def check_exec_start(paths: dict[str, str | None], settings_flag: str, settings_path: str) -> None:
    """Refuse what cannot go into an ExecStart: an executable (`paths`: flag -> path, None for one
    left out) systemd would refuse or expand; a settings path with a control character, relative,
    or hidden (unit_text.unit_path_problem). Where the executables live is host_paths' question."""
    for flag, path in paths.items():
        bad = path is not None and unit_text.exec_path_problem(path)
        if bad:
            raise _refuse(f"{flag} {path!r} cannot go into ExecStart", bad,
                          f"pass {flag} as a plain absolute path, e.g. /opt/dflash/bin/dflashctl")
    bad = unit_text.control_problem(settings_path) or unit_text.unit_path_problem(settings_path)
    if bad:
        raise _refuse(f"{settings_flag} {settings_path!r} cannot go into ExecStart", bad,
                      f"pass {settings_flag} an absolute path the service can read, e.g. under /etc "
                      "(the default)")


def referenced_settings(cfg: config.InstanceConfig) -> list[tuple[str, str]]:
    """(option, path) for the host directories the service reads: local models, the driver's."""
    out = [(key, model) for key, model in (("model", cfg.model), ("draftModel", cfg.draft_model))
           if model is not None and hub_cache.is_local(model)]
    return out + ([("driverLibraryDir", cfg.driver_library_dir)] if cfg.driver_library_dir else [])


def check_settings_paths(cfg: config.InstanceConfig) -> None:
    for key, path in referenced_settings(cfg):
        bad = unit_text.unit_path_problem(path)
        if bad:
            raise _refuse(f"{key} of instance {cfg.name!r} cannot be used by this unit", bad,
                          f"move it where the service can read it (e.g. under /srv or /var/lib) and set "
                          f"{key} to that absolute path", key)


def credentials(data: dict, pairs: list[tuple[str, str | None]]) -> dict:
    """LoadCredential= for each (credential id, file) given, each with a SetCredential= fallback:
    systemd then starts the service with the fallback's text where it cannot read the file, and
    the service names the file (serve.read_credential) instead of systemd failing the unit at its
    credentials step (243/CREDENTIALS, "Protocol error") before anything can say which file."""
    given = [(cid, path) for cid, path in pairs if path]
    if not given:
        return {}
    return {"LoadCredential": [f"{cid}:{unit_text.specifiers(path)}" for cid, path in given],
            "SetCredential": [f"{cid}:{data['credentialFallback']}" for cid, _ in given]}


def definition_digest(written: dict) -> str:
    """What the unit runs, as one value (instance_control.py): the start of the sha256 of the
    unit's lines as written, {"Unit": ..., "Service": ..., "Install": ...} (directive -> value, or
    the list of a directive's values), its own digest line left out. `render` adds "settings"
    where the unit names its settings by a path whose content can change (/etc/dflash/<name>.json).
    The running process carries the digest in its environment, so a rollout can tell whether the
    process runs the unit's current definition. nix/lib/service-unit.nix applies the same rule to
    the unit NixOS writes (its settings file is a store path: ExecStart says it all)."""
    canonical = json.dumps(written, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()[:unit_data()["digest"]["hexDigits"]]


def render(cfg: config.InstanceConfig, config_path: str, dflashctl: str, python: str | None = None,
           systemd: int | None = None) -> str:
    """The unit text (DynamicUser). `systemd`: the host's version; directives it lacks are left out.

    Every value is escaped by unit_text's rules; what cannot be escaped raises DflashError(CONFIG).
    """
    data = unit_data()
    check_exec_start({"--dflashctl": dflashctl, "--python": python}, "--config-path", config_path)
    service = dict(data["service"])
    argv = [dflashctl, "serve", "--config", config_path] + (["--python", python] if python else [])
    service["ExecStart"] = unit_text.command_line(argv)
    service["TimeoutStartSec"] = f"{cfg.start_timeout_sec + data['timeoutStartMarginSec']}s"
    service.update(credentials(data, [(data["apiKeyCredential"], cfg.api_key_file),
                                      (data["hfTokenCredential"], cfg.hf_token_file)]))
    check_settings_paths(cfg)
    try:
        # The sandbox decides where a cache can live (serve outside systemd may use any path).
        bad = cfg.cache_dir is not None and unit_text.cache_dir_problem(cfg.cache_dir, data["cacheDir"])
        if bad:
            raise ValueError(bad)
        cache = unit_text.cache_dir_directives(cfg.cache_dir, data["cacheDir"], static_user=False)
    except ValueError as e:
        raise _refuse(f"cacheDir of instance {cfg.name!r} cannot be used by this unit", str(e),
                      "set cacheDir under /var/cache (or leave it null: /var/cache/dflash-<name>)", "cacheDir")
    for key, value in cache.items():
        if key in service and not key.endswith("Mode"):
            value = [service[key], value]
        service[key] = value
    dropped = [k for k, v in data["minSystemd"].items() if systemd is not None and systemd < v]
    for key in dropped:
        service.pop(key, None)
    head = [f"# Rendered by `dflashctl unit` from dflashctl/service/data/service-unit.json for instance {cfg.name!r}.",
            "# Settings: " + config_path]
    if dropped:
        head.append(f"# Left out for systemd {systemd}: " + ", ".join(dropped))
    description = unit_text.fill(data["description"], name=cfg.name, model=cfg.model)
    unit = {"Description": unit_text.specifiers(description), **data["unit"]}
    digest = definition_digest({"Unit": unit, "Service": service, "Install": data["install"],
                                "settings": config.to_dict(cfg)})
    service["Environment"] = service["Environment"] + [f"{DIGEST_VAR}={digest}"]
    lines = head + _section("Unit", unit, data["why"]) + [""] \
        + _section("Service", service, data["why"]) + [""] \
        + _section("Install", data["install"], data["why"])
    return "\n".join(lines) + "\n"


def register(subparsers) -> None:
    p = subparsers.add_parser("unit", help="render the systemd unit of one instance (hosts without NixOS)",
                              **cli_help.texts("unit", __doc__))
    p.add_argument("--config", required=True, metavar="FILE",
                   help='the instance\'s settings JSON, or {"instances": {...}} with --name')
    p.add_argument("--name", help="instance name: the one to render from a file of several instances, "
                                  "or a new name for a file of one (default: the settings' name)")
    p.add_argument("--dflashctl", default=None, metavar="PATH",
                   help="absolute path of dflashctl on the host (default: this one)")
    p.add_argument("--python", metavar="PATH", help="the stack's interpreter, if not dflashctl's own")
    p.add_argument("--config-path", metavar="PATH",
                   help="where the settings will live on the host (default: /etc/dflash/<name>.json)")
    p.add_argument("--systemd", type=positive_int, metavar="VERSION",
                   help="target systemd version (default: this host's)")
    p.add_argument("--output", "-o", metavar="PATH", help="write the unit here instead of stdout")
    p.set_defaults(func=run)


def default_dflashctl() -> str:
    """This dflashctl as the shell found it (symlinks are followed by the path rule, unit_paths)."""
    exe = sys.argv[0] if sys.argv and sys.argv[0] else ""
    if os.path.basename(exe) == "dflashctl" and os.path.exists(exe):
        return os.path.abspath(exe)
    found = shutil.which("dflashctl")
    if found:
        return os.path.abspath(found)
    raise DflashError("cannot tell where dflashctl is installed", "it is not on PATH",
                      "pass --dflashctl /absolute/path/to/dflashctl", CONFIG)


def host_paths(dflashctl: str | None, python: str | None) -> tuple[str, str | None]:
    """The executables as the unit names them (unit_paths' rule on this host); this dflashctl when
    --dflashctl is not given, its code's directory included."""
    this = dflashctl is None
    dflashctl = default_dflashctl() if this else dflashctl
    dflashctl = unit_paths.executable(dflashctl, "--dflashctl") if dflashctl.startswith("/") else dflashctl
    if this:
        unit_paths.package_dir()
    if python is not None and python.startswith("/"):
        python = unit_paths.executable(python, "--python")
    return dflashctl, python


def run(args) -> int:
    out = output.check(args.output, "--output")
    data = config.read_json(args.config)
    key, d = config.instance_of(data, args.name, args.config)
    if key is None and args.name and isinstance(d, dict):
        d = {**d, "name": args.name}  # a file of one instance, renamed
    cfg = config.from_dict(d, name=key, origin=args.config)
    dflashctl, python = host_paths(args.dflashctl, args.python)
    config_path = args.config_path or f"/etc/dflash/{cfg.name}.json"
    text = render(cfg, config_path, dflashctl, python,
                  args.systemd if args.systemd is not None else systemd_version())
    for w in unit_paths.missing_credentials({"apiKeyFile": cfg.api_key_file, "hfTokenFile": cfg.hf_token_file}):
        print(f"dflashctl unit: warning: {w}", file=sys.stderr)
    name = unit_name(cfg)
    output.write(out, text, "--output")
    settings = json.dumps({**d, "name": cfg.name}, indent=2)
    q = shlex.quote
    print(f"\nInstall on the host (as root):\n"
          f"  install -D -m 0644 /dev/stdin {q(config_path)} <<'JSON'\n{settings}\nJSON\n"
          f"  install -m 0644 {q(str(out) if out else name)} {q('/etc/systemd/system/' + name)}\n"
          f"  {q(dflashctl)} validate {q(config_path)}\n"
          f"  systemctl daemon-reload && systemctl enable --now {q(name)}\n"
          f"  journalctl -u {q(name)} -f   # preflight, loading progress, then READY", file=sys.stderr)
    return OK
