"""`dflashctl diff A.json B.json [C.json ...]`: how hosts' saved fingerprints differ, what breaks first.

Differences come in groups: failures (checks that fail on one host only, in doctor's root-cause
order, each with its fix), GPU health figures (ECC counts, row remaps, retired pages, recovery
action, PCIe link, per GPU; between two runs of one host the same board, matched by UUID, shows
what is new since the first: new uncorrected errors, a remap pending or failed), ABI-breaking ones
(a wheel built against one of these will not load against the other: torch's CUDA line, the kernel
package versus torch, the driver, the names SGLang imports from the grammar backend), then models
whose cached commit differs (the hosts serve other weights), then package versions, then everything
else. Exit errors.FAILED when a failure, a board that got worse, an ABI-breaking difference or a
model difference exists.

Three or more files (a fleet): one table of the items on which some hosts differ from the majority,
each with the majority's value and every host that differs, in the same group order.
"""

import json

from dflashctl import cli_help, errors, output
from dflashctl.host import fingerprint, probes, symbols

FAILURE, HEALTH, ABI, SERVING, VERSION, OTHER = "failure", "gpu-health", "abi", "serving", "version", "other"
GROUPS = (FAILURE, HEALTH, ABI, SERVING, VERSION, OTHER)


def dig(fp: dict, path: str):
    """fp['probes']['torch']['facts']['cuda'] as dig(fp, 'probes.torch.facts.cuda'); None if absent."""
    node = fp
    for key in path.split("."):
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


def facts(probe: str, key: str) -> str:
    return f"probes.{probe}.facts.{key}"


def kernel_load(fp: dict) -> str | None:
    """Which common_ops variant loads, or the error: the kernel package versus this torch."""
    r = dig(fp, "probes.sgl_kernel") or {}
    if not r:
        return None
    if r.get("ok"):
        return r["facts"].get("variant")
    missing = symbols.undefined_symbol(r.get("error") or "")
    if missing:
        return f"fails: undefined symbol {missing['demangled'] or missing['symbol']}"
    return f"fails: {probes.failure_text(r)[:160]}"


def driver_major(fp: dict) -> str | None:
    v = dig(fp, facts("driver", "version"))
    return v.split(".")[0] if v else None


def cuda_line(fp: dict) -> str | None:
    v = dig(fp, facts("torch", "cuda"))
    return v.split(".")[0] if v else None


def python_minor(fp: dict) -> str | None:
    v = dig(fp, "python.version")
    return ".".join(v.split(".")[:2]) if v else None


# (label, how to read it) in the order a reader should look at them.
ABI_ITEMS = [
    ("architecture", lambda fp: dig(fp, "host.arch")),
    ("Python minor version (wheel tags)", python_minor),
    ("torch CUDA line", cuda_line),
    ("torch version", lambda fp: dig(fp, facts("torch", "version"))),
    ("torch C++11 ABI", lambda fp: dig(fp, facts("torch", "cxx11_abi"))),
    ("sglang-kernel version", lambda fp: dig(fp, facts("sgl_kernel", "version"))),
    ("sgl_kernel common_ops against torch", kernel_load),
    ("NVIDIA driver branch", driver_major),
    ("driver CUDA version", lambda fp: dig(fp, facts("driver", "cuda"))),
    ("triton version (pinned by torch)", lambda fp: dig(fp, facts("triton", "version"))),
    *[(f"{b} names SGLang imports, missing", (lambda b: lambda fp: _missing(fp, b))(b))
      for b in ("xgrammar", "llguidance", "outlines")],
]
OTHER_ITEMS = [
    ("glibc", lambda fp: dig(fp, "host.glibc")),
    ("kernel", lambda fp: dig(fp, "host.kernel")),
    ("hostname", lambda fp: dig(fp, "host.hostname")),
    ("Python", lambda fp: dig(fp, "python.version")),
    ("driver version", lambda fp: dig(fp, facts("driver", "version"))),
    ("GPUs", lambda fp: _gpus(fp)),
    ("torch sees a GPU", lambda fp: dig(fp, facts("torch", "gpu_visible"))),
    ("libsndfile", lambda fp: dig(fp, facts("soundfile", "libsndfile"))),
    ("flashinfer cubins", lambda fp: dig(fp, facts("flashinfer", "cubins"))),
    ("lock compared with", lambda fp: dig(fp, "lock.path")),
    ("lock spec sha256", lambda fp: dig(fp, "lock.spec_sha256")),
]


def _missing(fp: dict, backend: str):
    r = dig(fp, f"probes.grammar:{backend}") or {}
    if not r:
        return None
    if not r.get("ok"):
        return "does not import"
    return ", ".join(n.rsplit(".", 1)[1] for n in r["facts"].get("missing_names", [])) or "none"


def _gpus(fp: dict):
    gpus = dig(fp, facts("driver", "gpus"))
    return "; ".join(f"{g['name']} {g['compute_capability']} {g['memory_mib']} MiB" for g in gpus) if gpus else None


# GPU health figures diff compares: (label, path in a GPU's health figures, which way is worse).
HEALTH_ITEMS = [
    ("uncorrected ECC errors since reset", "ecc_errors.uncorrected_volatile", +1),
    ("uncorrected ECC errors, lifetime", "ecc_errors.uncorrected_aggregate", +1),
    ("corrected ECC errors, lifetime", "ecc_errors.corrected_aggregate", 0),
    ("rows remapped for uncorrectable errors", "remapped_rows.uncorrectable", +1),
    ("rows remapped for correctable errors", "remapped_rows.correctable", 0),
    ("row remap pending", "remapped_rows.pending", +1),
    ("row remap failed", "remapped_rows.failure", +1),
    ("pages retired (double-bit)", "retired_pages.double_bit", +1),
    ("pages retired (single-bit)", "retired_pages.multiple_single_bit", 0),
    ("pages waiting to be retired", "retired_pages_pending", +1),
    ("recovery action", "recovery_action", +1),
    ("PCIe link width", "pcie.width_current", -1),
    ("PCIe link generation, maximum", "pcie.gen_max", -1),
]


def nvml_gpus(fp: dict) -> dict[str, dict]:
    """A fingerprint's GPUs by UUID (index for those without one), lost ones included."""
    snapshot = dig(fp, "gpus.facts") or {}
    out = {}
    if not isinstance(snapshot, dict):
        return out
    listed = [g for key in ("gpus", "unanswered") if isinstance(snapshot.get(key), list) for g in snapshot[key]]
    for g in listed:  # a hand-edited or foreign file: only well-formed entries count
        if isinstance(g, dict) and isinstance(g.get("index"), int):
            uuid = g.get("uuid") if isinstance(g.get("uuid"), str) else None
            out[uuid or f"index {g['index']}"] = dict(g, uuid=uuid)
    return out


def health_figure(gpu: dict, path: str):
    node = gpu.get("health") or {}
    for key in path.split("."):
        node = node.get(key) if isinstance(node, dict) else None
    return node.get("value") if isinstance(node, dict) and node.get("rc") == 0 else None


def health_differences(a: dict, b: dict) -> list[dict]:
    """Per GPU, the health figures that differ. The same board in both (its UUID) gets `worse` when
    a figure moved the bad way since A: new uncorrected errors since last time, a remap pending."""
    ga, gb = nvml_gpus(a), nvml_gpus(b)
    same = {k for k in set(ga) & set(gb) if not k.startswith("index ")}
    pairs = [(ga.pop(k), gb.pop(k), True) for k in sorted(same, key=lambda k: gb[k]["index"])]
    # The rest by index: on one host (a GPU lost since A has no UUID to match) still the same board.
    one_host = dig(a, "host.hostname") is not None and dig(a, "host.hostname") == dig(b, "host.hostname")
    by_a, by_b = ({g["index"]: g for g in x.values()} for x in (ga, gb))
    pairs += [(by_a.get(i), by_b.get(i), one_host) for i in sorted(set(by_a) | set(by_b))]
    pairs.sort(key=lambda p: (p[1] or p[0])["index"])
    rows = []
    for ea, eb, board in pairs:
        gpu = eb or ea
        name = f"GPU {gpu['index']}" + (f" ({gpu['uuid'][:12]}…)" if board and gpu.get("uuid") else "")
        answers = [None if e is None else "rc" not in e for e in (ea, eb)]
        if answers[0] != answers[1]:
            rows.append({"group": HEALTH, "item": f"{name} answers NVML", "a": answers[0], "b": answers[1],
                         "worse": board and answers[0] is True and answers[1] is False})
        for label, path, bad in HEALTH_ITEMS:
            va, vb = (health_figure(e, path) if e else None for e in (ea, eb))
            if va == vb:
                continue
            worse = board and isinstance(va, int) and isinstance(vb, int) and bad and (vb - va) * bad > 0
            rows.append({"group": HEALTH, "item": f"{name} {label}", "a": va, "b": vb, "worse": bool(worse)})
    return rows


def failures(a: dict, b: dict) -> list[dict]:
    """Checks that fail on one side only, in the failing side's (root-cause) order, with its fix."""
    checks_a = {c["name"]: c for c in a.get("checks", [])}
    checks_b = {c["name"]: c for c in b.get("checks", [])}
    order = list(checks_b) + [n for n in checks_a if n not in checks_b]
    rows = []
    for name in order:
        ca, cb = checks_a.get(name, {}), checks_b.get(name, {})
        sa, sb = ca.get("status"), cb.get("status")
        if sa == sb or "fail" not in (sa, sb):
            continue
        failing, side = (cb, "b") if sb == "fail" else (ca, "a")
        rows.append({"group": FAILURE, "item": f"check {name}", "a": sa, "b": sb, "fails_on": side,
                     "summary": failing.get("summary", ""), "fix": failing.get("fix", "")})
    # Those failing on B (the host being compared) first: that is usually the one being fixed.
    return sorted(rows, key=lambda r: r["fails_on"] != "b")


def differences(a: dict, b: dict) -> list[dict]:
    """Every difference as {group, item, a, b}: failures (with summary and fix) first, then
    ABI-breaking ones, versions and the rest."""
    rows = []
    for group, items in ((ABI, ABI_ITEMS), (OTHER, OTHER_ITEMS)):
        for label, read in items:
            va, vb = read(a), read(b)
            if va != vb:
                rows.append({"group": group, "item": label, "a": va, "b": vb})
    pa, pb = a.get("packages", {}), b.get("packages", {})
    versions = [{"group": VERSION, "item": n, "a": pa.get(n), "b": pb.get(n)}
                for n in sorted(set(pa) | set(pb)) if pa.get(n) != pb.get(n)]
    checks_a = {c["name"]: c["status"] for c in a.get("checks", [])}
    checks_b = {c["name"]: c["status"] for c in b.get("checks", [])}
    failed = failures(a, b)
    statuses = [{"group": OTHER, "item": f"check {n}", "a": checks_a.get(n), "b": checks_b.get(n)}
                for n in sorted(set(checks_a) | set(checks_b)) if checks_a.get(n) != checks_b.get(n)
                and "fail" not in (checks_a.get(n), checks_b.get(n))]
    abi = [r for r in rows if r["group"] == ABI]
    return (failed + health_differences(a, b) + abi + model_differences(a, b) + versions
            + [r for r in rows if r["group"] == OTHER] + statuses)


def model_differences(a: dict, b: dict) -> list[dict]:
    """Hosts serving other weights: a model whose cached commit differs (doctor --model)."""
    ma = {m["repo_id"]: m for m in a.get("models") or [] if isinstance(m, dict) and "repo_id" in m}
    mb = {m["repo_id"]: m for m in b.get("models") or [] if isinstance(m, dict) and "repo_id" in m}
    rows = []
    for repo in sorted(set(ma) | set(mb)):
        ca, cb = (ma.get(repo) or {}).get("commit"), (mb.get(repo) or {}).get("commit")
        if ca != cb:
            rows.append({"group": SERVING, "item": f"{repo} commit", "a": ca, "b": cb})
    return rows


def shown(value) -> str:
    return "—" if value is None else str(value)


def render(rows: list[dict], name_a: str, name_b: str) -> str:
    if not rows:
        return f"no differences between {name_a} and {name_b}\n"
    titles = {FAILURE: "failures, root cause first", HEALTH: "GPU health figures", ABI: "ABI-breaking",
              SERVING: "serving other weights", VERSION: "versions", OTHER: "other"}
    wi = max(len(r["item"]) for r in rows)
    wa = max(len(name_a), *(len(shown(r["a"])) for r in rows))
    lines = []
    for group in GROUPS:
        part = [r for r in rows if r["group"] == group]
        if not part:
            continue
        lines += ["" if lines else None, f"{titles[group]} ({len(part)})",
                  f"  {'':<{wi}}  {name_a:<{wa}}  {name_b}"]
        for r in part:
            lines.append(f"  {r['item']:<{wi}}  {shown(r['a']):<{wa}}  {shown(r['b'])}")
            if r.get("worse"):
                lines.append(f"  {'':<{wi}}  worse on this board since {name_a}")
            if group == FAILURE:
                host = name_b if r["fails_on"] == "b" else name_a
                lines.append(f"  {'':<{wi}}  on {host}: {r['summary']}")
                if r["fix"]:
                    lines.append(f"  {'':<{wi}}  fix: {r['fix']}")
    return "\n".join(line for line in lines if line is not None) + "\n"


def host_values(fp: dict) -> dict[str, tuple[str, object]]:
    """item -> (group, value) of one host: what `fleet` compares across hosts."""
    out = {label: (ABI, read(fp)) for label, read in ABI_ITEMS}
    out.update({label: (OTHER, read(fp)) for label, read in OTHER_ITEMS if label != "hostname"})
    for name, version in fp.get("packages", {}).items():
        out[name] = (VERSION, version)
    for c in fp.get("checks", []):
        out[f"check {c['name']}"] = (FAILURE if c["status"] == "fail" else OTHER, c["status"])
    for m in fp.get("models") or []:
        if isinstance(m, dict) and "repo_id" in m:
            out[f"{m['repo_id']} commit"] = (SERVING, m.get("commit"))
    for gpu in nvml_gpus(fp).values():
        for label, path, _ in HEALTH_ITEMS:
            out[f"GPU {gpu['index']} {label}"] = (HEALTH, health_figure(gpu, path))
    return out


def fleet(named: list[tuple[str, dict]]) -> list[dict]:
    """Items on which some hosts differ from the majority: {group, item, majority, differs: {host:
    value}}, plus the failing hosts' summary and fix for a check. A tie goes to the first file's value."""
    from collections import Counter
    values = [(name, host_values(fp)) for name, fp in named]
    checks = {name: {c["name"]: c for c in fp.get("checks", [])} for name, fp in named}
    items = list(dict.fromkeys(k for _, v in values for k in v))
    rows = []
    for item in items:
        per_host = [(name, v.get(item, (None, None))) for name, v in values]
        seen = [json.dumps(val, sort_keys=True) for _, (_, val) in per_host]
        if len(set(seen)) == 1:
            continue
        counts = Counter(seen)
        top = max(counts.values())
        majority = next(s for s in seen if counts[s] == top)
        groups = {g for _, (g, _) in per_host if g}
        group = next(g for g in GROUPS if g in groups)
        row = {"group": group, "item": item, "majority": json.loads(majority),
               "differs": {name: val for (name, (_, val)), s in zip(per_host, seen) if s != majority}}
        if item.startswith("check ") and group == FAILURE:
            cname = item[len("check "):]
            row["failing"] = {name: {k: checks[name][cname].get(k, "") for k in ("summary", "fix")}
                              for name, (_, val) in per_host if val == "fail"}
        rows.append(row)
    return sorted(rows, key=lambda r: GROUPS.index(r["group"]))


def render_fleet(rows: list[dict], names: list[str]) -> str:
    if not rows:
        return f"no differences among the {len(names)} hosts\n"
    odd = sorted({h for r in rows for h in r["differs"]}, key=names.index)
    titles = {FAILURE: "failures", HEALTH: "GPU health", ABI: "ABI-breaking", SERVING: "serving other weights",
              VERSION: "versions", OTHER: "other"}
    wi = max(len(r["item"]) for r in rows)
    wm = max(len("majority"), *(len(shown(r["majority"])) for r in rows))
    lines = [f"{len(odd)} of {len(names)} hosts differ from the majority: {', '.join(odd)}",
             f"  {'group':<13} {'item':<{wi}}  {'majority':<{wm}}  hosts that differ"]
    for r in rows:
        differs = ", ".join(f"{h}: {shown(v)}" for h, v in r["differs"].items())
        lines.append(f"  {titles[r['group']]:<13} {r['item']:<{wi}}  {shown(r['majority']):<{wm}}  {differs}")
        for host, why in r.get("failing", {}).items():
            lines.append(f"  {'':<13} {'':<{wi}}  on {host}: {why['summary']}"
                         + (f"; fix: {why['fix']}" if why["fix"] else ""))
    return "\n".join(lines) + "\n"


def host_names(paths: list[str], fps: list[dict]) -> list[str]:
    """Each host's hostname when those are distinct, else the files as given."""
    names = [dig(fp, "host.hostname") for fp in fps]
    return names if all(names) and len(set(names)) == len(names) else list(paths)


def register(subparsers) -> None:
    p = subparsers.add_parser("diff", help="compare two fingerprints saved by `doctor --save` "
                                           "(or the hosts of two `smoke --json` results)",
                              **cli_help.texts("diff", __doc__))
    p.add_argument("files", nargs="+", metavar="FILE",
                   help="two fingerprints (A.json B.json), or three or more: one table of how each "
                        "differs from the majority")
    p.add_argument("--json", action="store_true", help="print the differences as JSON")
    p.set_defaults(func=run)


def run_fleet(args, paths: list[str], fps: list[dict]) -> int:
    names = host_names(paths, fps)
    rows = fleet(list(zip(names, fps)))
    bad = any(r["group"] in (FAILURE, ABI, SERVING) for r in rows)
    if args.json:
        output.print_json({"hosts": dict(zip(names, paths)), "breaking": bad, "differences": rows},
                          sort_keys=True)
    else:
        output.emit(render_fleet(rows, names))
    return errors.FAILED if bad else errors.OK


def run(args) -> int:
    paths = args.files
    if len(paths) < 2:
        raise errors.DflashError(f"{len(paths)} file given, at least two are needed",
                                 "it compares hosts: fingerprints (`doctor --save`) or smoke results",
                                 "pass A.json B.json (or more, for a fleet)", errors.USAGE)
    fps = [fingerprint.load(p) for p in paths]  # every file read before anything is printed
    if len(paths) > 2:
        return run_fleet(args, paths, fps)
    (pa, pb), (a, b) = paths, fps
    rows = differences(a, b)
    abi = any(r["group"] == ABI for r in rows)
    failed = any(r["group"] == FAILURE for r in rows)
    serving = any(r["group"] == SERVING for r in rows)
    worse = any(r.get("worse") for r in rows)
    if args.json:
        output.print_json({"a": pa, "b": pb, "abi_breaking": abi, "failures": failed,
                           "serving_other_weights": serving, "gpu_worse": worse, "differences": rows},
                          sort_keys=True)
    else:
        output.emit(render(rows, pa, pb))
    return errors.FAILED if abi or failed or serving or worse else errors.OK
