"""Ports for the servers the end-to-end test starts, chosen below Linux's ephemeral range.

A port the kernel hands out (binding port 0) is in the ephemeral range (32768 and up), the range
it also gives every outgoing connection its local port from: between choosing such a port and
the server binding it, a connection may take it, and the server fails to start. Ports below the
range are never taken that way. Ray's workers use 10002–19999, and SeaweedFS derives each gRPC
port as its port + 10000, so ports are drawn from 20000–22767, with port + 10000 free too.
"""
import random
import socket
import threading

LOW, HIGH = 20000, 22768
_given = set()
_lock = threading.Lock()


def bindable(port):
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port():
    """A port on 127.0.0.1 no server of this process was given and nothing holds now."""
    with _lock:
        for _ in range(10_000):
            port = random.randrange(LOW, HIGH)
            if port in _given or not (bindable(port) and bindable(port + 10_000)):
                continue
            _given.add(port)
            return port
    raise RuntimeError(f"no free port between {LOW} and {HIGH}")
