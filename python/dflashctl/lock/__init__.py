"""The pinned stack: `nix/stack.toml` resolved by uv into `nix/python-lock.json`.

Entry points: `lock.py` (`dflashctl lock`: resolve, check the ABI contract, write or `--check`)
and `export.py` (`dflashctl export`: hash-pinned requirements for pip hosts). `lockfile.py` is the
only reader and writer of the lock; the rest are its steps (spec, resolver, closure, wheels,
contract, lockdiff).
"""
