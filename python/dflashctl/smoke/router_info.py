"""`smoke --url` through SGLang's router: which workers stand behind it, and one of them to ask.

sglang-router 0.3.2 does not pass /server_info on (404), and its /get_server_info describes the
router itself; its /workers lists the workers with their health. The smoke measures through the
router's URL and reads the speculative settings from a healthy worker's own /server_info.
"""

from dflashctl.errors import DflashError
from dflashctl.smoke import loadgen


def workers(ep: loadgen.Endpoint) -> dict | None:
    """{url, workers: [{url, healthy, model}]} when `ep` is a router that lists its workers, else None."""
    try:
        listed = loadgen.get_json(ep, "/workers", timeout=10)
    except DflashError:
        return None
    if not isinstance(listed, dict) or not isinstance(listed.get("workers"), list):
        return None
    return {"url": ep.base_url,
            "workers": [{"url": w.get("url"), "healthy": bool(w.get("is_healthy")), "model": w.get("model_id")}
                        for w in listed["workers"] if isinstance(w, dict)]}


def server_info(ep: loadgen.Endpoint) -> tuple[dict, dict | None]:
    """(/server_info of the service, the router in front of it or None)."""
    try:
        return loadgen.get_json(ep, "/server_info"), None
    except DflashError as first:
        router = workers(ep)
        if router is None:
            raise first
    healthy = [w for w in router["workers"] if w["healthy"]]
    if not healthy:
        raise DflashError(f"the router at {ep.base_url} has no healthy worker",
                          f"its /workers lists {len(router['workers'])}, none healthy",
                          "start the instances behind it (systemctl start dflash-<name>) and wait for READY")
    return loadgen.get_json(loadgen.Endpoint(healthy[0]["url"], ep.api_key), "/server_info"), router
