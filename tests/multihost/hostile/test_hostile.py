"""Foreign and hostile clients against every endpoint of a job, on the test bed only (run on
hvd-h1 by tests/multihost/run.sh; every address is a test host's): the Gloo rendezvous store
(also the elastic driver's: the same server), the Spark services (HorovodRunner's driver and
task services, the rsh agent's), and the collective watchdog's side channel.

Each client is refused: without the secret or with a wrong one, a replayed frame, a truncated
one, oversized lengths, a connection held open saying nothing, a flood of a few hundred
connections (bounded), and random bytes (a short fuzz loop per protocol). Meanwhile the job's
own clients are served, and a running job's results (exact values, checked by its ranks) are
what they would be undisturbed.
"""
import hashlib
import hmac
import os
import pickle
import random
import re
import socket
import struct
import subprocess
import sys
import threading
import time

import pytest

from horovod_cpp.job.rendezvous import RendezvousClient, RendezvousServer, new_secret
from horovod_cpp.job import network

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
WORKER = os.path.join(ROOT, "tests", "chaos", "worker.py")
ADDR = socket.gethostbyname(socket.gethostname())  # hvd-h1's address on the test network
FLOOD = 300
FUZZ = 300

pytestmark = pytest.mark.skipif(not socket.gethostname().startswith("hvd-h"),
                                reason="hostile clients only on the test bed (a test host)")


def raw(port, host=ADDR):
    s = socket.create_connection((host, port), timeout=5)
    s.settimeout(5)
    return s


def closed_by_peer(sock, timeout=15):
    """Whether the peer closes the connection (reads until EOF) within `timeout`."""
    sock.settimeout(timeout)
    try:
        while sock.recv(4096):
            pass
        return True
    except socket.timeout:
        return False
    except OSError:
        return True


def flood(port, host=ADDR, n=FLOOD):
    """n connections opened and held (saying nothing); returns them for the caller to close."""
    conns = []
    for _ in range(n):
        try:
            conns.append(socket.create_connection((host, port), timeout=2))
        except OSError:
            pass  # the backlog may overflow: a refused connection is a refused client
    return conns


def close_all(conns):
    for c in conns:
        c.close()


def fuzz(port, rng, n=FUZZ, host=ADDR):
    """n connections sending random bytes (random lengths, some framing-like prefixes)."""
    for _ in range(n):
        try:
            s = raw(port, host)
            size = rng.choice([1, 4, 12, 20, 36, 64, 300, 5000])
            data = bytes(rng.getrandbits(8) for _ in range(size))
            if rng.random() < 0.3:  # a length field claiming a huge frame
                data = data[:16] + struct.pack(">I", 0xFFFFFFF0) + data[20:]
            s.sendall(data)
            s.close()
        except OSError:
            pass


# ---- the Gloo rendezvous store (and the elastic driver's) -------------------------------------

def test_rendezvous_store_refuses_foreign_clients_and_keeps_serving():
    secret = new_secret()
    server = RendezvousServer(secret, bind=ADDR)
    try:
        job = RendezvousClient(ADDR, server.port, secret)
        job.set("rank.0", b"address of rank 0")
        with pytest.raises(ConnectionError):
            RendezvousClient(ADDR, server.port, new_secret())  # a wrong secret
        # A replayed answer: valid for connection 1's nonce, sent on connection 2.
        first = raw(server.port)
        hello = first.recv(20)
        answer = hmac.new(secret.encode(), hello[4:], hashlib.sha256).digest()
        second = raw(server.port)
        second.recv(20)
        second.sendall(answer)
        assert closed_by_peer(second), "a replayed answer was accepted"
        first.sendall(answer)
        assert first.recv(1) == b"\x01"  # on its own connection it is the right one
        # Authenticated, then an item length of 4 GiB: that connection is closed, nothing read.
        first.sendall(b"S" + struct.pack(">I", 0xFFFFFFFF))
        assert closed_by_peer(first)
        # Truncated answers, garbage, no answer at all (held open), a flood: the job's client
        # is served throughout.
        for data in (answer[:10], b"\xff" * 32, b""):
            s = raw(server.port)
            s.recv(20)
            if data:
                s.sendall(data)
            s.close()
        silent = [raw(server.port) for _ in range(20)]
        held = flood(server.port)
        start = time.monotonic()
        assert job.get("rank.0") == b"address of rank 0"
        late = RendezvousClient(ADDR, server.port, secret)  # a rank joining during the flood
        late.set("rank.1", b"address of rank 1")
        assert time.monotonic() - start < 15
        close_all(held + silent)
        fuzz(server.port, random.Random(1))
        assert job.get("rank.1") == b"address of rank 1"
        assert server.keys() == ["rank.0", "rank.1"]  # nothing written by anyone else
        assert server.refused >= 1 + 1 + 3 + FLOOD // 2, server.refused
    finally:
        server.stop()


# ---- the Spark services -------------------------------------------------------------------------

def echo_service():
    key = network.new_key()
    seen = []

    def handle(sock, message):  # like a task service: the connection serves more messages
        while True:
            seen.append(message)
            network.send(sock, key, {"echo": message})
            try:
                message = network.recv(sock, key)
            except (ConnectionError, OSError):
                return
    return network.Service(key, handle, bind=ADDR), key, seen


def test_spark_service_refuses_foreign_clients_and_keeps_serving():
    service, key, seen = echo_service()
    address = "%s:%d" % (ADDR, service.port)
    try:
        assert network.request(address, key, {"type": "hello"}) == {"echo": {"type": "hello"}}
        with pytest.raises(ConnectionError):
            network.request(address, network.new_key(), {"type": "forged"})  # a wrong key
        # A frame recorded on one connection, replayed on another (another nonce), and again on
        # its own (another frame counter).
        first = network.connect(address)
        session = network._sessions[first]
        body = pickle.dumps({"type": "run"})
        head, digest = network._macs(key, session, b"C", 0, len(body), body)
        frame = head + struct.pack(">I", len(body)) + body + digest
        first.sendall(frame)
        assert network.recv(first, key) == {"echo": {"type": "run"}}
        first.sendall(frame)  # the same frame again on its own connection: another counter
        assert closed_by_peer(first), "a frame replayed on its connection was accepted"
        second = raw(service.port)
        assert second.recv(20)[:4] == b"HVDN"
        second.sendall(frame)  # on another connection
        assert closed_by_peer(second)
        # Truncated, oversized (a 4 GiB length without the key: refused before reading it),
        # garbage, silent, a flood; the job's own requests are answered throughout.
        for data in (frame[:25], b"\x00" * 16 + struct.pack(">I", 0xFFFFFFF0), b"\xff" * 80):
            s = raw(service.port)
            s.recv(20)
            s.sendall(data)
            if data[:1] == b"\x00":
                assert closed_by_peer(s), "an unauthenticated 4 GiB frame was waited for"
            s.close()
        silent = [raw(service.port) for _ in range(20)]
        held = flood(service.port)
        start = time.monotonic()
        assert network.request(address, key, {"type": "during"}) == {"echo": {"type": "during"}}
        assert time.monotonic() - start < 15
        close_all(held + silent)
        fuzz(service.port, random.Random(2))
        assert network.request(address, key, {"type": "after"}) == {"echo": {"type": "after"}}
        assert [m["type"] for m in seen] == ["hello", "run", "during", "after"], seen
        assert service.refused >= 1 + 1 + 3, service.refused
        first.close()
    finally:
        service.stop()


# ---- a running job: its store and every rank's side channel attacked ----------------------------

def test_a_running_gloo_job_across_hosts_is_not_disturbed(tmp_path):
    tag = "hostile-%d" % os.getpid()
    spec = ('{"tag": "%s", "workload": "mix", "steps": 160, "fault": "none", "victim": 0, '
            '"step": 0, "step_delay": 0.05}' % tag)
    job = subprocess.Popen(
        [sys.executable, "-m", "horovod_cpp.runner", "--gloo", "-np", "4", "-H",
         "hvd-h1:2,hvd-h2:2", "--log-level", "info", "--collective-timeout-seconds", "30",
         sys.executable, WORKER, spec], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, cwd=str(tmp_path))
    lines = []
    ports = {}
    store = None
    deadline = time.monotonic() + 120
    for line in job.stdout:
        lines.append(line.rstrip("\n"))
        m = re.match(r"\[(\d)\]<stderr>:.*answers the others' probes on TCP port (\d+)", line)
        if m:
            ports[int(m.group(1))] = int(m.group(2))
        if len(ports) == 4 and store is None:
            store = store_of(tag)
            break
        if time.monotonic() > deadline:
            break
    assert len(ports) == 4 and store, "\n".join(lines)
    hosts = {0: "hvd-h1", 1: "hvd-h1", 2: "hvd-h2", 3: "hvd-h2"}
    targets = [(store[0], store[1])] + [(socket.gethostbyname(hosts[r]), p)
                                        for r, p in sorted(ports.items())]
    rest = threading.Thread(target=lambda: lines.extend(l.rstrip("\n") for l in job.stdout),
                            daemon=True)
    rest.start()
    rng = random.Random(3)
    held = []
    for host, port in targets:  # while the job runs its collectives
        held += flood(port, host, n=FLOOD // len(targets))
        fuzz(port, rng, n=60, host=host)
        s = raw(port, host)
        s.recv(64)
        s.sendall(b"\x00" * 16 + struct.pack(">I", 0xFFFFFFF0))  # an oversized claim
        held.append(s)
    time.sleep(1)
    close_all(held)
    assert job.wait(120) == 0, "\n".join(lines)
    rest.join(10)
    text = "\n".join(lines)
    assert len(re.findall(r"chaos: rank \d OK ", text)) == 4, text  # every result exact


def store_of(tag):
    """(address, port) of the job's rendezvous store, from a rank's environment."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                if tag.encode() not in f.read():
                    continue
            with open("/proc/%s/environ" % pid, "rb") as f:
                env = dict(e.split(b"=", 1) for e in f.read().split(b"\0") if b"=" in e)
        except OSError:
            continue
        if b"HOROVOD_GLOO_RENDEZVOUS_PORT" in env:
            return (env[b"HOROVOD_GLOO_RENDEZVOUS_ADDR"].decode(),
                    int(env[b"HOROVOD_GLOO_RENDEZVOUS_PORT"]))
    return None
