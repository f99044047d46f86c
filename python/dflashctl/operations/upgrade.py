"""`dflashctl upgrade`: one host's step of a fleet upgrade; it returns when the host is proven or has stopped.

Any engine that runs hosts one at a time (Ansible's `serial`, a shell loop over ssh) runs this on
each host and stops on the first non-zero exit. In order:
1. install the new build beside the one serving (upgrade_build.py: a venv from `--requirements`
   with pip --require-hashes, or `--nix INSTALLABLE` with nix build + nix profile install);
2. under systemd, write every instance's unit with `dflashctl unit` (the build's own dflashctl when
   it has one) pointing at the new build, then `systemctl daemon-reload`; without systemd
   (`--restart-command`) move `<root>/current` to the new build, which the restart command starts;
3. run `dflashctl rollout --json` (its own process: its canary, batches and state are its own; the
   arguments after `--` go to it, e.g. `-- --canary-expect stack`);
4. exit 0 only when the rollout restarted every instance onto the new build (or found it running
   it, under systemd: `rollout --dry-run` afterwards must find nothing to restart). Otherwise the
   rollout's exit code, after putting back the units it replaced (daemon-reload) and `current`, so
   that an instance systemd or a supervisor restarts from now on gets the build the host serves,
   and then reverting (Nomad's auto_revert): the instances the rollout touched (left out of the
   router, or already on the new build) are restarted on that build by `rollout --resume --all
   --only` them (their canary judged) and put back, so the host ends at full capacity on the old
   build (`reverted`).
With `--json` the one JSON object holds the build, the rollout's own report and a one-line
`summary` naming the host, the instance that stopped and the canary's figures. Without systemd a
second run with the same build and settings restarts nothing (`changed: false`): the last upgrade's
outcome is kept in `<state dir>/upgrade.json`.
"""

import argparse
import glob
import hashlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from dflashctl import cli_help, inputs, output
from dflashctl.errors import CONFIG, FAILED, OK, OUTPUT, ROLLOUT_BUSY, ROLLOUT_STOPPED, USAGE, DflashError
from dflashctl.operations import canary, rollout_plan, rollout_state, unit_data
from dflashctl.operations.upgrade_build import Build, current, nix_build, pip_build, point_current, say
from dflashctl.service import unit
from dflashctl.service.serve import read_api_key

DEFAULT_ROOT = "/opt/dflash"
DEFAULT_UNITS_DIR = "/etc/systemd/system"
STATE_FILE = "upgrade.json"
# Options of `dflashctl rollout` that upgrade sets itself; given after `--` they are refused.
OWNED = ("--instance", "--router", "--no-router", "--restart-command", "--state-dir", "--json", "--dry-run")


# --------------------------------------------------------------------------------- units (systemd)

def settings_sha(files: list[str]) -> str:
    h = hashlib.sha256()
    for f in sorted(files):
        h.update(inputs.read_bytes(f, "settings file", f"fix {f}", CONFIG, 16 << 20))
    return h.hexdigest()[:16]


def dflashctl_of(build: Build) -> list[str]:
    """The dflashctl that renders the units and runs the rollout: the build's own when it has one."""
    exe = build.dflashctl
    return [str(exe)] if exe is not None else [sys.executable, "-m", "dflashctl"]


def write_units(build: Build, files: list[str], units_dir: Path) -> dict[Path, bytes | None]:
    """Each instance's unit, rendered for the new build; returns what each file held before."""
    before: dict[Path, bytes | None] = {}
    renderer = [*dflashctl_of(build), "unit", "--python", str(build.python)]
    if build.dflashctl is None:  # the units run the dflashctl running this step
        renderer += ["--dflashctl", unit.default_dflashctl()]
    for f in files:
        for cfg in rollout_plan.load_instances([f]):
            path = units_dir / unit.unit_name(cfg)
            before[path] = path.read_bytes() if path.exists() else None
            multi = ["--name", cfg.name] if "instances" in json.loads(Path(f).read_text()) else []
            argv = [*renderer, "--config", os.path.abspath(f), *multi, "--config-path", os.path.abspath(f),
                    "-o", str(path)]
            r = subprocess.run(argv, capture_output=True, text=True, timeout=120)
            if r.returncode != 0:
                restore_units(before)
                raise DflashError(f"rendering {path.name} for build {build.id} failed (exit {r.returncode}); "
                                  "nothing was restarted", (r.stderr or r.stdout).strip()[-1500:],
                                  "fix what it names (`dflashctl unit --config FILE` shows the same)", CONFIG)
    return before


def restore_units(before: dict[Path, bytes | None]) -> None:
    for path, text in before.items():
        try:
            if text is None:
                path.unlink(missing_ok=True)
            else:
                output.write(path, text, "a unit file")
        except (OSError, DflashError) as e:
            say(f"could not put back {path}: {e}")


def daemon_reload() -> None:
    try:
        r = subprocess.run(["systemctl", "daemon-reload"], capture_output=True, text=True, timeout=120)
    except (FileNotFoundError, subprocess.TimeoutExpired) as e:
        raise DflashError("systemctl daemon-reload did not run", str(e),
                          "run the upgrade where systemd runs the units, or pass --restart-command", CONFIG) from None
    if r.returncode != 0:
        raise DflashError("systemctl daemon-reload failed", (r.stderr or r.stdout).strip(),
                          "see `systemctl status`; nothing was restarted", FAILED)


# ----------------------------------------------------------------------------------------- rollout

def rollout_argv(build: Build, args, extra: list[str], dry_run: bool = False) -> list[str]:
    argv = [*dflashctl_of(build), "rollout", "--json", "--state-dir", str(args.state_dir)]
    for f in args.instance:
        argv += ["--instance", f]
    if args.router:
        argv += ["--router", args.router]
    if args.no_router:
        argv.append("--no-router")
    if args.restart_command:
        argv += ["--restart-command", args.restart_command]
    return argv + (["--dry-run"] if dry_run else list(extra))


def run_rollout(argv: list[str], env: dict) -> tuple[int, dict | None]:
    """The rollout as its own process: its progress on our stderr as it happens, its JSON kept."""
    try:
        proc = subprocess.run(argv, stdout=subprocess.PIPE, text=True, env=env)
    except OSError as e:
        raise DflashError("the rollout did not start", f"{argv[0]}: {e.strerror or e}",
                          "reinstall dflashctl in the build (--glue) or on PATH", CONFIG) from None
    try:
        report = json.loads(proc.stdout)
    except ValueError:
        report = None
    return proc.returncode, report if isinstance(report, dict) else None


def not_on_build(report: dict | None, names: list[str]) -> list[str]:
    """Instances the rollout's report does not show restarted (done) or up to date."""
    if report is None:
        return list(names)
    done = {s.get("name") for s in report.get("instances", []) if s.get("outcome") == "done"}
    fresh = {u.get("name") for u in report.get("up_to_date", [])}
    return [n for n in names if n not in done | fresh]


def serving_other_versions(build: Build, cfgs) -> list[str]:
    """Instances whose /server_info names another SGLang version than the build installs: the proof,
    without systemd, that the restart started the build (a restart command that ignores `current`
    restarts the old one). Nothing to compare when the build names no version."""
    want = build.sglang_version()
    if want is None:
        return []
    env, wrong = dict(os.environ), []
    for c in cfgs:
        status, body = canary.request(c.base_url, "/server_info", read_api_key(c, env), timeout=30)
        try:
            got = json.loads(body).get("version") if status == 200 else None
        except (ValueError, AttributeError):
            got = None
        if got != want:
            wrong.append(f"{c.name} (serves {got or 'no version: /server_info answered ' + str(status)}, "
                         f"the build has {want})")
    return wrong


def _figures(step: dict) -> str:
    canary = step.get("canary") or {}
    if canary.get("summary"):  # the rollout's verdict in one line (figures before -> after)
        return canary["summary"]
    flat = [f"{k}={v}" for k, v in canary.items() if isinstance(v, (int, float, str)) and v is not None]
    return ", ".join(flat) or "no canary figures"


def _reverted(reverted: dict | None) -> str:
    if not reverted:
        return ""
    if reverted["ok"]:
        return f"; reverted {', '.join(reverted['instances'])} to the build still serving (back in rotation)"
    return (f"; reverting {', '.join(reverted['instances'])} failed (exit {reverted['exit_code']}): still out of "
            f"the router: {', '.join(reverted['left_out']) or 'none'}")


def summary(host: str, build: Build, code: int, report: dict | None, missing: list[str],
            reverted: dict | None = None) -> str:
    if code == OK:
        return f"{host}: serving build {build.id} on every instance"
    steps = (report or {}).get("instances", [])
    failed = next((s for s in steps if s.get("outcome") == "failed"), None)
    if failed is not None:
        return (f"{host}: upgrade to build {build.id} stopped at instance {failed.get('name')}: "
                f"{failed.get('error')}; canary: {_figures(failed)}{_reverted(reverted)}")
    if missing:
        return f"{host}: build {build.id} rolled out, but not every instance runs it: {', '.join(missing)}"
    err = ((report or {}).get("error") or {}).get("what")
    return f"{host}: upgrade to build {build.id} stopped: " + (err or "the rollout gave no report")


# ----------------------------------------------------------------------------------------- the step

def register(subparsers) -> None:
    p = subparsers.add_parser("upgrade", help="this host's step of a fleet upgrade: install, render, roll out, "
                              "prove", **cli_help.texts("upgrade", __doc__))
    p.add_argument("--instance", action="append", default=[], metavar="FILE",
                   help=f"an instance's settings (repeat; default: every {rollout_plan.SETTINGS_GLOB})")
    p.add_argument("--router", metavar="FILE", help="the router settings (default: "
                   f"{unit_data.router_unit_data()['settingsPath']} if it exists)")
    p.add_argument("--no-router", action="store_true", help="roll without a router")
    how = p.add_mutually_exclusive_group(required=True)
    how.add_argument("--requirements", metavar="FILE", help="the exported lock (`dflashctl export`): a new venv "
                     "installed with pip --require-hashes")
    how.add_argument("--nix", metavar="INSTALLABLE", help="the stack as a Nix installable, e.g. "
                     "github:OWNER/dflash-stack#dflash-env (nix build, nix profile install)")
    p.add_argument("--glue", metavar="PATH", help="with --requirements: a dflashctl wheel installed into the build")
    p.add_argument("--python", default="python3.12", metavar="PATH",
                   help="with --requirements: the interpreter the venv is made from (python3.12)")
    p.add_argument("--root", default=DEFAULT_ROOT, metavar="DIR",
                   help=f"where builds live: DIR/builds/<id>, DIR/current ({DEFAULT_ROOT})")
    p.add_argument("--units-dir", default=DEFAULT_UNITS_DIR, metavar="DIR",
                   help=f"under systemd: where the instances' units are written ({DEFAULT_UNITS_DIR})")
    p.add_argument("--restart-command", metavar="CMD", help="hosts without systemd: how the rollout restarts an "
                   "instance ({name}, {unit}); it starts <root>/current, which points at the new build")
    p.add_argument("--state-dir", metavar="DIR", help="the rollout's state directory (also upgrade.json)")
    p.add_argument("--host-name", metavar="NAME", help="how the summary names this host (default: its host "
                   "name; the Ansible role passes the inventory's)")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object on stdout")
    p.add_argument("rollout_args", nargs=argparse.REMAINDER, metavar="-- ROLLOUT-ARGS",
                   help="after --: options for `dflashctl rollout` (e.g. --canary-expect stack, --max-unavailable 2)")
    p.set_defaults(func=run)


def check_args(args) -> list[str]:
    extra = list(args.rollout_args)
    if extra and extra[0] == "--":
        extra = extra[1:]
    elif extra:
        raise DflashError(f"unexpected argument {extra[0]!r}", "options for the rollout come after `--`",
                          "write e.g. `dflashctl upgrade ... -- --canary-expect stack`", USAGE)
    owned = [a for a in extra if a.split("=", 1)[0] in OWNED]
    if "--json" in extra:
        args.json = True  # asked for JSON, in the wrong place: the refusal comes as JSON too
    if owned:
        raise DflashError(f"{', '.join(owned)} after `--` is set by upgrade itself",
                          "upgrade passes the instances, router, restart command, state directory and --json",
                          "give it to upgrade before `--`", USAGE)
    if args.glue and not args.requirements:
        raise DflashError("--glue without --requirements", "the glue is installed into a pip build",
                          "a Nix build has dflashctl already (the flake's dflash-env)", USAGE)
    if args.router and args.no_router:
        raise DflashError("--router and --no-router do not go together", "", "pass one of them", USAGE)
    args.state_dir = Path(args.state_dir) if args.state_dir else rollout_state.default_dir()
    return extra


def read_state(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def run(args) -> int:
    extra = check_args(args)
    files = args.instance or sorted(glob.glob(rollout_plan.SETTINGS_GLOB))
    cfgs = rollout_plan.load_instances(files)
    args.instance = files
    root, systemd = Path(args.root), args.restart_command is None
    units_dir = Path(args.units_dir)
    if systemd and not units_dir.is_dir():
        raise DflashError(f"--units-dir {units_dir} is not a directory", "the instances' units are written there",
                          "pass --units-dir, or --restart-command on a host without systemd", OUTPUT)
    t0 = time.monotonic()
    build = (pip_build(root, args.requirements, args.glue, args.python) if args.requirements
             else nix_build(root, args.nix))
    state_path = args.state_dir / STATE_FILE
    last = read_state(state_path)
    settings = settings_sha(files)
    if not systemd and last.get("status") == "done" and last.get("build") == build.id \
            and last.get("settings") == settings and current(root) == build.id:
        return finish(args, build, OK, {"changed": False, "previous_build": build.id}, None, [], t0,
                      f"already serving build {build.id} with these settings: nothing restarted")
    return roll(args, build, extra, systemd, units_dir, cfgs, settings, t0)


def roll(args, build: Build, extra: list[str], systemd: bool, units_dir: Path, cfgs, settings: str,
         t0: float) -> int:
    root, names = Path(args.root), [c.name for c in cfgs]
    previous = current(root)
    before = write_units(build, args.instance, units_dir) if systemd else {}
    if systemd:
        daemon_reload()
    point_current(root, build.id)
    say(f"rolling out build {build.id} ({build.path}) to {', '.join(names)}")
    env = dict(os.environ, DFLASH_BUILD=str(build.path))
    code, report = run_rollout(rollout_argv(build, args, extra), env)
    missing = not_on_build(report, names) if code == OK else []
    if code == OK and systemd:
        _, plan = run_rollout(rollout_argv(build, args, extra, dry_run=True), env)
        missing = sorted(set(missing) | {r["name"] for r in (plan or {}).get("instances", [])
                                         if r.get("action") == "restart"}) if plan else list(names)
    if code == OK:
        missing += serving_other_versions(build, cfgs)
    if code == OK and missing:
        code = FAILED
    reverted = None
    if code != OK:
        restore_units(before)
        if systemd and before:
            daemon_reload()
        point_current(root, previous)
        reverted = revert(build, args, extra, env, report)
    changed = report is None or any(s.get("outcome") != "not reached" for s in report.get("instances", []))
    write_state(args.state_dir, {"build": build.id, "status": "done" if code == OK else "failed",
                                 "settings": settings, "previous_build": previous, "time": time.time()})
    return finish(args, build, code, {"changed": changed, "previous_build": previous, "reverted": reverted},
                  report, missing, t0, None)


def revert(build: Build, args, extra: list[str], env: dict, report: dict | None) -> dict | None:
    """Nomad's auto_revert: every instance the stopped rollout touched (left out of the router, or
    already restarted onto the new build) is restarted on the build still serving (its units and
    `current` are back) by `rollout --resume --all --only` them, its canary judged, and put back.
    None: the rollout touched nothing."""
    steps = (report or {}).get("instances") or []
    touched = sorted({s.get("name") for s in steps if s.get("outcome") not in (None, "not reached")}
                     | set((report or {}).get("left_out") or {}))
    if not touched:
        return None
    say(f"reverting {', '.join(touched)} to the build still serving")
    argv = rollout_argv(build, args, ["--resume", "--all", *[a for n in touched for a in ("--only", n)],
                                      *[a for a in extra if a not in ("--resume", "--all")]])
    code, back = run_rollout(argv, env)
    return {"instances": touched, "ok": code == OK, "exit_code": code,
            "left_out": sorted(((back or {}).get("left_out") or {})) if back else touched}


def write_state(directory: Path, state: dict) -> None:
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as e:
        raise DflashError(f"cannot use the state directory {directory}", e.strerror or str(e),
                          "run as root, or pass --state-dir a directory you can write", CONFIG) from None
    output.write(directory / STATE_FILE, json.dumps(state, indent=2) + "\n", "the upgrade state")


def finish(args, build: Build, code: int, facts: dict, report: dict | None, missing: list[str], t0: float,
           note: str | None) -> int:
    host = args.host_name or socket.gethostname()
    line = note or summary(host, build, code, report, missing, facts.get("reverted"))
    out = {"ok": code == OK, "exit_code": code, "host": host, "build": build.to_json(), **facts,
           "seconds": round(time.monotonic() - t0, 1), "summary": line, "rollout": report,
           "not_on_new_build": missing}
    if code != OK:
        rollout_error = (report or {}).get("error") or {}
        out["error"] = {"what": line, "why": rollout_error.get("what") or "see the rollout's report",
                        "fix": rollout_error.get("fix") or "read the rollout's report; `dflashctl status`",
                        "exit_code": code}
    if args.json:
        output.print_json(out)
    else:
        print(line)
    if code == OK:
        return OK
    err = out["error"]
    was = facts.get("previous_build")
    raise DflashError(line, f"every instance the rollout did not reach still serves "
                      f"{'build ' + was if was else 'the build it had'}", err["fix"],
                      code if code in (ROLLOUT_STOPPED, FAILED, CONFIG, ROLLOUT_BUSY) else FAILED)
