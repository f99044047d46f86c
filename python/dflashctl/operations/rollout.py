"""`dflashctl rollout`: restart a host's instances a few at a time behind the router, each one proven.

For each batch (at most `--max-unavailable` instances, default 1; `--batch` is the same option):
wait until enough of this host's instances serve without it, take the batch out of the router, let
its requests finish (at most the router's drainSec), measure the canary on each alone (greedy
outputs, acceptance length, decode speed), restart its unit, wait until it is ready (READY=1: a real
decode), measure again and judge (a slower build, a drafter that accepts less, changed outputs or a
failed request stop it here, before it is put back), put it back, wait until the router routes to
it, and watch it stay healthy `--healthy-for` seconds before the next batch goes. A failed step
stops the rollout: the instance that failed stays out of the router with its reason (in the state
directory, for `--resume`), the instances not reached keep their old version and keep serving.
Never fewer than all but `--max-unavailable` of this host's instances in rotation, counting those
already down; a batch that would break that is refused before anything is touched (exit 78).
rollout_plan.py decides which instances, rollout_machine.py runs each through its steps, canary.py
measures and judges, instance_control.py restarts (systemd or `--restart-command`).
"""

import argparse
import hashlib
import json
import math
import os
import signal
import time

from dflashctl import cli_help, output
from dflashctl.errors import CONFIG, FAILED, OK, ROLLOUT_STOPPED, DflashError
from dflashctl.operations import canary, rollout_plan, rollout_state, unit_data
from dflashctl.operations.rollout_machine import POLL_S, Options, Rollout, StepFailed, say
from dflashctl.operations.rollout_plan import Plan
from dflashctl.operations.router_admin import RouterAdmin, RouterUnreachable
from dflashctl.service import config, sdnotify
from dflashctl.service.instance_control import Command, Systemd
from dflashctl.service.serve import read_api_key

__all__ = ["Options", "Rollout", "StepFailed", "register", "run"]


# --- the command -------------------------------------------------------------------------------------
def register(subparsers) -> None:
    p = subparsers.add_parser("rollout", help="restart this host's instances one at a time behind the router",
                              **cli_help.texts("rollout", __doc__))
    p.add_argument("--instance", action="append", default=[], metavar="FILE",
                   help=f"an instance's settings, or the module's dflash-instances.json (repeat; default: "
                        f"every {rollout_plan.SETTINGS_GLOB})")
    p.add_argument("--router", metavar="FILE",
                   help=f"the router settings (default: {unit_data.router_unit_data()['settingsPath']} if it exists)")
    p.add_argument("--no-router", action="store_true", help="roll without a router (each port is down while it restarts)")
    p.add_argument("--max-unavailable", "--batch", dest="max_unavailable", type=int, default=1, metavar="N",
                   help="at most N of this host's instances out of rotation at once, counting those already "
                        "down; also how many restart together (default 1; --batch is the same option)")
    p.add_argument("--only", action="append", default=[], metavar="NAME", help="only this instance (repeat)")
    p.add_argument("--all", action="store_true", help="restart every instance, also those up to date")
    p.add_argument("--resume", action="store_true",
                   help="continue after a stopped rollout: the instances it left out of the router first")
    p.add_argument("--require-identical", action="store_true", help=argparse.SUPPRESS)  # refused: run() says why
    canary.add_arguments(p)
    p.add_argument("--healthy-for", type=float, default=10.0, metavar="SEC",
                   help="seconds an instance must stay in rotation before the next goes (10)")
    p.add_argument("--ready-timeout", type=float, metavar="SEC",
                   help="seconds from restart to ready (default: the instance's startTimeoutSec + margin)")
    p.add_argument("--drain-timeout", type=float, metavar="SEC",
                   help="seconds its requests in flight may take to finish (default: the router's drainSec)")
    p.add_argument("--restart-command", metavar="CMD",
                   help="hosts without systemd: how to restart an instance ({name}, {unit} filled in); it "
                        "returns once the old process stopped, non-zero if the restart failed")
    p.add_argument("--router-wait", type=float, default=60.0, metavar="SEC",
                   help="how long a router that does not answer is waited for, at the start and between "
                        "steps (60)")
    p.add_argument("--state-dir", metavar="DIR", help="where the lock and state live (default: "
                   "$STATE_DIRECTORY, /var/lib/dflash-rollout as root)")
    p.add_argument("--dry-run", action="store_true", help="say what would be restarted, restart nothing")
    p.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    p.set_defaults(func=run)


def options_of(args) -> Options:
    if args.require_identical:
        raise DflashError("--require-identical is gone", "the canary now fails a step by default when greedy "
                          "outputs change, and also when acceptance length or decode speed fall "
                          "(docs/service.md, \"The canary\")", "leave it out (NixOS: remove "
                          "services.dflash.rollout.requireIdentical); to allow an intended change pass "
                          "--canary-expect", CONFIG)
    if args.max_unavailable < 1:
        raise DflashError(f"--max-unavailable {args.max_unavailable} is out of range", "it must be at least 1",
                          "pass --max-unavailable 1 or more", CONFIG)
    if not (math.isfinite(args.healthy_for) and 0 <= args.healthy_for <= 3600):
        raise DflashError(f"--healthy-for {args.healthy_for} is out of range", "it must be 0 to 3600 seconds",
                          "pass e.g. --healthy-for 10 (the default)", CONFIG)
    for flag, value in (("--ready-timeout", args.ready_timeout), ("--drain-timeout", args.drain_timeout),
                        ("--router-wait", args.router_wait)):
        if value is not None and not (math.isfinite(value) and 0 < value <= 86400):
            raise DflashError(f"{flag} {value} is out of range", "it must be a positive number of seconds, at "
                              "most a day", f"leave {flag} out for the default", CONFIG)
    return Options(max_unavailable=args.max_unavailable, canary=canary.settings_of(args),
                   healthy_for=args.healthy_for, ready_timeout=args.ready_timeout,
                   drain_timeout=args.drain_timeout, router_wait=args.router_wait)


def definition_key(cfg) -> str:
    """What an instance is restarted onto, as far as this host can tell: its settings."""
    text = json.dumps(config.to_dict(cfg), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def carried_state(previous: dict, names: set[str]) -> dict:
    """What the last rollout leaves this one: the instances it left out, and, when it did not finish,
    those it restarted (so that neither --resume nor a re-run restarts them again)."""
    left_out = {n: v for n, v in (previous.get("left_out") or {}).items() if n in names and isinstance(v, dict)}
    done = previous.get("done") if previous.get("status") != "done" else None
    done = {n: k for n, k in (done or {}).items() if n in names and n not in left_out}
    return {"left_out": left_out, "done": done}


def run(args) -> int:
    opts = options_of(args)
    cfgs = rollout_plan.load_instances(args.instance)
    env = dict(os.environ)
    rcfg, admin_key = rollout_plan.load_router(args.router, args.no_router, env)
    state_dir = args.state_dir or rollout_state.default_dir()
    # a restart command's output is kept as restart-<name>.log beside the state; progress while it runs
    control = Command(args.restart_command, log_dir=state_dir, progress=say) if args.restart_command else Systemd()
    keys = {c.name: read_api_key(c, env) for c in cfgs}
    if args.dry_run:  # reads the state, takes no lock and creates nothing
        carried = carried_state(rollout_state.RolloutLock(state_dir).read(), set(keys))
        plan, _ = plan_of(args, cfgs, control, keys, carried, opts)
        admin = RouterAdmin(rcfg.url, admin_key) if rcfg is not None else None
        check_router(admin, plan, carried["left_out"], opts.router_wait)
        floor_of(plan, admin, opts)
        return report_plan(plan, rcfg, args.json)
    with rollout_state.RolloutLock(state_dir) as lock:
        carried = carried_state(lock.read(), set(keys))
        plan, definitions = plan_of(args, cfgs, control, keys, carried, opts)
        admin = RouterAdmin(rcfg.url, admin_key) if rcfg is not None else None
        check_router(admin, plan, carried["left_out"], opts.router_wait)
        floor = floor_of(plan, admin, opts)
        sdnotify.notify("READY=1")  # the NixOS unit's start job ends here; the rollout goes on
        rollout = Rollout(plan, admin, rcfg.drain_sec if rcfg else 0, control, opts, lock, carried, definitions)
        old = {s: signal.signal(s, lambda signum, frame: _on_signal(rollout, signum)) for s in
               (signal.SIGTERM, signal.SIGINT)}
        t0 = time.monotonic()
        try:
            status = rollout.run(lambda t: keys[t.name], floor)
        finally:
            for s, h in old.items():
                signal.signal(s, h)
        return report(rollout, status, time.monotonic() - t0, args.json)


def plan_of(args, cfgs, control, keys: dict, carried: dict, opts: Options) -> tuple[Plan, dict]:
    definitions = {c.name: definition_key(c) for c in cfgs}
    systemd = isinstance(control, Systemd)
    serving = None
    if not systemd:  # nothing else tells which are down: ask each (down ones go first, at no cost)
        serving = {c.name: canary.decodes(c.base_url, keys[c.name], timeout=10) for c in cfgs}
    done = {n: k for n, k in carried["done"].items() if definitions.get(n) == k}
    try:
        plan = rollout_plan.make_plan(cfgs, control if systemd else None, carried["left_out"], only=args.only,
                                      every=args.all, resume=args.resume, batch=opts.max_unavailable,
                                      serving=serving, done=done)
    except DflashError as e:
        if systemd and e.exit_code == FAILED:  # systemctl there, but no systemd answering it
            raise DflashError(e.what, e.why, f"{e.fix}; on a host without systemd pass --restart-command "
                              "(how to restart an instance)", CONFIG) from None
        raise
    return plan, definitions


def floor_of(plan: Plan, admin: RouterAdmin | None, opts: Options) -> int:
    """Kubernetes' maxUnavailable: the fewest of this host's instances that must stay in rotation.
    Refuses (CONFIG, nothing touched) a rollout whose batches cannot keep it."""
    n, most = len(plan.instances), opts.max_unavailable
    if n > 1 and most >= n:
        raise DflashError(f"--max-unavailable {most} would take all {n} of this host's instances out of "
                          "rotation at once", f"at least one must keep serving: at most {n - 1}",
                          f"pass --max-unavailable {n - 1} or less (the default is 1)", CONFIG)
    floor = n - most
    if admin is None or not plan.targets:
        return floor
    try:
        listed = admin.by_url()
    except RouterUnreachable:
        return floor  # check_router just reached it; the rollout waits for it like any other step
    going = {t.name for t in plan.targets}
    down = [c.name for c in plan.instances if c.name not in going
            and not (listed.get(c.base_url) and listed[c.base_url].healthy)]
    for i in range(0, len(plan.targets), most):
        batch = plan.targets[i:i + most]
        left = n - len(batch) - len(down)
        if left < floor:
            raise DflashError(f"taking {', '.join(t.name for t in batch)} out would leave {left} of this host's "
                              f"{n} instances in rotation, fewer than {floor} (--max-unavailable {most})",
                              f"{', '.join(down)} {'is' if len(down) == 1 else 'are'} already out of rotation "
                              "and not part of this rollout",
                              f"bring {', '.join(down)} back first (`dflashctl status`), or include "
                              f"{'it' if len(down) == 1 else 'them'} (--only), or raise --max-unavailable "
                              "knowing what it costs", CONFIG)
    return floor


def _on_signal(rollout: Rollout, signum: int) -> None:
    if rollout.stopping:
        rollout.aborting = True
        say(f"got {signal.Signals(signum).name} again: stopping now; what is out of rotation stays out "
            "and is listed for `dflashctl rollout --resume`")
    else:
        rollout.stopping = True
        say(f"got {signal.Signals(signum).name}: finishing the instances in progress, then stopping "
            "(again to stop at once)")


def check_router(admin: RouterAdmin | None, plan: Plan, left_out: dict, wait: float) -> None:
    """The router answers (within `wait` seconds: it may be starting), takes the key, and routes to
    every instance the rollout will restart."""
    if admin is None or not plan.targets:
        return
    deadline = time.monotonic() + wait
    while True:
        try:
            listed = admin.by_url()
            break
        except RouterUnreachable as e:
            if time.monotonic() >= deadline:
                raise DflashError(e.what, f"{e.why} (for {wait:.0f} s)", "start the router (`systemctl start "
                                  "dflash-router`), or pass --no-router to roll without it (each instance's "
                                  "port is down while it restarts)", CONFIG) from None
            time.sleep(POLL_S)
    missing = [t for t in plan.targets if t.cfg.base_url not in listed and t.name not in left_out]
    if missing:
        raise DflashError("not behind the router: " + ", ".join(f"{t.name} ({t.cfg.base_url})" for t in missing),
                          f"the router at {admin.url} routes to {', '.join(sorted(listed)) or 'nothing'}; "
                          "restarting an instance it does not route to drops every request sent to it directly",
                          "add it to the router (`dflashctl router-unit` with every --instance, then `systemctl "
                          "reload dflash-router`), or leave it out of this rollout with --only", CONFIG)


def report_plan(plan: Plan, rcfg, as_json: bool) -> int:
    rows = [{"name": t.name, "unit": t.unit, "url": t.cfg.base_url, "action": "restart", "why": t.why}
            for t in plan.targets] + [{"name": n, "action": "leave", "why": why} for n, why in plan.up_to_date]
    if as_json:
        output.print_json({"ok": True, "dry_run": True, "max_unavailable": plan.batch,
                           "router": rcfg.url if rcfg else None, "instances": rows})
        return OK
    print(f"rollout plan (at most {plan.batch} out at once, router {rcfg.url if rcfg else 'none'}):")
    for r in rows:
        print(f"  {r['action']:8} {r['name']:20} {r['why']}")
    if not plan.targets:
        print("  nothing to restart")
    return OK


def _cell(v, unit: str = "s") -> str:
    return "-" if v is None else f"{v:.1f} {unit}" if isinstance(v, float) else str(v)


def report(rollout: Rollout, status: str, seconds: float, as_json: bool) -> int:
    """The table or the one JSON object, on every path; the exit code from the command's table."""
    steps = list(rollout.steps.values())
    failure = rollout.failure
    code = OK if status == "done" else ROLLOUT_STOPPED
    left = ", ".join(rollout.left_out) or "none"
    not_reached = ", ".join(s.name for s in steps if s.outcome == "not reached") or "none"
    what = f"rollout {status}: " + (failure.what if failure else "the rollout was interrupted")
    why = (f"left out of rotation: {left} (why: above, and in {rollout.lock.state_path}); not reached: "
           f"{not_reached} (they keep their old version and keep serving)")
    fix = failure.fix if failure else "run `dflashctl rollout --resume` to continue"
    out = {"ok": code == OK, "exit_code": code, "status": status, "max_unavailable": rollout.opts.max_unavailable,
           "seconds": round(seconds, 1), "min_in_rotation": rollout.min_in_rotation,
           "router_restarts": rollout.router_restarts, "canary": rollout.opts.canary.to_json()
           if rollout.opts.canary.enabled else None,
           "instances": [s.to_json() for s in steps],
           "up_to_date": [{"name": n, "why": w} for n, w in rollout.plan.up_to_date],
           "left_out": {n: v["reason"] for n, v in rollout.left_out.items()}}
    if code != OK:
        out["error"] = {"what": what, "why": why, "fix": fix, "exit_code": code}
    if as_json:
        output.print_json(out)  # the one JSON object, also when the rollout stopped (cli.main adds none)
    else:
        print(f"{'instance':16} {'outcome':12} {'step':14} {'out of rotation':>15} {'restart to ready':>16} "
              f"{'back in':>8}  canary")
        for s in steps:
            verdict = (s.canary or {}).get("summary") or (s.canary or {}).get("verdict", "-")
            at = s.step if s.outcome in ("failed", "interrupted") else "-"
            print(f"{s.name:16} {s.outcome:12} {at or '-':14} {_cell(s.out_of_rotation_s):>15} "
                  f"{_cell(s.restart_to_ready_s):>16} {_cell(s.back_in_s):>8}  {verdict}")
        for n, w in rollout.plan.up_to_date:
            print(f"{n:16} {'up to date':12} ({w})")
        print(f"{status} in {seconds:.1f} s; at least {_cell(rollout.min_in_rotation)} of this host's instance(s) "
              "in rotation")
    if status == "done":
        sdnotify.status(f"done: {len(steps)} instance(s) restarted in {seconds:.0f} s")
        return OK
    raise DflashError(what, why, fix, ROLLOUT_STOPPED)
