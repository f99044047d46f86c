"""The GPU health facts in one file (python/dflashctl/host/data/gpu-health.json, host/gpu_health_data.py):
the file refuses what would make it lie, the trusted lists are the ones checked, docs/service.md's GPU
tables are the generated ones, and every verdict and text the code gives is the file's.

The judging itself, through the stand-in NVML, is tests/host/test_gpu_health.py; the alert rules
made from the file are tests/operations/test_gpu_alerts.py.
"""

import copy
import json

import pytest

from conftest import REPO
from dflashctl.host import gpu_health, gpu_health_data, gpu_health_docs

DOCS = REPO / "docs" / "service.md"


def raw() -> dict:
    return json.loads(gpu_health_data.DATA_FILE.read_text())


def test_the_docs_tables_are_the_datas():
    text = DOCS.read_text()
    assert gpu_health_docs.with_tables(text, gpu_health_data.load()) == text, \
        "docs/service.md's GPU tables are stale: run tests/regenerate (or python -m dflashctl.host.gpu_health_docs docs/service.md)"


def test_the_tables_are_rewritten_in_place_and_missing_markers_are_named(tmp_path, capsys):
    doc = tmp_path / "service.md"
    stale = DOCS.read_text().replace("| 79 | fail (exit 94) |", "| 79 | warn (serves on) |")
    assert stale != DOCS.read_text()
    doc.write_text(stale)
    assert gpu_health_docs.main([str(doc)]) == 0
    assert doc.read_text() == DOCS.read_text()
    doc.write_text("# no tables\n" + gpu_health_docs.FINDINGS[0] + "\n")
    assert gpu_health_docs.main([str(doc)]) == 1
    err = capsys.readouterr().err
    assert gpu_health_docs.FINDINGS[1] in err and gpu_health_docs.XIDS[0] in err
    assert doc.read_text() == "# no tables\n" + gpu_health_docs.FINDINGS[0] + "\n"  # nothing written


def test_the_trusted_lists_are_the_ones_checked():
    """Pinned by value from what was checked (AWS's node monitoring agent, NVIDIA's device plugin),
    not read back from the file the code reads."""
    lists = raw()["trustedLists"]
    assert (lists["aws"]["fatal"], lists["aws"]["notFatal"]) == ([48, 63, 64, 74, 79, 95, 119, 120], [94])
    assert (lists["nvidia"]["notFatal"], lists["nvidia"]["othersFatal"]) == ([13, 31, 43, 45, 68, 109], True)
    d = gpu_health_data.load()
    assert [d.list_verdict("aws", n) for n in (48, 94, 62)] == ["fatal", "not fatal", None]
    assert [d.list_verdict("nvidia", n) for n in (13, 92, 154)] == ["not fatal", "fatal", "fatal"]


def test_where_a_trusted_list_disagrees_the_reason_names_it():
    """The disagreements issue 41 found, resolved in the data: 63 serves on (both lists say fatal),
    92 serves on (NVIDIA's plugin says fatal), 94 ends the instance (AWS says not fatal)."""
    d = gpu_health_data.load()
    assert "AWS's node monitoring agent" in d.xid(63)["reason"] and d.xid(63)["verdict"] == "warn"
    assert "NVIDIA's device plugin" in d.xid(92)["reason"] and d.xid(92)["verdict"] == "warn"
    assert "AWS's node monitoring agent" in d.xid(94)["reason"] and d.xid(94)["verdict"] == "fail"


def broken(change) -> dict:
    data = copy.deepcopy(raw())
    change(data)
    return data


def xid(data: dict, number: int) -> dict:
    return next(x for x in data["xids"] if x["xid"] == number)


@pytest.mark.parametrize("change, problem", [
    (lambda d: d["findings"]["lost"].update(status="error"), "finding lost: status 'error' is not one of fail, warn"),
    (lambda d: d["findings"]["lost"].update(serving="stop"), "finding lost: serving 'stop' is not fail, warn or null"),
    (lambda d: d["findings"]["ecc-off"].pop("fix"), "finding ecc-off: no fix"),
    (lambda d: d["findings"]["lost"].update(xids=[79, 999]), "finding lost: XID 999 is not among the xids"),
    (lambda d: xid(d, 79).update(verdict="warn"), "finding lost: XID 79's verdict is warn, but the watch does fail"),
    (lambda d: d["xids"].append(dict(xid(d, 154))), "XID 154: listed twice"),
    (lambda d: d["xids"].reverse(), "xids: keep them in ascending order"),
    (lambda d: xid(d, 48).update(verdict="fatal"), "XID 48: verdict 'fatal' is not one of fail, warn"),
    (lambda d: xid(d, 31).update(reason=""), "XID 31: no reason"),
    # a verdict a trusted list disagrees with needs a reason that names the list
    (lambda d: xid(d, 74).update(verdict="warn"), "XID 74: AWS's node monitoring agent counts it fatal, the verdict"),
    (lambda d: xid(d, 92).update(reason="an early signal"), "XID 92: NVIDIA's device plugin counts it fatal"),
    (lambda d: xid(d, 13).update(verdict="fail"), "XID 13: NVIDIA's device plugin counts it not fatal"),
    (lambda d: xid(d, 48).update(fix="{rest}"), r"XID 48: unknown name \{rest\} in its fix"),
    (lambda d: d["clockReasons"][3].update(fix="{cooling}; {i}; {heat}"), r"clock reason 0x8: unknown name \{heat\}"),
])
def test_a_broken_file_is_refused_naming_the_entry(change, problem):
    with pytest.raises(ValueError, match=problem):
        gpu_health_data.from_data(broken(change))


def test_named_fixes_are_written_out_and_a_missing_figure_is_an_error():
    d = gpu_health_data.load()
    assert d.xid(48)["fix"] == "drain it, then `nvidia-smi -r -i {i}` (root); if it happens again, replace the board"
    assert gpu_health_data.fill(d.xid(48)["fix"], i=3).startswith("drain it, then `nvidia-smi -r -i 3` (root)")
    with pytest.raises(KeyError, match="no figure 'volatile'"):
        gpu_health_data.fill(d.finding("ecc-volatile")["what"], lifetime=1)
    assert gpu_health_data.join_fixes(["a; b", "b; c", "a"]) == "a; b; c"


@pytest.mark.parametrize("number", [x["xid"] for x in raw()["xids"]])
def test_each_xid_gets_the_files_verdict_fix_and_text(number):
    entry = gpu_health_data.load().xid(number)
    f = gpu_health.xid_finding(number, 2)
    assert (f.status, f.key) == (entry["verdict"], "xid")
    assert f.what.startswith(f"XID {number}: {entry['what']}")
    assert f.what.endswith("; the instance keeps serving") == (entry["verdict"] == "warn")
    assert f.fix == gpu_health_data.fill(entry.get("fix", "read `journalctl -k | grep -i xid`"), i=2)


def test_an_xid_the_file_does_not_list_is_noted_and_serves_on():
    f = gpu_health.xid_finding(140, 0)
    assert (f.status, f.what, f.fix) == ("warn", "XID 140: a critical XID this product does not act on; the "
                                         "instance keeps serving", "read `journalctl -k | grep -i xid`")


def test_a_recovery_action_nvml_does_not_name_still_fails_with_a_fix():
    """nvml.h names 1-4 (reset, reboot, drain P2P, drain and reset); headers disagree on 5, so it is
    not named here: any action the driver asks for fails the GPU all the same."""
    [f] = gpu_health.recovery_findings({"recovery_action": {"rc": 0, "value": 5}}, 1)
    assert (f.status, f.what, f.fix) == ("fail", "the driver asks for recovery action 5 (GPU recovery action 5)",
                                         "see `nvidia-smi -q` (GPU Recovery Action)")
    [f] = gpu_health.recovery_findings({"recovery_action": {"rc": 0, "value": 2}}, 1)
    assert f.fix == "drain the host and reboot it" and "a reboot of the host" in f.what


def test_every_finding_has_its_row_and_every_xid_its_row():
    text = DOCS.read_text()
    d = gpu_health_data.load()
    start, end = text.index(gpu_health_docs.FINDINGS[0]), text.index(gpu_health_docs.FINDINGS[1])
    rows = [line for line in text[start:end].splitlines() if line.startswith("| ") and "---" not in line]
    assert len(rows) == 1 + len(d.data["findings"]) + 2  # header, one per finding, the two XID rows
    start, end = text.index(gpu_health_docs.XIDS[0]), text.index(gpu_health_docs.XIDS[1])
    xid_rows = [line.split(" | ")[0][2:] for line in text[start:end].splitlines() if line[2:3].isdigit()]
    assert [int(n) for n in xid_rows if not n.startswith("0x")] == [x["xid"] for x in d.data["xids"]]
