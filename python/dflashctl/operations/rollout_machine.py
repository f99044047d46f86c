"""One rollout's work on this host's instances: each instance through its steps, and what came of it.

A batch goes through STEPS together: take out (the router stops routing to it, checked), drain
(its requests in flight finish, at most drainSec), measure before (the canary alone on it),
restart, ready (READY=1 under systemd, else one token of ours from its /generate), measure after and judge
(canary_verdict: a slower build, a drafter that accepts less, changed outputs or failed requests
fail the step here, before it is put back), put back (the router routes to it again), hold (it
stays in rotation `--healthy-for` seconds). `each` is the one place where whatever a step raises
(StepFailed, DflashError, the router gone, OSError, an interruption) becomes that instance's
outcome, with the step's name: the failure is said at once, recorded in the state file for
`--resume`, and the other instances of the batch go on to the end of their steps.

Capacity (Kubernetes' maxUnavailable): before a batch goes, this host's instances in rotation
outside the batch must be at least `floor`; workers of other hosts (router URLs that are none of
this host's instances) are reported, never counted or waited for.
"""

import os
import re
import sys
import time
from dataclasses import asdict, dataclass, field

from dflashctl.errors import PREFLIGHT_GPU_FAULT, SERVER_GPU_FAILED, DflashError
from dflashctl.operations import canary, rollout_state
from dflashctl.operations.canary import CanarySettings, Reading
from dflashctl.operations.rollout_plan import Plan, Target
from dflashctl.operations.router_admin import RouterAdmin, RouterUnreachable
from dflashctl.service import sdnotify, unit_text
from dflashctl.service.instance_control import Systemd

GPU_BUSY = 87  # errors.PREFLIGHT_GPU_BUSY: other work holds the GPU; it may end, so keep waiting
# serve's exits that name the GPU, not the definition: a rollback would not help
GPU_FAULTS = {PREFLIGHT_GPU_FAULT: "the preflight refused its GPU", SERVER_GPU_FAILED: "the GPU watch stopped it"}
_GPU_EXIT = re.compile(r"\bexit (" + "|".join(map(str, GPU_FAULTS)) + r")\b")
POLL_S = 0.5
PROGRESS_EVERY_S = 5.0
STEPS = ("take out", "drain", "measure before", "restart", "ready", "measure after", "put back", "hold")
ROUTER_LISTS_S = 10.0  # the router's admin API works in the background: how long a change may take to show
ADMIT_S = 60.0  # how long the router may take to route to an instance put back (its health check)
# How often the router's worker list is read while an instance waits to be admitted: it is out of
# rotation until then, and the router admits it as soon as one /health answers (about 50 ms with
# the Nix stack's promptReadiness fix-up; a 0.25 s poll added up to 0.25 s to every instance).
ADMIT_POLL_S = 0.05
# A decode speed below the bar, with nothing else wrong, is read again (the best reading counts): on
# the H200 an identical build read 0.78x once while the GPU's other instance served the host's load.
SPEED_RECHECKS = 2


@dataclass
class Options:
    max_unavailable: int = 1
    canary: CanarySettings = field(default_factory=CanarySettings)
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
    step: str | None = None  # the step it is at, or ended in when it failed or was interrupted
    error: str | None = None
    fix: str | None = None
    out_of_rotation_s: float | None = None
    drain_s: float | None = None
    still_running: int | None = None  # requests still in flight when the restart began
    restart_to_ready_s: float | None = None
    canary: dict | None = None
    back_in_s: float | None = None
    t_out: float | None = field(default=None, repr=False)
    before: Reading | None = field(default=None, repr=False)
    invocation: str = field(default="", repr=False)

    def to_json(self) -> dict:
        d = asdict(self)
        for k in ("t_out", "before", "invocation"):
            d.pop(k)
        return {k: round(v, 2) if isinstance(v, float) else v for k, v in d.items()}


class StepFailed(Exception):
    def __init__(self, what: str, fix: str):
        super().__init__(what)
        self.what, self.fix = what, fix


class Interrupted(Exception):
    pass


def say(text: str) -> None:
    print(f"dflashctl rollout: {text}", file=sys.stderr, flush=True)
    sdnotify.status(text.splitlines()[0])


def as_failure(name: str, step: str, e: BaseException, log_hint: str) -> StepFailed:
    """Whatever a step raised, as the instance's failure: what, naming the step, and the fix."""
    resume = "then `dflashctl rollout --resume`"
    if isinstance(e, StepFailed):  # the router's wait names neither: the report's row must
        return e if e.what.startswith(f"{name}: ") else StepFailed(f"{name}: {step} failed: {e.what}", e.fix)
    if isinstance(e, DflashError):  # RouterUnreachable is one: the router() wrapper waited already
        why = f": {e.why}" if e.why else ""
        return StepFailed(f"{name}: {step} failed: {e.what}{why}", f"{e.fix}; {resume}" if e.fix else resume)
    if isinstance(e, OSError):
        return StepFailed(f"{name}: {step} failed: {e.strerror or e}",
                          f"{log_hint} and what the error names; {resume}")
    return StepFailed(f"{name}: {step} failed: {type(e).__name__}: {e}",
                      f"this is a dflashctl bug: report it with the journal; {resume}")


def gpu_fault(t: Target, code: int, status: str, then: str) -> StepFailed:
    return StepFailed(f"{t.name}: its GPU is faulty (exit {code}: {GPU_FAULTS[code]}), not its new definition: "
                      f"{status}", f"the GPU needs the fix its status names (`dflashctl doctor` shows it), not a "
                      f"rollback; {then}")


class Rollout:
    def __init__(self, plan: Plan, admin: RouterAdmin | None, drain_sec: float, control,
                 opts: Options, lock: rollout_state.RolloutLock, carried: dict, definitions: dict[str, str]):
        """`carried`: what the last rollout's state holds ({"left_out", "done"}) for this host's instances;
        `definitions`: instance -> the key of the definition a restart now starts it on."""
        self.plan, self.admin, self.control, self.opts, self.lock = plan, admin, control, opts, lock
        self.drain_timeout = opts.drain_timeout if opts.drain_timeout is not None else drain_sec
        self.left_out = dict(carried.get("left_out") or {})  # name -> {"reason", "url", "step", "before"}
        self.done = dict(carried.get("done") or {})  # name -> the definition key it was restarted onto
        self.definitions = definitions
        self.steps = {t.name: Step(t.name, t.unit, t.cfg.base_url, t.why) for t in plan.targets}
        self.stopping = self.aborting = False
        self.status = "running"
        self.failure: StepFailed | None = None
        self.min_in_rotation: int | None = None
        self.router_restarts = 0
        self.remote_said: set[str] = set()
        self._router_ids: set[str] = set()
        self.started = time.time()

    @property
    def systemd(self) -> bool:
        return isinstance(self.control, Systemd)

    def log_hint(self, t: Target) -> str:
        """Where the instance's own account of a failure is: its journal only where systemd runs it."""
        if self.systemd:
            return f"read `journalctl -u {t.unit}`"
        kept = self.control.log_path(t.name)
        return f"read the restart command's output ({kept or 'above'}) and the instance's log"

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
        mine = self.mine()
        healthy = sum(w.healthy for w in listed if w.url in mine)
        self.min_in_rotation = healthy if self.min_in_rotation is None else min(self.min_in_rotation, healthy)
        return {w.url: w.healthy for w in listed}

    def mine(self) -> set[str]:
        return {c.base_url for c in self.plan.instances}

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

    def save(self, current: list[str] | None = None) -> None:
        self.lock.write({"pid": os.getpid(), "started": self.started, "status": self.status,
                         "current": current or [], "left_out": self.left_out, "done": self.done,
                         "instances": {s.name: {"outcome": s.outcome, "step": s.step} for s in self.steps.values()}})

    def leave_out(self, t: Target, reason: str) -> None:
        step = self.steps[t.name]
        before = step.before.to_json() if step.before else (self.left_out.get(t.name) or {}).get("before")
        self.left_out[t.name] = {"reason": reason, "url": t.cfg.base_url, "step": step.step, "before": before}

    def ready_timeout(self, t: Target) -> float:
        if self.opts.ready_timeout is not None:
            return self.opts.ready_timeout
        return t.cfg.start_timeout_sec + unit_text.unit_data()["timeoutStartMarginSec"]

    # --- the one place an exception becomes an outcome ----------------------------------------------
    def each(self, batch: list[Target], step_name: str, fn) -> list[Target]:
        """fn(t) for each instance of the batch; those it did not fail for go on."""
        going = []
        for t in batch:
            self.steps[t.name].step = step_name
            try:
                fn(t)
                going.append(t)
            except (Interrupted, KeyboardInterrupt):
                self.interrupt(batch)
                raise Interrupted() from None
            except Exception as e:  # noqa: BLE001 - every failure is this instance's outcome, said and saved
                self.fail(t, as_failure(t.name, step_name, e, self.log_hint(t)))
        self.save([t.name for t in going])
        return going

    def fail(self, t: Target, e: StepFailed) -> None:
        step = self.steps[t.name]
        step.outcome, step.error, step.fix = "failed", e.what, e.fix
        if self.failure is None:
            self.failure = e
        if step.step in ("take out", "drain", "measure before") and step.restart_to_ready_s is None:
            reason = f"{e.what} (at {step.step}, before its restart: it runs its old definition)"
        else:
            reason = f"{e.what} (at {step.step})"
        self.leave_out(t, reason)
        if self.admin is not None and step.step == "hold":  # out for real: when it comes back, no canary ran
            try:
                self.router(self.admin.remove, t.cfg.base_url)
            except Exception as gone:  # noqa: BLE001 - best effort, said: the failure above is the report's
                say(f"{t.name}: could not take it out of the router again: {getattr(gone, 'what', gone)}")
        say(f"{e.what}\n  fix: {e.fix}")
        self.save()

    def interrupt(self, batch: list[Target]) -> None:
        for t in batch:
            step = self.steps[t.name]
            if step.outcome == "not reached":
                step.outcome = "interrupted"
                if t.name in self.left_out:
                    self.left_out[t.name]["reason"] = f"interrupted at {step.step}"
                    self.left_out[t.name]["step"] = step.step

    # --- the steps ---------------------------------------------------------------------------------
    def wait_for_capacity(self, batch: list[Target], floor: int) -> None:
        """This host's instances in rotation outside the batch at least `floor`, or stop (nothing of the
        batch is touched yet). Other hosts' workers are said once, never waited for."""
        if self.admin is None:
            return
        mine, going = self.mine(), {t.cfg.base_url for t in batch}
        deadline = time.monotonic() + self.opts.wait_others
        said = False
        while True:
            listed = self.in_rotation()
            remote = sorted(u for u, ok in listed.items() if u not in mine and not ok and u not in self.remote_said)
            if remote:
                say(f"worker(s) of other hosts out of rotation: {', '.join(remote)} (not this host's: not waited for)")
                self.remote_said.update(remote)
            serving = sorted(u for u in mine - going if listed.get(u))
            if len(serving) >= floor:
                return
            out = sorted(u for u in mine - going if not listed.get(u))
            if time.monotonic() >= deadline:
                raise StepFailed(f"{', '.join(out)} out of rotation for {self.opts.wait_others:.0f} s: taking "
                                 f"{', '.join(t.name for t in batch)} out too would leave {len(serving)} of this "
                                 f"host's {len(mine)} instances serving, fewer than {floor} (--max-unavailable "
                                 f"{self.opts.max_unavailable})",
                                 "bring that instance back first (`dflashctl status`), then `dflashctl rollout "
                                 "--resume`")
            if not said:
                say(f"waiting for {', '.join(out)} to be in rotation before taking out "
                    f"{', '.join(t.name for t in batch)} ({len(serving)} serving, at least {floor} must)")
                said = True
            self._sleep()

    def take_out(self, t: Target) -> None:
        step = self.steps[t.name]
        step.t_out = time.monotonic()
        was_out = t.name in self.left_out
        self.leave_out(t, "taken out for its restart (the rollout had not finished it)")
        self.save([t.name])
        if self.admin is None:
            return
        listed = self.router(self.admin.remove, t.cfg.base_url)
        if not listed and not was_out:
            say(f"{t.name}: the router did not list it")
        if not self.router(self.admin.wait_listed, t.cfg.base_url, False, ROUTER_LISTS_S):
            raise StepFailed(f"{t.name}: the router still routes to it {ROUTER_LISTS_S:.0f} s after it was "
                             "asked to remove it", "see `journalctl -u dflash-router` (its admin API); the "
                             "instance was not restarted; then `dflashctl rollout --resume`")
        serving = sum(ok for u, ok in self.in_rotation().items() if u in self.mine())
        say(f"{t.name}: out of rotation ({serving} of this host's instance(s) serving)")

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

    def measure_before(self, t: Target, api_key: str | None) -> None:
        step = self.steps[t.name]
        saved = (self.left_out.get(t.name) or {}).get("before")
        if not self.opts.canary.enabled:
            return
        if saved:  # a resumed instance: the reading of the version before its first restart
            try:
                step.before = Reading.from_json(saved)
                say(f"{t.name}: canary: the reading from before its first restart (kept for --resume)")
                return
            except ValueError as e:
                say(f"{t.name}: {e}; measuring again")
        if not canary.decodes_now(t.cfg.base_url, api_key, timeout=30):  # out of rotation: no second to spare
            say(f"{t.name}: it does not decode before its restart: nothing to compare the canary with")
            return
        step.before = canary.measure(t.cfg.base_url, api_key, self.opts.canary,
                                     lambda text: say(f"{t.name}: {text}"))
        self.leave_out(t, "taken out for its restart (the rollout had not finished it)")

    def restart(self, t: Target) -> None:
        step = self.steps[t.name]
        step.restart_to_ready_s = None
        if self.systemd:
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
                             f"command was still waiting): {out or '(no output)'}",
                             f"{self.log_hint(t)}; if it only loads slowly, raise startTimeoutSec or pass "
                             "--ready-timeout; then `dflashctl rollout --resume`")
        if rc != 0:
            m = _GPU_EXIT.search(out or "")  # serve's exit status, as the command passes it on
            code = rc if rc in GPU_FAULTS else int(m.group(1)) if m else None
            if code is not None:
                raise gpu_fault(t, code, out or "(no output)", "then `dflashctl rollout --resume`")
            raise StepFailed(f"{t.name}: the restart command failed (exit {rc}): {out or '(no output)'}",
                             "fix what it names, then `dflashctl rollout --resume`; the instance stays out "
                             "of the router until then")

    def wait_ready(self, batch: list[Target], api_key_of, t0: float) -> list[Target]:
        """Until each is ready or failed (each failure its outcome at once)."""
        waiting = list(batch)
        ready: list[Target] = []
        last_said = time.monotonic()

        def check(t: Target) -> None:
            if self._ready_or_fail(t, api_key_of(t), time.monotonic() - t0):
                self.steps[t.name].restart_to_ready_s = time.monotonic() - t0
                say(f"{t.name}: ready after {time.monotonic() - t0:.1f} s")
                ready.append(t)
        while waiting:
            still = self.each(waiting, "ready", check)
            waiting = [t for t in still if t not in ready]
            if waiting and time.monotonic() - last_said >= PROGRESS_EVERY_S:
                last_said = time.monotonic()
                for t in waiting:
                    say(f"{t.name}: starting ({time.monotonic() - t0:.0f} s){self._status_of(t)}")
            if waiting:
                self.keep_out(waiting)
                self._sleep()
        return [t for t in batch if t in ready]

    def _status_of(self, t: Target) -> str:
        if not self.systemd:
            return ""
        text = self.control.show(t.unit).status_text
        return f": {text}" if text else ""

    def _ready_or_fail(self, t: Target, api_key: str | None, elapsed: float) -> bool:
        """True when ready, False while it starts; StepFailed when the start failed or took too long."""
        limit = self.ready_timeout(t)
        if self.systemd:
            s = self.control.show(t.unit)
            restarted = s.invocation != self.steps[t.name].invocation or not self.steps[t.name].invocation
            if restarted and s.ready:
                return True
            if restarted and s.start_failed and s.exit_status in GPU_FAULTS:
                raise gpu_fault(t, s.exit_status, s.status_text or "no status",
                                f"then `systemctl start {t.unit}` and `dflashctl rollout --resume`")
            if restarted and s.start_failed and s.exit_status != GPU_BUSY:
                code = f"exit {s.exit_status}" if s.exit_status is not None else s.result
                raise StepFailed(f"{t.name}: its new start failed ({code}): {s.status_text or 'no status'}",
                                 f"read `journalctl -u {t.unit}`; roll back or fix, then `dflashctl rollout "
                                 "--resume`. It stays out of the router; systemd "
                                 + ("does not restart it (a failure that repeats)" if s.active == "failed"
                                    else "keeps restarting it with backoff"))
        elif canary.decodes_now(t.cfg.base_url, api_key, timeout=10):
            return True
        if elapsed >= limit:
            how = (" (its port refuses connections: is the process running?)"
                   if canary.request(t.cfg.base_url, "/health", api_key, timeout=5)[0] == 0 else "")
            raise StepFailed(f"{t.name}: not ready {limit:.0f} s after its restart{how}",
                             f"{self.log_hint(t)}; if it only loads slowly, raise startTimeoutSec or pass "
                             "--ready-timeout; then `dflashctl rollout --resume`")
        return False

    def measure_after(self, t: Target, api_key: str | None) -> None:
        step = self.steps[t.name]
        if not self.opts.canary.enabled:
            step.canary = {"verdict": "skipped (--no-canary)"}
            return
        verdict, rechecks = self.judge_after(t, api_key, step.before)
        step.canary = {**verdict.to_json(), "summary": verdict.summary(), "speed_rechecks": rechecks}
        say(f"{t.name}: canary {verdict.summary()}")
        for note in verdict.notes:
            say(f"{t.name}: canary note: {note}")
        if not verdict.ok:
            raise StepFailed(f"{t.name}: {verdict.what}", f"{verdict.fix}; it stays out of the router (the "
                             "instances not reached keep the old build); after a rollback or a fix, "
                             "`dflashctl rollout --resume`")

    def judge_after(self, t: Target, api_key: str | None, before: Reading | None):
        """The canary after the restart, judged against `before`; a verdict that failed on decode speed
        alone is read again, up to SPEED_RECHECKS times, and the best reading counts. (verdict, rechecks)"""
        def reading():
            return canary.measure(t.cfg.base_url, api_key, self.opts.canary, lambda text: say(f"{t.name}: {text}"))
        verdict = canary.judge(before, reading(), self.opts.canary)
        rechecks = 0
        while rechecks < SPEED_RECHECKS and verdict.failed_only_on_speed:
            rechecks += 1
            say(f"{t.name}: canary: decode speed {verdict.speed['ratio']:.2f}x of before, below "
                f"{verdict.speed['min_ratio']:g}x, and nothing else failed: measuring again "
                f"({rechecks} of {SPEED_RECHECKS})")
            again = canary.judge(before, reading(), self.opts.canary)
            if again.ok or (again.speed["ratio"] or 0) > verdict.speed["ratio"]:
                verdict = again
        return verdict, rechecks

    def put_back(self, t: Target) -> None:
        step = self.steps[t.name]
        if self.admin is None:
            self.left_out.pop(t.name, None)
            return
        t0 = time.monotonic()
        self.router(self.admin.add, t.cfg.base_url)
        if not self.router(self.admin.wait_listed, t.cfg.base_url, True, ADMIT_S, ADMIT_POLL_S):
            raise StepFailed(f"{t.name}: the router did not route to it within {ADMIT_S:.0f} s of adding it",
                             "see `journalctl -u dflash-router` (its health check of the instance); then "
                             "`dflashctl rollout --resume`")
        self.left_out.pop(t.name, None)
        step.back_in_s = time.monotonic() - t0
        step.out_of_rotation_s = time.monotonic() - step.t_out if step.t_out is not None else None
        say(f"{t.name}: back in rotation ({step.out_of_rotation_s or 0:.1f} s out)")

    def hold(self, batch: list[Target]) -> list[Target]:
        """Nomad's min_healthy_time: the batch must stay serving a while before the next one goes. An
        instance that leaves fails at once; the others hold on."""
        end = time.monotonic() + self.opts.healthy_for
        holding = self.each(batch, "hold", self._note_invocation)
        invocations = {t.name: self.steps[t.name].invocation for t in holding}
        while holding and time.monotonic() < end:
            listed: dict[str, bool] = {}
            if self.admin is not None:
                try:
                    listed = self.in_rotation()
                except StepFailed as e:  # the router gone for good: every instance held fails with it
                    for t in holding:
                        self.fail(t, StepFailed(f"{t.name}: hold failed: {e.what}", e.fix))
                    return []

            def still(t: Target) -> None:
                gone = self.admin is not None and not listed.get(t.cfg.base_url)
                if self.systemd:
                    s = self.control.show(t.unit)
                    gone = gone or not s.ready or s.invocation != invocations.get(t.name)
                if gone:
                    raise StepFailed(f"{t.name}: out of rotation again within {self.opts.healthy_for:.0f} s of "
                                     "its restart", f"{self.log_hint(t)}; roll back or fix, then "
                                     "`dflashctl rollout --resume`")
            holding = self.each(holding, "hold", still)
            if holding:
                self._sleep()
        return holding

    def _note_invocation(self, t: Target) -> None:
        if self.systemd:
            self.steps[t.name].invocation = self.control.show(t.unit).invocation

    # --- the loop ----------------------------------------------------------------------------------
    def run(self, api_key_of, floor: int) -> str:
        """'done' | 'failed' | 'interrupted'; the state file says the same once it returns."""
        try:
            self.status = self._run(api_key_of, floor)
        except (Interrupted, KeyboardInterrupt):
            self.status = "interrupted"
        except Exception as e:  # noqa: BLE001 - outside any instance's steps (capacity, the router)
            self.failure = as_failure("the rollout", "its next batch", e, "read the messages above")
            say(f"{self.failure.what}\n  fix: {self.failure.fix}")
            self.status = "failed"
        finally:
            if self.status == "running":
                self.status = "interrupted"
            self.save()
        return self.status

    def _run(self, api_key_of, floor: int) -> str:
        targets = self.plan.targets
        if not targets:
            say("nothing to restart: every instance runs its unit's current definition")
            return "done"
        if self.admin is None:
            say("no router: each instance's own port is down while it restarts")
        size = self.opts.max_unavailable
        for i in range(0, len(targets), size):
            batch = targets[i:i + size]
            if self.stopping:
                return "interrupted"
            label = f"[{i + 1}/{len(targets)}] " if len(batch) == 1 else f"[{i + 1}-{i + len(batch)}/{len(targets)}] "
            say(label + ", ".join(f"{t.name} ({t.why})" for t in batch))
            self.wait_for_capacity(batch, floor)  # nothing of the batch is touched when it stops here
            try:
                self.run_batch(batch, api_key_of)
            except (Interrupted, KeyboardInterrupt):
                self.interrupt(batch)
                raise
            except Exception as e:  # noqa: BLE001 - between the steps (the router gone while waiting)
                for t in batch:
                    if self.steps[t.name].outcome == "not reached":
                        self.fail(t, as_failure(t.name, self.steps[t.name].step or "take out", e, self.log_hint(t)))
            if self.failure is not None:
                return "failed"
        return "interrupted" if self.stopping and any(s.outcome == "not reached" for s in self.steps.values()) \
            else "done"

    def run_batch(self, batch: list[Target], api_key_of) -> None:
        live = self.each(batch, "take out", self.take_out)
        live = self.each(live, "drain", lambda t: self.drain(t, api_key_of(t)))
        live = self.each(live, "measure before", lambda t: self.measure_before(t, api_key_of(t)))
        if self.stopping:  # nothing restarted yet: put them back as they were
            for t in self.each(live, "put back", self.put_back):
                self.steps[t.name].outcome = "interrupted"
            raise Interrupted()
        t0 = time.monotonic()
        live = self.each(live, "restart", self.restart)
        live = self.wait_ready(live, api_key_of, t0)
        live = self.each(live, "measure after", lambda t: self.measure_after(t, api_key_of(t)))
        live = self.each(live, "put back", self.put_back)
        for t in self.hold(live):
            step = self.steps[t.name]
            step.outcome, step.step = "done", None
            self.done[t.name] = self.definitions.get(t.name)
        self.save()
