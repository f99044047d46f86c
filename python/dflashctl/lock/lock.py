"""`dflashctl lock`: nix/stack.toml → nix/python-lock.json, with the ABI contract enforced.

    dflashctl lock                 resolve every system, check the contract, write the lock
    dflashctl lock --check         re-resolve; exit 1 with a diff if the committed lock differs
    dflashctl lock --diff OLD NEW  what changed between two lock files
"""

import dataclasses
import json
import os
import sys
import time
from pathlib import Path

from dflashctl import cli_help, inputs, output
from dflashctl.errors import FAILED, INPUT, DflashError
from dflashctl.lock import contract, licenses, lockdiff, lockfile, resolver
from dflashctl.lock import spec as specmod
from dflashctl.lock.closure import closure
from dflashctl.lock.lockfile import Lock


def lock_from_uv(uv_lock: dict, spec: specmod.Spec, torch_requires, licenses) -> Lock:
    """Build and contract-check the Lock from a parsed uv.lock.

    `torch_requires(system, url) -> list[str]` gives the chosen torch wheel's Requires-Dist and
    `licenses({file: url}) -> {file: spdx}` every chosen wheel's licence (the network in real
    runs, captured metadata in tests). Raises one DflashError listing every broken rule; never
    returns a lock that breaks the contract.
    """
    from concurrent.futures import ThreadPoolExecutor

    closures = {s: closure(uv_lock, spec, s) for s in spec.systems}
    with ThreadPoolExecutor(max_workers=len(closures)) as pool:
        requires = {s: pool.submit(torch_requires, s, c.urls["torch"])
                    for s, c in closures.items() if "torch" in c.urls}
        requires = {s: f.result() for s, f in requires.items()}
    problems = []
    for s, c in closures.items():
        problems += c.problems
        problems += contract.check(spec.contract, s, c.packages, requires.get(s), spec.python)
    if problems:
        raise DflashError(
            f"the resolved stack breaks {len(problems)} rule(s) of the ABI contract",
            "".join(f"\n  - {p}" for p in problems),
            "change the pins in nix/stack.toml (or the [contract] table, if the new versions are "
            "meant) and run `dflashctl lock` again; the lock was not written")
    urls = {c.packages[n].file: url for c in closures.values() for n, url in c.urls.items()}
    found = licenses(urls)
    systems = {s: {n: dataclasses.replace(w, license=found[w.file]) for n, w in c.packages.items()}
               for s, c in closures.items()}
    return Lock(spec.sha256, spec.python, spec.exclude_newer, list(spec.requirements), systems,
                {s: c.roots for s, c in closures.items()},
                {s: c.dev_roots for s, c in closures.items()})


def known_licenses(path) -> dict[str, str]:
    """file -> licence from an existing lock: a published wheel never changes, so neither does its
    metadata; only new files are read from the index."""
    try:
        lock = lockfile.load(path)
    except DflashError:
        return {}
    return {w.file: w.license for pkgs in lock.systems.values() for w in pkgs.values() if w.license}


def resolve(spec: specmod.Spec, quiet: bool = False, known: dict[str, str] | None = None) -> Lock:
    import tomllib
    from concurrent.futures import ThreadPoolExecutor

    text = resolver.run_uv_lock(spec, quiet)
    with ThreadPoolExecutor(max_workers=4) as pool:
        # torch's metadata downloads while the TOML parses; the chosen wheel is among these.
        fetched = {url: pool.submit(resolver.requires_dist, url)
                   for url in resolver.wheel_urls(text, "torch", spec.python)}

        def torch_requires(system, url):
            return (fetched.get(url) or pool.submit(resolver.requires_dist, url)).result()

        def read_licenses(urls):
            found = {f: (known or {})[f] for f in urls if f in (known or {})}
            new = {f: u for f, u in urls.items() if f not in found}
            return {**found, **(licenses.fetch(new, quiet) if new else {})}

        return lock_from_uv(tomllib.loads(text), spec, torch_requires, read_licenses)


def summary(lock: Lock) -> dict:
    out = {}
    for s in sorted(lock.systems):
        stack, everything = lock.packages(s), lock.packages(s, dev=True)
        out[s] = {"packages": len(stack), "dev_packages": len(everything) - len(stack),
                  "download_bytes": sum(w.size for w in everything.values()),
                  "unfree": sorted(n for n, w in everything.items() if licenses.is_unfree(w.license)),
                  "unknown_license": sorted(n for n, w in everything.items()
                                            if w.license == licenses.UNKNOWN)}
    return out


def _cmd_diff(args) -> int:
    old, new = lockfile.load(args.diff[0]), lockfile.load(args.diff[1])
    changes = lockdiff.diff(old, new)
    if args.json:
        output.print_json(lockdiff.as_json(changes))
    else:
        print(lockdiff.table(changes))
    return 0


def _cmd_check(args, spec: specmod.Spec) -> int:
    committed_text = _read(args.lock)
    committed = lockfile.parse(_json(committed_text, args.lock), str(args.lock))
    fresh = resolve(spec, args.quiet, known_licenses(args.lock))
    changes = lockdiff.diff(committed, fresh)
    hand_formatted = not changes and committed_text != fresh.dumps()
    result = {"up_to_date": not changes and not hand_formatted, "changes": lockdiff.as_json(changes)}
    if args.json and result["up_to_date"]:
        output.print_json(result)
    elif changes and not args.json:
        print(lockdiff.table(changes))
    if not changes and not hand_formatted:
        if not args.json:
            print(f"{args.lock} is up to date with {args.spec}", file=sys.stderr)
        return 0
    tampered = [c for c in changes if c.kind == "re-hashed"]
    if tampered:
        names = ", ".join(f"{c.package} ({c.system})" for c in tampered)
        raise _with(result, f"{args.lock} was tampered with",
                          f"the sha256 or size of the same wheel file differs from the index for "
                          f"{names}; the index never changes a published file, so the lock was edited",
                          "restore the lock from git or regenerate it with `dflashctl lock`", FAILED)
    if hand_formatted:
        raise _with(result, f"{args.lock} is not in canonical form",
                          "its content matches a fresh resolution but its text differs (edited by hand?)",
                          "run `dflashctl lock` and commit the result", FAILED)
    why = (f"{len(changes)} difference(s) from a fresh resolution of {args.spec} (table above)"
           + ("; stack.toml changed since the lock was written"
              if committed.spec_sha256 != spec.sha256 else ""))
    raise _with(result, f"{args.lock} is stale", why,
                "run `dflashctl lock` and commit nix/stack.toml and the lock together", FAILED)


def _with(result: dict, *args) -> DflashError:
    """A failure whose --json object carries the comparison (output.error_object)."""
    e = DflashError(*args)
    e.result = result
    return e


def _read(path: Path) -> str:
    if not os.path.lexists(path):
        raise DflashError(f"no lock at {path}", "the file does not exist",
                          "run `dflashctl lock` first, or pass --lock PATH", INPUT)
    return inputs.read_text(path, "lock", "regenerate it with `dflashctl lock`", INPUT, lockfile.MAX_LOCK)


def _json(text: str, path) -> dict:
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError) as e:
        raise DflashError(f"{path} is not valid JSON", str(e) or "nested too deeply",
                          "regenerate it with `dflashctl lock`", INPUT) from None


def run(args) -> int:
    if args.diff:
        return _cmd_diff(args)
    if not args.check:
        output.check(args.lock, "--lock")  # before the resolution: it is where the lock goes
    spec = specmod.load(args.spec)
    if args.check:
        return _cmd_check(args, spec)
    start = time.monotonic()
    lock = resolve(spec, args.quiet, known_licenses(args.lock))
    text = lock.dumps()
    old = _read(args.lock) if Path(args.lock).exists() else None
    if text != old:
        lockfile.write_atomic(args.lock, text, "--lock")
    wall = time.monotonic() - start
    info = summary(lock)
    if args.json:
        output.print_json({"lock": str(args.lock), "changed": text != old, "wall_s": round(wall, 2),
                           "systems": info})
    else:
        for system, s in info.items():
            print(f"{system}: {s['packages']} packages + {s['dev_packages']} for the dev shell, "
                  f"{s['download_bytes'] / 2**30:.2f} GiB of wheels, {len(s['unfree'])} unfree"
                  + (f", licence unknown: {', '.join(s['unknown_license'])}"
                     if s["unknown_license"] else ""))
        print(f"{'wrote' if text != old else 'unchanged:'} {args.lock} ({wall:.1f} s)")
        if text != old:
            print("next: `dflashctl audit` checks the new wheels against the Nix build "
                  "(libraries, fix-ups, collisions) before a host builds them")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("lock", help="resolve nix/stack.toml into nix/python-lock.json",
                              **cli_help.texts("lock", __doc__, full=True))
    p.add_argument("--spec", type=Path, default=lockfile.DEFAULT_SPEC, help="default: %(default)s")
    p.add_argument("--lock", type=Path, default=lockfile.DEFAULT_LOCK, help="default: %(default)s")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true",
                      help="re-resolve and fail with a diff if the lock is stale or edited")
    mode.add_argument("--diff", nargs=2, metavar=("OLD", "NEW"), type=Path,
                      help="show what changed between two lock files")
    p.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=run)

