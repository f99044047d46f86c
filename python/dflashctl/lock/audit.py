"""`dflashctl audit`: what a real `nix build` of the lock would stop on, found from the locked
wheels themselves, without nixpkgs.

    dflashctl audit                       every system of nix/python-lock.json (downloads ~3.6 GiB each)
    dflashctl audit --system x86_64-linux --only soundfile,triton   those wheels and their closures
    dflashctl audit --wheels DIR          wheels from DIR instead of the index (offline)

For each system it reads what the overlay will ask of every wheel by evaluating
overlays/default.nix and the real overlays/fixups/*.nix over a stand-in nixpkgs (nix/audit.nix),
then checks, per wheel:
  - every ELF file's needed libraries resolve as autoPatchelf will resolve them: the package's own
    *.so files, those of its dependency closure's site-packages (fix-up additions included),
    the nixpkgs libraries in its buildInputs (nix/audit.nix lists their sonames), glibc, or its
    ignore list (the driver's libcuda/libnvidia-ml are on every list);
  - every `substituteInPlace ... --replace-fail OLD NEW` of its fix-up finds OLD in that file;
and, per environment (dflash-env's set, the dev shell's set): no two wheels leave one path with
different content (python.buildEnv refuses a collision): their files, their entry-point scripts
(bin/*) and the byte code the install hook compiles for every .py, after the files fix-ups remove.
Run it after every pin change: `dflashctl lock` says so.
"""

import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from dflashctl import cli_help, output
from dflashctl.errors import FAILED, INPUT, DflashError
from dflashctl.lock import lockfile, wheelfetch, wheelfiles
from dflashctl.lock import spec as specmod
from dflashctl.lock.fixup_scripts import effects
from dflashctl.systems import SYSTEMS

OUT = "$out/"
# Files of glibc's lib directory: autoPatchelf leaves these to the dynamic linker.
GLIBC = {"libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1", "libutil.so.1",
         "libresolv.so.2", "libnsl.so.1", "libanl.so.1", "libmvec.so.1", "libthread_db.so.1",
         "libBrokenLocale.so.1", "libc_malloc_debug.so.0", "libnss_files.so.2", "libnss_dns.so.2",
         "ld-linux-x86-64.so.2", "ld-linux-aarch64.so.1"}


@dataclass
class Report:
    system: str
    packages: int = 0
    elf_files: int = 0
    replacements: int = 0
    installed_paths: int = 0
    scripts: int = 0
    bytecode_files: int = 0
    problems: list[str] = field(default_factory=list)


def default_cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "dflash" / "wheels"


# --- what Nix says --------------------------------------------------------------------------

def overlay_view(repo: Path, lock_path: Path, system: str, fixups: Path) -> dict:
    """nix/audit.nix evaluated for one system: per package its closure, sonames, ignore list and
    install scripts, plus the stack's and the dev shell's package names."""
    nix = shutil.which("nix")
    if nix is None:
        raise DflashError("`dflashctl audit` needs Nix", "`nix` is not on PATH; the audit evaluates "
                          "the real fix-ups with it", "install Nix (Debian: apt-get install nix-bin)")
    expr = (f"import {(repo / 'nix/audit.nix').resolve()} {{ lockFile = {lock_path.resolve()}; "
            f"fixupsDir = {fixups.resolve()}; system = \"{system}\"; }}")
    env = {**os.environ, "NIX_CONFIG": "experimental-features = nix-command flakes\nsubstituters ="}
    done = subprocess.run([nix, "eval", "--json", "--impure", "--expr", expr], capture_output=True,
                          text=True, env=env, timeout=300)
    if done.returncode != 0:
        why = done.stderr.strip().splitlines()
        raise DflashError(f"the overlay does not evaluate for {system}", " ".join(why[:6])[-1200:],
                          "fix the fix-up it names; if a fix-up uses a nixpkgs package nix/audit.nix "
                          "lacks, add it there with the sonames it provides")
    return json.loads(done.stdout)


# --- getting the wheels -----------------------------------------------------------------------

def index_urls(spec_path: Path, lock: lockfile.Lock, quiet: bool) -> dict[str, str]:
    """file name -> URL, from a fresh `uv lock` of the spec the lock was made from."""
    from dflashctl.lock import resolver

    spec = specmod.load(spec_path)
    if spec.sha256 != lock.spec_sha256:
        raise DflashError(f"the lock was not made from {spec_path}",
                          "its spec_sha256 differs from the file's sha256",
                          "run `dflashctl lock` (and commit both files) before auditing")
    text = resolver.run_uv_lock(spec, quiet)
    return {url.rsplit("/", 1)[-1]: url for url in re.findall(r'url = "([^"]+\.whl)"', text)}


def fetch_wheels(wheels: list[lockfile.LockedWheel], cache: Path, urls: dict[str, str] | None,
                 source: Path | None, quiet: bool) -> dict[str, int]:
    """Make every wheel present in `cache` with its locked sha256; returns download counts."""
    stats = {"downloaded_bytes": 0, "downloaded": 0, "reused": 0}
    todo = []
    for w in wheels:
        dest = cache / w.file
        if source is not None:
            src = source / w.file
            if not src.exists():
                raise DflashError(f"{w.file} is not in {source}", "--wheels names a directory "
                                  "that lacks a locked wheel", "put the wheel there or drop --wheels")
            got = wheelfetch.sha256_of(src)
            if got != w.sha256:
                raise DflashError(f"{src} does not match the lock",
                                  f"sha256 {got}, the lock says {w.sha256}",
                                  "use the locked file, or run `dflashctl lock` after a pin change")
            continue
        if dest.exists() and dest.stat().st_size == w.size and wheelfetch.sha256_of(dest) == w.sha256:
            stats["reused"] += 1
        else:
            todo.append(w)
    if not todo:
        return stats
    missing = [w.file for w in todo if w.file not in (urls or {})]
    if missing:
        raise DflashError("the index's resolution lacks locked files", ", ".join(missing[:5]),
                          "run `dflashctl lock --check`: the lock is stale or was edited")
    total = sum(w.size for w in todo)
    say = (lambda *a: None) if quiet else (lambda m: print(m, file=sys.stderr, flush=True))
    say(f"downloading {len(todo)} wheels ({total / 2**30:.2f} GiB) into {cache}")
    done_bytes, start = 0, time.monotonic()

    def one(w):
        wheelfetch.download(urls[w.file], cache / w.file, w.sha256, w.size)
        return w

    with ThreadPoolExecutor(max_workers=4) as pool:
        for i, w in enumerate(pool.map(one, sorted(todo, key=lambda w: -w.size)), 1):
            done_bytes += w.size
            rate = done_bytes / max(time.monotonic() - start, 1e-3) / 2**20
            say(f"  [{i:3}/{len(todo)}] {w.file}  {w.size / 2**20:.1f} MiB "
                f"({done_bytes / 2**30:.2f} of {total / 2**30:.2f} GiB, {rate:.0f} MiB/s), sha256 ok")
    stats.update(downloaded_bytes=total, downloaded=len(todo))
    return stats


# --- the checks -------------------------------------------------------------------------------

def _library_names(scan: wheelfiles.Scan, machine: str, dependency: bool = False) -> set[str]:
    """File names autoPatchelf indexes: ELF files named *.so* of this machine; of a dependency,
    those under site-packages (build-wheel.nix's search path) and directly in lib/ (the hook's
    gatherLibraries adds $dep/lib of every host dependency)."""
    def searched(path: str) -> bool:
        return (not dependency or path.startswith(wheelfiles.SITE + "/")
                or (path.startswith("lib/") and path.count("/") == 1))
    return {Path(p).name for p, e in scan.elf.items() if e.machine == machine and searched(p)
            and fnmatch.fnmatch(Path(p).name, "*.so*")}


def check_libraries(name, w, scans, view, machine) -> tuple[int, list[str]]:
    pkg = view["packages"][name]
    own = _library_names(scans[name], machine)
    found = own | set(pkg["sonames"]) | GLIBC
    for dep in pkg["closure"]:
        if dep in scans:
            found |= _library_names(scans[dep], machine, dependency=True)
    problems, files = [], 0
    for path, info in sorted(scans[name].elf.items()):
        if info.machine != machine or not info.patched:
            continue  # autoPatchelf skips other architectures, object files, static executables
        files += 1
        for soname in info.needed:
            if soname in found or any(fnmatch.fnmatch(soname, p) for p in pkg["ignoreMissing"]):
                continue
            problems.append(
                f"{w.file}: {scans[name].member(path)} needs {soname}, which autoPatchelf will not "
                f"find: not in {name} itself, its {len(pkg['closure'])} dependencies, the nixpkgs "
                f"libraries of its buildInputs, python, glibc, nor its ignore list; fix: a fix-up "
                f"overlays/fixups/{name}.nix that adds the wheel or nixpkgs package providing it "
                f"(dependencies / buildInputs), or lists it in autoPatchelfIgnoreMissingDeps "
                f"if it is only dlopened")
    return files, problems


def package_effects(view, name):
    scripts = view["packages"][name]["scripts"]
    return effects("\n".join(scripts[k] for k in ("postInstall", "preFixup", "postFixup")))


def check_replacements(name, w, wheel: Path, scan, view) -> tuple[int, list[str]]:
    import zipfile

    problems, count = [], 0
    contents: dict[str, str] = {}
    for r in package_effects(view, name).replacements:
        count += 1
        where = f"overlays/fixups/{name}.nix: substituteInPlace {r.path}"
        member = scan.member(r.path.removeprefix(OUT)) if r.path.startswith(OUT) else None
        if member is None:
            problems.append(f"{where}: {w.file} installs no such file; fix: update the fix-up "
                            f"for {name} {w.version}")
            continue
        if member not in contents:
            with zipfile.ZipFile(wheel) as z:
                contents[member] = z.read(member).decode("utf-8", "replace")
        if r.old not in contents[member]:
            if r.must_match:
                problems.append(f"{where} --replace-fail {r.old!r}: the text is not in {member} of "
                                f"{w.file}; fix: update the fix-up for {name} {w.version}")
            continue
        contents[member] = contents[member].replace(r.old, r.new)
    return count, problems


COLLIDING = {"file": "a file of each",
             "script": "an entry-point script of each (console_scripts/gui_scripts)",
             "bytecode": "byte code the install hook compiles for each of them (each .pyc names its own "
                         "store path)"}


def installed_files(name: str, scan: wheelfiles.Scan, view) -> list[tuple[str, str, str]]:
    """(path, digest, kind) of what package `name` leaves in $out: the wheel's files, its console
    scripts and the byte code the install hook compiles, less what its fix-up removes (compiled
    before the fix-up's postInstall runs, so a removed .py keeps its .pyc unless that is removed
    too) and site-packages/tests (pythonRemoveTestsDirHook)."""
    removed = [p.removeprefix(OUT) for p in package_effects(view, name).removed if p.startswith(OUT)]
    out = []
    for f in scan.files:
        kind = "script" if f.member == wheelfiles.SCRIPT_MEMBER else "file"
        out.append((f.path, f.digest, kind))
        out += [(pyc, f"bytecode={name}", "bytecode") for pyc in wheelfiles.bytecode(f)]
    return [(path, digest, kind) for path, digest, kind in out
            if not any(fnmatch.fnmatch(path, pattern) for pattern in removed)
            and not path.startswith(wheelfiles.SITE + "/tests/")]


def check_collisions(env: str, names: list[str], scans, view, lock_files) -> tuple[dict[str, int], list[str]]:
    """No two packages of `env` may leave one path with different content (python.buildEnv stops
    on it). Returns the number of paths checked per kind (file, script, bytecode) and the problems."""
    owners: dict[str, tuple[str, str]] = {}
    kinds: dict[str, str] = {}
    problems = []
    for name in sorted(names):
        for path, digest, kind in installed_files(name, scans[name], view):
            if path in owners and owners[path][1] != digest:
                other = owners[path][0]
                what = COLLIDING.get(kind if kind != "file" else kinds[path], COLLIDING["file"])
                problems.append(f"{env}: {path} is installed by both {lock_files[other]} and "
                                f"{lock_files[name]} with different content ({what}): python.buildEnv "
                                f"will stop on the collision; fix: a fix-up that removes it from one "
                                f"of them (and, for a .py, its __pycache__/*.pyc; "
                                f"overlays/fixups/flashinfer-python.nix does this)")
            owners.setdefault(path, (name, digest))
            kinds.setdefault(path, kind)
    counts = {k: sum(1 for v in kinds.values() if v == k) for k in ("file", "script", "bytecode")}
    return counts, problems


def audit_system(lock, system, repo, lock_path, fixups, cache, source, urls, only, quiet):
    report = Report(system)
    view = overlay_view(repo, lock_path, system, fixups)
    every = lock.packages(system, dev=True)
    names = sorted(every)
    if only:
        unknown = sorted(set(only) - set(every))
        if unknown:
            raise DflashError(f"--only names packages the {system} lock lacks", ", ".join(unknown),
                              "use canonical names from nix/python-lock.json")
        wanted = set(only)
        for n in only:
            wanted |= set(view["packages"][n]["closure"])
        names = sorted(wanted)
    stats = fetch_wheels([every[n] for n in names], cache, urls, source, quiet)
    where = source or cache
    scans = {n: wheelfiles.cached_scan(where / every[n].file, every[n].sha256) for n in names}
    machine = SYSTEMS[system]
    checked = only or names
    for n in checked:
        files, problems = check_libraries(n, every[n], scans, view, machine)
        report.elf_files += files
        report.problems += [f"{system}: {p}" for p in problems]
        count, problems = check_replacements(n, every[n], where / every[n].file, scans[n], view)
        report.replacements += count
        report.problems += [f"{system}: {p}" for p in problems]
    if not only:
        files = {n: every[n].file for n in names}
        for env, members in (("dflash-env", view["stack"]), ("the dev shell", view["devStack"])):
            counts, problems = check_collisions(env, members, scans, view, files)
            report.installed_paths = max(report.installed_paths, counts["file"])
            report.scripts = max(report.scripts, counts["script"])
            report.bytecode_files = max(report.bytecode_files, counts["bytecode"])
            report.problems += [f"{system} {p}" for p in problems]
    report.packages = len(checked)
    return report, stats


def check_inputs(args) -> None:
    """What audit reads besides the lock, before anything is evaluated or fetched."""
    repo = Path(args.repo)
    if not os.path.isfile(repo / "nix" / "audit.nix"):
        raise DflashError(f"{repo} is not the flake's checkout", f"{repo / 'nix' / 'audit.nix'} is missing "
                          "(the audit evaluates it and overlays/)",
                          "run `dflashctl audit` in the repository root, or pass --repo DIR", INPUT)
    for flag, value in (("--fixups", args.fixups), ("--wheels", args.wheels)):
        if value is not None and not os.path.isdir(value):
            raise DflashError(f"{flag} {value!r} is not a directory", "", f"pass {flag} an existing directory",
                              INPUT)
    output.check_dir(Path(args.cache) if args.cache else default_cache(), "--cache")


def run(args) -> int:
    start = time.monotonic()
    check_inputs(args)
    lock = lockfile.load(args.lock)
    repo = Path(args.repo)
    systems = args.system or sorted(lock.systems)
    only = [o for o in (args.only or "").split(",") if o]
    cache = Path(args.cache) if args.cache else default_cache()
    source = Path(args.wheels) if args.wheels else None
    urls = None
    if source is None:
        urls = index_urls(args.spec, lock, args.quiet)
    reports, totals = [], {"downloaded_bytes": 0, "downloaded": 0, "reused": 0}
    for system in systems:
        fixups = Path(args.fixups) if args.fixups else repo / "overlays/fixups"
        report, stats = audit_system(lock, system, repo, Path(args.lock), fixups, cache,
                                     source, urls, only, args.quiet)
        reports.append(report)
        for k in totals:
            totals[k] += stats[k]
        if not args.quiet and not args.json:
            print(f"{system}: {report.packages} wheels, {report.elf_files} ELF files resolved, "
                  f"{report.replacements} fix-up replacements found, "
                  f"{report.installed_paths} installed paths, {report.scripts} entry-point scripts and "
                  f"{report.bytecode_files} byte-code files without a collision"
                  + (f"; {len(report.problems)} problem(s)" if report.problems else ""),
                  file=sys.stderr)
    wall = time.monotonic() - start
    problems = [p for r in reports for p in r.problems]
    result = {"ok": not problems, "wall_s": round(wall, 1), **totals,
              "systems": {r.system: {"packages": r.packages, "elf_files": r.elf_files,
                                     "replacements": r.replacements, "installed_paths": r.installed_paths,
                                     "scripts": r.scripts, "bytecode_files": r.bytecode_files,
                                     "problems": r.problems} for r in reports}}
    if problems:
        e = DflashError(f"the Nix build of {args.lock} would fail ({len(problems)} problem(s))",
                        "".join(f"\n  - {p}" for p in problems),
                        "fix each as it says, then run `dflashctl audit` again", FAILED)
        e.result = result
        raise e
    if args.json:
        output.print_json(result)
    if not args.json:
        print(f"audit passed for {', '.join(systems)} in {wall:.1f} s "
              f"({totals['downloaded_bytes'] / 2**30:.2f} GiB downloaded, {totals['reused']} wheels reused)")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("audit", help="predict autoPatchelf, fix-ups and collisions from the "
                              "locked wheels", **cli_help.texts("audit", __doc__, full=True))
    p.add_argument("--lock", type=Path, default=lockfile.DEFAULT_LOCK, help="default: %(default)s")
    p.add_argument("--spec", type=Path, default=lockfile.DEFAULT_SPEC, help="default: %(default)s")
    p.add_argument("--repo", type=Path, default=Path("."),
                   help="the flake's checkout, for nix/audit.nix and overlays/ (default: .)")
    p.add_argument("--fixups", type=Path, help="fix-up directory (default: REPO/overlays/fixups)")
    p.add_argument("--system", action="append", choices=sorted(SYSTEMS),
                   help="audit only this system (repeatable; default: every system of the lock)")
    p.add_argument("--only", metavar="NAMES", help="comma-separated packages to audit (their "
                   "dependency closures are fetched too); skips the collision check")
    p.add_argument("--cache", help=f"where wheels are kept between runs (default: {default_cache()})")
    p.add_argument("--wheels", metavar="DIR", help="read the locked wheels from DIR, no network")
    p.add_argument("--json", action="store_true", help="machine-readable report on stdout")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=run)
