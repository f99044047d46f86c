"""What a host has: the facts the stack depends on, read in child processes with timeouts.

Entry points: `doctor.py` (`dflashctl doctor`: checks with fixes, `--save` a fingerprint) and
`fingerprint_diff.py` (`dflashctl diff`: two fingerprints, ABI-breaking differences first).
`probe_child.py` runs inside the inspected interpreter; `probes.py` turns its facts into checks
(shared with serve's preflight); `cuda_home.py` finds the stack's own nvcc for SGLang's JIT.
"""
