"""One SGLang instance as a systemd service.

Entry points: `validate.py` (`dflashctl validate`), `unit.py` (`dflashctl unit`: the unit file for
hosts without NixOS) and `serve.py` (`dflashctl serve`: preflight, start, READY=1, supervise).
`config.py` is the settings schema, `sglang_args.py` the only mapping to SGLang's flags,
`server.py` the child-process supervisor, `data/service-unit.json` the unit directives that the
NixOS module reads too.
"""
