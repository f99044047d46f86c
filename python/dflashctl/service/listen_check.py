"""Can SGLang listen on the instance's host:port, and if not, who holds it.

SGLang binds its HTTP port only at the very end of its start, after its imports, the weights, the KV
cache and the CUDA graphs: a port another program holds costs a whole model load on the GPU before
uvicorn fails with EADDRINUSE. `serve` binds the address itself first, the way uvicorn binds it
(SO_REUSEADDR on, so a port whose last connections linger in TIME_WAIT is free, as it is for
uvicorn), and closes it again at once; and where SGLang's log shows it lost the port all the same
(taken in between), `serve` names the holder the same way.

The holder is found without `ss`: the kernel's socket tables (/proc/net/tcp, tcp6) give the
listening socket's inode and owner uid to anyone; the process that holds the inode is found among
the /proc/PID/fd links this user may read (its own processes, or every one as root).
"""

import errno
import os
import pwd
import socket
from dataclasses import dataclass
from pathlib import Path

from dflashctl.errors import PORT_TAKEN, DflashError

LISTEN = "0A"  # TCP_LISTEN, as /proc/net/tcp writes a socket's state
SOCKET_TABLES = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))
COMMAND_SHOWN = 160  # of the holder's command line, in an error that also goes to systemd's status
PORT_LOST_MARKERS = ("address already in use", "[errno 98]")  # uvicorn's log line, or Python's OSError text


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


def listening_sockets(port: int, tables=SOCKET_TABLES) -> dict[int, int]:
    """{inode: uid} of the TCP sockets listening on `port`, on any address."""
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
            if int(fields[1].rsplit(":", 1)[1], 16) == port:
                found[int(fields[9])] = int(fields[7])
    return found


def holders(port: int, proc: Path = Path("/proc"), tables=SOCKET_TABLES) -> list[Holder]:
    """Who listens on `port`: one Holder per listening socket, with its process where visible."""
    sockets = listening_sockets(port, tables)
    owner: dict[int, tuple[int, str]] = {}
    wanted = {f"socket:[{inode}]": inode for inode in sockets}
    for entry in (proc.iterdir() if wanted else ()):
        if not entry.name.isdigit():
            continue
        for link in _fd_links(entry) & wanted.keys():
            owner.setdefault(wanted[link], (int(entry.name), _command(entry)))
    return [Holder(uid, *owner.get(inode, (None, ""))) for inode, uid in sorted(sockets.items())]


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


def taken_error(host: str, port: int, problem: OSError | None, consequence: str) -> DflashError:
    """What holds host:port (problem: the bind's error now; None: it was taken, and is free again)."""
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    retry = "; systemd retries the start with backoff"
    if problem is None:
        return DflashError(f"{address} was taken when SGLang tried to listen, and is free again now",
                           consequence, "find the program that binds that port now and then (`sudo ss -ltnp "
                           f"'sport = :{port}'` while it holds it) and stop it, or give this instance another "
                           "`port`" + retry, PORT_TAKEN)
    if problem.errno != errno.EADDRINUSE:
        return DflashError(f"{address} cannot be listened on: {problem.strerror or problem}", consequence,
                           "set `host` to an address of this machine and `port` to one this user may bind"
                           + retry, PORT_TAKEN)
    found = holders(port)
    if found:
        who = "; ".join(h.describe() for h in found) + f" listens on port {port}"
    else:  # bound without listening: an outgoing connection's local port, or a program's bind()
        who = f"a socket that does not listen holds port {port}"
    hidden = not found or any(h.pid is None for h in found)
    return DflashError(f"{address} is taken: {who}", consequence,
                       "stop that program or give this instance another `port`"
                       + (f" (`sudo ss -ltnp 'sport = :{port}'` names the process)" if hidden else "")
                       + retry, PORT_TAKEN)


def lost_port(log_tail: str) -> bool:
    """SGLang's log says it could not listen: its port was taken after serve's own check."""
    text = log_tail.lower()
    return any(marker in text for marker in PORT_LOST_MARKERS)
