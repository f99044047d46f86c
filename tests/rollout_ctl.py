"""`rollout_ctl.py ADDRESS restart NAME`: ask tests/rollout_harness.py's supervisor to restart an instance.

The rollout's --restart-command in the loopback tests. Prints the supervisor's answer; exits 0 once
the instance is ready again, 1 when its start failed (as `systemctl restart` on a Type=notify unit).
"""

import socket
import sys


def main() -> int:
    if len(sys.argv) != 4:
        print("usage: rollout_ctl.py ADDRESS restart NAME", file=sys.stderr)
        return 2
    address, verb, name = sys.argv[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect("\0" + address.lstrip("@"))
        s.sendall(f"{verb} {name}\n".encode())
        answer = s.makefile().readline().strip()
    print(answer)
    return 0 if answer.startswith("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
