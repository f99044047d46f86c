"""Loopback ports for the servers smoke starts."""

import random
import socket

from dflashctl.errors import DflashError
from dflashctl.service.config import MAX_PORT


def free_port() -> int:
    """A free loopback port SGLang accepts: at most config.MAX_PORT (it derives port + 10000)."""
    for _ in range(200):
        port = random.randint(20000, MAX_PORT)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise DflashError(f"no free loopback port between 20000 and {MAX_PORT}", "200 tries were all taken",
                      "stop some local servers, or pass --url to test a running one")
