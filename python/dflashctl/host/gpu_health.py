"""GPU health from NVML's figures: is a GPU fit to serve, and if not, what it needs.

`assess(snapshot)` takes the facts probe_child.nvml_snapshot reads (doctor's `gpus` probe, serve's
preflight, a `doctor --record-nvml` recording) and returns one GpuHealth per GPU: its identity
(index, UUID, PCI bus id, name) and findings, each ok / warn / fail with what it means and the fix.
It calls nothing: whoever holds NVML facts (doctor, serve, smoke, `dflashctl status`) can judge
them the same way. `xid_finding` and `watch_finding` judge what the GPU watch sees while an
instance serves (host/gpu_watch.py).

What fails, and why: a GPU NVML has lost (NVML_ERROR_GPU_IS_LOST) or that needs a reset; a GPU
the settings name that NVML does not count; a row remap pending (it takes effect at the next
reset) or failed (the memory cannot repair itself); uncorrected ECC errors since the last reset
or driver load; a recovery action the driver asks for. What warns: uncorrected errors in the
board's past only, ECC off, pages waiting to be retired (older boards), clocks held down by
hardware or heat, a PCIe link narrower than it can be, or slower while busy. Bit values and codes
are NVML's own (nvml.h).
"""

from dataclasses import dataclass, field

from dflashctl import errors
from dflashctl.host import probes

GPU_IS_LOST, RESET_REQUIRED, NOT_SUPPORTED = 15, 16, 3  # nvmlReturn_t

# nvmlClocksEventReason* bits (nvml.h): those that are the host's doing, not the workload's, warn.
COOLING = "check the cooling: fans, airflow, inlet temperature, dust (`nvidia-smi -q -d TEMPERATURE,PERFORMANCE`)"
POWER = "check the power supplies and the board's power cables; the chassis' management log says why"
CLOCK_REASONS = {
    0x1: ("idle", None),
    0x2: ("application clocks setting", None),
    0x4: ("software power cap (the workload at the board's power limit)", None),
    0x8: ("hardware slowdown (heat, a power brake or over-current protection halve the clocks)",
          f"{COOLING}; {POWER}"),
    0x10: ("sync boost", None),
    0x20: ("software thermal slowdown (the GPU or its memory at its maximum operating temperature)", COOLING),
    0x40: ("hardware thermal slowdown (clocks halved or less: the GPU is too hot)", COOLING),
    0x80: ("hardware power brake (an external power brake, e.g. from the power supply, is asserted)", POWER),
    0x100: ("display clock setting", None),
}
GPU_IDLE = 0x1

# nvmlDeviceGpuRecoveryAction_t (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION)
RECOVERY = {1: ("a GPU reset", "drain it, then `nvidia-smi -r -i {i}` (root)"),
            2: ("a reboot of the host", "drain the host and reboot it"),
            3: ("its peer-to-peer (NVLink) traffic drained", "stop the instances that span it and this GPU's peers"),
            4: ("its peer-to-peer traffic drained and a GPU reset",
                "stop the instances on it and its peers, then `nvidia-smi -r -i {i}` (root)"),
            5: ("its IMEX domain recovered", "recover the IMEX domain (see NVIDIA's IMEX documentation)")}

# Critical XIDs (NVIDIA's Xid catalog) that mean the GPU itself failed: the supervisor ends the
# instance on these (errors.SERVER_GPU_FAILED). The others are the application's own errors (13, 31,
# 43, 45: SGLang dies by itself if it caused them) or early signals (63 a row remap recorded, 92 a
# high single-bit rate): those are logged and the instance keeps serving.
RESET = "drain it, then `nvidia-smi -r -i {i}` (root); if it happens again, replace the board"
FAILED_XIDS = {
    48: ("a double-bit (uncorrectable) ECC error", RESET),
    62: ("an internal micro-controller halt (GSP/PMU firmware)", RESET + "; update the driver if it recurs"),
    64: ("a row remap or page retirement that failed", "replace the board: its memory cannot repair itself"),
    74: ("an NVLink error", "drain it and its NVLink peers, reset them; check the NVLink bridges or baseboard"),
    79: ("the GPU has fallen off the bus", "power-cycle the host (`nvidia-smi -r` cannot reach a GPU off the "
         "bus); if it falls off again, reseat or replace the board, its riser or its power cables"),
    94: ("a contained uncorrectable ECC error (the process using that memory was stopped)", RESET),
    95: ("an uncontained uncorrectable ECC error (every process on the GPU is affected)", RESET),
    119: ("a GSP RPC timeout (the GPU's firmware stopped answering)", RESET + "; update the driver if it recurs"),
    120: ("a GSP error (the GPU's firmware failed)", RESET + "; update the driver if it recurs"),
    154: ("a change in the recovery action the driver asks for", "do what `nvidia-smi -q` names under GPU "
          "Recovery Action (a reset or a reboot)"),
}
NOTED_XIDS = {13: "a graphics engine exception (usually the application's)",
              31: "a GPU memory page fault (usually the application's)",
              43: "a stopped channel (usually the application's)", 45: "a channel torn down after an error",
              63: "a row remap or page retirement recorded (a reset applies it)",
              92: "a high single-bit ECC error rate"}


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


def assess(snapshot: dict, indices: list[int] | None = None) -> list[GpuHealth]:
    """One GpuHealth per GPU NVML counts (or per GPU of `indices`, which then also names a GPU
    the settings list that NVML does not count)."""
    by_index = {g["index"]: g for g in [*snapshot.get("gpus", []), *snapshot.get("unanswered", [])]}
    wanted = sorted(by_index) if indices is None else list(indices)
    count = snapshot.get("count", len(by_index))
    out = []
    for i in wanted:
        if i in by_index:
            out.append(assess_gpu(by_index[i]))
        else:
            out.append(GpuHealth(i, findings=[Finding(
                "fail", f"NVML counts {count} GPU(s) ({', '.join(map(str, sorted(by_index))) or 'none'}); "
                f"GPU {i} is not among them",
                "a GPU that fell off the bus can vanish from the count once the driver reloads: check "
                "`nvidia-smi -L` and `journalctl -k | grep -i xid`; if this host has fewer GPUs, list the ones "
                "it has in gpus", "missing")]))
    return out


def assess_gpu(gpu: dict) -> GpuHealth:
    figures = gpu.get("health") or {}
    h = GpuHealth(gpu["index"], gpu.get("uuid"), (value(figures.get("pci")) or {}).get("busId"),
                  gpu.get("name"), figures=figures)
    i = h.index
    if "rc" in gpu:  # NVML could not read the GPU at all
        h.findings.append(unanswered(gpu, i))
        return h
    if not figures:
        h.findings.append(Finding("ok", "no health figures (a recording made before they were read)"))
        return h
    for judge in (recovery_findings, ecc_findings, remap_findings, retired_page_findings, clock_findings,
                  pcie_findings):
        h.findings += judge(figures, i)
    return h


def unanswered(gpu: dict, i: int) -> Finding:
    rc = gpu["rc"]
    if rc == GPU_IS_LOST:
        return Finding("fail", "NVML has lost this GPU (NVML_ERROR_GPU_IS_LOST: fallen off the bus or "
                       "otherwise unreachable; the kernel log shows XID 79)",
                       f"stop what uses it, then `nvidia-smi -r -i {i}` (root); if NVML still reports it lost, "
                       "power-cycle the host; if it falls off again, reseat or replace the board, its riser or "
                       "its power cables (`journalctl -k | grep -i xid`)", "lost")
    if rc == RESET_REQUIRED:
        return Finding("fail", "the driver says this GPU needs a reset before it can be used again "
                       "(NVML_ERROR_RESET_REQUIRED)", f"drain it, then `nvidia-smi -r -i {i}` (root)", "lost")
    return Finding("fail", f"NVML cannot read this GPU: {gpu.get('error')}",
                   f"run `nvidia-smi -q -i {i}`; if it fails too, reset the GPU (`nvidia-smi -r -i {i}`) or "
                   "reboot the host", "lost")


def recovery_findings(figures: dict, i: int) -> list[Finding]:
    action = value(figures.get("recovery_action"))
    if not action:
        return []
    what, fix = RECOVERY.get(action, (f"recovery action {action}", "see `nvidia-smi -q` (GPU Recovery Action)"))
    return [Finding("fail", f"the driver asks for {what} (GPU recovery action {action})", fix.format(i=i),
                    "recovery")]


def ecc_findings(figures: dict, i: int) -> list[Finding]:
    counts = {k: value(v) for k, v in (figures.get("ecc_errors") or {}).items()}
    mode = value(figures.get("ecc_mode")) or {}
    if all(v is None for v in counts.values()):
        if mode.get("current") == 0:
            return [Finding("warn", "ECC is off: memory errors go uncounted and uncorrected",
                            f"`nvidia-smi -e 1 -i {i}` (root), then reset the GPU or reboot", "ecc")]
        return [Finding("ok", "no ECC counters (this board has none)", key="ecc")]
    volatile, lifetime = counts.get("uncorrected_volatile") or 0, counts.get("uncorrected_aggregate") or 0
    figures_text = (f"uncorrected ECC errors: {volatile} since the last reset, {lifetime} in the board's lifetime; "
                    f"corrected: {counts.get('corrected_volatile') or 0} / {counts.get('corrected_aggregate') or 0}")
    if volatile:
        return [Finding("fail", f"{volatile} uncorrected ECC error(s) since the driver loaded or the GPU was last "
                        f"reset ({lifetime} in its lifetime): what it computes from that memory cannot be trusted",
                        f"drain it and reset it (`nvidia-smi -r -i {i}`, root: this clears the volatile counts and "
                        "applies pending row remaps); if new uncorrected errors come, replace the board", "ecc")]
    if lifetime:
        return [Finding("warn", f"{lifetime} uncorrected ECC error(s) in the board's lifetime, none since the last "
                        "reset", "watch it: `dflashctl doctor --save FILE` now and `dflashctl diff FILE NEW` later "
                        "shows new ones; replace the board if they come back", "ecc")]
    return [Finding("ok", figures_text, key="ecc")]


def remap_findings(figures: dict, i: int) -> list[Finding]:
    rows = value(figures.get("remapped_rows"))
    if rows is None:
        return []  # before Ampere, or MIG on: retired pages instead
    remapped = (f"{rows['correctable']} row(s) remapped for correctable and {rows['uncorrectable']} for "
                "uncorrectable errors")
    if rows.get("failure"):
        return [Finding("fail", f"a row remap failed ({remapped}): this memory can no longer repair itself",
                        "replace the board (RMA); until then keep work off this GPU", "remap")]
    if rows.get("pending"):
        return [Finding("fail", f"a row remap is pending ({remapped}): it takes effect at the next GPU reset, "
                        "and until then the driver keeps the bad memory offline", f"with nothing running on it, "
                        f"`nvidia-smi -r -i {i}` (root), then start the instance again", "remap")]
    return [Finding("ok", f"no row remap pending or failed ({remapped})", key="remap")]


def retired_page_findings(figures: dict, i: int) -> list[Finding]:
    pages = {k: value(v) for k, v in (figures.get("retired_pages") or {}).items()}
    if all(v is None for v in pages.values()):
        return []  # Ampere and later remap rows instead (the H200 answers NOT_SUPPORTED)
    counted = f"{pages.get('double_bit') or 0} page(s) retired for double-bit and " \
              f"{pages.get('multiple_single_bit') or 0} for repeated single-bit errors"
    if value(figures.get("retired_pages_pending")):
        return [Finding("warn", f"pages wait to be retired at the next reset or driver load ({counted})",
                        f"drain it, then `nvidia-smi -r -i {i}` (root) or reboot", "retired-pages")]
    return [Finding("ok", counted, key="retired-pages")]


def clock_findings(figures: dict, i: int) -> list[Finding]:
    reasons = mask(figures.get("clock_event_reasons"))
    if reasons is None:
        return []
    named = [(bit, text, fix) for bit, (text, fix) in CLOCK_REASONS.items() if reasons & bit]
    host = [(text, fix) for _, text, fix in named if fix]
    if host:
        return [Finding("warn", "clocks held down: " + ", ".join(t for t, _ in host) + temperature(figures),
                        "; ".join(dict.fromkeys(f for _, f in host)), "clocks")]
    shown = ", ".join(t for _, t, _ in named) or "none (clocks as high as they go)"
    return [Finding("ok", f"clock event reasons: {shown}" + temperature(figures), key="clocks")]


def temperature(figures: dict) -> str:
    t, p = value(figures.get("temperature_c")), value(figures.get("power_mw"))
    parts = [f"{t} °C" if t is not None else None, f"{p / 1000:.0f} W" if p is not None else None]
    return f" ({', '.join(x for x in parts if x)})" if any(parts) else ""


def pcie_findings(figures: dict, i: int) -> list[Finding]:
    link = {k: value(v) for k, v in (figures.get("pcie") or {}).items()}
    gen, gen_max, width, width_max = (link.get(k) for k in ("gen_current", "gen_max", "width_current", "width_max"))
    if None in (gen, gen_max, width, width_max):
        return []
    shown = f"PCIe gen {gen} x{width} (this slot and GPU: gen {gen_max} x{width_max})"
    if link.get("gen_gpu_max") and link["gen_gpu_max"] > gen_max:
        shown += f"; the slot limits the GPU's gen {link['gen_gpu_max']}"
    fix = ("reseat the board and check its slot and riser (a worn or dirty connector trains a narrower or slower "
           "link); `nvidia-smi -q -d PCI -i {i}` shows the link; the BIOS may also cap the slot").format(i=i)
    if width < width_max:
        return [Finding("warn", f"{shown}: the link runs {width} of {width_max} lanes, so weights load and host "
                        f"transfers run at about {width / width_max:.0%} of its bandwidth", fix, "pcie")]
    idle = (mask(figures.get("clock_event_reasons")) or 0) & GPU_IDLE
    if gen < gen_max and not idle:
        return [Finding("warn", f"{shown}: the link runs below its generation while the GPU is busy", fix, "pcie")]
    if gen < gen_max:
        shown += " (idle: the link steps down to save power)"
    return [Finding("ok", shown, key="pcie")]


# ---------------------------------------------------------------------------- while serving

def xid_finding(xid: int, i: int) -> Finding:
    """A critical XID on GPU `i`: fail when it means the GPU failed, else a note."""
    if xid in FAILED_XIDS:
        what, fix = FAILED_XIDS[xid]
        return Finding("fail", f"XID {xid}: {what}", fix.format(i=i), "xid")
    return Finding("warn", f"XID {xid}: {NOTED_XIDS.get(xid, 'a critical XID this product does not act on')}; "
                   "the instance keeps serving", "read `journalctl -k | grep -i xid`", "xid")


def watch_finding(before: dict, now: dict, i: int) -> Finding | None:
    """What changed between two readings of the watch figures (probe_child.watch_figures) on GPU `i`:
    a failure that ends the instance, a warning for its status line, or None."""
    rcs = {fig.get("rc") for fig in iter_figures(now)}
    if rcs & {GPU_IS_LOST, RESET_REQUIRED}:
        return unanswered({"rc": GPU_IS_LOST if GPU_IS_LOST in rcs else RESET_REQUIRED}, i)
    old = value((before.get("ecc_errors") or {}).get("uncorrected_volatile")) or 0
    new = value((now.get("ecc_errors") or {}).get("uncorrected_volatile")) or 0
    if new > old:
        return Finding("fail", f"{new - old} new uncorrected ECC error(s) while serving", RESET.format(i=i), "ecc")
    rows_before, rows = value(before.get("remapped_rows")) or {}, value(now.get("remapped_rows")) or {}
    if rows.get("failure") and not rows_before.get("failure"):
        return remap_findings(now, i)[0]
    action = value(now.get("recovery_action"))
    if action and action != value(before.get("recovery_action")):
        return recovery_findings(now, i)[0]
    if rows.get("pending") and not rows_before.get("pending"):
        return Finding("warn", "a row remap became pending while serving: the driver keeps the bad memory offline "
                       "and the instance serves on; the next start refuses this GPU until it is reset",
                       f"when it is convenient, drain it and `nvidia-smi -r -i {i}` (root)", "remap")
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
    Without NVML's answers none: doctor's `gpus` check already says they were not read."""
    if not result.get("ok"):
        return []
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
