"""Nix system names and what they mean for wheels and markers."""

import platform

# Nix system -> (platform_machine as PEP 508 markers see it, manylinux arch suffix)
SYSTEMS = {
    "x86_64-linux": "x86_64",
    "aarch64-linux": "aarch64",
}


def current_system() -> str:
    """The Nix system name of this host, e.g. 'x86_64-linux'."""
    machine = platform.machine()
    machine = {"amd64": "x86_64", "arm64": "aarch64"}.get(machine.lower(), machine)
    return f"{machine}-{platform.system().lower()}"
