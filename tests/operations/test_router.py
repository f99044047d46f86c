"""The router in front of a host's instances: the real sglang-router 0.3.2 against stand-in SGLang.

Every process is real and on 127.0.0.1: stand-in workers (tests/data/service/standin_server.py,
SGLang 0.5.11's JSON), and the router as its unit starts it (`dflashctl router`, operations/router.py's
flags and the defaults of data/router-unit.json). Load is bounded by request count and deadline;
no assertion is about time, only about what was answered and by whom.
"""

import json
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from dflashctl import cli, errors
from dflashctl.errors import DflashError
from dflashctl.operations import router, router_unit
from dflashctl.service import config
from nixos_host import nix_router, nixos_router_unit
from router_harness import (
    MEASURED_DEFAULTS,
    REPO,
    Load,
    Router,
    Standin,
    free_port,
    generate_body,
    needs_router,
    request,
    served_by,
)


@pytest.fixture
def workers(tmp_path):
    started = []

    def make(n: int = 2, **env) -> list[Standin]:
        for _ in range(n):
            started.append(Standin(free_port(), tmp_path, **env).start())
        return started[-n:]
    yield make
    for w in started:
        w.stop()


@pytest.fixture
def make_router(tmp_path):
    started = []

    def make(ws: list[Standin], **settings) -> Router:
        env = settings.pop("_env", None)
        r = Router({"workers": [w.url for w in ws], **settings}, tmp_path, env=env).start()
        started.append(r)
        return r
    yield make
    for r in started:
        r.stop()


# --- settings and unit (no router process) -----------------------------------------------------------

def instance(name: str, port: int, **extra) -> config.InstanceConfig:
    return config.from_dict({"name": name, "model": "m", "port": port, **extra})


DEFAULT_FLAGS = {  # the router's flag each default becomes
    "--host": "127.0.0.1", "--port": "30080", "--prometheus-host": "127.0.0.1", "--prometheus-port": "30081",
    "--policy": "round_robin", "--health-check-endpoint": "/health", "--health-check-interval-secs": "2",
    "--health-check-timeout-secs": "5", "--health-failure-threshold": "2", "--health-success-threshold": "1",
    "--cb-failure-threshold": "3", "--cb-timeout-duration-secs": "5", "--request-timeout-secs": "300",
    "--worker-startup-timeout-secs": "3600", "--worker-startup-check-interval": "2",
    "--shutdown-grace-period-secs": "30", "--log-level": "info", "--retry-max-retries": "3",
}


def test_defaults_are_the_measured_ones_and_keep_off_the_instances_port():
    s = router_unit.settings_for([instance("a", 30000), instance("b", 30001)], {})
    assert s["workers"] == ["http://127.0.0.1:30000", "http://127.0.0.1:30001"]
    assert s["instanceUnits"] == ["dflash-a.service", "dflash-b.service"]
    assert {k: s[k] for k in MEASURED_DEFAULTS} == MEASURED_DEFAULTS
    assert s["port"] not in (30000, 30001) and s["host"] == s["metricsHost"] == "127.0.0.1"


def test_the_docs_table_gives_the_same_defaults():
    text = (REPO / "docs" / "service.md").read_text()
    table = text[text.index("**Settings** (router JSON"):]
    rows = {}
    for line in table.splitlines()[4:]:
        if not line.startswith("|"):
            break
        keys, default = line.split("|")[1:3]
        for k, v in zip(re.findall(r"`(\w+)`", keys), default.split(" / ")):
            rows[k] = v.strip()
    assert {k: rows[k] for k in MEASURED_DEFAULTS} == {k: str(v) for k, v in MEASURED_DEFAULTS.items()}


def test_the_defaults_reach_the_routers_flags():
    cfg = router.from_dict({"workers": ["http://127.0.0.1:30000"]})
    argv = router.build_argv(cfg, "py", None, None)
    assert argv[:3] == ["py", "-m", "sglang_router.launch_router"]
    flags = {argv[i]: argv[i + 1] for i in range(3, len(argv) - 1) if argv[i].startswith("--")
             and not argv[i + 1].startswith("--")}
    assert {f: flags[f] for f in DEFAULT_FLAGS} == DEFAULT_FLAGS
    assert argv[argv.index("--worker-urls") + 1] == "http://127.0.0.1:30000"
    assert "--disable-retries" not in argv and "--api-key" not in argv and "--control-plane-api-keys" not in argv
    none = router.build_argv(router.from_dict({"workers": ["http://127.0.0.1:30000"], "retries": 0}), "py", "k", "a")
    assert "--disable-retries" in none and "--retry-max-retries" not in none
    assert none[none.index("--api-key") + 1] == "k"
    assert none[none.index("--control-plane-api-keys") + 1] == "dflash-admin:dflash admin:admin:a"
    assert router.masked(none)[none.index("--api-key") + 1] == "***"


@pytest.mark.parametrize("given, instances, fragment", [
    ({"port": 30001}, [("a", 30001)], "port: 30001 is a worker's port"),
    ({"metricsPort": 40000}, [("a", 30000)], "clashes with instance 'a'"),  # its gRPC port
    ({"host": "0.0.0.0"}, [("a", 30000)], "adminApiKeyFile: required when host is '0.0.0.0'"),
    ({"healthCheckTimeoutSec": 1}, [("a", 30000)], "with 1 the router admitted no worker"),
    ({"extraArgs": ["--policy", "random"]}, [("a", 30000)], "--policy is set by the setting policy"),
    ({"workers": ["http://x:1"]}, [("a", 30000)], "must not list workers"),
    ({"remoteWorkers": ["ftp://x:1"]}, [("a", 30000)], "http://HOST:PORT"),
    ({"polcy": "random"}, [("a", 30000)], "did you mean 'policy'"),
])
def test_bad_router_settings_are_refused_with_the_fix(given, instances, fragment):
    with pytest.raises(errors.DflashError) as e:
        router_unit.settings_for([instance(n, p) for n, p in instances], given)
    assert fragment in str(e.value) and e.value.exit_code == errors.CONFIG


def test_instance_keys_must_be_one_key():
    a = instance("a", 30000, apiKeyFile="/etc/k1")
    b = instance("b", 30001, apiKeyFile="/etc/k2")
    with pytest.raises(errors.DflashError, match="one apiKeyFile"):
        router_unit.settings_for([a, b], {})
    s = router_unit.settings_for([a, instance("b", 30001, apiKeyFile="/etc/k1")], {})
    assert s["apiKeyFile"] == "/etc/k1"  # the router reaches the workers with their key


def directives(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        if "=" in line and not line.startswith("#"):
            k, v = line.split("=", 1)
            out.setdefault(k, []).append(v)
    return out


def render_cli(tmp_path: Path, settings: dict | None = None, remote=()) -> Path:
    files = []
    for name, port in (("a", 30000), ("b", 30001)):
        f = tmp_path / f"{name}.json"
        f.write_text(json.dumps({"name": name, "model": "m", "port": port, "gpus": [0],
                                 "allowSharedGpus": True}))
        files += ["--instance", str(f)]
    s = tmp_path / "given.json"
    s.write_text(json.dumps({**(settings or {}), **({"remoteWorkers": list(remote)} if remote else {})}))
    out = tmp_path / "dflash-router.service"
    visible = shutil.which("true")  # an executable the unit's sandbox can see (a venv may lead into /root)
    assert cli.main(["router-unit", *files, "--settings", str(s), "--python", visible,
                     "--dflashctl", visible, "-o", str(out),
                     "--settings-output", str(tmp_path / "router.json")]) == 0
    return out


def test_rendered_unit_has_no_gpu_and_survives_a_down_instance(tmp_path):
    d = directives(render_cli(tmp_path, {"apiKeyFile": "/etc/dflash/key",
                                         "adminApiKeyFile": "/etc/dflash/admin"}).read_text())
    assert d["DevicePolicy"] == ["closed"] and "DeviceAllow" not in d and d["PrivateDevices"] == ["true"]
    # No instance in the router's unit (each instance orders itself Before= it): its text stays the
    # same when instances come and go. Nothing that would stop it with an instance either.
    assert not any("dflash-a" in v or "dflash-b" in v for k in ("After", "Wants", "Before") for v in d.get(k, []))
    assert "Requires" not in d and "BindsTo" not in d and "Requisite" not in d and "PartOf" not in d
    stop = int(d["TimeoutStopSec"][0].rstrip("s"))
    assert stop > json.loads((tmp_path / "router.json").read_text())["drainSec"]
    assert d["LoadCredential"] == ["router-api-key:/etc/dflash/key", "router-admin-api-key:/etc/dflash/admin"]
    assert d["SetCredential"] == ["router-api-key:DFLASH-CREDENTIAL-NOT-LOADED",  # unit.credentials' fallback
                                  "router-admin-api-key:DFLASH-CREDENTIAL-NOT-LOADED"]
    assert d["IPAddressAllow"] == ["localhost"] and d["IPAddressDeny"] == ["any"]
    assert "key" not in d["ExecStart"][0].replace("--config", "")  # secrets only as credentials


def test_remote_workers_lift_the_loopback_only_rule(tmp_path):
    d = directives(render_cli(tmp_path, remote=["http://10.0.0.2:30000"]).read_text())
    assert "IPAddressDeny" not in d
    assert "http://10.0.0.2:30000" in json.loads((tmp_path / "router.json").read_text())["workers"]


def test_router_unit_through_systemd_analyze(tmp_path):
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed")
    path = render_cli(tmp_path)
    r = subprocess.run(["systemd-analyze", "verify", str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "Unknown key" not in r.stderr and "Unknown section" not in r.stderr, r.stderr
    r = subprocess.run(["systemd-analyze", "security", "--offline=true", "--no-pager", str(path)],
                       capture_output=True, text=True)
    score = float(r.stdout.split("Overall exposure level for dflash-router.service: ")[1].split()[0])
    print(f"router unit exposure: {score}")
    assert score <= 1.6


def test_router_argv_masks_keys(tmp_path, capsys):
    (tmp_path / "k").write_text("client-secret\n")
    (tmp_path / "adm").write_text("admin-secret\n")
    f = tmp_path / "r.json"
    f.write_text(json.dumps({"workers": ["http://127.0.0.1:30000"], "apiKeyFile": str(tmp_path / "k"),
                             "adminApiKeyFile": str(tmp_path / "adm")}))
    assert cli.main(["router", "--config", str(f), "--python", sys.executable, "--dry-run"]) == 0
    out = capsys.readouterr().out
    argv = json.loads(out)["argv"]
    assert "secret" not in out and argv[argv.index("--api-key") + 1] == "***"
    assert argv[argv.index("--port") + 1] == "30080" and argv[argv.index("--policy") + 1] == "round_robin"


# --- router.py on its own: the schema, the settings file, the admin API against a scripted router --

W = ["http://127.0.0.1:30000"]


def refused(d) -> list[str]:
    with pytest.raises(errors.DflashError) as e:
        router.from_dict(d, origin="r.json")
    assert e.value.what == "invalid router settings in r.json" and e.value.exit_code == errors.CONFIG
    assert e.value.fix == 'correct the settings above (docs/service.md, "Router", lists them)'
    lines = e.value.why.splitlines()
    assert lines[0] == f"{len(lines) - 1} problem(s)"
    return [line.strip()[2:] for line in lines[1:]]


@pytest.mark.parametrize("d, problems", [
    ([1], ["the router settings must be a JSON object"]),
    ({}, ['workers: required (the instances\' URLs, e.g. ["http://127.0.0.1:30000"])']),
    ({"workers": []}, ["workers: empty; list at least one instance (`dflashctl router-unit --instance FILE`)"]),
    ({"workers": W, "metricsPort": 30080},
     ["metricsPort: 30080 is the router's port too; choose another"]),
    ({"workers": ["http://localhost:30080"]},
     ["port: 30080 is a worker's port (http://localhost:30080); choose another for the router (default 30080; "
      "instances default to 30000 and up)"]),
    ({"workers": ["http://[::1]:30081"]}, ["port: 30081 is a worker's port (http://[::1]:30081); choose another for "
                                           "the router (default 30080; instances default to 30000 and up)"]),
    ({"workers": W, "healthCheckTimeoutSec": 1},
     ["healthCheckTimeoutSec: at least 2 (SGLang's /health takes about 1 s under load; with 1 the router admitted "
      "no worker at all on the H200)"]),
    ({"workers": W, "host": "::"}, ["adminApiKeyFile: required when host is '::': the router's admin API (/workers) "
                                    "can add and remove workers, i.e. redirect every request; without a key anyone "
                                    "who reaches the port could; set adminApiKeyFile or keep host 127.0.0.1"]),
    ({"workers": W, "extraArgs": ["--retry-max-retries=9", "--max-payload-size", "1"]},
     ["extraArgs: --retry-max-retries is set by the setting retries; use that setting"]),
    ({"workers": W, "retries": 21, "policy": "fastest"},
     ['policy: must be one of "round_robin", "cache_aware", "power_of_two", "random" (got "fastest")',
      "retries: must be an integer from 0 to 20 (got 21)"]),
    ({"workers": ["http://a:1", "http://a:1/"]}, ['workers: must be a list without repeats (got ["http://a:1", '
                                                  '"http://a:1/"])']),
    ({"workers": "http://a:1"}, ['workers: must be a list of at most 256 worker URLs (got "http://a:1")']),
    ({"workers": [7]}, ['workers: must be a list of http:// URLs, e.g. ["http://10.0.0.2:30000"] (got [7])']),
    ({"workers": ["http://a:x"]}, ['workers: must be a list of URLs with a valid port (\'http://a:x\' has none) '
                                   '(got ["http://a:x"])']),
    ({"workers": ["http://a:1/v1"]}, ["workers: must be a list of http:// URLs of the form http://HOST:PORT "
                                      "('http://a:1/v1' is not) (got [\"http://a:1/v1\"])"]),
    ({"workers": W, "instanceUnits": ["dflash-a"]},
     ['instanceUnits: must be a list of unit names, e.g. ["dflash-a.service"] (got ["dflash-a"])']),
    ({"workers": W, "logLevel": "trace"}, ['logLevel: must be one of "debug", "info", "warn", "error" (got "trace")']),
], ids=["not-object", "no-workers", "empty-workers", "metrics-port", "worker-port", "worker-port-v6",
        "health-timeout", "wildcard-no-admin-key", "owned-flag", "two-problems", "repeated-worker", "workers-string",
        "worker-number", "worker-port-text", "worker-path", "unit-name", "log-level"])
def test_router_settings_are_refused_each_problem_named(d, problems):
    assert refused(d) == problems


@pytest.mark.parametrize("url", ["http://10.0.0.2:30000", "https://h.example:443", "http://[fd00::1]:30000",
                                 "http://host:30000/"])
def test_worker_urls_the_router_takes(url):
    assert router.from_dict({"workers": [url]}).workers == (url.rstrip("/"),)


@pytest.mark.parametrize("url", ["ftp://x:1", "http://:1", "http://u@h:1", "http://h:1?q=1", "http://h:1#f"])
def test_worker_urls_the_router_refuses(url):
    assert refused({"workers": [url]})[0].startswith("workers: must be a list of http:// URLs of the form")


def test_the_settings_file_holds_every_key_and_reads_back():
    cfg = router.from_dict({"workers": W, "instanceUnits": ["dflash-a.service"], "extraArgs": ["--x"],
                            "host": "0.0.0.0", "adminApiKeyFile": "/etc/a"})
    d = router.to_dict(cfg)
    assert list(d) == ["workers", "instanceUnits", "host", "port", "metricsHost", "metricsPort", "policy",
                       "healthCheckIntervalSec", "healthCheckTimeoutSec", "healthFailureThreshold",
                       "healthSuccessThreshold", "circuitBreakerFailures", "circuitBreakerOpenSec", "retries",
                       "requestTimeoutSec", "workerStartupTimeoutSec", "drainSec", "apiKeyFile", "adminApiKeyFile",
                       "logLevel", "extraArgs"]
    assert d["workers"] == W and d["extraArgs"] == ["--x"]
    assert router.from_dict(d) == cfg
    assert cfg.url == "http://127.0.0.1:30080"
    assert router.from_dict({"workers": W, "host": "::", "adminApiKeyFile": "/k"}).url == "http://[::1]:30080"
    assert router.from_dict({"workers": W, "host": "10.1.2.3", "adminApiKeyFile": "/k"}).url == "http://10.1.2.3:30080"


def test_the_keys_come_from_the_credentials_directory_or_their_files(tmp_path):
    (tmp_path / "creds").mkdir()
    (tmp_path / "creds" / "router-api-key").write_text("from-systemd\n")
    (tmp_path / "admin").write_text("admin-file\n")
    cfg = router.from_dict({"workers": W, "apiKeyFile": "/nonexistent", "adminApiKeyFile": str(tmp_path / "admin")})
    assert router.read_keys(cfg, {"CREDENTIALS_DIRECTORY": str(tmp_path / "creds")}) == ("from-systemd", "admin-file")
    assert router.read_keys(router.from_dict({"workers": W}), {}) == (None, None)
    with pytest.raises(errors.DflashError) as e:
        router.read_keys(cfg, {})
    assert e.value.what == "cannot read the router's API key /nonexistent"


class AdminAPI:
    """The router's admin routes as sglang-router 0.3.2 answers them: GET /workers, POST /workers,
    DELETE /workers/ID; records each call; `status` makes every answer that HTTP status."""

    def __init__(self, workers, status=200, key=None):
        import http.server
        import threading
        self.calls, self.workers, self.status, self.key = [], list(workers), status, key
        outer = self

        class H(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def answer(self, body):
                outer.calls.append((self.command, self.path, self.headers.get("Authorization"), body))
                status = outer.status
                if outer.key and self.headers.get("Authorization") != f"Bearer {outer.key}":
                    status = 401
                data = json.dumps({"workers": [{"url": u + "/", "id": f"w{i}"} for i, u in enumerate(outer.workers)]}
                                  if self.command == "GET" else {}).encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self.answer(None)

            def do_POST(self):
                self.answer(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))

            def do_DELETE(self):
                self.answer(None)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True).start()
        self.port = self.server.server_address[1]

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_sync_adds_and_removes_workers_through_the_admin_api():
    api = AdminAPI(["http://127.0.0.1:30000", "http://127.0.0.1:30001"], key="adm")
    try:
        cfg = router.from_dict({"workers": ["http://127.0.0.1:30001", "http://127.0.0.1:30002"], "port": api.port})
        assert router.sync(cfg, "adm") == (["http://127.0.0.1:30002"], ["http://127.0.0.1:30000"])
        assert api.calls[0] == ("GET", "/workers", "Bearer adm", None)
        changes = [c for c in api.calls if c[0] != "GET"]
        assert changes == [("POST", "/workers", "Bearer adm", {"url": "http://127.0.0.1:30002"}),
                           ("DELETE", "/workers/w0", "Bearer adm", None)]
        assert {c[2] for c in api.calls} == {"Bearer adm"}
        with pytest.raises(errors.DflashError) as e:
            router.sync(cfg, None)
        assert (e.value.what, e.value.why) == ("the router's admin API refused GET /workers", "HTTP 401")
        assert e.value.fix.startswith("give the router's admin key (adminApiKeyFile in the router settings")
        api.status = 500
        with pytest.raises(errors.DflashError) as e:
            router.sync(cfg, "adm")
        assert e.value.why.startswith("HTTP 500") and e.value.fix == "see `journalctl -u dflash-router`"
    finally:
        api.close()
    with pytest.raises(errors.DflashError) as e:
        router.sync(cfg, "adm")
    assert e.value.what == f"cannot reach the router at http://127.0.0.1:{api.port}"
    assert e.value.fix == "start it first (`systemctl start dflash-router`)"


def test_reload_through_the_command_says_what_changed(tmp_path, capsys):
    api = AdminAPI(["http://127.0.0.1:30000"])
    try:
        f = tmp_path / "r.json"
        f.write_text(json.dumps({"workers": ["http://127.0.0.1:30000"], "port": api.port}))
        assert cli.main(["router", "--config", str(f), "--sync"]) == 0
        assert capsys.readouterr().err.strip() == "dflashctl router: added none; removed none"
        f.write_text(json.dumps({"workers": ["http://127.0.0.1:30009"], "port": api.port}))
        assert cli.main(["router", "--config", str(f), "--sync"]) == 0
        assert capsys.readouterr().err.strip() == ("dflashctl router: added http://127.0.0.1:30009; removed "
                                                   "http://127.0.0.1:30000")
        assert api.calls[0] == ("GET", "/workers", None, None)  # no admin key set: none sent
    finally:
        api.close()


def test_a_router_environment_that_cannot_run_is_a_config_error(tmp_path, capsys):
    f = tmp_path / "r.json"
    f.write_text(json.dumps({"workers": W}))
    assert cli.main(["router", "--config", str(f), "--python", str(tmp_path / "no-python")]) == errors.CONFIG
    err = capsys.readouterr().err
    assert "in front of" not in err  # refused before it says it starts
    assert f"--python {tmp_path / 'no-python'} cannot run the router: {tmp_path / 'no-python'} does not exist" in err
    assert "pass --python the router environment's interpreter, which has sglang-router 0.3.2" in err


def test_an_interpreter_without_sglang_router_is_refused_before_the_start(tmp_path, capsys):
    """dflashctl's own venv (the default --python) has no sglang_router: Python's "Error while
    finding module specification" was all the journal said. Here a real Python 3 without site-packages."""
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\nexec {sys.executable} -S \"$@\"\n")
    python.chmod(0o755)
    f = tmp_path / "r.json"
    f.write_text(json.dumps({"workers": W}))
    assert cli.main(["router", "--config", str(f), "--python", str(python)]) == errors.CONFIG
    err = capsys.readouterr().err
    assert f"--python {python} cannot run the router: {python} (Python 3." in err and "has no sglang_router" in err
    fix = err.splitlines()[-1]
    assert fix.startswith("  fix: pass --python the router environment's interpreter") and "router-lock.json" in fix


URLS = ["http://127.0.0.1:30000", "http://127.0.0.1:30001"]


def keyed_settings(tmp_path) -> Path:
    (tmp_path / "api").write_text("s3cret-api\n")
    (tmp_path / "admin").write_text("s3cret-admin\n")
    f = tmp_path / "r.json"
    f.write_text(json.dumps({"workers": URLS, "apiKeyFile": str(tmp_path / "api"),
                             "adminApiKeyFile": str(tmp_path / "admin")}))
    return f


def test_the_command_starts_the_router_with_both_keys_and_says_so(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    ran = []

    def execv(path, argv):
        ran.append((path, argv))
        raise OSError("exec format error")
    monkeypatch.setattr(router.os, "execv", execv)
    monkeypatch.setattr(router, "check_python", lambda python: None)  # /env/bin/python is not here
    assert cli.main(["router", "--config", str(keyed_settings(tmp_path)), "--python", "/env/bin/python"]) == errors.CONFIG
    [(path, argv)] = ran
    assert path == "/env/bin/python" and argv[:3] == ["/env/bin/python", "-m", "sglang_router.launch_router"]
    assert argv[argv.index("--api-key") + 1] == "s3cret-api"
    assert argv[argv.index("--control-plane-api-keys") + 1] == "dflash-admin:dflash admin:admin:s3cret-admin"
    err = capsys.readouterr().err.splitlines()
    assert err[0] == f"dflashctl router: http://127.0.0.1:30080 in front of 2 worker(s): {URLS[0]} {URLS[1]}"
    assert "cannot start the router with /env/bin/python" in err[1] and "exec format error" in "\n".join(err[1:])
    assert "None" not in "\n".join(err[1:])


def test_dry_run_prints_the_argv_with_both_keys_masked(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    assert cli.main(["router", "--config", str(keyed_settings(tmp_path)), "--python", "/env/bin/python",
                     "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.startswith('{\n  "argv": [\n    "/env/bin/python",\n    "-m",\n')  # two spaces a level
    argv = json.loads(out)["argv"]
    assert argv[0] == "/env/bin/python" and "s3cret" not in out
    assert argv[argv.index("--api-key") + 1] == argv[argv.index("--control-plane-api-keys") + 1] == "***"
    assert argv.count("***") == 2


def test_sync_through_the_command_sends_the_admin_key_and_lists_each_change(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    seen = []

    def sync(cfg, admin_key):
        seen.append((list(cfg.workers), admin_key))
        return ["http://h:1", "http://h:2"], ["http://h:3", "http://h:4"]
    monkeypatch.setattr(router, "sync", sync)
    assert cli.main(["router", "--config", str(keyed_settings(tmp_path)), "--sync"]) == 0
    assert seen == [(URLS, "s3cret-admin")]
    assert capsys.readouterr().err.strip() == ("dflashctl router: added http://h:1 http://h:2; "
                                               "removed http://h:3 http://h:4")


def test_bad_settings_through_the_command_name_their_file(tmp_path, capsys):
    f = tmp_path / "r.json"
    f.write_text(json.dumps({"workers": 1}))
    assert cli.main(["router", "--config", str(f), "--dry-run"]) == errors.CONFIG
    assert f"invalid router settings in {f}" in capsys.readouterr().err
    with pytest.raises(DflashError) as e:
        router.from_dict({"workers": 1})
    assert e.value.what == "invalid router settings in router settings"


def test_dry_run_and_sync_exclude_each_other(tmp_path, capsys):
    assert cli.main(["router", "--config", str(tmp_path / "r.json"), "--dry-run", "--sync"]) == errors.USAGE
    assert "argument --sync: not allowed with argument --dry-run" in capsys.readouterr().err


def test_the_router_commands_options():
    parser = cli.build_parser(["router"])
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction").choices["router"]
    got = [(a.option_strings, a.required, a.default, a.metavar, a.help) for a in sub._actions if a.option_strings
           and a.dest != "help"]
    assert got == [
        (["--config"], True, None, "FILE", "the router settings JSON"),
        (["--python"], False, sys.executable, "PATH",
         "the router environment's interpreter (nix/router-lock.json; default: this one)"),
        (["--dry-run"], False, False, None, "print the router's argv (keys masked) and exit"),
        (["--sync"], False, False, None, "make the running router's workers the settings' ones, without a restart "
                                         "(the unit's ExecReload: `systemctl reload dflash-router`)")]
    assert sub.get_default("func") is router.run
    subs = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    assert [c.help for c in subs._choices_actions if c.dest == "router"] == [
        "run SGLang's router in front of this host's instances"]
    assert sub.description == ("`dflashctl router --config FILE`: SGLang's router (sglang-router 0.3.2) in front "
                               "of a host's\ninstances.")
    assert sub.epilog.splitlines() == [  # docs/cli.md's rows for the command
        "exit codes (docs/cli.md):", "    0  success", "    1  --sync: the running router refused a change",
        "    2  bad arguments (argparse, or options that do not go together)",
        "   78  the settings are invalid or unreadable (not restarted by systemd)", "  130  interrupted (Ctrl-C or SIGTERM)"]


def test_each_key_names_its_setting_when_it_cannot_be_read():
    cfg = router.from_dict({"workers": W, "apiKeyFile": "/nonexistent/api", "adminApiKeyFile": "/nonexistent/adm"})
    with pytest.raises(DflashError) as e:
        router.read_keys(cfg, {})
    assert e.value.what == "cannot read the router's API key /nonexistent/api"
    assert e.value.fix.startswith("create apiKeyFile /nonexistent/api (readable by root")
    with pytest.raises(DflashError) as e:
        router.read_keys(router.from_dict({"workers": W, "adminApiKeyFile": "/nonexistent/adm"}), {})
    assert e.value.what == "cannot read the router's admin API key /nonexistent/adm"
    assert e.value.fix.startswith("create adminApiKeyFile /nonexistent/adm (readable by root")


def test_router_settings_problems_word_for_word():
    assert router.problems_of({"workers": W, "prot": 1, "host": "a\x01"})[0] == [
        "prot: unknown setting (did you mean 'port'?)",
        'host: contains the control character U+0001 (a newline, tab, NUL or similar would end or corrupt a line '
        'of the systemd unit); remove it (got "a\\u0001")']
    assert router.problems_of({"workers": ["http://0.0.0.0:30080", "http://[::]:30081"]})[0] == [
        f"port: {p} is a worker's port ({u}); choose another for the router (default 30080; instances default "
        "to 30000 and up)" for p, u in ((30080, "http://0.0.0.0:30080"), (30081, "http://[::]:30081"))]
    assert router.problems_of({"workers": W, "healthCheckTimeoutSec": 2})[0] == []
    assert router.problems_of({"workers": W, "healthCheckTimeoutSec": 1})[0] == [
        "healthCheckTimeoutSec: at least 2 (SGLang's /health takes about 1 s under load; with 1 the router "
        "admitted no worker at all on the H200)"]
    many = [f"http://127.0.0.1:{31000 + i}" for i in range(257)]
    assert router.problems_of({"workers": many[:256]})[0] == []
    assert router.problems_of({"workers": W, "extraArgs": ["--port=8=9"]})[0] == [
        "extraArgs: --port is set by the setting port; use that setting"]  # the flag: up to the first "="
    assert list(router.from_dict({"workers": ["http://nodeX/", "http://10.0.0.2:30000/"]}).workers) == [
        "http://nodeX", "http://10.0.0.2:30000"]  # the trailing slash only
    [too_many] = router.problems_of({"workers": many})[0]
    assert too_many.startswith("workers: must be a list of at most 256 worker URLs (got [")


# --- the real router --------------------------------------------------------------------------------

@needs_router
def test_routes_json_and_streaming_across_workers(workers, make_router):
    ws = workers(2)
    r = make_router(ws)
    r.wait_healthy([w.url for w in ws])
    seen = set()
    for _ in range(6):
        status, body = request(r.url + "/generate", "POST", generate_body(3))
        assert status == 200, body
        answer = json.loads(body)
        assert answer["meta_info"]["completion_tokens"] == 3 and answer["text"] == " t0 t1 t2"
        seen.add(served_by(body))
    assert seen == {w.port for w in ws}  # round_robin reaches both
    status, body = request(r.url + "/generate", "POST", generate_body(3, stream=True))
    events = [line[6:] for line in body.decode().splitlines() if line.startswith("data: ")]
    assert status == 200 and events[-1] == "[DONE]" and len(events) == 4
    assert json.loads(events[-2])["meta_info"]["completion_tokens"] == 3
    chat = {"model": "standin-model", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 2}
    status, body = request(r.url + "/v1/chat/completions", "POST", chat)
    assert status == 200, body
    assert json.loads(body)["choices"][0]["message"]["content"] == " t0 t1"
    status, body = request(r.url + "/v1/chat/completions", "POST", {**chat, "stream": True})
    events = [line[6:] for line in body.decode().splitlines() if line.startswith("data: ")]
    assert status == 200 and events[-1] == "[DONE]"
    assert "".join(json.loads(e)["choices"][0]["delta"].get("content", "") for e in events[:-1]) == " t0 t1"


@needs_router
def test_kill9_under_load_fails_no_json_request_and_the_worker_comes_back(workers, make_router):
    ws = workers(2, STANDIN_TOKEN_DELAY="0.01")
    victim, survivor = ws
    r = make_router(ws)
    r.wait_healthy([w.url for w in ws])
    load = Load(r.url + "/generate", generate_body(4), clients=4, max_requests=4000, seconds=120).start()
    assert load.wait_for(lambda o: sum(x.worker == victim.port for x in o) >= 10, 30)
    victim.kill9()
    killed = len(load.outcomes)
    assert load.wait_for(lambda o: len(o) >= killed + 100, 60)  # served on while it is gone
    victim.start()  # same port, as systemd restarts the unit
    restarted = len(load.outcomes)
    came_back = load.wait_for(lambda o: any(x.worker == victim.port for x in o[restarted:]), 60)
    outcomes = load.stop()
    failed = [o for o in outcomes if o.status != 200]
    assert not failed, f"{len(failed)} of {len(outcomes)} failed, first: {failed[0].status} {failed[0].error}"
    assert came_back, f"the restarted worker was never sent a request; router: {r.workers()}"
    assert r.workers() == {victim.url: True, survivor.url: True}
    print(f"kill -9 under load: {len(outcomes)} requests, 0 failed; "
          f"{sum(o.worker == victim.port for o in outcomes[restarted:])} served by the restarted worker")


@needs_router
@pytest.mark.parametrize("retries", [0, 3])
def test_a_hung_worker_is_cut_off_by_the_request_timeout(workers, make_router, retries):
    """With retries (the default), what the hung worker held is answered by the other; without,
    it is an error, but never a request left hanging."""
    ws = workers(2)
    hung, alive = ws
    r = make_router(ws, requestTimeoutSec=2, retries=retries)
    r.wait_healthy([w.url for w in ws])
    hung.proc.send_signal(signal.SIGSTOP)  # listening, accepting, never answering: a stuck GPU
    try:
        results = [request(r.url + "/generate", "POST", generate_body(2), timeout=60) for _ in range(6)]
    finally:
        hung.proc.send_signal(signal.SIGCONT)
    codes = [s for s, _ in results]
    print(f"while one worker hung: {codes}")
    assert 0 not in codes, "a request hung past the router's timeout (the client gave up at 60 s)"
    if retries:
        assert codes == [200] * 6, codes  # timed out on the hung one, then retried on the other
    else:
        assert any(s >= 500 for s in codes), codes  # the ones sent to the hung worker: cut off, an error
    assert all(served_by(b) == alive.port for s, b in results if s == 200)
    assert request(r.url + "/generate", "POST", generate_body(2))[0] == 200


@needs_router
def test_bad_inputs_get_4xx_and_the_router_keeps_serving(workers, make_router):
    ws = workers(2, STANDIN_CONTEXT="64")
    r = make_router(ws)
    r.wait_healthy([w.url for w in ws])
    cases = {
        "malformed JSON": (b'{"input_ids": [1, 2', {}),
        "wrong content type": (json.dumps(generate_body()).encode(), {"Content-Type": "text/plain"}),
        "over-long input": ({"input_ids": list(range(100)), "sampling_params": {"max_new_tokens": 1}}, {}),
        "empty input ids": ({"input_ids": [], "sampling_params": {"max_new_tokens": 1}}, {}),
        "negative max_new_tokens": ({"input_ids": [1], "sampling_params": {"max_new_tokens": -1}}, {}),
    }
    codes = {}
    for what, (body, headers) in cases.items():
        codes[what] = request(r.url + "/generate", "POST", body, headers)[0]
    print(f"bad inputs: {codes}")
    assert all(400 <= c < 500 for c in codes.values()), codes
    assert [request(r.url + "/generate", "POST", generate_body(2))[0] for _ in range(4)] == [200] * 4
    assert r.workers() == {w.url: True for w in ws}  # 4xx do not open a worker's circuit


@needs_router
def test_api_keys_for_clients_admin_and_workers(tmp_path, workers, make_router):
    key, admin = tmp_path / "key", tmp_path / "admin"
    key.write_text("client-key\n")
    admin.write_text("admin-key\n")
    creds = tmp_path / "creds"  # as systemd's LoadCredential lays them out
    creds.mkdir()
    (creds / "router-api-key").write_text("client-key\n")
    (creds / "router-admin-api-key").write_text("admin-key\n")
    ws = workers(2, STANDIN_API_KEY="client-key")  # the instances' own --api-key
    r = make_router(ws, apiKeyFile="/nonexistent/only-the-credential-is-read",
                    adminApiKeyFile="/nonexistent/either", _env={"CREDENTIALS_DIRECTORY": str(creds)})
    adm = {"Authorization": "Bearer admin-key"}
    r.wait_healthy([w.url for w in ws], headers=adm)
    assert request(r.url + "/generate", "POST", generate_body(2))[0] == 401
    status, body = request(r.url + "/generate", "POST", generate_body(2),
                           {"Authorization": "Bearer client-key"})
    assert status == 200, body  # and the worker accepted the router's key
    assert request(r.url + "/workers")[0] == 401
    assert request(r.url + "/workers", headers={"Authorization": "Bearer client-key"})[0] == 401
    assert "client-key" not in r.log.read_text() and "admin-key" not in r.log.read_text()


@needs_router
def test_reload_adds_and_removes_workers_without_failing_a_request(workers, make_router):
    """A configuration change reaches the running router through `systemctl reload` (ExecReload =
    `dflashctl router --sync`): under load, a new instance is added and an old one removed."""
    old, new = workers(2, STANDIN_TOKEN_DELAY="0.01")
    r = make_router([old])
    r.wait_healthy([old.url])
    load = Load(r.url + "/generate", generate_body(4), clients=4, max_requests=4000, seconds=120).start()
    assert load.wait_for(lambda o: len(o) >= 40, 30)
    done = r.sync(workers=[old.url, new.url])
    assert done.returncode == 0 and f"added {new.url}" in done.stderr, done.stderr
    assert load.wait_for(lambda o: any(x.worker == new.port for x in o), 60)
    done = r.sync(workers=[new.url])
    assert done.returncode == 0 and f"removed {old.url}" in done.stderr, done.stderr
    gone = None
    for _ in range(300):
        if r.workers() == {new.url: True}:
            gone = time.monotonic()
            break
        time.sleep(0.1)
    assert gone is not None, r.workers()
    assert load.wait_for(lambda o: sum(x.start > gone for x in o) >= 100, 60)
    outcomes = load.stop()
    failed = [o for o in outcomes if o.status != 200]
    assert not failed, f"{len(failed)} of {len(outcomes)} failed, first: {failed[0].status} {failed[0].error}"
    late = [o for o in outcomes if o.start > gone]
    assert all(o.worker == new.port for o in late)  # the removed one gets nothing sent after it left


# --- the Nix twin: nix/lib/router-unit.nix gives the same directives --------------------------------

def sections(text: str) -> dict[str, dict[str, list[str]]]:
    out, current = {}, None
    for line in text.splitlines():
        if line.startswith("[") and line.endswith("]"):
            current = out.setdefault(line[1:-1], {})
        elif current is not None and "=" in line and not line.startswith("#"):
            k, v = line.split("=", 1)
            current.setdefault(k, []).append(v)
    return out


def nix_sections(settings: dict, tmp_path: Path) -> dict[str, dict[str, list[str]]]:
    from conftest import nix_or_skip
    from nixeval import unit_sections
    f = tmp_path / "settings.json"
    f.write_text(json.dumps(settings))
    lib = Path(__file__).resolve().parent.parent.parent / "nix" / "lib" / "router-unit.nix"
    expr = (f"(import {lib}).directives {{ settings = builtins.fromJSON (builtins.readFile {f}); "
            f'dflashctl = "/opt/dflash/bin/dflashctl"; python = "/opt/router env/bin/python"; '
            f'settingsFile = "/etc/dflash-router.json"; }}')
    return unit_sections(nix_or_skip(), expr)


@pytest.mark.nix
@pytest.mark.parametrize("given, remote", [
    ({}, []),
    ({"apiKeyFile": "/run/keys/50% key", "adminApiKeyFile": "/run/keys/admin", "drainSec": 90}, []),
    ({"host": "0.0.0.0", "adminApiKeyFile": "/run/keys/admin"}, []),
    ({}, ["http://10.0.0.2:30000", "http://[fd00::2]:30000"]),
])
def test_nix_router_unit_matches_dflashctl(tmp_path, given, remote):
    settings = router_unit.settings_for([instance("a", 30000), instance("b", 30001)],
                                        {**given, **({"remoteWorkers": remote} if remote else {})})
    text = router_unit.render(settings, "/etc/dflash-router.json", "/opt/dflash/bin/dflashctl",
                              "/opt/router env/bin/python")
    assert nix_sections(settings, tmp_path) == sections(text)


@needs_router
def test_smoke_through_the_router_names_it_and_its_workers(tmp_path, workers, make_router):
    """`dflashctl smoke --url ROUTER`: sglang-router 0.3.2 answers 404 to /server_info, so the smoke
    reads a healthy worker's and records the router with every worker behind it."""
    ws = workers(2)
    r = make_router(ws)
    r.wait_healthy([w.url for w in ws])
    out = tmp_path / "result.json"
    done = subprocess.run([sys.executable, "-m", "dflashctl", "smoke", "--url", r.url, "--no-grammar",
                           "--requests", "2", "--sequential-requests", "1", "--max-new-tokens", "8",
                           "--json", str(out)], capture_output=True, text=True, timeout=120,
                          env=r.env)
    assert done.returncode == 0, done.stderr
    routers = json.loads(out.read_text())["settings"]["routers"]
    assert [(x["url"], x["for"]) for x in routers] == [(r.url, "service")]
    assert sorted(routers[0]["workers"], key=lambda w: w["url"]) == sorted(
        ({"url": w.url, "healthy": True, "model": "standin-model"} for w in ws), key=lambda w: w["url"])
    assert f"{r.url} is a router in front of" in done.stderr


# --- services.dflash.router: the settings and refusals the module gets from nix/lib/router-unit.nix ----

HOST = {"a": {"model": "m", "port": 30000, "gpus": [0]}, "b": {"model": "m", "port": 30001, "gpus": [1]}}


@pytest.mark.nix
@pytest.mark.parametrize("given, instances", [
    ({}, HOST),
    ({"port": 31000, "drainSec": 90, "policy": "cache_aware", "remoteWorkers": ["http://10.0.0.2:30000"]}, HOST),
    ({}, {n: {**o, "apiKeyFile": "/run/keys/k"} for n, o in HOST.items()}),
    ({"host": "0.0.0.0", "adminApiKeyFile": "/run/keys/admin"}, {"a": {"model": "m", "host": "::"}}),
], ids=["defaults", "settings-and-remote", "instances-key", "wildcard-hosts"])
def test_module_router_settings_are_dflashctls(given, instances):
    got = nix_router(given, instances)
    assert got["failed"] == []
    cfgs = [config.from_dict({"name": n, **o}) for n, o in sorted(instances.items())]
    assert got["settings"] == router_unit.settings_for(cfgs, given)


@pytest.mark.nix
@pytest.mark.parametrize("given, instances, message, python_says", [
    ({}, {"a": {"model": "m", "apiKeyFile": "/run/k1"}, "b": {"model": "m", "port": 30001, "gpus": [1],
                                                             "apiKeyFile": "/run/k2"}},
     "the instances' API keys differ from each other or from the router's", "API keys differ"),
    ({"apiKeyFile": "/run/r"}, {"a": {"model": "m", "apiKeyFile": "/run/k1"}},
     "the instances' API keys differ from each other or from the router's", "API keys differ"),
    ({"port": 40000}, {"a": {"model": "m", "port": 30000}}, "port: 40000 clashes with instance 'a'",
     "port 40000 clashes with instance 'a'"),
    ({"metricsPort": 30001}, HOST, "metricsPort: 30001 clashes with instance 'b'", "30001 is a worker's port"),
], ids=["two-instance-keys", "router-key-differs", "grpc-port", "metrics-port"])
def test_module_router_refuses_what_dflashctl_refuses(given, instances, message, python_says):
    got = nix_router(given, instances)
    assert any(message in m for m in got["failed"]), got["failed"]
    cfgs = [config.from_dict({"name": n, **o}) for n, o in sorted(instances.items())]
    with pytest.raises(DflashError) as e:
        router_unit.settings_for(cfgs, given)
    assert python_says in str(e.value), str(e.value)


@pytest.mark.nix
def test_module_router_needs_a_worker():
    got = nix_router({}, {})
    assert any("services.dflash.router: no workers" in m for m in got["failed"])


# --- nixos-rebuild switch: which change reloads the router and which restarts it --------------------

TWO = {"a": {"model": "m", "port": 30000, "gpus": [0]}, "b": {"model": "m", "port": 30001, "gpus": [1]}}
ONE = {"a": TWO["a"]}
ELSEWHERE = {"a": {**TWO["a"], "port": 30002}}
RENAMED = {"c": TWO["a"]}


@pytest.mark.nix
@pytest.mark.parametrize("old, new, expected", [
    ((ONE, {}), (TWO, {}), "reload"),  # an instance added
    ((TWO, {}), (ONE, {}), "reload"),  # an instance removed
    ((ONE, {}), (ELSEWHERE, {}), "reload"),  # an instance's port changed
    ((ONE, {}), (ONE, {"remoteWorkers": ["http://127.0.0.1:40000"]}), "reload"),  # a remote worker on loopback
    ((ONE, {}), (RENAMED, {}), "nothing"),  # an instance renamed, same URL: the router has nothing to do
    ((ONE, {}), (ONE, {"policy": "cache_aware"}), "restart"),  # a router setting
    ((ONE, {}), (ONE, {"port": 31080}), "restart"),  # the router's own port: it binds it at start
    ((ONE, {}), (ONE, {"remoteWorkers": ["http://10.0.0.2:30000"]}), "restart"),  # IPAddressDeny/Allow go
    ((ONE, {}), ({"a": {**TWO["a"], "apiKeyFile": "/run/k"}}, {}), "restart"),  # the key, LoadCredential
], ids=["instance-added", "instance-removed", "instance-port", "loopback-remote-worker", "instance-renamed",
        "router-setting", "router-port", "remote-worker-elsewhere", "instances-key"])
def test_switch_reloads_the_router_for_workers_and_restarts_it_for_the_rest(old, new, expected):
    """NixOS's switch rule (tests/nixos_switch.py, read from switch-to-configuration's source) over
    the router's unit from the module's pure functions, per kind of change."""
    import nixos_switch
    before, after = nixos_router_unit(old[1], old[0]), nixos_router_unit(new[1], new[0])
    assert nixos_switch.action(before, after) == expected, (before, after)


@pytest.mark.nix
def test_switch_restarts_the_router_for_a_new_package():
    import nixos_switch
    before = nixos_router_unit({}, ONE)
    assert nixos_switch.action(before, nixos_router_unit({}, TWO)) == "reload"  # the control
    assert nixos_switch.action(before, nixos_router_unit({}, ONE, python="/nix/store/r2-router-env/bin/python")) \
        == "restart"  # services.dflash.router.package
    assert nixos_switch.action(before, nixos_router_unit({}, ONE, dflashctl="/nix/store/d2/bin/dflashctl")) \
        == "restart"  # services.dflash.dflashctlPackage: ExecStart and ExecReload


@pytest.mark.nix
def test_instances_come_and_go_without_touching_the_others_units():
    """An instance's unit names the router (Before=), never another instance: adding or removing
    one leaves the others' units equal, so NixOS does nothing to them."""
    import nix_unit
    import nixos_switch
    a_alone = nixos_switch.parse(nix_unit.unit_text(ONE, "a"))
    a_beside_b = nixos_switch.parse(nix_unit.unit_text(TWO, "a"))
    assert nixos_switch.action(a_alone, a_beside_b) == "nothing"
    assert a_alone["Unit"]["Before"] == [router_unit.UNIT_NAME]


def test_the_switch_rule_as_read():
    """tests/nixos_switch.py on units that differ in one way each."""
    import nixos_switch as s
    base = {"Unit": {"Description": ["x"], "After": ["a"], "X-Reload-Triggers": ["/nix/store/1-r"]},
            "Service": {"ExecStart": ["/bin/x"]}, "Install": {"WantedBy": ["multi-user.target"]}}

    def changed(section, key, value):
        return {**base, section: {**base[section], key: value}}
    assert s.action(base, base) == "nothing"
    assert s.action(base, changed("Unit", "Description", ["y"])) == "nothing"
    assert s.action(base, changed("Install", "WantedBy", ["other.target"])) == "nothing"
    assert s.action(base, changed("Unit", "X-Reload-Triggers", ["/nix/store/2-r"])) == "reload"
    assert s.action(base, changed("Unit", "After", ["a", "b"])) == "restart"
    assert s.action(base, changed("Unit", "X-Restart-Triggers", ["/nix/store/3-r"])) == "restart"
    assert s.action(base, changed("Service", "ExecStart", ["/bin/y"])) == "restart"
    both = changed("Service", "ExecStart", ["/bin/y"])
    both["Unit"] = {**both["Unit"], "X-Reload-Triggers": ["/nix/store/2-r"]}
    assert s.action(base, both) == "restart"
    skipped = changed("Service", "X-RestartIfChanged", ["false"])
    assert s.action(base, skipped) == "nothing"
    assert s.action(base, changed("Service", "X-ReloadIfChanged", ["true"])) == "reload"
    assert s.parse("[Unit]\nAfter=a\nAfter=\nAfter=b\n[Install]\nWantedBy=x\n") == {"Unit": {"After": ["b"]}}
