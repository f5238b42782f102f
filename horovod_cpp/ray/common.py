"""What the fixed-size (``RayExecutor``) and the elastic (``ElasticRayExecutor``) executors'
workers and drivers share, below both: a worker's report of its call, and the driver's address
its workers reach."""
import traceback

from horovod_cpp.elastic import WorkerRemoved
from horovod_cpp.job import network


def outcome(call):
    """("ok", call()), or ("error", (type name, message, traceback, the exception if it
    pickles)) when it raises, or ("removed", None) for an elastic worker that the driver let
    go (not an error): what a worker sends back."""
    try:
        return ("ok", call())
    except WorkerRemoved:
        return ("removed", None)
    except BaseException as e:  # sent back with its traceback
        return ("error", (type(e).__name__, str(e), traceback.format_exc(), picklable(e)))


def picklable(exc):
    """``exc`` where it survives pickling (to travel back to the driver), else None."""
    try:
        import cloudpickle
        cloudpickle.loads(cloudpickle.dumps(exc))
        return exc
    except Exception:
        return None


def facing_address(node_ips):
    """The driver's address the workers' nodes reach: loopback when they are all on this
    node, else this node's address on the route to one of them."""
    import ray
    mine = ray.util.get_node_ip_address()
    others = [ip for ip in node_ips if ip != mine]
    return network.source_address(others[0]) if others else mine


def node_slots(node, cpus_per_slot, gpus_per_slot=0):
    """Slots of one ``ray.nodes()`` entry: as many as its CPUs (and GPUs, if any per slot) hold;
    0 for a node that is not alive."""
    if not node.get("Alive"):
        return 0
    resources = node.get("Resources", {})
    slots = int(resources.get("CPU", 0) // cpus_per_slot)
    if gpus_per_slot:
        slots = min(slots, int(resources.get("GPU", 0) // gpus_per_slot))
    return slots
