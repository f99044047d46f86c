"""The running router's admin API (sglang-router 0.3.2): which workers it routes to, and changing them.

Used by `dflashctl router --sync` (the unit's ExecReload) and by `dflashctl rollout`. Facts about
0.3.2's API, as observed against the real binary (tests/operations/test_router.py, tests/operations/test_rollout.py):
`GET /workers` lists `{"workers": [{"id", "url", "is_healthy", "load", ...}]}`; `POST /workers
{"url"}` answers 202 and adds the worker in the background (a URL already listed keeps its id);
`DELETE /workers/<id>` answers 202 and removes it in the background, letting the requests it holds
finish; an unknown id is 404. A worker is sent requests only while `is_healthy` is true, i.e. after
its health check passed. A router that restarts reads its settings file again: every configured
worker comes back (once it answers), whatever was removed through this API before.
"""

import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

from dflashctl.errors import CONFIG, DflashError

TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Worker:
    id: str
    url: str
    healthy: bool


class RouterUnreachable(DflashError):
    """The router did not answer at all (down, restarting): callers may wait and try again."""


class RouterAdmin:
    def __init__(self, url: str, admin_key: str | None, timeout: float = TIMEOUT_S):
        self.url, self.admin_key, self.timeout = url.rstrip("/"), admin_key, timeout

    def _call(self, method: str, path: str, body: dict | None = None) -> dict:
        headers = {"Content-Type": "application/json"}
        if self.admin_key:
            headers["Authorization"] = f"Bearer {self.admin_key}"
        req = urllib.request.Request(self.url + path, method=method, headers=headers,
                                     data=None if body is None else json.dumps(body).encode())
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                return json.loads(r.read() or b"{}")
        except urllib.error.HTTPError as e:
            if e.code in (401, 403):
                raise DflashError(f"the router's admin API refused {method} {path}", f"HTTP {e.code}",
                                  "give the router's admin key (adminApiKeyFile in the router settings; "
                                  "the units hand it over as a credential)", CONFIG) from None
            raise DflashError(f"the router's admin API refused {method} {path}", f"HTTP {e.code}: "
                              + e.read()[:200].decode(errors="replace"),
                              "see `journalctl -u dflash-router`") from None
        except (OSError, ValueError) as e:  # refused, reset, timeout, or not JSON
            raise RouterUnreachable(f"cannot reach the router at {self.url}",
                                    str(getattr(e, "reason", e)),
                                    "start it first (`systemctl start dflash-router`)") from None

    def workers(self) -> list[Worker]:
        listed = self._call("GET", "/workers").get("workers", [])
        return [Worker(w["id"], w["url"].rstrip("/"), bool(w.get("is_healthy"))) for w in listed]

    def by_url(self) -> dict[str, Worker]:
        return {w.url: w for w in self.workers()}

    def add(self, url: str) -> None:
        self._call("POST", "/workers", {"url": url})

    def remove(self, url: str) -> bool:
        """Take `url` out of rotation; False when the router does not list it."""
        worker = self.by_url().get(url.rstrip("/"))
        if worker is None:
            return False
        try:
            self._call("DELETE", f"/workers/{worker.id}")
        except RouterUnreachable:
            raise
        except DflashError as e:
            if "HTTP 404" not in e.why:  # removed in between: what was asked for
                raise
        return True

    def wait_listed(self, url: str, healthy: bool, timeout: float, poll: float = 0.25) -> bool:
        """Until the router lists `url` healthy (healthy=True) or no longer lists it (False)."""
        url = url.rstrip("/")
        deadline = time.monotonic() + timeout
        while True:
            worker = self.by_url().get(url)
            if (worker is not None and worker.healthy) if healthy else worker is None:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(poll)

    def sync(self, wanted: list[str]) -> tuple[list[str], list[str]]:
        """Make the router's workers `wanted` (added ones get requests once their health check
        passes; removed ones finish what they hold). Returns (added, removed)."""
        running = self.by_url()
        added = [u for u in wanted if u not in running]
        removed = [u for u in running if u not in wanted]
        for url in added:
            self.add(url)
        for url in removed:
            self._call("DELETE", f"/workers/{running[url].id}")
        return added, removed
