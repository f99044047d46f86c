"""The ABI contract: rules no resolver knows, checked on every lock, one message per broken rule.

Each message names the package, what the contract expects and what the lock has. The rules come
from real failures (docs: ../shared context): a CUDA 12.8 torch next to a CUDA 13 kernel, an
sglang-kernel built for another torch, xgrammar 0.1.10, a missing soundfile.
"""

from packaging.requirements import Requirement
from packaging.version import InvalidVersion, Version

from dflashctl.lock.lockfile import LockedWheel, canonical_name
from dflashctl.lock.spec import Contract
from dflashctl.lock.wheels import marker_env


def torch_requirements(requires_dist: list[str], system: str, python: str) -> dict[str, Requirement]:
    """torch's Requires-Dist that apply on `system` (no extras), by canonical name."""
    env = marker_env(system, python)
    out = {}
    for line in requires_dist:
        r = Requirement(line)
        if r.marker is None or r.marker.evaluate(env):
            out[canonical_name(r.name)] = r
    return out


def _pinned_line(req: Requirement) -> str | None:
    """'13.0.2' for `==13.0.2`, '13.0' for `==13.0.*`; None when the requirement is not one pin."""
    specs = list(req.specifier)
    if len(specs) == 1 and specs[0].operator in ("==", "==="):
        return specs[0].version.removesuffix(".*")
    return None


def _in_line(version: str, line: str) -> bool:
    try:
        v, want = Version(version).release, Version(line).release
    except InvalidVersion:
        return False
    return v[:len(want)] == want


def check(contract: Contract, system: str, packages: dict[str, LockedWheel],
          torch_requires: list[str] | None, python: str) -> list[str]:
    """Every violated rule on `system`, as a readable sentence; [] when the contract holds."""
    out = []

    def version_rule(name, expected):
        if expected is None:
            return
        found = packages.get(name)
        if found is None:
            out.append(f"{name} on {system}: expected {expected}, found no {name} in the lock")
        elif found.version != expected:
            out.append(f"{name} on {system}: expected {expected}, found {found.version}")

    version_rule("torch", contract.torch)
    version_rule("sglang-kernel", contract.sglang_kernel)
    version_rule("xgrammar", contract.xgrammar)
    for name in contract.required:
        if name not in packages:
            out.append(f"{name} on {system}: expected in the lock (the contract requires it), "
                       f"found nothing")

    torch = packages.get("torch")
    if torch is None or torch_requires is None:
        return out
    reqs = torch_requirements(torch_requires, system, python)
    if contract.cuda is not None:
        toolkit = reqs.get("cuda-toolkit")
        pin = _pinned_line(toolkit) if toolkit else None
        if toolkit is None:
            out.append(f"torch on {system}: expected {torch.file} to require cuda-toolkit=="
                       f"{contract.cuda}.*, found no CUDA toolkit requirement (a CPU build?)")
        elif pin is None or not _in_line(pin, contract.cuda):
            out.append(f"torch on {system}: expected {torch.file} to require cuda-toolkit=="
                       f"{contract.cuda}.*, found cuda-toolkit{toolkit.specifier}")
        else:
            locked = packages.get("cuda-toolkit")
            if locked is None or not _in_line(locked.version, contract.cuda):
                found = locked.version if locked else "none"
                out.append(f"cuda-toolkit on {system}: expected {contract.cuda}.* (torch requires "
                           f"{toolkit.specifier}), found {found}")
    triton_req = reqs.get("triton")
    triton = packages.get("triton")
    if triton_req is None:
        out.append(f"triton on {system}: expected torch {torch.version} to pin triton, "
                   f"found no triton requirement in {torch.file}")
    elif _pinned_line(triton_req) is None:
        out.append(f"triton on {system}: expected torch to pin one triton release, "
                   f"found triton{triton_req.specifier}")
    elif triton is None or not triton_req.specifier.contains(triton.version, prereleases=True):
        out.append(f"triton on {system}: expected {triton_req.specifier} (what torch "
                   f"{torch.version} requires), found {triton.version if triton else 'none'}")
    return out
