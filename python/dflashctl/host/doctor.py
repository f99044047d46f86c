"""`dflashctl doctor`: what is really installed on this host, checked against the lock.

Prints one line per check (ok / warn / fail) with the one thing that fixes each problem, and exits
errors.FAILED when any check fails. `--save FILE` keeps the fingerprint for `dflashctl diff`.
"""

import json
import os
import sys
import time

from dflashctl import cli_help, errors, output
from dflashctl.cli_help import positive_float, positive_int
from dflashctl.host import fingerprint, gpus, hub_cache, kernels
from dflashctl.lock import locate, lockfile


def register(subparsers) -> None:
    p = subparsers.add_parser("doctor", help="check this host's stack against the lock",
                              **cli_help.texts("doctor", __doc__))
    p.add_argument("--lock", metavar="PATH",
                   help=f"lock to compare with (default: ${locate.ENV}, else the lock installed with "
                        "dflashctl, else its source checkout's nix/python-lock.json)")
    p.add_argument("--python", default=sys.executable,
                   help="the Python environment to inspect (default: the one running dflashctl)")
    p.add_argument("--json", action="store_true", help="print the fingerprint as JSON")
    p.add_argument("--save", metavar="FILE", help="also write the fingerprint JSON to FILE, for `diff`")
    p.add_argument("--timeout", type=positive_float, default=30.0,
                   help="seconds each probe may take (%(default)s)")
    p.add_argument("--model", action="append", default=[], metavar="REPO[@REVISION]",
                   help="also report which commit of this hub model the cache holds and whether it is "
                        "complete (repeatable; `dflashctl models status --config FILE` does it per instance)")
    p.add_argument("--hf-home", metavar="DIR", help="the model cache's HF_HOME (default: as the hub client finds it)")
    p.add_argument("--record-nvml", metavar="FILE",
                   help=f"also save NVML's answers (GPU memory, utilization, processes) as a recording "
                        f"that {gpus.REPLAY_ENV}=FILE replays")
    p.add_argument("--expect-gpus", type=positive_int, metavar="N",
                   help="the number of GPUs this host has: fewer seen fails (a GPU NVML no longer counts, "
                        "fallen off the bus after a driver reload, fails its health check; none at all, "
                        "NVML not answering, fails `gpu-count`)")
    p.add_argument("--kernels", metavar="DIR", default=os.environ.get(kernels.PREBUILT_ENV),
                   help=f"prebuilt kernel directory to check against this GPU (default ${kernels.PREBUILT_ENV})")
    p.add_argument("--model-config", action="append", default=[], metavar="PATH",
                   help="a model directory or config.json whose kernel shapes the prebuilt directory must "
                        "cover (repeatable; default: the smoke's synthetic target)")
    p.set_defaults(func=run)


def render(fp: dict) -> str:
    """The human table: a header naming what was inspected, one row per check, a fix under problems."""
    host, py = fp["host"], fp["python"]
    lines = [f"dflashctl doctor: {py['executable']} (Python {py['version']}) on {host['system']}, "
             f"glibc {host['glibc']}, kernel {host['kernel']}"]
    width = max(len(c["name"]) for c in fp["checks"])
    for c in fp["checks"]:
        lines.append(f"{c['status']:<4}  {c['name']:<{width}}  {c['summary']}")
        if c["status"] != "ok" and c["fix"]:
            lines.append(f"{'':<4}  {'':<{width}}  fix: {c['fix']}")
    lines += gpus.render_lines(fp.get("gpus") or {})
    for s in fp.get("shadowed", []):
        lines.append(f"note: {s['name']} {s['version']} at {s['location']} is shadowed by "
                     f"{fp['packages'].get(s['name'])} earlier on sys.path")
    counts = {s: sum(c["status"] == s for c in fp["checks"]) for s in ("ok", "warn", "fail")}
    lines.append(f"{counts['ok']} ok, {counts['warn']} warn, {counts['fail']} fail")
    return "\n".join(lines) + "\n"


def _repo_rev(spec: str) -> tuple[str, str | None]:
    repo, _, rev = spec.partition("@")
    return repo, rev or None


def exit_code(fp: dict) -> int:
    return errors.FAILED if any(c["status"] == "fail" for c in fp["checks"]) else errors.OK


def run(args) -> int:
    started = time.monotonic()
    # Everything given on purpose is checked before the probes: where the results go, the lock to
    # compare with (none found is a warning in the report; one named and unreadable is a mistake).
    save = output.check(args.save, "--save")
    record = output.check(args.record_nvml, "--record-nvml")
    if save is not None and record is not None and save.absolute() == record.absolute():
        raise errors.DflashError("--save and --record-nvml name the same file", str(save),
                                 "give the fingerprint and the NVML recording a file each", errors.USAGE)
    if args.lock:
        lockfile.load(args.lock)
    configs = kernels.model_configs(args.model_config, False)
    print(f"dflashctl doctor: probing {args.python} …", file=sys.stderr)
    fp = fingerprint.build(args.python, args.lock, args.timeout, args.kernels or "", configs,
                           expected_gpus=args.expect_gpus)
    if args.model:
        env = dict(os.environ, **({"HF_HOME": args.hf_home} if args.hf_home else {}))
        fp["models"] = [hub_cache.inspect(env, *_repo_rev(m)).to_json() for m in args.model]
        fp["checks"] += [hub_cache.check(m).to_json() for m in fp["models"]]
    fp["seconds"] = round(time.monotonic() - started, 2)
    files = [(save, json.dumps(fp, indent=2, sort_keys=True) + "\n", "--save")] if save else []
    if record is not None:
        files.append((record, gpus.recording_text(fp["gpus"], "dflashctl doctor --record-nvml"), "--record-nvml"))
    if not args.json:
        output.emit(render(fp))  # the findings first: a full disk below costs no re-run
    try:
        output.write_all(files)
    except errors.DflashError as e:
        e.result = fp  # --json: the fingerprint rides in the error object
        raise
    if args.json:
        output.print_json(fp, sort_keys=True)
    print(f"dflashctl doctor: done in {fp['seconds']:.1f} s", file=sys.stderr)
    return exit_code(fp)
