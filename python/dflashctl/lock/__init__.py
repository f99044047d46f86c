"""The pinned stack: `nix/stack.toml` resolved by uv into `nix/python-lock.json`.

Entry points: `lock.py` (`dflashctl lock`: resolve, check the ABI contract, write or `--check`),
`export.py` (`dflashctl export`: hash-pinned requirements for pip hosts) and `audit.py`
(`dflashctl audit`: the locked wheels against the Nix build). `lockfile.py` is the only reader and
writer of the lock; the rest are their steps (spec, resolver, closure, wheels, contract, licenses,
lockdiff; wheelfetch, wheelfiles, elf, fixup_scripts).
"""
