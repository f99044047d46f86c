"""Servers sharing a GPU start side by side only where SGLang's own memory rule lets every one of
them start, whatever the order in which they take their free-memory snapshot (memory.memory_plan)."""

import json

from smoke_runner import smoke

from dflashctl.smoke import memory
from dflashctl.smoke.memory import memory_plan
from dflashctl.smoke.settings import RunSpec

H200_FREE = 143155  # MiB, tests/data/gpus/h200-idle.json
OVERHEAD_MIB = 4096  # a server's CUDA context, graphs and activations: 2.3-3.2 GiB in the H200's logs, rounded up
# What the H200's default smoke computed (docs/gpu/smoke-oracle-h200.json, launch_plan).
H200_DEMANDS = [
    {"run": "baseline", "weights_mib": 84, "kv_mib": 1025, "static_mib": 1108, "total_mib": 5204},
    {"run": "DFLASH", "weights_mib": 104, "kv_mib": 1281, "static_mib": 1384, "total_mib": 5480},
    {"run": "DFLASH-poisoned", "weights_mib": 104, "kv_mib": 1281, "static_mib": 1384, "total_mib": 5480},
    {"run": "grammar", "weights_mib": 786, "kv_mib": 1025, "static_mib": 1810, "total_mib": 5906},
]


def worst_rest(plan, demands, free) -> float:
    """SGLang's rest = f x snapshot - what the others hold - own weights and overhead, when the
    snapshot saw the GPU empty and every neighbour allocated before the profile: the least of all
    orders. Must cover the server's KV pool."""
    total = sum(d["total_mib"] for d in demands)
    return min(plan["fraction"] * free - (total - d["total_mib"]) - (d["static_mib"] - d["kv_mib"])
               - OVERHEAD_MIB - d["kv_mib"] for d in demands)


def test_the_h200_fits_side_by_side_at_a_quarter_whatever_the_order():
    plan = memory_plan(H200_FREE, H200_DEMANDS, 0.25)
    assert plan["together"] and plan["fraction"] == 0.25 and plan["needed_fraction"] == 0.1542
    assert worst_rest(plan, H200_DEMANDS, H200_FREE) >= 0


def test_a_smaller_gpu_gets_the_least_fraction_that_fits():
    free = 40000
    plan = memory_plan(free, H200_DEMANDS, 0.25)
    assert plan["together"] and 0.25 < plan["fraction"] <= 0.85
    assert worst_rest(plan, H200_DEMANDS, free) >= 0
    assert worst_rest({"fraction": plan["fraction"] - 0.01}, H200_DEMANDS, free) < 0  # the least such


def test_too_little_memory_means_one_server_at_a_time():
    plan = memory_plan(25000, H200_DEMANDS, 0.25)
    assert not plan["together"] and "would need memFractionStatic 0.88" in plan["reason"]
    plan = memory_plan(15000, H200_DEMANDS, 0.25)
    assert not plan["together"] and "hold up to 22070 MiB together" in plan["reason"]
    assert not memory_plan(None, H200_DEMANDS, 0.25)["together"]


def test_demands_from_the_files_and_configs(tmp_path):
    from dflashctl.smoke import oracle, synthetic
    pair = oracle.write_pair(tmp_path / "o")
    d = memory.server_demand_mib(RunSpec("DFLASH", "DFLASH", str(pair.target), str(pair.draft)), 32768)
    assert d == H200_DEMANDS[1]
    target, _ = synthetic.write_pair(tmp_path / "r")  # dummy weights: counted from the config
    g = memory.server_demand_mib(RunSpec("grammar", None, str(target), dummy=True), 65536)
    assert g == H200_DEMANDS[3]


def test_without_nvml_smoke_starts_its_servers_one_at_a_time(tmp_path):
    p = smoke(tmp_path, "--runs", "baseline,DFLASH", "--json", "result.json", DFLASHCTL_NVML_REPLAY="")
    assert p.returncode == 0, p.stderr
    assert "starting the servers one at a time: the GPU's free memory could not be read" in p.stderr
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["settings"]["launch"] == "sequential" and result["launch_plan"]["together"] is False
    assert [r["measured_while_starting"] for r in result["runs"]] == [[], []]


def test_with_room_the_servers_start_together_at_the_planned_fraction(tmp_path):
    p = smoke(tmp_path, "--runs", "baseline,DFLASH", "--json", "result.json", "--work-dir", str(tmp_path / "w"))
    assert p.returncode == 0, p.stderr
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["launch_plan"]["together"] and result["settings"]["launch"] == "together"
    args = (tmp_path / "w" / "logs" / "DFLASH.log").read_text().splitlines()[0].split()
    assert args[args.index("--mem-fraction-static") + 1] == "0.25"
