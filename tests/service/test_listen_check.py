"""service/listen_check.py: whether SGLang could listen on an instance's host:port, and who holds it."""

import errno
import os
import socket
import subprocess
import sys

import pytest
from serve_fixture import free_port

from dflashctl import errors
from dflashctl.errors import DflashError
from dflashctl.service import listen_check

TABLE_HEAD = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"


def _row(local: str, state: str, uid: int, inode: int) -> str:
    return f"   0: {local} 00000000:0000 {state} 00000000:00000000 00:00000000 00000000 {uid:>5} 0 {inode} 1 0\n"


def test_listening_sockets_are_read_from_both_tables_and_only_in_the_listen_state(tmp_path):
    v4, v6 = tmp_path / "tcp", tmp_path / "tcp6"
    v4.write_text(TABLE_HEAD + _row("0100007F:7530", "0A", 1000, 111)     # 127.0.0.1:30000, listening
                  + _row("0100007F:7530", "01", 1000, 112)                 # an established connection
                  + _row("0100007F:7531", "0A", 1000, 113))                # another port
    v6.write_text(TABLE_HEAD + _row("00000000000000000000000000000000:7530", "0A", 0, 114))  # [::]:30000
    assert listen_check.listening_sockets(30000, (v4, v6)) == {111: 1000, 114: 0}
    assert listen_check.listening_sockets(30002, (v4, v6)) == {}
    assert listen_check.listening_sockets(30000, (tmp_path / "absent",)) == {}  # no table: nothing known


def test_the_holder_of_a_real_listening_socket_is_this_process():
    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        found = listen_check.holders(port)
        assert [h.pid for h in found] == [os.getpid()]
        assert found[0].uid == os.getuid()
        assert "pytest" in found[0].command or "python" in found[0].command
        assert listen_check.bind_problem("127.0.0.1", port).errno == errno.EADDRINUSE
        assert listen_check.bind_problem("0.0.0.0", port).errno == errno.EADDRINUSE  # every address
    assert listen_check.holders(port) == []
    assert listen_check.bind_problem("127.0.0.1", port) is None


def test_a_port_left_in_time_wait_is_free_as_it_is_for_uvicorn():
    """The last start's connections linger in TIME_WAIT on the port after it stopped: uvicorn binds
    with SO_REUSEADDR and succeeds, so the check must not refuse the restart."""
    port = free_port()
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen()
    client = socket.create_connection(("127.0.0.1", port))
    conn, _ = listener.accept()
    conn.close()  # the server's side closes first: its end (on `port`) goes to TIME_WAIT
    client.recv(1)
    client.close()
    listener.close()
    with socket.socket() as plain:  # without address reuse the port is still busy: the case is real
        with pytest.raises(OSError) as busy:
            plain.bind(("127.0.0.1", port))
        assert busy.value.errno == errno.EADDRINUSE
    assert listen_check.bind_problem("127.0.0.1", port) is None


def test_an_address_that_is_not_this_machines_is_named_with_the_setting_to_change():
    with pytest.raises(DflashError) as e:
        listen_check.check_listen("192.0.2.1", free_port())  # TEST-NET-1: no host has it
    assert e.value.exit_code == errors.PORT_TAKEN
    assert "cannot be listened on" in e.value.what and "set `host`" in e.value.fix


def test_a_port_taken_and_free_again_says_so_rather_than_naming_nobody():
    e = listen_check.taken_error("127.0.0.1", 30000, None, "SGLang could not listen")
    assert e.exit_code == errors.PORT_TAKEN
    assert "is free again now" in e.what and "ss -ltnp 'sport = :30000'" in e.fix


def test_an_ipv6_address_is_bound_as_ipv6_and_shown_in_brackets():
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback on this machine")
    port = free_port()
    with socket.socket(socket.AF_INET6) as s:
        s.bind(("::1", port))
        s.listen()
        with pytest.raises(DflashError) as e:
            listen_check.check_listen("::1", port)
    assert e.value.what.startswith(f"[::1]:{port} is taken: pid {os.getpid()} (")


def test_a_failed_bind_carries_the_mark_serve_looks_for_in_sglangs_log():
    """The stand-in prints Python's OSError as it is; uvicorn's line starts with the same "[Errno 98]"."""
    port = free_port()
    with socket.socket() as s, socket.socket() as second:
        s.bind(("127.0.0.1", port))
        s.listen()
        with pytest.raises(OSError) as e:
            second.bind(("127.0.0.1", port))
    assert listen_check.PORT_LOST_MARK in str(e.value)


def test_only_listeners_whose_address_overlaps_the_instances_count(tmp_path):
    v4, v6 = tmp_path / "tcp", tmp_path / "tcp6"
    v4.write_text(TABLE_HEAD + _row("0200007F:7530", "0A", 1000, 121)      # 127.0.0.2:30000
                  + _row("0100007F:7530", "0A", 1000, 122))                # 127.0.0.1:30000
    v6.write_text(TABLE_HEAD + _row("0000000000000000FFFF00000200007F:7530", "0A", 1000, 123))  # [::ffff:127.0.0.2]
    assert listen_check.listening_sockets(30000, (v4, v6), "127.0.0.1") == {122: 1000}
    assert listen_check.listening_sockets(30000, (v4, v6), "127.0.0.2") == {121: 1000, 123: 1000}
    assert listen_check.listening_sockets(30000, (v4, v6), "0.0.0.0") == {121: 1000, 122: 1000, 123: 1000}
    v4.write_text(TABLE_HEAD + _row("00000000:7530", "0A", 0, 124))        # 0.0.0.0:30000 takes them all
    assert listen_check.listening_sockets(30000, (v4,), "127.0.0.1") == {124: 0}


def test_a_listener_of_another_process_group_is_foreign_and_one_of_the_group_is_not():
    port = free_port()
    code = ("import socket, sys, time; s = socket.socket(); s.bind(('127.0.0.1', int(sys.argv[1]))); "
            "s.listen(); print('up', flush=True); time.sleep(60)")
    child = subprocess.Popen([sys.executable, "-c", code, str(port)], stdout=subprocess.PIPE, text=True,
                             start_new_session=True)  # a group of its own, as serve starts SGLang
    try:
        assert child.stdout.readline().strip() == "up"
        assert listen_check.foreign("127.0.0.1", port, child.pid) == []  # SGLang's own listener
        found = listen_check.foreign("127.0.0.1", port, os.getpgid(0))   # seen from another group
        assert [h.pid for h in found] == [child.pid]
        assert listen_check.foreign("127.0.0.2", port, os.getpgid(0)) == []  # another address: no overlap
    finally:
        child.kill()
        child.wait()
