"""Can SGLang listen on the instance's host:port, and if not, who holds it.

SGLang binds its HTTP port only at the very end of its start, after its imports, the weights, the KV
cache and the CUDA graphs: a port another program holds costs a whole model load on the GPU before
uvicorn fails with EADDRINUSE. `serve` binds the address itself first, the way uvicorn binds it
(SO_REUSEADDR on, so a port whose last connections linger in TIME_WAIT is free, as it is for
uvicorn), and closes it again at once. A port taken after that check, while SGLang loads, leaves
SGLang hanging, not dead: uvicorn fails to bind, and its shutdown waits for SGLang's warm-up thread,
which asks the port (now another program's) for /model_info 120 times. So serve watches SGLang's log
for the bind error and then looks who listens (`foreign`); and before it says READY it makes sure the
answers came from its own SGLang, not from another server on the port.

The holder is found without `ss`: the kernel's socket tables (/proc/net/tcp, tcp6) give the
listening socket's inode and owner uid to anyone; the process that holds the inode is found among
the /proc/PID/fd links this user may read (its own processes, or every one as root).
"""

import errno
import ipaddress
import os
import pwd
import socket
from dataclasses import dataclass
from pathlib import Path

from dflashctl.errors import PORT_TAKEN, DflashError

LISTEN = "0A"  # TCP_LISTEN, as /proc/net/tcp writes a socket's state
SOCKET_TABLES = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))
COMMAND_SHOWN = 160  # of the holder's command line, in an error that also goes to systemd's status
# In SGLang's log when its bind failed: uvicorn's error line and Python's OSError text both carry it
# (EADDRINUSE is 98 on x86_64 and aarch64). Other ports' failures (NCCL's, ZMQ's) may carry it too:
# `foreign` then decides whether it was the instance's port.
PORT_LOST_MARK = "[Errno 98]"


def bind_problem(host: str, port: int) -> OSError | None:
    """The error binding host:port as uvicorn does would meet now; None when it would succeed."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            return e
    return None


@dataclass(frozen=True)
class Holder:
    uid: int
    pid: int | None = None  # None: the process is not one this user may look into
    command: str = ""

    def describe(self) -> str:
        try:
            user = pwd.getpwuid(self.uid).pw_name
        except KeyError:
            user = f"uid {self.uid}"
        if self.pid is None:
            return f"a process of user {user}"
        return f"pid {self.pid} ({self.command or '?'}) of user {user}"


def _address(hex_address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """/proc/net/tcp{,6}'s local address (the kernel's 32-bit words, each in host byte order: little
    endian on the machines this runs on)."""
    raw = bytes.fromhex(hex_address)
    packed = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    address = ipaddress.ip_address(packed)
    return address.ipv4_mapped or address if address.version == 6 else address


def _host_address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The address `host` names; None where it does not resolve (then every listener counts)."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        try:
            address = ipaddress.ip_address(socket.getaddrinfo(host, None)[0][4][0])
        except (OSError, ValueError, IndexError):
            return None
    return address.ipv4_mapped or address if address.version == 6 else address


def _overlap(a, b) -> bool:
    """Whether a listener on address a and one on address b take each other's connections (or binds):
    the same address, or either one a wildcard (:: takes IPv4 too, unless IPV6_V6ONLY)."""
    return a is None or b is None or a.is_unspecified or b.is_unspecified or a == b


def listening_sockets(port: int, tables=SOCKET_TABLES, host: str | None = None) -> dict[int, int]:
    """{inode: uid} of the TCP sockets listening on `port`: on any address, or (host given) on one
    whose connections or binds overlap host's."""
    mine = _host_address(host) if host is not None else None
    found = {}
    for table in tables:
        try:
            rows = table.read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) < 10 or fields[3] != LISTEN:
                continue
            address, hex_port = fields[1].rsplit(":", 1)
            if int(hex_port, 16) == port and _overlap(_address(address), mine):
                found[int(fields[9])] = int(fields[7])
    return found


def holders(port: int, host: str | None = None, proc: Path = Path("/proc"), tables=SOCKET_TABLES,
            first: tuple[int, ...] = ()) -> list[Holder]:
    """Who listens on `port` (where host is given: on an address overlapping it): one Holder per
    listening socket, with its process where visible. The processes `first` are looked into before
    the rest of /proc, which is not read once every socket has its process."""
    sockets = listening_sockets(port, tables, host)
    owner: dict[int, tuple[int, str]] = {}
    wanted = {f"socket:[{inode}]": inode for inode in sockets}
    for entry in _processes(proc, first) if wanted else ():
        for link in _fd_links(entry) & wanted.keys():
            owner.setdefault(wanted[link], (int(entry.name), _command(entry)))
        if len(owner) == len(wanted):
            break
    return [Holder(uid, *owner.get(inode, (None, ""))) for inode, uid in sorted(sockets.items())]


def _processes(proc: Path, first: tuple[int, ...]):
    yield from (proc / str(pid) for pid in first)
    yield from (e for e in proc.iterdir() if e.name.isdigit() and int(e.name) not in first)


def foreign(host: str, port: int, group: int) -> list[Holder]:
    """The listeners on host:port that are not of process group `group` (SGLang's: serve starts it
    in a group of its own). A listener of this user whose process cannot be seen counts as ours."""
    def ours(h: Holder) -> bool:
        if h.pid is None:
            return h.uid == os.getuid()
        try:
            return os.getpgid(h.pid) == group
        except ProcessLookupError:  # gone since: not in the way any more
            return True
    return [h for h in holders(port, host, first=(group,)) if not ours(h)]  # SGLang's uvicorn: its leader


def _fd_links(entry: Path) -> set[str]:
    """What a process's file descriptors point to; none of another user's process, or one gone."""
    try:
        fds = list((entry / "fd").iterdir())
    except OSError:
        return set()
    links = set()
    for fd in fds:
        try:
            links.add(os.readlink(fd))
        except OSError:  # closed since the listing (the listing's own descriptor, for one)
            pass
    return links


def _command(entry: Path) -> str:
    try:
        words = (entry / "cmdline").read_bytes().rstrip(b"\0").split(b"\0")
    except OSError:
        return ""
    command = " ".join(" ".join(w.decode(errors="replace").split()) for w in words)  # one line
    return command if len(command) <= COMMAND_SHOWN else command[:COMMAND_SHOWN - 3] + "..."


def check_listen(host: str, port: int) -> None:
    """PORT_TAKEN, naming the holder, when SGLang could not listen on host:port now."""
    problem = bind_problem(host, port)
    if problem is not None:
        raise taken_error(host, port, problem, "SGLang would load the model, then fail to listen")


def taken_error(host: str, port: int, problem: OSError | None, consequence: str,
                found: list[Holder] | None = None) -> DflashError:
    """What holds host:port. problem: the bind's error now (None: the port was taken, and is free
    again); found: the holders, where the caller has them."""
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    retry = "; systemd retries the start with backoff"
    if problem is not None and problem.errno != errno.EADDRINUSE:
        return DflashError(f"{address} cannot be listened on: {problem.strerror or problem}", consequence,
                           "set `host` to an address of this machine and `port` to one this user may bind"
                           + retry, PORT_TAKEN)
    found = holders(port, host) if found is None else found
    if not found and problem is None:
        return DflashError(f"{address} was taken when SGLang tried to listen, and is free again now",
                           consequence, "find the program that binds that port now and then (`sudo ss -ltnp "
                           f"'sport = :{port}'` while it holds it) and stop it, or give this instance another "
                           "`port`" + retry, PORT_TAKEN)
    if found:
        who = "; ".join(h.describe() for h in found) + f" listens on port {port}"
    else:  # bound without listening: an outgoing connection's local port, or a program's bind()
        who = f"a socket that does not listen holds port {port}"
    hidden = not found or any(h.pid is None for h in found)
    return DflashError(f"{address} is taken: {who}", consequence,
                       "stop that program or give this instance another `port`"
                       + (f" (`sudo ss -ltnp 'sport = :{port}'` names the process)" if hidden else "")
                       + retry, PORT_TAKEN)
