"""Which instances a rollout restarts, in which order, and the router it works through.

The host's instances are their settings files, found as status and monitoring find them
(operations/instances.py: `--instance`, else every `/etc/dflash/*.json` and `/etc/dflash-instances.json`).
Under systemd an instance needs a restart when its unit is not serving or when the running process
was started from another definition of its unit than the current one (instance_control says how
that is known); without systemd each one, but those a rollout that did not finish already restarted
onto the same settings; `--all` restarts every one. Instances a stopped rollout left out of the
router go first (`--resume`), then those not serving (under systemd the unit's state, else their own
/health_generate: restarting them costs no capacity), then the rest in the order given.
"""

from dataclasses import dataclass
from pathlib import Path

from dflashctl.errors import CONFIG, ROLLOUT_STOPPED, DflashError
from dflashctl.operations import instances, router, unit_data
from dflashctl.service import config, unit
from dflashctl.service.config import InstanceConfig
from dflashctl.service.instance_control import DIGEST_VAR, Systemd

SETTINGS_GLOB = instances.SETTINGS_GLOB


@dataclass(frozen=True)
class Target:
    cfg: InstanceConfig
    why: str

    @property
    def name(self) -> str:
        return self.cfg.name

    @property
    def unit(self) -> str:
        return unit.unit_name(self.cfg)


@dataclass(frozen=True)
class Plan:
    targets: list[Target]
    up_to_date: list[tuple[str, str]]  # (instance, why it is left alone)
    batch: int
    instances: list[InstanceConfig]  # every instance of the host, restarted or not


def load_instances(paths: list[str]) -> list[InstanceConfig]:
    """The host's instances as status and monitoring read them (operations/instances.py)."""
    return instances.load(paths)


def load_router(path: str | None, no_router: bool, env: dict[str, str]):
    """(router settings or None, its admin key or None)."""
    if no_router:
        return None, None
    default = unit_data.router_unit_data()["settingsPath"]
    if path is None and not Path(default).exists():
        return None, None
    cfg = router.from_dict(config.read_json(path or default), origin=path or default)
    _, admin = router.read_keys(cfg, env)
    return cfg, admin


def freshness(cfg: InstanceConfig, control: Systemd) -> tuple[bool, str]:
    """(needs a restart, why) for one instance's unit."""
    name = unit.unit_name(cfg)
    state = control.show(name)
    if state.load != "loaded":
        raise DflashError(f"{name} is not installed on this host", f"systemd says LoadState={state.load}",
                          f"install its unit first (`dflashctl unit --config <settings> -o {name}`), or "
                          "leave the instance out", CONFIG)
    if state.need_reload:
        raise DflashError(f"{name} changed on disk but systemd still has the old definition",
                          "NeedDaemonReload=yes", "run `systemctl daemon-reload` first: the rollout "
                          "restarts units into the definition systemd has loaded", CONFIG)
    if not state.ready:
        return True, f"not serving ({state.active}/{state.sub})"
    if state.digest is None:
        return True, f"its unit has no {DIGEST_VAR} (rendered before rollouts): cannot tell, restarting"
    if control.running_digest(state) != state.digest:
        return True, "runs an older definition of its unit"
    return False, "runs its unit's current definition"


def make_plan(cfgs: list[InstanceConfig], control: Systemd | None, left_out: dict, *, only: list[str],
              every: bool, resume: bool, batch: int, serving: dict[str, bool] | None = None,
              done: dict | None = None) -> Plan:
    """`left_out`: what the last rollout left out of rotation ({name: {"reason": ...}}); `serving`
    (without systemd): which instances answer /health_generate; `done`: the instances a rollout that
    did not finish restarted onto the definition they have now (not restarted again without --all)."""
    known = {c.name for c in cfgs}
    unknown = [n for n in only if n not in known]
    if unknown:
        raise DflashError(f"--only names no instance of this host: {', '.join(unknown)}",
                          f"the instances are {', '.join(sorted(known))}", "pass names from that list", CONFIG)
    if left_out and not resume:
        listed = "; ".join(f"{n}: {v.get('reason', '?')}" for n, v in sorted(left_out.items()))
        raise DflashError("the last rollout stopped and left instances out of the router", listed,
                          "fix the cause (or roll back the generation / the units), then run "
                          "`dflashctl rollout --resume`: it starts with those", ROLLOUT_STOPPED)
    first, down, rest, fresh = [], [], [], []
    for c in cfgs:
        if only and c.name not in only and c.name not in left_out:
            continue
        if c.name in left_out:
            first.append(Target(c, f"left out by the last rollout: {left_out[c.name].get('reason', '?')}"))
            continue
        if control is None:
            if serving is not None and not serving.get(c.name, True):
                down.append(Target(c, "not serving (no answer to /health_generate)"))
            elif c.name in (done or {}) and not every:
                fresh.append((c.name, "restarted onto this definition by the rollout that did not finish"))
            else:
                rest.append(Target(c, "restart (without systemd nothing tells whether it is out of date)"))
            continue
        needs, why = freshness(c, control)
        if every and not needs:
            needs, why = True, "--all"
        if not needs:
            fresh.append((c.name, why))
        elif why.startswith("not serving"):
            down.append(Target(c, why))
        else:
            rest.append(Target(c, why))
    return Plan(first + down + rest, fresh, batch, cfgs)
