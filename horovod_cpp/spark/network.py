"""Small authenticated TCP messaging between the driver, the barrier tasks, the rsh agent and
the ranks.

A frame is HMAC-SHA256(key, body) (32 bytes), the body's length (4 bytes, big endian) and the
body, a pickled object. A frame whose digest does not match is rejected before anything is
unpickled, so only holders of the per-run key can talk to a service.
"""
import hashlib
import hmac
import os
import pickle
import socket
import socketserver
import struct
import threading

from horovod_cpp.runner.rendezvous import recv_exact as _recv_exact

_DIGEST = 32
_MAX_FRAME = 1 << 31


class ProtocolError(ConnectionError):
    pass


def new_key():
    return os.urandom(32)


def send(sock, key, obj):
    body = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    digest = hmac.new(key, body, hashlib.sha256).digest()
    sock.sendall(digest + struct.pack(">I", len(body)) + body)


def recv(sock, key):
    header = _recv_exact(sock, _DIGEST + 4)
    digest, (length,) = header[:_DIGEST], struct.unpack(">I", header[_DIGEST:])
    if length >= _MAX_FRAME:
        raise ProtocolError("frame of %d bytes refused" % length)
    body = _recv_exact(sock, length)
    if not hmac.compare_digest(digest, hmac.new(key, body, hashlib.sha256).digest()):
        raise ProtocolError("message with a bad digest refused")
    return pickle.loads(body)


def connect(address, timeout=30.0):
    """A connected socket to 'host:port'."""
    host, _, port = address.rpartition(":")
    sock = socket.create_connection((host, int(port)), timeout=timeout)
    sock.settimeout(None)
    return sock


def request(address, key, obj, timeout=30.0):
    """One request, one reply."""
    with connect(address, timeout) as sock:
        send(sock, key, obj)
        return recv(sock, key)


class Service(object):
    """A threaded TCP server: ``handle(sock, message)`` runs for the first message of every
    connection (in its own thread) and may keep the connection for more."""

    def __init__(self, key, handle, bind="0.0.0.0"):
        self.key = key
        service = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self):
                try:
                    message = recv(self.request, service.key)
                except (ConnectionError, OSError, pickle.UnpicklingError, EOFError):
                    return  # bad or foreign client: drop it
                handle(self.request, message)

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self._server = Server((bind, 0), Handler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True,
                                        name="hvd-service")
        self._thread.start()

    def stop(self):
        self._server.shutdown()
        self._server.server_close()
