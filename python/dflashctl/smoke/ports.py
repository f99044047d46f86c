"""Loopback ports for the servers smoke starts (and the tests' stand-ins and routers).

A port is chosen some time before its server binds it: SGLang listens only after its imports and
model load. A port from the kernel's ephemeral range (`ip_local_port_range`, where binding port 0
and every outgoing connection draw theirs) can be taken in that window by any connection this host
opens, which a busy host opens all the time. So ports come from outside that range; what can still
take one is another program binding it explicitly, which the smoke meets by starting again on a
fresh port (smoke/fleet.py).
"""

import random
from pathlib import Path

from dflashctl.errors import DflashError
from dflashctl.service.config import MAX_PORT
from dflashctl.service.listen_check import bind_problem

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST = 20000  # below: the ports of well-known services; 20000 .. 32767 is outside Linux's default range
TRIES = 200


def ephemeral_range(path: Path = EPHEMERAL_RANGE) -> tuple[int, int] | None:
    """The kernel's (first, last) ephemeral port; None where it cannot be read (not Linux)."""
    try:
        first, last = (int(word) for word in path.read_text().split())
    except (OSError, ValueError):
        return None
    return first, last


def candidates(at_most: int = MAX_PORT, lowest: int = LOWEST,
               ephemeral: tuple[int, int] | None = None) -> list[range]:
    """The port ranges to choose from: [lowest, at_most] without the ephemeral range. Where that
    leaves nothing (a host that made almost every port ephemeral), the whole of [lowest, at_most]:
    a start that then loses its port is retried on a fresh one."""
    if ephemeral is None:
        return [range(lowest, at_most + 1)]
    first, last = ephemeral
    outside = [range(lowest, min(first - 1, at_most) + 1), range(max(last + 1, lowest), at_most + 1)]
    outside = [r for r in outside if len(r)]
    return outside or [range(lowest, at_most + 1)]


def free_port(at_most: int = MAX_PORT, lowest: int = LOWEST) -> int:
    """A port free on 127.0.0.1 now, outside the ephemeral range, at most `at_most` (an instance's
    port: SGLang refuses one above MAX_PORT, it derives port + 10000)."""
    ranges = candidates(at_most, lowest, ephemeral_range())
    for _ in range(TRIES):
        r = random.choices(ranges, weights=[len(x) for x in ranges])[0]
        port = random.choice(r)
        if is_free(port):
            return port
    spans = ", ".join(f"{r.start}-{r.stop - 1}" for r in ranges)
    raise DflashError(f"no free loopback port in {spans}", f"{TRIES} ports tried were all taken",
                      "stop some local servers, or pass --url to test a running one")


def is_free(port: int) -> bool:
    """Whether 127.0.0.1:port can be bound now (as a server binds it: address reuse on, so a port
    whose last connection lingers in TIME_WAIT counts as free, as it is for the server)."""
    return bind_problem("127.0.0.1", port) is None
