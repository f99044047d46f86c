"""One SGLang instance as a systemd service.

Entry points: `validate.py` (`dflashctl validate`), `unit.py` (`dflashctl unit`: the unit file for
hosts without NixOS) and `serve.py` (`dflashctl serve`: preflight, start, READY=1, supervise).
`data/settings.json` is the settings schema (read by `settings_schema.py` and the NixOS module),
`config.py` the settings' parser and rules, `sglang_args.py` the only mapping to SGLang's flags,
`server.py` the child-process supervisor, `data/service-unit.json` the unit directives that the
NixOS module reads too. What the host does across its instances (router, rollout, status,
monitoring) is `dflashctl.operations`, above this package.
"""
