"""Proof that a host decodes with DFlash: `dflashctl smoke` (Entry point: `smoke.py`).

`synthetic.py` writes a random-weight target and drafter, `servers.py` starts them through the
service's own path, `loadgen.py` streams requests and watches the servers, `report.py` renders
the table and JSON and decides the exit code. `grammar.py` checks constrained decoding
(`tokenizer.py` gives the synthetic target a tokenizer, `schema.py` validates JSON).
"""
