"""Small authenticated TCP messaging between the driver, the barrier tasks, the rsh agent and
the ranks.

A service sends every new connection "HVDN" and a fresh 16-byte nonce (connect() reads it).
Frames then carry a counter per direction, both bound to that nonce:

    HMAC(key, nonce | dir | n | length)[:16]   length (4 bytes, big endian)   body (pickle)
    HMAC(key, nonce | dir | n | length | body)

where dir is b"C" (client to service) or b"S" and n counts that direction's frames. The header
is checked before the body is read (no holder of the key, no memory spent on its length), the
body before anything is unpickled; a frame replayed on another connection (another nonce), or
again on the same one (another n), is refused, and so is a truncated one. A service gives a
new connection 10 s for its first frame, and at most 256 connections may owe one at once.
"""
import hashlib
import hmac
import os
import pickle
import socket
import socketserver
import struct
import threading
import time
import weakref


def source_address(host, port=1):
    """This host's address on the route to ``host``: what a peer there reaches it at (a UDP
    connect picks the route and sends nothing)."""
    addr = socket.getaddrinfo(host, port, socket.AF_INET, socket.SOCK_DGRAM)[0][4]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(addr)
        return s.getsockname()[0]


def recv_exact(sock, n):
    """Exactly ``n`` bytes from ``sock`` (ConnectionError if it closes first)."""
    chunks = []
    while n:
        chunk = sock.recv(min(n, 1 << 20))
        if not chunk:
            raise ConnectionError("connection closed")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def connect_for_hello(host, port, size, timeout, patience):
    """(socket, the first ``size`` bytes the server sends). A server shedding a flood closes new
    connections before its hello: tried again, with backoff, for ``patience`` seconds (the
    flood's connections time out meanwhile). Shared by the rendezvous store's clients and this
    module's."""
    deadline = time.monotonic() + patience
    delay = 0.01
    while True:
        sock = socket.create_connection((host, int(port)), timeout=timeout)
        try:
            return sock, recv_exact(sock, size)
        except (ConnectionError, OSError):
            sock.close()
            if time.monotonic() >= deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 0.5)


_HELLO = b"HVDN"
_NONCE = 16
_HEAD = 16
_DIGEST = 32
_MAX_FRAME = 1 << 31
_FIRST_FRAME_SECONDS = 10
_MAX_CONNECTIONS = 256


class ProtocolError(ConnectionError):
    pass


def new_key():
    return os.urandom(32)


class _Session(object):
    """A connection's nonce and frame counters (``sent`` under ``lock``: several threads of a
    service may send on one connection)."""

    def __init__(self, nonce, service_side):
        self.nonce = nonce
        self.out_dir, self.in_dir = (b"S", b"C") if service_side else (b"C", b"S")
        self.sent = 0
        self.received = 0
        self.lock = threading.Lock()


_sessions = weakref.WeakKeyDictionary()  # socket -> _Session


def _session(sock):
    s = _sessions.get(sock)
    if s is None:
        raise ProtocolError("not a horovod_cpp connection (no nonce: use network.connect)")
    return s


def _macs(key, session, direction, n, length, body=None):
    prefix = session.nonce + direction + struct.pack(">QI", n, length)
    head = hmac.new(key, prefix, hashlib.sha256).digest()[:_HEAD]
    if body is None:
        return head
    return head, hmac.new(key, prefix + body, hashlib.sha256).digest()


def send(sock, key, obj):
    body = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    s = _session(sock)
    with s.lock:
        head, digest = _macs(key, s, s.out_dir, s.sent, len(body), body)
        s.sent += 1
        sock.sendall(head + struct.pack(">I", len(body)) + body + digest)


def recv(sock, key):
    s = _session(sock)
    header = recv_exact(sock, _HEAD + 4)
    (length,) = struct.unpack(">I", header[_HEAD:])
    if not hmac.compare_digest(header[:_HEAD], _macs(key, s, s.in_dir, s.received, length)):
        raise ProtocolError("frame with a bad header digest refused (no key, or a replay)")
    if length >= _MAX_FRAME:
        raise ProtocolError("frame of %d bytes refused" % length)
    body = recv_exact(sock, length)
    digest = recv_exact(sock, _DIGEST)
    if not hmac.compare_digest(digest, _macs(key, s, s.in_dir, s.received, length, body)[1]):
        raise ProtocolError("message with a bad digest refused")
    s.received += 1
    return pickle.loads(body)


def connect(address, timeout=30.0):
    """A connected socket to the service at 'host:port', its nonce read. A service shedding a
    flood closes new connections before its hello: tried again until the flood's connections
    time out (10 s)."""
    host, _, port = address.rpartition(":")
    sock, hello = connect_for_hello(host, port, len(_HELLO) + _NONCE, timeout,
                                    _FIRST_FRAME_SECONDS + 5)
    if hello[:len(_HELLO)] != _HELLO:
        sock.close()
        raise ProtocolError("%s is not a horovod_cpp service" % address)
    _sessions[sock] = _Session(hello[len(_HELLO):], service_side=False)
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
        self.refused = 0  # connections dropped: no key, a replay, silent, truncated, a flood
        self._open = 0
        self._lock = threading.Lock()
        service = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self):
                service._serve(self.request, handle)

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True
            request_queue_size = 128  # a burst of connections queues instead of being dropped

        self._server = Server((bind, 0), Handler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True,
                                        name="hvd-service")
        self._thread.start()

    def _serve(self, sock, handle):
        # At most _MAX_CONNECTIONS connections still owe their first frame: a flood of
        # clients that never send one gets the rest closed at once (the job's own clients
        # send theirs within milliseconds); connections that sent one are not counted.
        with self._lock:
            full = self._open >= _MAX_CONNECTIONS
            self.refused += full
            self._open += not full
        if full:
            return
        message, ok = None, False
        try:
            sock.settimeout(_FIRST_FRAME_SECONDS)
            nonce = os.urandom(_NONCE)
            _sessions[sock] = _Session(nonce, service_side=True)
            sock.sendall(_HELLO + nonce)
            message = recv(sock, self.key)
            sock.settimeout(None)
            ok = True
        except (ConnectionError, OSError, pickle.UnpicklingError, EOFError, ValueError):
            pass  # bad, foreign, silent or truncated client: dropped
        finally:
            with self._lock:
                self._open -= 1
                self.refused += not ok
        if ok:
            handle(sock, message)

    def stop(self):
        self._server.shutdown()
        self._server.server_close()
