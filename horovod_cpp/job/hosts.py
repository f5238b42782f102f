"""Host lists: ``-H host1:2,host2:4`` and hostfiles with ``host slots=N`` lines."""
import re

_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")


class HostError(ValueError):
    pass


def _host(name, slots, where):
    if not _NAME.match(name):
        raise HostError("%s: %r is not a host name" % (where, name))
    if slots <= 0:
        raise HostError("%s: host %s has %d slots; slots must be positive" % (where, name, slots))
    return name, slots


def parse_hosts(text):
    """'h1:2,h2' -> [('h1', 2), ('h2', 1)]; a host without ':slots' has one slot."""
    hosts = []
    for item in text.split(","):
        item = item.strip()
        where = "-H %s" % text
        if not item:
            raise HostError("%s: empty host entry" % where)
        name, sep, slots = item.partition(":")
        if sep and not slots.isdigit():
            raise HostError("%s: slots of %r must be a positive integer" % (where, item))
        hosts.append(_host(name, int(slots) if sep else 1, where))
    return _merge(hosts, "-H %s" % text)


def parse_hostfile(path):
    """Lines 'host slots=N' (or just 'host': one slot); '#' starts a comment."""
    hosts = []
    try:
        with open(path) as f:
            lines = f.readlines()
    except OSError as e:
        raise HostError("--hostfile %s: %s" % (path, e.strerror))
    for number, line in enumerate(lines, 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        where = "--hostfile %s line %d" % (path, number)
        slots = 1
        for word in words[1:]:
            key, _, value = word.partition("=")
            if key not in ("slots", "max_slots", "max-slots") or not value.isdigit():
                raise HostError("%s: expected 'host slots=N', got %r" % (where, line.strip()))
            if key == "slots":
                slots = int(value)
        hosts.append(_host(words[0], slots, where))
    if not hosts:
        raise HostError("--hostfile %s: no hosts in the file" % path)
    return _merge(hosts, "--hostfile %s" % path)


def _merge(hosts, where):
    seen = {}
    for name, slots in hosts:
        if name in seen:
            raise HostError("%s: host %s is listed twice" % (where, name))
        seen[name] = slots
    return hosts


def hosts_arg(hosts):
    """[('h1', 2), ('h2', 1)] -> 'h1:2,h2:1' for mpirun -H."""
    return ",".join("%s:%d" % h for h in hosts)
