"""promptReadiness (overlays/fixups/sglang.nix; issue 44): SGLang 0.5.11's health handler and its
warm-up's wait for the server each slept a whole second before looking; after the fix-up they look
every 50 ms and give the same answers. Every wait runs on a virtual clock (the module's `time` and
`asyncio` replaced), so what is asserted is when, in the clock's seconds, each answer comes: no wall
time is measured.

Offline: over functions of our own with the shapes the fix-up edits (import_fixups.SHAPED_HTTP_SERVER).
With network: over the locked wheel's own `health_generate` and `_execute_server_warmup`, taken
from its http_server.py before and after the install script, with stand-ins for what they call."""

import ast
import asyncio
import importlib.util
import logging
import time as wall
import types
from pathlib import Path

import pytest

from fixup_shell import locked_wheel, run_script, unpack
from import_fixups import HTTP_SERVER, shaped_sglang_site as shaped_site, sglang_post_install as post_install

pytestmark = pytest.mark.nix

START = 1000.0  # the virtual clock's reading when a wait begins


class VirtualClock:
    """time.time, time.monotonic, time.sleep and asyncio.sleep over one reading that only sleeps move."""

    def __init__(self):
        self.now = START
        self.asyncio = types.SimpleNamespace(sleep=self.async_sleep, create_task=self.create_task)

    def time(self) -> float:
        return self.now

    monotonic = time
    localtime, strftime = staticmethod(wall.localtime), staticmethod(wall.strftime)  # log lines only

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    async def async_sleep(self, seconds: float) -> None:
        self.now += seconds

    @staticmethod
    def create_task(coroutine):
        coroutine.close()  # the request to the scheduler: its answer is the test's to give
        return types.SimpleNamespace(cancel=lambda: None)

    def since_start(self) -> float:
        return round(self.now - START, 6)


def load(path: Path, clock: VirtualClock) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(f"shaped_http_server_{id(clock)}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.time, module.asyncio = clock, clock.asyncio
    return module


def shaped_health(path: Path, answered_after: float | None) -> tuple[int, float]:
    """(status, virtual seconds) of the shaped handler when the scheduler answers after `answered_after`."""
    clock = VirtualClock()
    module = load(path, clock)
    module.scheduler.answered_at = None if answered_after is None else START + answered_after
    status = asyncio.run(module.health())
    return status, clock.since_start()


def shaped_wait(path: Path, listens_after: float | None, try_takes: float = 0.0) -> tuple[bool, float, int]:
    """(found, virtual seconds, tries) of the shaped warm-up wait for a server that answers from
    `listens_after` on (None: never), each try taking `try_takes`."""
    clock = VirtualClock()
    module = load(path, clock)
    tries = []

    def try_once() -> bool:
        tries.append(clock.now)
        clock.sleep(try_takes)
        return listens_after is not None and clock.now - START >= listens_after

    found = module.wait_for_server(try_once)
    return found, clock.since_start(), len(tries)


def test_the_health_handler_answers_as_soon_as_the_scheduler_did(tmp_path):
    site = shaped_site(tmp_path)
    path = site / HTTP_SERVER
    assert shaped_health(path, 0.01) == (200, 1.0)  # as published: a whole second, whatever the answer
    assert shaped_health(path, None) == (503, 20.0)
    done = run_script(post_install(), tmp_path / "out")
    assert done.returncode == 0, done.stderr
    status, at = shaped_health(path, 0.01)
    assert status == 200 and at == pytest.approx(0.05)
    status, at = shaped_health(path, 1.5)  # a busy scheduler's answer: found within 50 ms of it
    assert status == 200 and 1.5 <= at <= 1.55 + 1e-9
    status, at = shaped_health(path, None)  # no answer: the same 503 after the same timeout
    assert status == 503 and at == pytest.approx(20.0, abs=0.06)
    assert "dflash fix-up" in path.read_text()
    assert list((site / "sglang/srt/entrypoints/__pycache__").glob("http_server.*.pyc"))  # compiled again


def test_the_warm_up_finds_the_server_within_50_ms_and_still_gives_up_after_120_s(tmp_path):
    site = shaped_site(tmp_path)
    path = site / HTTP_SERVER
    assert shaped_wait(path, 0.3) == (True, 1.0, 1)  # as published: the first try after a second
    assert shaped_wait(path, None) == (False, 120.0, 120)
    assert shaped_wait(path, None, try_takes=5.0) == (False, 720.0, 120)  # a try that hangs to its timeout
    assert run_script(post_install(), tmp_path / "out").returncode == 0

    found, at, tries = shaped_wait(path, 0.3)
    assert found and 0.3 <= at <= 0.35 + 1e-9 and tries == round(at / 0.05)  # a try every 50 ms
    found, at, tries = shaped_wait(path, None)
    assert not found and at == pytest.approx(120.0, abs=0.06) and tries >= 2399
    found, at, tries = shaped_wait(path, None, try_takes=5.0)
    assert not found and 120 <= at <= 125.1 and tries == 24  # bounded by the 120 s, not by the tries


# ---------------------------------------------------------------- the locked wheel, with network

def real_function(path: Path, name: str, namespace: dict):
    """`name` from the file at `path`, defined in `namespace` without its decorators (FastAPI's routes)
    and annotations (FastAPI's and SGLang's types, not needed to run it)."""
    tree = ast.parse(path.read_text())
    (node,) = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name]
    node.decorator_list, node.returns = [], None
    for arg in node.args.args + node.args.kwonlyargs:
        arg.annotation = None
    exec(compile(ast.Module(body=[node], type_ignores=[]), str(path), "exec"), namespace)
    return namespace[name]


class TokenizerManager:
    """What the health handler reads of SGLang's tokenizer manager; the scheduler's answer to its
    request arrives `answered_after` virtual seconds after the request (None: never)."""

    def __init__(self, clock: VirtualClock, answered_after: float | None):
        self.clock, self.answered_after = clock, answered_after
        self.gracefully_exit, self.is_generation, self.server_status = False, True, "Up"
        self.server_args = types.SimpleNamespace(disaggregation_mode="null")
        self.rid_to_state = {}

    @property
    def last_receive_tstamp(self) -> float:
        arrives = None if self.answered_after is None else START + self.answered_after
        return arrives if arrives is not None and self.clock.now >= arrives else 0.0

    async def generate_request(self, request, raw):
        yield {}


def real_health(path: Path, answered_after: float | None) -> tuple[int, float]:
    clock = VirtualClock()
    manager = TokenizerManager(clock, answered_after)
    enabled = types.SimpleNamespace(get=lambda: True)
    namespace = {
        "time": clock, "asyncio": clock.asyncio, "logger": logging.getLogger("readiness-test"),
        "_global_state": types.SimpleNamespace(tokenizer_manager=manager),
        "ServerStatus": types.SimpleNamespace(Starting="Starting", Up="Up", UnHealthy="UnHealthy"),
        "envs": types.SimpleNamespace(SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=enabled),
        "HEALTH_CHECK_RID_PREFIX": "HEALTH_CHECK", "HEALTH_CHECK_TIMEOUT": 20,
        "GenerateReqInput": types.SimpleNamespace, "EmbeddingReqInput": types.SimpleNamespace,
        "DisaggregationMode": types.SimpleNamespace(NULL=types.SimpleNamespace(value="null")),
        "FAKE_BOOTSTRAP_HOST": "fake", "Response": lambda status_code: status_code,
    }
    handler = real_function(path, "health_generate", namespace)
    request = types.SimpleNamespace(url=types.SimpleNamespace(path="/health_generate"))
    status = asyncio.run(handler(request))
    return status, clock.since_start()


class Reached(Exception):
    """Raised by the stand-in response's json(): the wait is over, the warm-up request would follow."""


class ConnectionRefused(Exception):
    pass


def real_wait(path: Path, listens_after: float | None) -> tuple[bool, float, int, list]:
    """(found, virtual seconds, tries, kills) of the real _execute_server_warmup's wait for /model_info."""
    clock = VirtualClock()
    tries, kills = [], []

    def model_info():
        raise Reached()

    def get(url, timeout, headers, verify):
        tries.append(clock.now)
        assert url.endswith("/model_info") and timeout == 5
        if listens_after is None or clock.now - START < listens_after:
            raise ConnectionRefused(url)
        return types.SimpleNamespace(status_code=200, text="{}", json=model_info)

    requests = types.SimpleNamespace(get=get, exceptions=types.SimpleNamespace(RequestException=ConnectionRefused))
    namespace = {
        "time": clock, "requests": requests, "logger": logging.getLogger("readiness-test"),
        "get_exception_traceback": lambda: "traceback", "kill_process_tree": kills.append,
        "os": types.SimpleNamespace(getpid=lambda: 4242),
    }
    warmup = real_function(path, "_execute_server_warmup", namespace)
    args = types.SimpleNamespace(api_key=None, url=lambda: "http://127.0.0.1:30000", ssl_verify=lambda: True)
    try:
        found = warmup(args)
    except Reached:
        found = True
    return found, clock.since_start(), len(tries), kills


@pytest.mark.network
def test_the_locked_sglang_answers_health_and_warms_up_without_its_idle_seconds(tmp_path):
    site = unpack(locked_wheel("sglang", tmp_path), tmp_path / "out")
    path = site / HTTP_SERVER
    assert real_health(path, 0.01) == (200, 1.0)
    assert real_health(path, None) == (503, 20.0)
    assert real_wait(path, 0.3)[:3] == (True, 1.0, 1)

    done = run_script(post_install(), tmp_path / "out")
    assert done.returncode == 0, done.stderr
    status, at = real_health(path, 0.01)
    assert status == 200 and at == pytest.approx(0.05)
    status, at = real_health(path, None)
    assert status == 503 and at == pytest.approx(20.0, abs=0.06)
    found, at, tries, kills = real_wait(path, 0.3)
    assert found and 0.3 <= at <= 0.35 + 1e-9 and tries == round(at / 0.05) and kills == []
    found, at, tries, kills = real_wait(path, None)  # never answers: SGLang's own end, as published
    assert found is False and at == pytest.approx(120.0, abs=0.06) and kills == [4242]
