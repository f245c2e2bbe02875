"""A ProxyCommand for tests: joins its stdin/stdout to a TCP connection, as `nc HOST PORT` would
(nc is not on every machine; python is). Usage: python tcp_relay.py HOST PORT"""

from __future__ import annotations

import os
import socket
import sys
import threading


def main() -> None:
    sock = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
    sock.settimeout(None)
    print(f"tcp_relay: connected to {sys.argv[1]}:{sys.argv[2]}", file=sys.stderr, flush=True)

    def upstream() -> None:
        while data := os.read(0, 65536):
            sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)

    threading.Thread(target=upstream, daemon=True).start()
    while data := sock.recv(65536):
        os.write(1, data)


if __name__ == "__main__":
    main()
