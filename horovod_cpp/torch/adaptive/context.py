"""The process-wide state of adaptive training that the loaders, the epochs and the controller
share (as AdaptDL's module-level state): the epoch that ``remaining_epochs_until`` is in, each
loader's position within it, the loader being iterated, and the controller
(``AdaptiveDataParallel``) that chooses the batch configuration.

Everything that must survive an elastic reset or a checkpoint is in ``Progress``, whose
state_dict holds plain numbers (``torch.load(weights_only=True)`` loads it)."""


class Progress(object):
    """The epoch and, per loader name, (epoch, samples of that epoch consumed by completed
    steps)."""

    def __init__(self):
        self.epoch = 0
        self.positions = {}

    def position(self, name, epoch):
        """Samples of ``epoch`` that loader ``name`` has consumed (0 in a new epoch)."""
        saved = self.positions.get(name)
        return saved[1] if saved is not None and saved[0] == epoch else 0

    def advance(self, name, epoch, position):
        self.positions[name] = [int(epoch), int(position)]

    def state_dict(self):
        return {"epoch": int(self.epoch),
                "positions": {k: list(v) for k, v in sorted(self.positions.items())}}

    def load_state_dict(self, state):
        self.epoch = int(state["epoch"])
        self.positions = {str(k): [int(v[0]), int(v[1])] for k, v in state["positions"].items()}


class _Context(object):
    def __init__(self):
        self.progress = Progress()
        self.loader = None      # the AdaptiveDataLoader being iterated
        self.controller = None  # the AdaptiveDataParallel, once made
        self.controllers = 0    # made so far in this process (names their collectives)
        self.in_epochs = None   # inside remaining_epochs_until: its loop's token


CONTEXT = _Context()
