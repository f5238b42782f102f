"""Elastic state objects: what is committed, restored and synced across resets."""
import copy

from horovod_cpp.common.elastic import ObjectState, State  # noqa: F401
from horovod_cpp.torch.functions import (broadcast_object, broadcast_optimizer_state,
                                         broadcast_parameters)


class TorchState(ObjectState):
    """A model's and an optimizer's state plus any picklable attributes. commit copies the
    model's and the optimizer's state dicts; restore loads them back; sync broadcasts the
    parameters, the optimizer state and the attributes from rank 0.

    With a ``hvd.ShardedOptimizer``, commit keeps each rank's slice of the optimizer state and
    a replica of it on another rank (another host when the job spans hosts), and sync reshards
    the last commit over the ranks of the re-formed job (``reshard_seconds``: how long it
    took): losing one rank or one host between two commits loses nothing committed. With a
    model given to ``hvd.shard_model`` (stage 3) the parameters are sharded too: the commit
    keeps their slices the same way, and the reshard re-splits them over the new ranks.

    With ``compression=hvd.Compression.powersgd(...)`` the commit keeps its step count, its Qs
    and each error as the mean over the ranks (the averaged gradients depend on nothing
    else); restore and sync give every rank of the new world that mean."""

    def __init__(self, model=None, optimizer=None, **kwargs):
        self.model = model
        self.optimizer = optimizer
        self.reshard_seconds = None
        self._pending_snapshot = None
        self._saved_model_state = None
        self._saved_optimizer_state = None
        self._saved_compression = None
        # An AdaptiveDataParallel model brings its adaptive state (epoch, loader positions,
        # noise scale, throughput profile, configuration).
        adaptive = getattr(model, "_hvd_adaptive_state", None)
        if adaptive is not None and "adaptive" not in kwargs:
            kwargs["adaptive"] = adaptive
        # Objects with state_dict/load_state_dict (an ElasticSampler) travel as their state.
        self._handled = {k: v for k, v in kwargs.items()
                         if hasattr(v, "state_dict") and hasattr(v, "load_state_dict")}
        plain = {k: v for k, v in kwargs.items() if k not in self._handled}
        for k, v in self._handled.items():
            setattr(self, k, v)
        self._saved_handled = {}
        super().__init__(**plain)
        self._save_torch()

    def _compressor(self):
        """The optimizer's PowerSGD state (its Qs, errors and step count), if it has one."""
        return getattr(self.optimizer, "_powersgd", None) if self.optimizer is not None else None

    def _sharded(self):
        return self.optimizer is not None and hasattr(self.optimizer, "_elastic_reshard")

    def _model_state(self):
        """The model's state_dict; of a model given to hvd.shard_model, its buffers alone (its
        parameters are sharded: the ShardedOptimizer's commit keeps them)."""
        sd = self.model.state_dict()
        if getattr(self.model, "_hvd_sharded", None) is not None:
            params = {n for n, _ in self.model.named_parameters()}
            sd = {k: v for k, v in sd.items() if k not in params}
        return sd

    def _snapshot(self):
        return {"handled": {k: copy.deepcopy(v.state_dict()) for k, v in self._handled.items()},
                "model": (copy.deepcopy(self._model_state()) if self.model is not None
                          else None),
                "objects": {k: copy.deepcopy(getattr(self, k)) for k in self._saved_state}}

    def _keep(self, snapshot):
        self._saved_handled = snapshot["handled"]
        self._saved_model_state = snapshot["model"]
        self._saved_state = snapshot["objects"]

    def _save_torch(self, replicate=False):
        """Saves the model, the optimizer, the handled objects and the attributes together.
        ``replicate``: collective (commit, sync); a ShardedOptimizer then also keeps a replica
        of each rank's slice on another rank, and the commit counts only once every rank has
        its replicas (until then it is pending: see sync)."""
        snapshot = self._snapshot()
        if self._sharded():
            self._pending_snapshot = ((self.optimizer.commit_id + 1, snapshot) if replicate
                                      else None)
            self.optimizer._elastic_save(replicate=replicate)
            self._pending_snapshot = None
        elif self.optimizer is not None:
            self._saved_optimizer_state = copy.deepcopy(self.optimizer.state_dict())
        comp = self._compressor()
        if comp is not None:
            # Collective: each error as its mean over the ranks, all that the averaged
            # gradients depend on, so that a world of another size goes on exactly.
            self._saved_compression = (comp._elastic_commit(self.optimizer.process_set)
                                       if replicate else comp.state_dict())
        self._keep(snapshot)

    def save(self):
        self._save_torch(replicate=True)  # the attributes too (ObjectState.save's part)

    def _restore_model_and_objects(self):
        if self.model is not None:
            self.model.load_state_dict(self._saved_model_state, strict=getattr(
                self.model, "_hvd_sharded", None) is None)
        for k, v in self._handled.items():
            v.load_state_dict(self._saved_handled[k])
        super().restore()

    def restore(self):
        if self._sharded():
            self.optimizer._elastic_restore()
        elif self.optimizer is not None:
            # A copy: PyTorch 2's load_state_dict keeps the tensors it is given as the state,
            # which the next steps would then change under the commit.
            self.optimizer.load_state_dict(copy.deepcopy(self._saved_optimizer_state))
        if self._compressor() is not None:
            self._compressor().load_state_dict(self._saved_compression)
        self._restore_model_and_objects()

    def sync(self):
        if self._sharded():
            # The job agrees on the newest commit that some rank confirmed (a rank that failed
            # before confirming it holds it as pending, and takes it now), and each rank gets
            # its slice of it, laid out over the ranks there are now.
            self.reshard_seconds = self.optimizer._elastic_reshard()
            pending, self._pending_snapshot = self._pending_snapshot, None
            if pending is not None and pending[0] == self.optimizer.agreed_commit:
                self._keep(pending[1])
                self._restore_model_and_objects()
        if self.model is not None:
            broadcast_parameters(self._model_state(), root_rank=0)
        if self.optimizer is not None and not self._sharded():
            broadcast_optimizer_state(self.optimizer, root_rank=0)
        if self._compressor() is not None:  # rank 0's last commit (errors: the mean)
            self._compressor().load_state_dict(broadcast_object(
                self._saved_compression, 0, name="elastic.powersgd"))
        for k, v in self._handled.items():  # rank 0's, then re-partitioned for the new world
            v.load_state_dict(broadcast_object(v.state_dict(), 0, name="elastic." + k))
        super().sync()
        self._save_torch(replicate=True)  # what was synced is the point to roll back to
