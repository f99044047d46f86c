"""`dflashctl rollout`: restart a host's instances a few at a time behind the router, each one proven.

For each batch (`--batch`, default 1): wait until every other worker is in rotation, take the batch
out of the router, let its requests finish (at most the router's drainSec), ask the canary's prompts
(greedy, alone on the instance), restart its unit, wait until it is ready (READY=1: a real decode),
ask the same prompts again and compare, put it back, wait until the router routes to it, and watch
it stay healthy `--healthy-for` seconds before the next batch goes. A failed step stops the rollout:
the instance that failed stays out of the router with its reason (in the state directory, for
`--resume`), the instances not reached keep their old version and keep serving. Never more than
`--batch` instances are out of rotation. rollout_plan.py decides which instances, canary.py asks,
instance_control.py restarts (systemd or `--restart-command`), router_admin.py talks to the router.
"""

import os
import signal
import sys
import time
from dataclasses import asdict, dataclass, field

from dflashctl import cli_help, output
from dflashctl.errors import CONFIG, OK, PREFLIGHT_GPU_FAULT, ROLLOUT_STOPPED, DflashError
from dflashctl.operations import canary, rollout_plan, rollout_state, unit_data
from dflashctl.operations.canary import Answers
from dflashctl.operations.rollout_plan import Plan, Target
from dflashctl.operations.router_admin import RouterAdmin, RouterUnreachable
from dflashctl.service import sdnotify, unit_text
from dflashctl.service.instance_control import Command, Systemd
from dflashctl.service.serve import read_api_key

GPU_BUSY = 87  # errors.PREFLIGHT_GPU_BUSY: other work holds the GPU; it may end, so keep waiting
POLL_S = 0.5
PROGRESS_EVERY_S = 5.0


@dataclass
class Options:
    batch: int = 1
    canary_prompts: int = 4
    canary_tokens: int = 32
    require_identical: bool = False
    healthy_for: float = 10.0
    ready_timeout: float | None = None  # None: the instance's startTimeoutSec + the unit's margin
    drain_timeout: float | None = None  # None: the router's drainSec
    wait_others: float = 120.0
    router_wait: float = 60.0  # how long an unreachable router is waited for mid-rollout


@dataclass
class Step:
    """What happened to one instance (the table's row, the JSON's entry)."""
    name: str
    unit: str
    url: str
    why: str
    outcome: str = "not reached"  # done | failed | interrupted | not reached
    error: str | None = None
    fix: str | None = None
    out_of_rotation_s: float | None = None
    drain_s: float | None = None
    still_running: int | None = None  # requests still in flight when the restart began
    restart_to_ready_s: float | None = None
    canary: dict | None = None
    back_in_s: float | None = None
    t_out: float | None = field(default=None, repr=False)
    before: Answers | None = field(default=None, repr=False)
    invocation: str = field(default="", repr=False)

    def to_json(self) -> dict:
        d = asdict(self)
        for k in ("t_out", "before", "invocation"):
            d.pop(k)
        return {k: round(v, 2) if isinstance(v, float) else v for k, v in d.items()}


class StepFailed(Exception):
    def __init__(self, what: str, fix: str, target: Target | None = None):
        super().__init__(what)
        self.what, self.fix, self.target = what, fix, target


class Interrupted(Exception):
    pass


def say(text: str) -> None:
    print(f"dflashctl rollout: {text}", file=sys.stderr, flush=True)
    sdnotify.status(text)


class Rollout:
    def __init__(self, plan: Plan, admin: RouterAdmin | None, drain_sec: float, control,
                 opts: Options, lock: rollout_state.RolloutLock, left_out: dict):
        self.plan, self.admin, self.control, self.opts, self.lock = plan, admin, control, opts, lock
        self.drain_timeout = opts.drain_timeout if opts.drain_timeout is not None else drain_sec
        self.left_out = dict(left_out)  # name -> {"reason", "url", "before"}: carried in the state
        self.steps = {t.name: Step(t.name, t.unit, t.cfg.base_url, t.why) for t in plan.targets}
        self.questions = canary.prompts(opts.canary_prompts)
        self.stopping = self.aborting = False
        self.min_in_rotation: int | None = None
        self.router_restarts = 0
        self._router_ids: set[str] = set()
        self.started = time.time()

    # --- the router, tolerant of a restart ---------------------------------------------------------
    def router(self, fn, *args):
        deadline = time.monotonic() + self.opts.router_wait
        said = False
        while True:
            try:
                return fn(*args)
            except RouterUnreachable as e:
                if time.monotonic() >= deadline:
                    raise StepFailed(f"the router stayed unreachable for {self.opts.router_wait:.0f} s ({e.why})",
                                     "start it (`systemctl start dflash-router`), then `dflashctl rollout --resume`")
                if not said:
                    say(f"the router does not answer ({e.why}); waiting for it")
                    said = True
                self._sleep()

    def in_rotation(self) -> dict[str, bool]:
        """The router's workers (url -> healthy); notes a router restart (every worker id new)."""
        listed = self.router(self.admin.workers)
        ids = {w.id for w in listed}
        if self._router_ids and ids and not ids & self._router_ids:
            self.router_restarts += 1
            say("the router restarted (every worker has a new id): it re-reads its settings and admits "
                "every configured worker that answers; instances out for this rollout are taken out again")
        self._router_ids = ids
        healthy = sum(w.healthy for w in listed)
        self.min_in_rotation = healthy if self.min_in_rotation is None else min(self.min_in_rotation, healthy)
        return {w.url: w.healthy for w in listed}

    def keep_out(self, batch: list[Target]) -> None:
        """After a router restart, an instance taken out may be listed again: take it out again."""
        if self.admin is None:
            return
        listed = self.in_rotation()
        for t in batch:
            if t.cfg.base_url in listed and self.steps[t.name].outcome != "done":
                self.router(self.admin.remove, t.cfg.base_url)

    # --- helpers -----------------------------------------------------------------------------------
    def _sleep(self, seconds: float = POLL_S) -> None:
        time.sleep(seconds)
        if self.aborting:
            raise Interrupted()

    def save(self, status: str, current: list[str]) -> None:
        self.lock.write({"pid": os.getpid(), "started": self.started, "status": status, "current": current,
                         "left_out": self.left_out})

    def leave_out(self, t: Target, reason: str) -> None:
        step = self.steps[t.name]
        before = step.before.to_json() if step.before else (self.left_out.get(t.name) or {}).get("before")
        self.left_out[t.name] = {"reason": reason, "url": t.cfg.base_url, "before": before}

    def ready_timeout(self, t: Target) -> float:
        if self.opts.ready_timeout is not None:
            return self.opts.ready_timeout
        return t.cfg.start_timeout_sec + unit_text.unit_data()["timeoutStartMarginSec"]

    # --- the steps ---------------------------------------------------------------------------------
    def wait_others(self, batch: list[Target]) -> None:
        """Every worker but the batch in rotation, or stop: never more than --batch out at once."""
        if self.admin is None:
            return
        mine = {t.cfg.base_url for t in batch}
        deadline = time.monotonic() + self.opts.wait_others
        said = False
        while True:
            listed = self.in_rotation()
            expected = {c.base_url for c in self.plan.instances if c.name not in self.left_out} - mine
            out = sorted(u for u, ok in listed.items() if not ok and u not in mine)
            out += sorted(u for u in expected if u not in listed)
            if not out:
                return
            if time.monotonic() >= deadline:
                raise StepFailed(f"{', '.join(out)} out of rotation for {self.opts.wait_others:.0f} s: taking "
                                 f"{', '.join(t.name for t in batch)} out too would leave fewer than all but "
                                 f"{self.plan.batch} serving",
                                 "bring that worker back first (`dflashctl status`, its journal), or allow more "
                                 "at once with --batch")
            if not said:
                say(f"waiting for {', '.join(out)} to be in rotation before taking out "
                    f"{', '.join(t.name for t in batch)}")
                said = True
            self._sleep()

    def take_out(self, t: Target) -> None:
        step = self.steps[t.name]
        step.t_out = time.monotonic()
        was_out = t.name in self.left_out
        self.leave_out(t, "taken out for its restart (the rollout had not finished it)")
        if self.admin is None:
            return
        listed = self.router(self.admin.remove, t.cfg.base_url)
        if not listed and not was_out:
            say(f"{t.name}: the router did not list it")
        self.router(self.admin.wait_listed, t.cfg.base_url, False, 10.0)
        serving = sum(self.in_rotation().values())
        say(f"{t.name}: out of rotation ({serving} worker(s) serving)")

    def drain(self, t: Target, api_key: str | None) -> None:
        step = self.steps[t.name]
        if self.admin is None:
            return
        t0 = time.monotonic()
        left = canary.requests_in_flight(t.cfg.base_url, api_key)
        while left and time.monotonic() - t0 < self.drain_timeout:
            self._sleep(0.2)
            left = canary.requests_in_flight(t.cfg.base_url, api_key)
        step.drain_s = time.monotonic() - t0
        step.still_running = left
        if left:
            say(f"{t.name}: {left} request(s) still running after {self.drain_timeout:.0f} s (drainSec); "
                "restarting anyway: they fail or are retried by the router")
        elif left is None and canary.request(t.cfg.base_url, "/health", api_key, timeout=5)[0] != 0:
            say(f"{t.name}: cannot tell its requests in flight (no /v1/loads answer); not waiting")

    def ask_before(self, t: Target, api_key: str | None) -> None:
        step = self.steps[t.name]
        saved = (self.left_out.get(t.name) or {}).get("before")
        if saved:  # a resumed instance: the answers of the version before its first restart
            step.before = Answers.from_json(saved)
        elif self.opts.canary_prompts and canary.decodes(t.cfg.base_url, api_key):
            step.before = canary.ask(t.cfg.base_url, api_key, self.questions, self.opts.canary_tokens)
        self.leave_out(t, "taken out for its restart (the rollout had not finished it)")

    def restart(self, t: Target) -> None:
        step = self.steps[t.name]
        step.restart_to_ready_s = None
        if isinstance(self.control, Systemd):
            step.invocation = self.control.show(t.unit).invocation
            self.control.restart(t.unit)
            say(f"{t.name}: restarting {t.unit}")
            return
        say(f"{t.name}: restarting ({' '.join(self.control.argv(t.name, t.unit))})")
        rc, out = self.control.restart(t.name, t.unit, self.ready_timeout(t), lambda: self.aborting)
        if rc == 130 and self.aborting:
            raise Interrupted()
        if rc == 124:  # the command waited for readiness (as systemctl restart does) and ran out
            raise StepFailed(f"{t.name}: not ready {self.ready_timeout(t):.0f} s after its restart (the restart "
                             "command was still waiting)", "read its log; if it only loads slowly, raise "
                             "startTimeoutSec or pass --ready-timeout; then `dflashctl rollout --resume`")
        if rc != 0:
            raise StepFailed(f"{t.name}: the restart command failed (exit {rc}): {out or '(no output)'}",
                             "fix what it names, then `dflashctl rollout --resume`; the instance stays out "
                             "of the router until then")

    def wait_ready(self, batch: list[Target], api_key_of, t0: float) -> list[tuple[Target, StepFailed]]:
        waiting = {t.name: t for t in batch}
        failed: list[tuple[Target, StepFailed]] = []
        last_said = time.monotonic()
        while waiting:
            for name, t in list(waiting.items()):
                problem = self._ready_or_failed(t, api_key_of(t), time.monotonic() - t0)
                if problem is True:
                    self.steps[name].restart_to_ready_s = time.monotonic() - t0
                    say(f"{name}: ready after {time.monotonic() - t0:.1f} s")
                    del waiting[name]
                elif isinstance(problem, StepFailed):
                    failed.append((t, problem))
                    del waiting[name]
            if waiting and time.monotonic() - last_said >= PROGRESS_EVERY_S:
                last_said = time.monotonic()
                for t in waiting.values():
                    say(f"{t.name}: starting ({time.monotonic() - t0:.0f} s){self._status_of(t)}")
            if waiting:
                self.keep_out(batch)
                self._sleep()
        return failed

    def _status_of(self, t: Target) -> str:
        if not isinstance(self.control, Systemd):
            return ""
        text = self.control.show(t.unit).status_text
        return f": {text}" if text else ""

    def _ready_or_failed(self, t: Target, api_key: str | None, elapsed: float):
        """True when ready, a StepFailed when the start failed or took too long, else None."""
        limit = self.ready_timeout(t)
        if isinstance(self.control, Systemd):
            s = self.control.show(t.unit)
            restarted = s.invocation != self.steps[t.name].invocation or not self.steps[t.name].invocation
            if restarted and s.ready:
                return True
            if restarted and s.start_failed and s.exit_status == PREFLIGHT_GPU_FAULT:
                return StepFailed(f"{t.name}: its GPU is faulty (exit {PREFLIGHT_GPU_FAULT}), not its new "
                                  f"definition: {s.status_text or 'no status'}",
                                  "the GPU needs the fix its status names (`dflashctl doctor` shows it), not a "
                                  f"rollback; then `systemctl start {t.unit}` and `dflashctl rollout --resume`")
            if restarted and s.start_failed and s.exit_status != GPU_BUSY:
                code = f"exit {s.exit_status}" if s.exit_status is not None else s.result
                return StepFailed(f"{t.name}: its new start failed ({code}): {s.status_text or 'no status'}",
                                  f"read `journalctl -u {t.unit}`; roll back or fix, then `dflashctl rollout "
                                  "--resume`. It stays out of the router; systemd "
                                  + ("does not restart it (a failure that repeats)" if s.active == "failed"
                                     else "keeps restarting it with backoff"))
        elif canary.decodes(t.cfg.base_url, api_key, timeout=10):
            return True
        if elapsed >= limit:
            how = (" (its port refuses connections: is the process running?)"
                   if canary.request(t.cfg.base_url, "/health", api_key, timeout=5)[0] == 0 else "")
            return StepFailed(f"{t.name}: not ready {limit:.0f} s after its restart{how}",
                              f"read its log (`journalctl -u {t.unit}`); if it only loads slowly, raise "
                              "startTimeoutSec or pass --ready-timeout; then `dflashctl rollout --resume`")
        return None

    def ask_after(self, t: Target, api_key: str | None) -> None:
        step = self.steps[t.name]
        if not self.opts.canary_prompts:
            step.canary = {"verdict": "skipped (--no-canary)"}
            return
        try:
            after = canary.ask(t.cfg.base_url, api_key, self.questions, self.opts.canary_tokens)
        except DflashError as e:
            raise StepFailed(f"{t.name}: the canary failed after the restart: {e.what}: {e.why}",
                             e.fix + "; it stays out of the router") from None
        result = {"prompts": len(self.questions), "tokens": self.opts.canary_tokens,
                  "accept_length_after": after.accept_length, "seconds": round(after.seconds, 2)}
        if step.before is None:
            step.canary = {**result, "verdict": "not compared (it did not answer before the restart)"}
            say(f"{t.name}: canary decoded {len(self.questions)} x {self.opts.canary_tokens} tokens (nothing "
                "to compare with)")
            return
        result["accept_length_before"] = step.before.accept_length
        diverged = canary.first_divergence(step.before, after)
        if diverged is None:
            step.canary = {**result, "verdict": "identical"}
            say(f"{t.name}: canary identical ({len(self.questions)} x {self.opts.canary_tokens} greedy tokens)")
        else:
            step.canary = {**result, "verdict": "differs", "first_divergence": asdict(diverged)}
            if self.opts.require_identical:
                raise StepFailed(f"{t.name}: the canary's greedy output changed: {diverged.describe()}",
                                 "expected when the model, its revision or the kernels changed; otherwise the "
                                 "new build decodes differently: roll back, or run without --require-identical")
            say(f"{t.name}: warning: canary output changed: {diverged.describe()} (expected only when the "
                "model or kernels changed; --require-identical makes it fatal)")
        b, a = step.before.accept_length, after.accept_length
        if b and a is not None and a < 0.5 * b:
            say(f"{t.name}: warning: acceptance length fell from {b:g} to {a:g} (a wrong drafter?)")

    def put_back(self, t: Target) -> None:
        step = self.steps[t.name]
        self.left_out.pop(t.name, None)
        if self.admin is None:
            return
        t0 = time.monotonic()
        self.router(self.admin.add, t.cfg.base_url)
        if not self.router(self.admin.wait_listed, t.cfg.base_url, True, 60.0):
            self.leave_out(t, "the router did not admit it after its restart")
            raise StepFailed(f"{t.name}: the router did not admit it within 60 s of adding it",
                             "see `journalctl -u dflash-router` (its health check of the instance)")
        step.back_in_s = time.monotonic() - t0
        step.out_of_rotation_s = time.monotonic() - step.t_out
        say(f"{t.name}: back in rotation ({step.out_of_rotation_s:.1f} s out)")

    def hold(self, batch: list[Target]) -> None:
        """Nomad's min_healthy_time: the batch must stay serving a while before the next one goes."""
        end = time.monotonic() + self.opts.healthy_for
        invocations = {t.name: self.control.show(t.unit).invocation
                       for t in batch if isinstance(self.control, Systemd)}
        while time.monotonic() < end:
            listed = self.in_rotation() if self.admin is not None else {}
            for t in batch:
                gone = self.admin is not None and not listed.get(t.cfg.base_url)
                if isinstance(self.control, Systemd):
                    s = self.control.show(t.unit)
                    gone = gone or not s.ready or s.invocation != invocations[t.name]
                if gone:
                    self.leave_out(t, "it failed again after its restart")
                    if self.admin is not None:  # out for real: when systemd brings it back, no canary ran
                        self.router(self.admin.remove, t.cfg.base_url)
                    raise StepFailed(f"{t.name}: out of rotation again within {self.opts.healthy_for:.0f} s of "
                                     "its restart", f"read `journalctl -u {t.unit}`; roll back or fix, then "
                                     "`dflashctl rollout --resume`", t)
            self._sleep()

    # --- the loop ----------------------------------------------------------------------------------
    def run(self, api_key_of) -> tuple[str, StepFailed | None]:
        """('done' | 'failed' | 'interrupted', the failure)."""
        targets = self.plan.targets
        if not targets:
            say("nothing to restart: every instance runs its unit's current definition")
            self.save("done", [])
            return "done", None
        if self.admin is None:
            say("no router: each instance's own port is down while it restarts")
        for i in range(0, len(targets), self.plan.batch):
            batch = targets[i:i + self.plan.batch]
            if self.stopping:
                return "interrupted", None
            label = f"[{i + 1}/{len(targets)}] " if len(batch) == 1 else f"[{i + 1}-{i + len(batch)}/{len(targets)}] "
            say(label + ", ".join(f"{t.name} ({t.why})" for t in batch))
            try:
                failure = self.run_batch(batch, api_key_of)
            except Interrupted:
                for t in batch:
                    if self.steps[t.name].outcome == "not reached":
                        self.steps[t.name].outcome = "interrupted"
                self.save("interrupted", [])
                return "interrupted", None
            except StepFailed as e:  # before anything of the batch was taken out
                self.save("failed", [])
                return "failed", e
            self.save("failed" if failure else "running", [])
            if failure:
                return "failed", failure
        self.save("done", [])
        return "done", None

    def run_batch(self, batch: list[Target], api_key_of) -> StepFailed | None:
        self.wait_others(batch)
        self.save("running", [t.name for t in batch])
        for t in batch:
            self.take_out(t)
            self.save("running", [t.name for t in batch])
        for t in batch:
            self.drain(t, api_key_of(t))
            self.ask_before(t, api_key_of(t))
        self.save("running", [t.name for t in batch])
        if self.stopping:  # nothing restarted yet: put them back as they were
            for t in batch:
                self.put_back(t)
                self.steps[t.name].outcome = "interrupted"
            raise Interrupted()
        t0 = time.monotonic()
        failures: list[tuple[Target, StepFailed]] = []
        started = []
        for t in batch:
            try:
                self.restart(t)
                started.append(t)
            except StepFailed as e:
                failures.append((t, e))
        failures += self.wait_ready(started, api_key_of, t0)
        for t in batch:
            if any(f[0] is t for f in failures):
                continue
            try:
                self.ask_after(t, api_key_of(t))
                self.put_back(t)
                self.steps[t.name].outcome = "done"
            except StepFailed as e:
                failures.append((t, e))
        done = [t for t in batch if self.steps[t.name].outcome == "done"]
        try:
            self.hold(done)
        except StepFailed as e:
            self.steps[e.target.name].outcome = "failed"
            failures.append((e.target, e))
        for t, e in failures:
            step = self.steps[t.name]
            step.outcome, step.error, step.fix = "failed", e.what, e.fix
            if t.name not in self.left_out:
                self.leave_out(t, e.what)
            else:
                self.left_out[t.name]["reason"] = e.what
            say(f"{e.what}\n  fix: {e.fix}")
        return failures[0][1] if failures else None


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
    p.add_argument("--batch", type=int, default=1, metavar="N", help="instances restarted together (default 1)")
    p.add_argument("--only", action="append", default=[], metavar="NAME", help="only this instance (repeat)")
    p.add_argument("--all", action="store_true", help="restart every instance, also those up to date")
    p.add_argument("--resume", action="store_true",
                   help="continue after a stopped rollout: the instances it left out of the router first")
    p.add_argument("--require-identical", action="store_true",
                   help="a canary whose greedy output changed stops the rollout")
    p.add_argument("--no-canary", action="store_true", help="do not compare outputs before and after")
    p.add_argument("--canary-tokens", type=int, default=32, metavar="N", help="tokens per canary prompt (32)")
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
    for flag, value, lo in (("--batch", args.batch, 1), ("--canary-tokens", args.canary_tokens, 1),
                            ("--healthy-for", args.healthy_for, 0)):
        if value < lo:
            raise DflashError(f"{flag} {value} is out of range", f"it must be at least {lo}",
                              f"pass {flag} {lo} or more", CONFIG)
    for flag, value in (("--ready-timeout", args.ready_timeout), ("--drain-timeout", args.drain_timeout),
                        ("--router-wait", args.router_wait)):
        if value is not None and value <= 0:
            raise DflashError(f"{flag} {value} is out of range", "it must be positive",
                              f"leave {flag} out for the default", CONFIG)
    return Options(batch=args.batch, canary_prompts=0 if args.no_canary else 4, canary_tokens=args.canary_tokens,
                   require_identical=args.require_identical, healthy_for=args.healthy_for,
                   ready_timeout=args.ready_timeout, drain_timeout=args.drain_timeout,
                   router_wait=args.router_wait)


def run(args) -> int:
    opts = options_of(args)
    if args.no_canary and args.require_identical:
        raise DflashError("--no-canary and --require-identical contradict each other", "",
                          "pass one of them", CONFIG)
    cfgs = rollout_plan.load_instances(args.instance)
    env = dict(os.environ)
    rcfg, admin_key = rollout_plan.load_router(args.router, args.no_router, env)
    state_dir = args.state_dir or rollout_state.default_dir()
    # a restart command's output is kept as restart-<name>.log beside the state; progress while it runs
    control = Command(args.restart_command, log_dir=state_dir, progress=say) if args.restart_command else Systemd()
    keys = {c.name: read_api_key(c, env) for c in cfgs}
    with rollout_state.RolloutLock(state_dir) as lock:
        previous = lock.read()
        left_out = {n: v for n, v in (previous.get("left_out") or {}).items() if n in keys}
        plan = rollout_plan.make_plan(cfgs, control if isinstance(control, Systemd) else None, left_out,
                                      only=args.only, every=args.all, resume=args.resume, batch=opts.batch)
        admin = RouterAdmin(rcfg.url, admin_key) if rcfg is not None else None
        check_router(admin, plan, left_out, opts.router_wait)
        if args.dry_run:
            return report_plan(plan, rcfg, args.json)
        sdnotify.notify("READY=1")  # the NixOS unit's start job ends here; the rollout goes on
        rollout = Rollout(plan, admin, rcfg.drain_sec if rcfg else 0, control, opts, lock, left_out)
        old = {s: signal.signal(s, lambda signum, frame: _on_signal(rollout, signum)) for s in
               (signal.SIGTERM, signal.SIGINT)}
        t0 = time.monotonic()
        try:
            status, failure = rollout.run(lambda t: keys[t.name])
        finally:
            for s, h in old.items():
                signal.signal(s, h)
        return report(rollout, status, failure, time.monotonic() - t0, args.json)


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
        output.print_json({"ok": True, "dry_run": True, "batch": plan.batch,
                           "router": rcfg.url if rcfg else None, "instances": rows})
        return OK
    print(f"rollout plan (batch {plan.batch}, router {rcfg.url if rcfg else 'none'}):")
    for r in rows:
        print(f"  {r['action']:8} {r['name']:20} {r['why']}")
    if not plan.targets:
        print("  nothing to restart")
    return OK


def _cell(v, unit: str = "s") -> str:
    return "-" if v is None else f"{v:.1f} {unit}" if isinstance(v, float) else str(v)


def report(rollout: Rollout, status: str, failure: StepFailed | None, seconds: float, as_json: bool) -> int:
    steps = list(rollout.steps.values())
    code = OK if status == "done" else ROLLOUT_STOPPED
    out = {"ok": code == OK, "exit_code": code, "status": status, "batch": rollout.plan.batch,
           "seconds": round(seconds, 1), "min_in_rotation": rollout.min_in_rotation,
           "router_restarts": rollout.router_restarts,
           "instances": [s.to_json() for s in steps],
           "up_to_date": [{"name": n, "why": w} for n, w in rollout.plan.up_to_date],
           "left_out": {n: v["reason"] for n, v in rollout.left_out.items()}}
    if failure is not None:
        out["error"] = {"what": failure.what, "fix": failure.fix}
    if as_json:
        output.print_json(out)  # the one JSON object, also when the rollout stopped (cli.main adds none)
    else:
        print(f"{'instance':16} {'outcome':12} {'out of rotation':>15} {'restart to ready':>16} "
              f"{'back in':>8}  canary")
        for s in steps:
            verdict = (s.canary or {}).get("verdict", "-")
            print(f"{s.name:16} {s.outcome:12} {_cell(s.out_of_rotation_s):>15} {_cell(s.restart_to_ready_s):>16} "
                  f"{_cell(s.back_in_s):>8}  {verdict}")
        for n, w in rollout.plan.up_to_date:
            print(f"{n:16} {'up to date':12} ({w})")
        print(f"{status} in {seconds:.1f} s; at least {_cell(rollout.min_in_rotation)} worker(s) in rotation")
    if status == "done":
        sdnotify.status(f"done: {len(steps)} instance(s) restarted in {seconds:.0f} s")
        return OK
    left = ", ".join(rollout.left_out) or "none"
    what = failure.what if failure else "the rollout was interrupted"
    raise DflashError(f"rollout {status}: {what}", f"left out of rotation: {left} (why: above, and in "
                      f"{rollout.lock.state_path}); not reached: "
                      + (", ".join(s.name for s in steps if s.outcome == "not reached") or "none")
                      + " (they keep their old version and keep serving)",
                      (failure.fix if failure else "run `dflashctl rollout --resume` to continue"),
                      ROLLOUT_STOPPED)
