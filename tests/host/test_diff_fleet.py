"""`dflashctl diff` over more than two hosts: one table of who differs from the majority, and how.

The hosts are copies of a real fingerprint saved on the H200 (docs/gpu/fingerprint-good.json), each
changed the way a fleet drifts: an old xgrammar on one host, another driver on another."""

import copy
import json
import subprocess
import sys
from pathlib import Path

from dflashctl import errors

GOOD = json.loads((Path(__file__).parent.parent.parent / "docs" / "gpu" / "fingerprint-good.json").read_text())


def host(name: str, change=None) -> dict:
    fp = copy.deepcopy(GOOD)
    fp["host"]["hostname"] = name
    if change:
        change(fp)
    return fp


def old_xgrammar(fp: dict) -> None:
    fp["packages"]["xgrammar"] = "0.1.10"
    fp["probes"]["grammar:xgrammar"]["facts"]["missing_names"] = ["xgrammar.StructuralTag"]
    check = next(c for c in fp["checks"] if c["name"] == "grammar:xgrammar")
    check.update(status="fail", summary="xgrammar 0.1.10 lacks StructuralTag",
                 fix="install the locked wheel: xgrammar 0.1.32")


def other_driver(fp: dict) -> None:
    fp["probes"]["driver"]["facts"]["version"] = "580.95.05"


def diff(tmp_path: Path, hosts: list[dict], *extra: str) -> subprocess.CompletedProcess:
    paths = []
    for i, fp in enumerate(hosts):
        paths.append(tmp_path / f"h{i}.json")
        paths[-1].write_text(json.dumps(fp))
    return subprocess.run([sys.executable, "-m", "dflashctl", "diff", *map(str, paths), *extra],
                          capture_output=True, text=True, timeout=60)


def test_a_fleet_table_names_the_hosts_that_differ_from_the_majority(tmp_path):
    hosts = [host("gpu-a"), host("gpu-b", old_xgrammar), host("gpu-c"), host("gpu-d", other_driver),
             host("gpu-e")]
    done = diff(tmp_path, hosts, "--json")
    assert done.returncode == errors.FAILED, done.stderr  # a failing check and an ABI break
    rows = {r["item"]: r for r in json.loads(done.stdout)["differences"]}
    assert rows["check grammar:xgrammar"]["group"] == "failure"
    assert rows["check grammar:xgrammar"]["majority"] == "ok"
    assert rows["check grammar:xgrammar"]["differs"] == {"gpu-b": "fail"}
    assert rows["check grammar:xgrammar"]["failing"]["gpu-b"]["fix"] == "install the locked wheel: xgrammar 0.1.32"
    assert rows["xgrammar names SGLang imports, missing"] == {
        "group": "abi", "item": "xgrammar names SGLang imports, missing", "majority": "none",
        "differs": {"gpu-b": "StructuralTag"}}
    assert rows["xgrammar"]["differs"] == {"gpu-b": "0.1.10"} and rows["xgrammar"]["group"] == "version"
    assert rows["driver version"]["differs"] == {"gpu-d": "580.95.05"}
    assert set(rows) == {"check grammar:xgrammar", "xgrammar names SGLang imports, missing", "xgrammar",
                         "driver version"}  # hostnames differ by design and are not an item
    table = diff(tmp_path, hosts).stdout
    assert table.splitlines()[0] == "2 of 5 hosts differ from the majority: gpu-b, gpu-d"
    assert table.index("failures") < table.index("ABI-breaking") < table.index("versions") < table.index("other")
    assert "on gpu-b: xgrammar 0.1.10 lacks StructuralTag; fix: install the locked wheel: xgrammar 0.1.32" in table


def test_a_fleet_that_agrees_passes(tmp_path):
    done = diff(tmp_path, [host("a"), host("b"), host("c", other_driver)])
    assert done.returncode == errors.OK, done.stdout  # another driver patch release breaks nothing
    assert done.stdout.startswith("1 of 3 hosts differ from the majority: c")
    same = diff(tmp_path, [host("a"), host("b"), host("c")])
    assert (same.returncode, same.stdout) == (errors.OK, "no differences among the 3 hosts\n")
