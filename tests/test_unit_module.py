"""nix/module.nix evaluated with nixpkgs' lib and stubbed NixOS options (tests/data/service/eval-module.nix).

Needs a nixpkgs lib: DFLASH_NIXPKGS_LIB=/path/to/nixpkgs.lib (its `lib` folder is used) or
DFLASH_NIXPKGS=/path/to/nixpkgs. Skipped otherwise; the full module is built by tier 2.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import nix_or_skip
from dflashctl import errors
from dflashctl.service import unit

HERE = Path(__file__).parent
EVAL = HERE / "data" / "service" / "eval-module.nix"
REPO = HERE.parent
pytestmark = pytest.mark.nix


def nix_lib() -> str:
    for var in ("DFLASH_NIXPKGS_LIB", "DFLASH_NIXPKGS"):
        if os.environ.get(var):
            return str(Path(os.environ[var]) / "lib")
    pytest.skip("no nixpkgs lib here: set DFLASH_NIXPKGS_LIB or DFLASH_NIXPKGS")


def evaluate(tmp_path: Path, instances: str, flake: bool = False, top: str = "{ }") -> dict:
    nix_or_skip()
    f = tmp_path / "instances.nix"
    f.write_text(instances)
    r = subprocess.run(["nix-instantiate", "--eval", "--read-write-mode", "--strict", "--json", str(EVAL),
                        "--arg", "lib", f"import {nix_lib()}", "--arg", "instances", f"import {f}",
                        "--arg", "flake", "true" if flake else "false", "--arg", "top", top],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def validate(path: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO / "python"))
    return subprocess.run([sys.executable, "-m", "dflashctl", "validate", path], capture_output=True,
                          text=True, env=env)


TWO = """{
  qwen = { model = "Qwen/Qwen3-8B"; draftModel = "z-lab/Qwen3-8B-DFlash-b16";
           speculative.algorithm = "DFLASH"; gpus = [ 0 ]; apiKeyFile = "/run/secrets/k"; openFirewall = true; };
  llama = { model = "meta-llama/Llama-3.1-8B-Instruct"; gpus = [ 1 ]; port = 30001; user = "dflash"; };
}"""


def test_units_come_from_the_shared_file(tmp_path):
    out = evaluate(tmp_path, TWO)
    data = unit.unit_data()
    assert set(out["services"]) == {"dflash-qwen", "dflash-llama"}
    qwen = out["services"]["dflash-qwen"]["serviceConfig"]
    for key, value in data["service"].items():
        assert qwen[key] == value, key
    assert out["services"]["dflash-qwen"]["unitConfig"] == data["unit"]
    # the host compiler for SGLang's JIT kernels (nvcc itself comes from the stack's wheels)
    assert [str(p) for p in out["services"]["dflash-qwen"]["path"]] == [
        "/nix/store/00000000000000000000000000000000-gcc-wrapper"]
    assert qwen["LoadCredential"] == "api-key:/run/secrets/k"
    assert qwen["TimeoutStartSec"] == f"{900 + data['timeoutStartMarginSec']}s"
    assert out["services"]["dflash-llama"]["serviceConfig"]["User"] == "dflash"
    assert out["users"]["users"]["dflash"]["isSystemUser"] is True
    assert out["firewall"] == [30000]
    assert out["failedAssertions"] == []


def test_settings_json_is_what_dflashctl_reads(tmp_path):
    out = evaluate(tmp_path, TWO)
    exec_start = out["services"]["dflash-qwen"]["serviceConfig"]["ExecStart"]
    settings = re.search(r"--config (\S+)", exec_start).group(1)
    assert json.loads(Path(settings).read_text())["speculative"]["algorithm"] == "DFLASH"
    all_settings = re.search(r"validate (\S+-dflash-instances\.json)", out["checks"][0]["script"]).group(1)
    r = validate(all_settings)
    assert r.returncode == 0, r.stderr
    assert "2 instance(s) valid" in r.stdout


def test_build_time_validation_refuses_a_shared_port(tmp_path):
    out = evaluate(tmp_path, """{
      a = { model = "m"; gpus = [ 0 ]; };
      b = { model = "m"; gpus = [ 1 ]; };
    }""")
    all_settings = re.search(r"validate (\S+-dflash-instances\.json)", out["checks"][0]["script"]).group(1)
    r = validate(all_settings)
    assert r.returncode == errors.CONFIG
    assert "both use port 30000" in r.stderr


def test_api_key_in_the_store_fails_evaluation(tmp_path):
    out = evaluate(tmp_path, '{ a = { model = "m"; apiKeyFile = "/nix/store/abc-key"; }; }')
    assert any("apiKeyFile points into the Nix store" in m for m in out["failedAssertions"])


def test_flake_module_defaults_to_the_flakes_packages(tmp_path):
    """nixosModules.dflash wraps nix/module.nix; its package defaults yield to the host's own setting."""
    out = evaluate(tmp_path, '{ a = { model = "m"; speculative.algorithm = "DFLASH"; draftModel = "d"; }; }',
                   flake=True, top='{ services.dflash.dflashctlPackage = { type = "derivation"; '
                                   'name = "mine"; outPath = "/nix/store/11111111111111111111111111111111-mine"; '
                                   'meta.mainProgram = "dflashctl"; }; }')
    exec_start = out["services"]["dflash-a"]["serviceConfig"]["ExecStart"]
    assert exec_start.startswith("/nix/store/11111111111111111111111111111111-mine/bin/dflashctl serve")
    assert "--python /nix/store/00000000000000000000000000000000-flake-dflash-env/bin/python" in exec_start
    assert "flake-dflash-env/bin/python" in out["checks"][0]["script"]  # DDTREE/algorithm check
    # the same pinned compiler as the flake's smoke app and dev shell
    assert out["services"]["dflash-a"]["path"] == ["/nix/store/00000000000000000000000000000000-flake-gcc-wrapper"]
    assert out["failedAssertions"] == []
