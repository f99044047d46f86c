"""`dflashctl diff` on fingerprints edited by hand: one line saying what is wrong, never a traceback.

The base is a real fingerprint saved on the H200 (docs/gpu/fingerprint-good.json)."""

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from dflashctl import errors

GOOD = json.loads((Path(__file__).parent.parent.parent / "docs" / "gpu" / "fingerprint-good.json").read_text())


def mangled(change) -> dict:
    fp = copy.deepcopy(GOOD)
    change(fp)
    return fp


def diff(tmp_path: Path, b) -> subprocess.CompletedProcess:
    (tmp_path / "a.json").write_text(json.dumps(GOOD))
    path = tmp_path / "b.json"
    path.write_bytes(b if isinstance(b, bytes) else json.dumps(b).encode())
    return subprocess.run([sys.executable, "-m", "dflashctl", "diff", str(tmp_path / "a.json"), str(path)],
                          capture_output=True, text=True, timeout=60)


CASES = [
    # (id, B's content, what the message says)
    ("deep-nesting", b'{"fingerprint_version": 1, "host": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
     "its JSON is nested too deeply"),  # was RecursionError
    ("empty-kernel-error", mangled(lambda fp: fp["probes"]["sgl_kernel"].update(ok=False, error="")),
     None),  # was IndexError (''.splitlines()[0]); an empty error is still a readable fingerprint
    ("facts-a-list", mangled(lambda fp: fp["probes"]["sgl_kernel"].update(ok=False, facts=[])),
     "probes.sgl_kernel.facts is list, not dict"),  # was AttributeError
    ("check-a-number", mangled(lambda fp: fp["checks"].append(1)),
     f"checks[{len(GOOD['checks'])}] must be an object with text fields name, status, summary, fix"),  # was TypeError
    ("gpus-of-strings", mangled(lambda fp: fp["probes"]["driver"]["facts"].update(gpus=["H200"])),
     "probes.driver.facts.gpus must list objects with name, compute_capability, memory_mib"),
    ("missing-names-not-dotted", mangled(lambda fp: fp["probes"]["grammar:xgrammar"]["facts"].update(
        missing_names=["StructuralTag"])), "must list names like module.Name"),
    ("python-version-number", mangled(lambda fp: fp["python"].update(version=3.12)),
     "python.version is float, not str"),
    ("invalid-utf8", b'{"fingerprint_version": 1, "host": "\xff"}', "is not UTF-8 text"),
]


@pytest.mark.parametrize("content,message", [(c, m) for _, c, m in CASES], ids=[i for i, _, _ in CASES])
def test_a_hand_mangled_fingerprint_is_one_line(tmp_path, content, message):
    proc = diff(tmp_path, content)
    assert "Traceback" not in proc.stderr, proc.stderr
    if message is None:
        assert proc.returncode == errors.FAILED and "sgl_kernel common_ops against torch" in proc.stdout
        return
    assert proc.returncode == errors.INPUT  # unreadable input, not "the hosts differ" (FAILED)
    assert message in proc.stderr and proc.stderr.startswith("dflashctl diff: ")
    assert len(proc.stderr.splitlines()) == 2  # what and why, then the fix


def test_odd_gpu_health_figures_are_compared_where_they_can_be_and_never_crash(tmp_path):
    """The GPU part (fp["gpus"], NVML's answers) is not validated: diff takes what is well-formed."""
    def odd(fp):
        fp["gpus"] = {"ok": True, "facts": {"gpus": [{"index": 0, "uuid": ["not", "text"], "health": 7},
                                                     "GPU 1", {"index": "2"}],
                                            "unanswered": {"index": 3}}}
    proc = diff(tmp_path, mangled(odd))
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode in (errors.OK, errors.FAILED)
