"""sd_notify without libsystemd: one datagram to $NOTIFY_SOCKET (a path, or '@name' for abstract)."""

import os
import socket


def notify(message: str, env: dict[str, str] | None = None) -> bool:
    """Send e.g. "READY=1" or "STATUS=loading"; False when not run by systemd (no socket)."""
    address = (os.environ if env is None else env).get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]  # Linux abstract namespace
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
        try:
            sock.sendto(message.encode(), address)
        except OSError:
            return False  # systemd went away; the service's own work matters more than the status
    return True


def status(text: str, limit: int = 200) -> bool:
    # STATUS= is one line in `systemctl status`: keep it short and single-line.
    return notify("STATUS=" + " ".join(text.split())[:limit])
