"""GPU health from NVML's figures: is a GPU fit to serve, and if not, what it needs.

`assess(snapshot)` takes the facts probe_child.nvml_snapshot reads (doctor's `gpus` probe, serve's
preflight, a `doctor --record-nvml` recording) and returns one GpuHealth per GPU: its identity
(index, UUID, PCI bus id, name) and findings, each ok / warn / fail with what it means and the fix.
It calls nothing: whoever holds NVML facts (doctor, serve, smoke, `dflashctl status`) can judge
them the same way. `xid_finding` and `watch_finding` judge what the GPU watch sees while an
instance serves (host/gpu_watch.py).

What fails and what warns, each threshold, each XID's verdict and every text an operator reads
(what is wrong, the fix) are data/gpu-health.json's (gpu_health_data.py reads it); this module
holds how NVML's figures are read and compared. Bit values and codes are NVML's own (nvml.h).
"""

from dataclasses import dataclass, field

from dflashctl import errors
from dflashctl.host import gpu_health_data, probes

# Every verdict, threshold and text below comes from data/gpu-health.json (gpu_health_data.py): the
# docs' tables and the alert rules are generated from the same file, so they cannot disagree.
DATA = gpu_health_data.load()
_RC = DATA.data["nvmlReturn"]
GPU_IS_LOST, RESET_REQUIRED, NOT_SUPPORTED = _RC["gpuIsLost"], _RC["resetRequired"], _RC["notSupported"]
GPU_IDLE = next(r["bit"] for r in DATA.clock_reasons() if r["name"] == "gpu_idle")


@dataclass
class Finding:
    status: str  # ok | warn | fail
    what: str  # what NVML says and what it means
    fix: str = ""
    key: str = ""  # lost | missing | recovery | ecc | remap | retired-pages | clocks | pcie | xid


@dataclass
class GpuHealth:
    index: int
    uuid: str | None = None
    pci_bus_id: str | None = None
    name: str | None = None
    findings: list[Finding] = field(default_factory=list)
    figures: dict = field(default_factory=dict)  # NVML's raw figures, each with its return code

    @property
    def status(self) -> str:
        states = {f.status for f in self.findings}
        return "fail" if "fail" in states else "warn" if "warn" in states else "ok"

    @property
    def label(self) -> str:
        known = [x for x in (self.name, self.uuid, self.pci_bus_id and f"PCI {self.pci_bus_id}") if x]
        return f"GPU {self.index}" + (f" ({', '.join(known)})" if known else "")

    def problems(self) -> list[Finding]:
        return [f for f in self.findings if f.status != "ok"]

    def summary(self) -> str:
        """What is wrong, worst first; or what was read, when nothing is."""
        bad = sorted(self.problems(), key=lambda f: f.status != "fail")
        shown = bad or self.findings
        return f"{self.label}: " + "; ".join(f.what for f in shown)

    def fix(self) -> str:
        bad = sorted(self.problems(), key=lambda f: f.status != "fail")
        return "; ".join(dict.fromkeys(f.fix for f in bad if f.fix))

    def to_json(self) -> dict:
        return {"index": self.index, "uuid": self.uuid, "pci_bus_id": self.pci_bus_id, "name": self.name,
                "status": self.status, "summary": self.summary(), "fix": self.fix(),
                "findings": [vars(f) for f in self.findings], "figures": self.figures}


# ------------------------------------------------------------------------------------- judging

def value(fig) -> object | None:
    """A figure's value when NVML gave one (rc 0), else None."""
    return fig.get("value") if isinstance(fig, dict) and fig.get("rc") == 0 else None


def mask(fig) -> int | None:
    v = value(fig)
    return int(v, 16) if isinstance(v, str) else v


def found(key: str, i: int, **figures) -> Finding:
    """The data's finding `key` on GPU `i`, its texts filled with `figures`."""
    f = DATA.finding(key)
    return Finding(f["status"], gpu_health_data.fill(f["what"], i=i, **figures),
                   gpu_health_data.fill(f.get("fix", ""), i=i), f["key"])


def found_serving(key: str, i: int, **figures) -> Finding:
    """The data's finding `key` as the watch names it while the instance serves."""
    f = DATA.finding(key)
    return Finding(f["serving"], gpu_health_data.fill(f["servingWhat"], i=i, **figures),
                   gpu_health_data.fill(f["servingFix"], i=i), f["key"])


def ok(text: str, key: str = "", **figures) -> Finding:
    return Finding("ok", DATA.text(text, **figures), key=key)


def assess(snapshot: dict, indices: list[int] | None = None) -> list[GpuHealth]:
    """One GpuHealth per GPU NVML counts (or per GPU of `indices`, which then also names a GPU
    the settings list that NVML does not count)."""
    by_index = {g["index"]: g for g in [*snapshot.get("gpus", []), *snapshot.get("unanswered", [])]}
    wanted = sorted(by_index) if indices is None else list(indices)
    count = snapshot.get("count", len(by_index))
    counted = ", ".join(map(str, sorted(by_index))) or "none"
    return [assess_gpu(by_index[i]) if i in by_index else
            GpuHealth(i, findings=[found("missing", i, count=count, counted=counted)]) for i in wanted]


def assess_gpu(gpu: dict) -> GpuHealth:
    figures = gpu.get("health") or {}
    h = GpuHealth(gpu["index"], gpu.get("uuid"), (value(figures.get("pci")) or {}).get("busId"),
                  gpu.get("name"), figures=figures)
    i = h.index
    if "rc" in gpu:  # NVML could not read the GPU at all
        h.findings.append(unanswered(gpu, i))
        return h
    if not figures:
        h.findings.append(ok("noFigures"))
        return h
    for judge in (recovery_findings, ecc_findings, remap_findings, retired_page_findings, clock_findings,
                  pcie_findings):
        h.findings += judge(figures, i)
    return h


def unanswered(gpu: dict, i: int) -> Finding:
    rc = gpu["rc"]
    if rc == GPU_IS_LOST:
        return found("lost", i)
    if rc == RESET_REQUIRED:
        return found("reset-required", i)
    return found("unreadable", i, error=gpu.get("error"))


def recovery_findings(figures: dict, i: int) -> list[Finding]:
    action = value(figures.get("recovery_action"))
    if not action:
        return []
    asked = DATA.recovery(action)
    f = found("recovery", i, action=action, action_what=gpu_health_data.fill(asked["what"], action=action))
    f.fix = gpu_health_data.fill(asked["fix"], i=i)
    return [f]


def ecc_findings(figures: dict, i: int) -> list[Finding]:
    counts = {k: value(v) for k, v in (figures.get("ecc_errors") or {}).items()}
    mode = value(figures.get("ecc_mode")) or {}
    if all(v is None for v in counts.values()):
        if mode.get("current") == 0:
            return [found("ecc-off", i)]
        return [ok("eccNone", "ecc")]
    volatile, lifetime = counts.get("uncorrected_volatile") or 0, counts.get("uncorrected_aggregate") or 0
    if volatile > DATA.finding("ecc-volatile")["above"]:
        return [found("ecc-volatile", i, volatile=volatile, lifetime=lifetime)]
    if lifetime > DATA.finding("ecc-lifetime")["above"]:
        return [found("ecc-lifetime", i, lifetime=lifetime)]
    return [ok("eccCounts", "ecc", volatile=volatile, lifetime=lifetime,
               corrected_volatile=counts.get("corrected_volatile") or 0,
               corrected_aggregate=counts.get("corrected_aggregate") or 0)]


def remap_findings(figures: dict, i: int) -> list[Finding]:
    rows = value(figures.get("remapped_rows"))
    if rows is None:
        return []  # before Ampere, or MIG on: retired pages instead
    remapped = DATA.text("remapped", correctable=rows["correctable"], uncorrectable=rows["uncorrectable"])
    if rows.get("failure"):
        return [found("remap-failed", i, remapped=remapped)]
    if rows.get("pending"):
        return [found("remap-pending", i, remapped=remapped)]
    return [ok("remapOk", "remap", remapped=remapped)]


def retired_page_findings(figures: dict, i: int) -> list[Finding]:
    pages = {k: value(v) for k, v in (figures.get("retired_pages") or {}).items()}
    if all(v is None for v in pages.values()):
        return []  # Ampere and later remap rows instead (the H200 answers NOT_SUPPORTED)
    counted = DATA.text("retiredCounted", double_bit=pages.get("double_bit") or 0,
                        multiple_single_bit=pages.get("multiple_single_bit") or 0)
    if value(figures.get("retired_pages_pending")):
        return [found("retired-pages-pending", i, counted=counted)]
    return [Finding("ok", counted, key="retired-pages")]


def clock_findings(figures: dict, i: int) -> list[Finding]:
    reasons = mask(figures.get("clock_event_reasons"))
    if reasons is None:
        return []
    named = [r for r in DATA.clock_reasons() if reasons & r["bit"]]
    host = [r for r in named if "fix" in r]  # the host's doing, not the workload's: these warn
    if host:
        f = found("clocks", i, reasons=", ".join(r["what"] for r in host), temperature=temperature(figures))
        f.fix = gpu_health_data.join_fixes([r["fix"] for r in host])
        return [f]
    shown = ", ".join(r["what"] for r in named) or DATA.text("clocksNone")
    return [ok("clocksOk", "clocks", reasons=shown, temperature=temperature(figures))]


def temperature(figures: dict) -> str:
    t, p = value(figures.get("temperature_c")), value(figures.get("power_mw"))
    parts = [f"{t} °C" if t is not None else None, f"{p / 1000:.0f} W" if p is not None else None]
    return f" ({', '.join(x for x in parts if x)})" if any(parts) else ""


def pcie_findings(figures: dict, i: int) -> list[Finding]:
    link = {k: value(v) for k, v in (figures.get("pcie") or {}).items()}
    gen, gen_max, width, width_max = (link.get(k) for k in ("gen_current", "gen_max", "width_current", "width_max"))
    if None in (gen, gen_max, width, width_max):
        return []
    shown = DATA.text("pcieLink", gen=gen, width=width, gen_max=gen_max, width_max=width_max)
    if link.get("gen_gpu_max") and link["gen_gpu_max"] > gen_max:
        shown += DATA.text("pcieSlotLimits", gen_gpu_max=link["gen_gpu_max"])
    if width < width_max:
        return [found("pcie-narrow", i, link=shown, width=width, width_max=width_max, share=f"{width / width_max:.0%}")]
    idle = (mask(figures.get("clock_event_reasons")) or 0) & GPU_IDLE
    if gen < gen_max and not idle:
        return [found("pcie-slow", i, link=shown)]
    if gen < gen_max:
        shown += DATA.text("pcieIdle")
    return [Finding("ok", shown, key="pcie")]


# ---------------------------------------------------------------------------- while serving

def xid_finding(xid: int, i: int) -> Finding:
    """A critical XID on GPU `i`: fail when it means the GPU failed, else a note."""
    known = DATA.xid(xid) or {"verdict": "warn", "what": DATA.text("xidUnknown")}
    fix = gpu_health_data.fill(known.get("fix") or DATA.data["fixes"]["journal"], i=i)
    text = "xidFail" if known["verdict"] == "fail" else "xidWarn"
    return Finding(known["verdict"], DATA.text(text, xid=xid, what=known["what"]), fix, "xid")


def watch_finding(before: dict, now: dict, i: int) -> Finding | None:
    """What changed between two readings of the watch figures (probe_child.watch_figures) on GPU `i`:
    a failure that ends the instance, a warning for its status line, or None."""
    rcs = {fig.get("rc") for fig in iter_figures(now)}
    if rcs & {GPU_IS_LOST, RESET_REQUIRED}:
        return unanswered({"rc": GPU_IS_LOST if GPU_IS_LOST in rcs else RESET_REQUIRED}, i)
    old = value((before.get("ecc_errors") or {}).get("uncorrected_volatile")) or 0
    new = value((now.get("ecc_errors") or {}).get("uncorrected_volatile")) or 0
    if new - old > DATA.finding("ecc-volatile")["above"]:
        return found_serving("ecc-volatile", i, new=new - old)
    rows_before, rows = value(before.get("remapped_rows")) or {}, value(now.get("remapped_rows")) or {}
    if rows.get("failure") and not rows_before.get("failure"):
        return remap_findings(now, i)[0]
    action = value(now.get("recovery_action"))
    if action and action != value(before.get("recovery_action")):
        return recovery_findings(now, i)[0]
    if rows.get("pending") and not rows_before.get("pending"):
        return found_serving("remap-pending", i)
    return None


def iter_figures(node):
    if isinstance(node, dict) and "rc" in node:
        yield node
    elif isinstance(node, dict):
        for v in node.values():
            yield from iter_figures(v)


# ------------------------------------------------------------------------------------- checks

def not_read(name: str, result: dict) -> probes.Check:
    return probes.warn(name, f"GPU health not checked: NVML gave no answers ({probes.failure_text(result)})",
                       "see the driver check", **probes.evidence(result))


def doctor_checks(result: dict, expected: int | None = None) -> list[probes.Check]:
    """doctor: one check per GPU, `gpu-health:N`; with `expected`, GPUs NVML does not count fail too.
    Without NVML's answers none (doctor's `gpus` check already says they were not read), unless GPUs
    are expected: then not one of them is seen, and that fails (`gpu-count`), a warning would not."""
    if not result.get("ok"):
        if not expected:
            return []
        return [probes.fail("gpu-count", f"--expect-gpus {expected}, but no GPU is seen: NVML gave no answers "
                            f"({probes.failure_text(result)})",
                            "see the driver check; then `nvidia-smi -L` should list the host's GPUs",
                            errors.PREFLIGHT_DRIVER, **probes.evidence(result))]
    snapshot = result["facts"]
    counted = sorted(g["index"] for g in [*snapshot.get("gpus", []), *snapshot.get("unanswered", [])])
    indices = sorted(set(counted) | set(range(expected or 0)))
    return [as_check(f"gpu-health:{h.index}", h) for h in assess(snapshot, indices)]


def as_check(name: str, h: GpuHealth) -> probes.Check:
    details = {"gpu": h.to_json()}
    if h.status == "fail":
        return probes.fail(name, h.summary(), h.fix(), errors.PREFLIGHT_GPU_FAULT, **details)
    if h.status == "warn":
        return probes.warn(name, h.summary(), h.fix(), **details)
    return probes.ok(name, h.summary(), **details)


def preflight_check(result: dict, indices: list[int]) -> probes.Check:
    """serve: refuse (errors.PREFLIGHT_GPU_FAULT) when a GPU of the instance fails; warnings start it."""
    name = "gpu-health"
    if not result.get("ok"):
        return not_read(name, result)
    healths = assess(result["facts"], indices)
    details = {"gpus": [h.to_json() for h in healths]}
    failing = [h for h in healths if h.status == "fail"]
    if failing:
        return probes.fail(name, " | ".join(h.summary() for h in failing), " | ".join(h.fix() for h in failing),
                           errors.PREFLIGHT_GPU_FAULT, **details)
    warned = [h for h in healths if h.status == "warn"]
    if warned:
        return probes.warn(name, " | ".join(h.summary() for h in warned), " | ".join(h.fix() for h in warned),
                           **details)
    return probes.ok(name, " | ".join(h.summary() for h in healths), **details)


def brief(healths: list[GpuHealth]) -> str:
    """One line naming each GPU's verdict (smoke's result, status lines)."""
    return "; ".join(f"GPU {h.index} {h.status}" + ("" if h.status == "ok" else f": {h.summary().split(': ', 1)[1]}")
                     for h in healths) or "no GPUs"
