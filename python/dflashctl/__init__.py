"""dflashctl: one pinned SGLang + DFlash stack on every host, a service that fails fast, a smoke test.

Five capabilities, one subpackage each; imports run one way, smoke -> operations -> service -> host
-> lock, each using only those after it and the shared modules here (cli, errors, systems):

- `lock`: the pinned stack (nix/stack.toml -> nix/python-lock.json, export for pip hosts).
- `host`: what a host has (probes in child processes, fingerprints, doctor, diff, the stack's nvcc).
- `service`: one SGLang instance (settings, SGLang flags, systemd unit, the `serve` supervisor).
- `operations`: the host across its instances (router, rollout, status, monitoring).
- `smoke`: proof that a host decodes with DFlash (synthetic models, servers, load, report).
"""

__version__ = "0.1.0"
