"""What the flake offers on each system it supports: its outputs by attribute, written out."""

PER_SYSTEM = {
    "packages": {"dflash-env", "dflashctl", "dflash-host-compiler", "dflash-kernels", "default"},
    "apps": {"dflash-smoke"},
    "devShells": {"default"},
    "checks": {"pytest", "lock-matches-spec", "nixos-example", "nixos-vm", "formatting"},
}
SYSTEMS = {"x86_64-linux", "aarch64-linux"}
