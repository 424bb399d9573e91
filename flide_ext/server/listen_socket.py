"""The server's listening address, taken before the model loads: a port in use
is refused in one line at once, not after the load (a minute on a GPU) by
uvicorn's own message."""

from __future__ import annotations

import socket

from ..protocol.errors import FlideError


def bind(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (not listening yet: uvicorn listens on
    it once the server is ready, so a client meanwhile is refused, as before).

    Args:
        host: a name or address (IPv4 or IPv6), as ``--host`` takes it.
        port: 0-65535 (0: any free port).

    Raises:
        FlideError: the name does not resolve, or the address cannot be bound
            (in use, not this machine's, or a privileged port).
    """
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as e:
        raise FlideError(f"--host {host!r} does not resolve: {e.strerror}") from None
    sock = socket.socket(family, kind, proto)
    # As uvicorn binds: a port whose last server's connections linger in TIME_WAIT is free.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as e:
        sock.close()
        raise FlideError(f"cannot listen on {host}:{port} (--host, --port): {e.strerror}") from None
    sock.set_inheritable(False)
    return sock
