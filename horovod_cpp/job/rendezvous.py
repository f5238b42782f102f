"""The rendezvous store that ranks of a Gloo job meet through (server and Python client).

The launcher (hvdrun --gloo, the elastic driver) serves it; ranks reach it at
HOROVOD_GLOO_RENDEZVOUS_ADDR:HOROVOD_GLOO_RENDEZVOUS_PORT and prove they hold the job's secret
(HOROVOD_GLOO_SECRET): the server sends "HVDS" and a 16-byte nonce, the client answers
HMAC-SHA256(secret, nonce), and a wrong answer closes the connection before any key is read or
written; a replayed answer is wrong (every connection has its own nonce). A client has 10 s to
answer, and at most 128 connections may be answering at once (a flood gets the rest closed at
once; the ranks, which answer within milliseconds, retry). Then: 'S' u32 keylen key u32 vallen val -> 1; 'G' u32 keylen key -> 0 | 1 u32 len val
(lengths big-endian). The C++ client is ops/rendezvous_client.cc.
"""
import hashlib
import hmac
import os
import secrets
import socket
import socketserver
import struct
import threading
import time

from horovod_cpp.job.network import connect_for_hello, recv_exact

_HELLO = b"HVDS"
_NONCE = 16
_MAC = 32
_MAX_ITEM = 64 << 20
_AUTH_SECONDS = 10
_MAX_HANDSHAKES = 128


def new_secret():
    return secrets.token_hex(32)


class RendezvousServer(object):
    """A key-value store over TCP for one job. ``bind`` is the address to listen on; the port
    is chosen by the kernel (``port``). Thread-safe; ``put``/``get`` work in-process too."""

    def __init__(self, secret, bind="127.0.0.1"):
        self.secret = secret.encode() if isinstance(secret, str) else secret
        self._items = {}
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self.refused = 0  # connections that did not prove the secret (or came in a flood)
        self._handshakes = 0
        store = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self):
                store._serve(self.request)

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True
            request_queue_size = 128  # a burst of connections queues instead of being dropped
            address_family = socket.AF_INET6 if ":" in bind else socket.AF_INET

        self._server = Server((bind, 0), Handler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True,
                                        name="hvd-rendezvous")
        self._thread.start()

    def _serve(self, sock):
        with self._lock:
            flooded = self._handshakes >= _MAX_HANDSHAKES
            if flooded:
                self.refused += 1
            else:
                self._handshakes += 1
        if flooded:
            return  # closed at once
        proven = False
        try:
            proven = self._handshake(sock)
        finally:
            with self._lock:
                self._handshakes -= 1
                if not proven:
                    self.refused += 1
        if proven:
            self._requests(sock)

    def _handshake(self, sock):
        """Whether the client proves the secret over this connection's nonce."""
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            nonce = os.urandom(_NONCE)
            sock.settimeout(_AUTH_SECONDS)
            sock.sendall(_HELLO + nonce)
            mac = recv_exact(sock, _MAC)
        except (ConnectionError, OSError, socket.timeout):
            return False
        return hmac.compare_digest(mac, hmac.new(self.secret, nonce, hashlib.sha256).digest())

    def _requests(self, sock):
        try:
            sock.sendall(b"\x01")
            sock.settimeout(None)
            while True:
                op = sock.recv(1)
                if not op:
                    return
                (klen,) = struct.unpack(">I", recv_exact(sock, 4))
                if klen > _MAX_ITEM:
                    return
                key = recv_exact(sock, klen).decode("utf-8", "replace")
                if op == b"S":
                    (vlen,) = struct.unpack(">I", recv_exact(sock, 4))
                    if vlen > _MAX_ITEM:
                        return
                    self.put(key, recv_exact(sock, vlen))
                    sock.sendall(b"\x01")
                elif op == b"G":
                    value = self.get(key)
                    if value is None:
                        sock.sendall(b"\x00")
                    else:
                        sock.sendall(b"\x01" + struct.pack(">I", len(value)) + value)
                else:
                    return
        except (ConnectionError, OSError, socket.timeout):
            return

    def put(self, key, value):
        with self._lock:
            self._items[key] = bytes(value)
            self._changed.notify_all()

    def get(self, key):
        with self._lock:
            return self._items.get(key)

    def wait(self, key, timeout):
        """The value of ``key`` once it is set, or None after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while key not in self._items:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._changed.wait(left)
            return self._items[key]

    def keys(self, prefix=""):
        with self._lock:
            return sorted(k for k in self._items if k.startswith(prefix))

    def stop(self):
        self._server.shutdown()
        self._server.server_close()


class RendezvousClient(object):
    """Python client of a RendezvousServer (what a rank's elastic layer uses)."""

    def __init__(self, host, port, secret, timeout=30.0):
        self.secret = secret.encode() if isinstance(secret, str) else secret
        self._sock, hello = connect_for_hello(host, port, len(_HELLO) + _NONCE, timeout,
                                              _AUTH_SECONDS + 5)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if hello[:len(_HELLO)] != _HELLO:
            raise ConnectionError("%s:%s is not a horovod_cpp rendezvous store" % (host, port))
        self._sock.sendall(hmac.new(self.secret, hello[len(_HELLO):], hashlib.sha256).digest())
        if recv_exact(self._sock, 1) != b"\x01":
            raise ConnectionError("the rendezvous store refused this process")

    def set(self, key, value):
        k = key.encode()
        self._sock.sendall(b"S" + struct.pack(">I", len(k)) + k + struct.pack(">I", len(value))
                           + bytes(value))
        if recv_exact(self._sock, 1) != b"\x01":
            raise ConnectionError("the rendezvous store did not store %r" % key)

    def get(self, key):
        """The value of ``key``, or None while it is not set."""
        k = key.encode()
        self._sock.sendall(b"G" + struct.pack(">I", len(k)) + k)
        if recv_exact(self._sock, 1) != b"\x01":
            return None
        (n,) = struct.unpack(">I", recv_exact(self._sock, 4))
        return recv_exact(self._sock, n)

    def wait(self, key, timeout):
        deadline = time.monotonic() + timeout
        delay = 0.001
        while True:
            value = self.get(key)
            if value is not None or time.monotonic() >= deadline:
                return value
            time.sleep(delay)
            delay = min(delay * 2, 0.1)

    def close(self):
        self._sock.close()
