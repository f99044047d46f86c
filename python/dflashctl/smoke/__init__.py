"""Proof that a host decodes with DFlash: `dflashctl smoke` (Entry point: `smoke.py`).

`oracle.py` writes the default pair, whose weights are set by hand so that the drafter is right
(`acceptance.py` holds each run to what that pair must accept); `synthetic.py` writes the
random-weight pair (`--pair random`, and the grammar server's target); `options.py` holds the
command line as frozen options, `plan.py` the run decided once; `fleet.py` starts the servers
through the service's own path (`settings.py` their settings, `memory.py` whether they fit side by
side), `measure.py` measures each, `loadgen.py` streams requests and watches the servers,
`report.py` renders the table and JSON and decides the exit code. `grammar.py` checks constrained
decoding (`tokenizer.py` gives the synthetic target a tokenizer, `schema.py` validates JSON).
"""
