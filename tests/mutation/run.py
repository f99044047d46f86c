"""Mutation testing of the modules that carry dflashctl's proofs and refusals (not part of tests/run).

    python3 tests/mutation/run.py [MODULE ...] [--timeout S] [--work DIR] [--json OUT]

For each module (default: all of MODULES) mutmut (3.8.1, installed from the package index into a
venv of its own under --work) changes the module's functions one small edit at a time and runs
the tests that cover the module against each change; a change no test notices "survives". Each
module runs alone, against its own tests, with a time cap (--timeout, default 1800 s), one test
process at a time: the suite runs on machines of two shared cores.

mutmut wants the package under src/ and the tests beside it, so each run works on a copy of the
repository in --work (default ${XDG_CACHE_HOME:-~/.cache}/dflash-tests/mutation): tests/ and the
rest as they are, python/dflashctl as src/dflashctl. The tests import the mutated copy; those
that start `python -m dflashctl` in a child process run the original and so kill nothing, which
is why each module names the in-process tests that cover it.

Survivors are triaged in tests/mutation/equivalent.json (mutant name -> its diff and why): an
equivalent one (no test can tell it from the original) leaves the count, an accepted one
("equivalent": false: a test would break a house rule, e.g. time a request) stays in it as not
killed. An entry holds while the mutant's diff is unchanged. The kill rate is
killed / (mutants - equivalent); a mutant that makes a test hang past mutmut's limit counts as killed. A
module stopped by --timeout is marked capped: the mutants mutmut did not reach are counted apart
("not reached") and its rate is over those it checked. --report-only reads the workspaces of an
earlier run again (after triaging its survivors) without running mutmut. The table and survivors
go to docs/testing.md by hand, from the --markdown output.
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MUTMUT = "mutmut==3.8.1"
TOOLS = [MUTMUT, "pytest==9.2.0", "packaging==26.4"]  # what the mutation venv needs
# module -> the tests (pytest node ids or files, with -k where a file mixes slow tests in) that cover it
MODULES = {
    "smoke/lossless.py": ["tests/smoke/test_smoke_lossless.py", "-k", "compare or shorter or lacking or means or describe "
                          "or judge or require_lossless_fails"],
    "smoke/acceptance.py": ["tests/smoke/test_smoke_oracle.py", "-k", "rules_bands or band_follows or value_just_outside "
                            "or no_expectations or histogram or expectations_cover or broken_run_names"],
    "smoke/loadgen.py": ["tests/smoke/test_loadgen.py"],
    "host/probes.py": ["tests/host/test_probes.py", "-k", "not doctor"],  # not `dflashctl doctor` in a child
    "service/config.py": ["tests/service/test_config.py", "tests/service/test_validate.py", "tests/service/test_sglang_args.py", "-k",
                          "not real_process"],
    "operations/router.py": ["tests/operations/test_router.py", "-k", "(defaults or docs_table or reach_the_routers or bad_router "
                          "or instance_keys or rendered_unit or remote_workers or argv_masks or settings_are_refused "
                          "or worker_urls or settings_file or keys_come or sync_adds or reload_through or cannot_run "
                          "or both_keys or keys_masked or lists_each_change or name_their_file or exclude_each_other "
                          "or commands_options or names_its_setting or word_for_word) "
                          "and not module_router"],  # not the Nix twin's: its data file is outside src/
    "lock/contract.py": ["tests/lock/test_lock.py", "-k", "not cli_"],
    "lock/lockdiff.py": ["tests/lock/test_lock.py", "-k", "not cli_"],
}
STATUS = re.compile(r"^\s*(\S+__mutmut_\d+): (.+)$")


def sh(argv, **kw):
    print("+", " ".join(str(a) for a in argv), flush=True)
    return subprocess.run(argv, check=True, **kw)


def venv(work: Path) -> Path:
    v = work / "venv"
    py = v / "bin" / "python"
    stamp = v / "tools.txt"
    if not py.exists() or not stamp.exists() or stamp.read_text() != "\n".join(TOOLS):
        shutil.rmtree(v, ignore_errors=True)
        sh([sys.executable, "-m", "venv", str(v)])
        sh([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", *TOOLS])
        stamp.write_text("\n".join(TOOLS))
    return v


def workspace(work: Path, module: str, tests: list[str]) -> Path:
    ws = work / module.replace("/", "-").removesuffix(".py")
    shutil.rmtree(ws, ignore_errors=True)
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, check=True,
                           capture_output=True, text=True).stdout.split("\n")
    for f in files:
        if not f or f.startswith("python/") or not (REPO / f).is_file():
            continue
        (ws / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / f, ws / f)
    shutil.copytree(REPO / "python" / "dflashctl", ws / "src" / "dflashctl",
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    shutil.copy2(REPO / "nix" / "python-lock.json", ws / "src" / "dflashctl" / "lock" / "python-lock.json")
    selection = "\n    ".join(tests)
    also = "\n    ".join(sorted({f.split("/")[0] for f in files if f and "/" in f} - {"python", "tests"}))
    (ws / "setup.cfg").write_text(f"""[mutmut]
source_paths = src
only_mutate = src/dflashctl/{module}
pytest_add_cli_args = -p no:cacheprovider -q
pytest_add_cli_args_test_selection =
    {selection}
also_copy =
    {also}
""")
    return ws


def results(ws: Path, mutmut: Path) -> dict[str, str]:
    out = subprocess.run([str(mutmut), "results", "--all", "true"], cwd=ws, capture_output=True, text=True)
    return {m.group(1): m.group(2).strip() for line in out.stdout.splitlines() if (m := STATUS.match(line))}


def show(ws: Path, mutmut: Path, name: str) -> str:
    out = subprocess.run([str(mutmut), "show", name], cwd=ws, capture_output=True, text=True)
    return "\n".join(line for line in out.stdout.splitlines() if line.startswith(("-", "+"))
                     and not line.startswith(("---", "+++")))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("modules", nargs="*", default=list(MODULES), help="e.g. smoke/lossless.py (default: all)")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per module (default 1800)")
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    p.add_argument("--work", type=Path, default=cache / "dflash-tests" / "mutation")
    p.add_argument("--json", type=Path, help="write the figures and survivors here")
    p.add_argument("--markdown", type=Path, help="write the table and the triaged survivors here (docs/testing.md)")
    p.add_argument("--report-only", action="store_true", help="report the last run's workspaces, run nothing")
    a = p.parse_args()
    equivalent = json.loads((REPO / "tests" / "mutation" / "equivalent.json").read_text())
    a.work.mkdir(parents=True, exist_ok=True)
    v = venv(a.work)
    mutmut = v / "bin" / "mutmut"
    report = {}
    for module in a.modules:
        ws = a.work / module.replace("/", "-").removesuffix(".py")
        log = ws / "mutmut.log"
        t0 = time.monotonic()
        if a.report_only:
            capped = None  # unknown: the earlier run's log says
        else:
            ws = workspace(a.work, module, MODULES[module])
            env = {**os.environ, "PATH": f"{v / 'bin'}{os.pathsep}{os.environ['PATH']}",
                   "PYTHONDONTWRITEBYTECODE": "1"}
            try:
                with log.open("w") as out:
                    subprocess.run([str(mutmut), "run", "--max-children", "1"], cwd=ws, env=env, timeout=a.timeout,
                                   stdout=out, stderr=subprocess.STDOUT)
                capped = False
            except subprocess.TimeoutExpired:
                capped = True
        status = results(ws, mutmut)
        if status and all(s == "not checked" for s in status.values()):
            tail = log.read_text(errors="replace").replace("\r", "\n").splitlines()[-25:]
            print(f"{module}: mutmut checked nothing; the end of {log}:\n  " + "\n  ".join(tail), file=sys.stderr)
            report[module] = {"mutants": len(status), "error": "mutmut checked nothing", "log": str(log)}
            continue
        # a mutant that makes a test hang past mutmut's limit is found too ("timeout"); one the time
        # cap left unchecked is neither killed nor a survivor
        unreached = sorted(n for n, s in status.items() if s == "not checked")
        status = {n: s for n, s in status.items() if s != "not checked"}
        survived = sorted(n for n, s in status.items() if s not in ("killed", "timeout"))
        diffs = {n: show(ws, mutmut, n) for n in survived}
        # an entry counts only while the mutant is still the change it was judged for
        judged = [n for n in survived if equivalent.get(n, {}).get("diff") == diffs[n]]
        equiv = [n for n in judged if equivalent[n].get("equivalent", True)]
        accepted = [n for n in judged if n not in equiv]  # triaged: no test without breaking a house rule
        open_ = [n for n in survived if n not in judged]
        counted = len(status) - len(equiv)
        killed = len(status) - len(survived)
        report[module] = {
            "mutants": len(status) + len(unreached), "not_reached": len(unreached), "killed": killed,
            "equivalent": len(equiv),
            "kill_rate": round(killed / counted, 4) if counted else None,
            "seconds": None if a.report_only else round(time.monotonic() - t0), "capped": capped,
            "accepted": len(accepted), "open": len(open_),
            "survivors": {n: {"status": status[n], "equivalent": n in equiv,
                              "why": equivalent[n]["why"] if n in judged else None, "diff": diffs[n]}
                          for n in survived},
        }
        rate = report[module]["kill_rate"]
        print(f"{module}: {killed}/{counted} non-equivalent mutants killed"
              f" ({'-' if rate is None else f'{100 * rate:.1f} %'}), {len(equiv)} equivalent, "
              f"{len(accepted)} accepted, {len(open_)} open, {report[module]['seconds']} s"
              f"{f' (capped: {len(unreached)} not reached)' if unreached else ''}", flush=True)
        for n in open_:
            stale = " (equivalent.json has another change under this name: judge it again)" if n in equivalent else ""
            print(f"  survived: {n} ({status[n]}){stale}\n    " + diffs[n].replace("\n", "\n    "))
    if a.json:
        a.json.write_text(json.dumps(report, indent=1) + "\n")
    if a.markdown:
        a.markdown.write_text(markdown(report))
    return 0


def markdown(report: dict) -> str:
    rows = ["| module | mutants | not reached | killed | equivalent | not killed | kill rate | seconds |",
            "|---|---|---|---|---|---|---|---|"]
    for module, r in report.items():
        if "error" in r:
            rows.append(f"| {module} | {r['mutants']} | - | - | - | - | {r['error']} | - |")
            continue
        rate = "-" if r["kill_rate"] is None else f"{100 * r['kill_rate']:.1f} %"
        checked = r["mutants"] - r["not_reached"]
        rows.append(f"| `{module}` | {r['mutants']} | {r['not_reached']} | {r['killed']} | {r['equivalent']} | "
                    f"{checked - r['killed'] - r['equivalent']} | {rate} | {r['seconds'] or '-'} |")
    out = ["\n".join(rows), ""]
    for module, r in report.items():
        for kind, title in ((True, "equivalent"), (False, "not killed")):
            items = [(n, v) for n, v in r.get("survivors", {}).items() if v["equivalent"] is kind]
            if not items:
                continue
            out.append(f"`{module}`, {title}:\n")
            for n, v in items:
                change = " / ".join(line[1:].strip() for line in v["diff"].splitlines() if line.startswith("+"))
                out.append(f"- `{n.rsplit('.', 1)[1]}` (`{change}`): {v['why'] or 'open: ' + v['status']}")
            out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    raise SystemExit(main())
