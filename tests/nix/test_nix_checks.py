"""`nix flake check` builds only what checks the flake: no check depends on dflash-env,
dflash-kernels or a wheel of nix/python-lock.json (the CUDA stack, ~3.6 GiB of wheels per system).

The flake is evaluated over a stand-in nixpkgs whose packages are derivations that are never
built (tests/nix/closure-nixpkgs: the real overlay, every locked wheel a fetchPypi derivation named
after its file), and each check's dependency derivations are read the way Nix reads them,
`nix-store --query --requisites` on its .drv. checks.nixos-vm's hosts are evaluated by
tests/nix/harness/nixos-lite.nix; where a nixpkgs lib is at hand (DFLASH_NIXPKGS_LIB) the real
module system must find the same dependencies. The controls (dflash-env, the flake's dflashctl, a
host on the flake's module defaults) must reach what the checks must not, or the test proves nothing.
"""

import json
import os
import subprocess
from pathlib import Path

import pytest

from conftest import REPO, nix_or_skip
from nixeval import nix_env

pytestmark = pytest.mark.nix
HARNESS = REPO / "tests" / "nix" / "harness"


def evaluate(expr: str):
    done = subprocess.run([nix_or_skip(), "eval", "--json", "--impure", "--expr", expr], capture_output=True,
                          text=True, env=nix_env(), timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def requisites(*drvs: str) -> set[str]:
    """Every derivation and source a build of `drvs` needs (their store paths)."""
    nix_store = str(Path(nix_or_skip()).with_name("nix-store"))
    done = subprocess.run([nix_store, "--query", "--requisites", *drvs], capture_output=True, text=True,
                          env=nix_env(), timeout=120)
    assert done.returncode == 0, done.stderr
    return set(done.stdout.split())


def name(path: str) -> str:
    return path.split("-", 1)[1]


def wheels(paths: set[str]) -> set[str]:
    return {name(p).removesuffix(".drv") for p in paths if p.endswith(".whl.drv")}


def locked_files(lock: str, system: str, host_only: bool = False) -> set[str]:
    packages = json.loads((REPO / "nix" / lock).read_text())["systems"][system]["packages"]
    return {p["file"] for p in packages.values() if not (host_only and p.get("dev"))}


@pytest.fixture(scope="module")
def flake():
    return evaluate(f"import {HARNESS / 'checks-closure.nix'}")


def test_no_check_reaches_the_stack_the_kernels_or_a_wheel(flake):
    from flake_outputs import PER_SYSTEM, SYSTEMS
    assert set(flake) == SYSTEMS
    for system, out in flake.items():
        assert set(out["checks"]) == PER_SYSTEM["checks"], system
        stack, router = locked_files("python-lock.json", system), locked_files("router-lock.json", system)
        for check, drv in out["checks"].items():
            needs = requisites(drv)
            found = wheels(needs)
            assert out["packages"]["dflash-env"] not in needs, (system, check)
            assert out["packages"]["dflash-kernels"] not in needs, (system, check)
            # Only the VM test has wheels: the router's environment, from its own lock (no torch, no
            # CUDA); the 23 it shares with the stack are the same files, fetched once.
            allowed = router if check == "nixos-vm" else set()
            assert found <= allowed, (system, check, sorted(found - allowed)[:5])
            assert not found & (stack - router), (system, check)
        vm = requisites(out["checks"]["nixos-vm"])
        assert wheels(vm) == router and out["packages"]["dflash-router-env"] in vm, system


def test_the_controls_reach_what_the_checks_must_not(flake):
    """The detection works: the stack's own derivations do reach the stack, so their absence from
    every check above is a finding, not a blind spot."""
    for system, out in flake.items():
        p = out["packages"]
        env = requisites(p["dflash-env"])
        assert wheels(env) >= locked_files("python-lock.json", system, host_only=True) , system
        assert p["dflash-env"] in requisites(p["dflash-kernels"]), system
        assert p["dflash-env"] in requisites(p["dflash-env-tests-bytecode"]), system  # the byte-code test
        # The flake's dflashctl takes `packaging` from the lock; the VM test builds its own from nixpkgs'.
        assert any(w.startswith("packaging-") for w in wheels(requisites(p["dflashctl"]))), system


def vm_hosts(lib: Path | None) -> dict[str, dict[str, set[str]]]:
    arg = f"{{ lib = import {lib}; }}" if lib else "{ }"
    out = evaluate(f"import {HARNESS / 'vm-nodes.nix'} {arg}")
    return {node: {how: requisites(*drvs) for how, drvs in v.items()} for node, v in out.items()}


def test_vm_hosts_offline_see_the_flake_defaults_and_override_them(flake):
    hosts = vm_hosts(None)
    p = flake["x86_64-linux"]["packages"]
    control = hosts.pop("flake-defaults")["lite"]
    assert p["dflash-env"] in control and p["dflash-kernels"] in control
    assert wheels(control) >= locked_files("python-lock.json", "x86_64-linux", host_only=True)
    assert set(hosts) == {"good", "broken", "restarting"}
    for node, found in hosts.items():
        assert p["dflash-env"] not in found["lite"] and p["dflash-kernels"] not in found["lite"], node
        assert p["dflashctl"] not in found["lite"], node  # the stand-in's, with nixpkgs' packaging


def test_vm_hosts_closure_is_the_module_systems():
    """nixos-lite against NixOS's own module system (nixpkgs' lib.evalModules), host by host:
    the same dependency derivations, the control included."""
    root = os.environ.get("DFLASH_NIXPKGS_LIB") or os.environ.get("DFLASH_NIXPKGS")
    if not root or not (Path(root) / "lib" / "default.nix").exists():
        pytest.skip("no nixpkgs lib: set DFLASH_NIXPKGS_LIB to a nix-community/nixpkgs.lib checkout "
                    "(outside the repository) to compare nixos-lite with the real module system")
    for node, found in vm_hosts(Path(root) / "lib").items():
        assert found["lite"] == found["real"], (node, sorted(map(name, found["lite"] ^ found["real"])))
