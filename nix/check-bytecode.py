"""The flake's bytecode check: doctor's bytecode probe and check on this interpreter's packages."""
import sys

from dflashctl.host import probes

result = probes.run_probe(sys.executable, "bytecode", ",".join(probes.BYTECODE_PACKAGES), 600)
check = probes.check_bytecode(result, sys.executable)
print(f"bytecode: {check.status}: {check.summary}" + (f" (fix: {check.fix})" if check.fix else ""))
sys.exit(0 if check.status == "ok" else 1)
