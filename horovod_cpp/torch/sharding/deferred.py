"""Deferred initialisation: a model built on the meta device (or under ``hvd.sharded_init()``)
is sharded without ever being whole. ``shard_model`` puts a placeholder (the parameter's shape
over one element) where each meta parameter was, packs the placeholders into flat buffers
whose slices it allocates, and then initialises the model one module at a time: the module's
own parameters made real (on the CPU), its ``reset_parameters()`` or the ``param_init_fn`` run,
this rank's part of each parameter copied into its slice, the whole tensors dropped. No rank
holds more than one module's parameters at once.

Every rank runs every module's initialisation from rank 0's random state, in the order of
``model.modules()`` (the order in which a model's modules are usually built), so the same seed
gives the same parameters as building the model whole, at any world size. A tied parameter is
initialised by the first module that holds it; a later one's initialisation still draws from
the generator (as building the model whole does), into a scratch tensor."""
import contextlib

import torch

from horovod_cpp.torch.collectives import broadcast


def _is_meta(t):
    return t is not None and getattr(t, "is_meta", False)


def is_deferred(model):
    """Whether any of the model's parameters or buffers is on the meta device."""
    return any(_is_meta(t) for t in model.parameters()) or \
        any(_is_meta(t) for t in model.buffers())


def make_placeholders(model, device):
    """Replaces every meta parameter with a placeholder of its shape, dtype and requires_grad
    on ``device`` (tied parameters stay one placeholder); the placeholders of one dtype are
    views of one element. Returns (the placeholders' ids, those elements)."""
    placeholders, bases = {}, {}
    for module in model.modules():
        for name, p in list(module._parameters.items()):
            if _is_meta(p):
                if id(p) not in placeholders:
                    if p.dtype not in bases:
                        bases[p.dtype] = torch.empty((), dtype=p.dtype, device=device)
                    placeholders[id(p)] = torch.nn.Parameter(bases[p.dtype].expand(p.shape),
                                                             requires_grad=p.requires_grad)
                module._parameters[name] = placeholders[id(p)]
    return {id(p) for p in placeholders.values()}, list(bases.values())


def _unset(t):
    """Fills a floating tensor with NaN, so that an initialisation that leaves it is seen."""
    if t.is_floating_point() or t.is_complex():
        t.fill_(float("nan"))


def _left_unset(t):
    return (t.is_floating_point() or t.is_complex()) and bool(torch.isnan(t).any())


_ONLY_OWN = ("an initialisation may set only the module's own parameters and buffers: the "
             "others are not there yet; give shard_model a param_init_fn(module) that does")


def _attention_init(module):
    """nn.MultiheadAttention as building it initialises it: its out_proj (built first, inside
    its __init__), then its own _reset_parameters (which also zeroes out_proj's bias)."""
    module.out_proj.reset_parameters()
    module._reset_parameters()


# Modules whose initialisation sets submodules' parameters too, as building them does: their
# type -> (those submodules' names, the initialisation). Initialised together, in one piece.
_TOGETHER = {torch.nn.MultiheadAttention: (("out_proj",), _attention_init)}


def _groups(model, param_init_fn):
    """[(the module whose initialisation runs, the modules it sets)] in model.modules()'
    order."""
    covered, out = set(), []
    for module in model.modules():
        if id(module) in covered:
            continue
        together = _TOGETHER.get(type(module)) if param_init_fn is None else None
        members = [module]
        if together is not None:
            members += [getattr(module, c) for c in together[0] if getattr(module, c, None)
                        is not None]
            covered.update(id(m) for m in members[1:])
        out.append((module, members))
    return out


def initialise(model, placeholders, fill, process_set, param_init_fn=None, device="cpu"):
    """Initialises the deferred parameters (``placeholders``: what make_placeholders gave) and
    the meta buffers of ``model``, module by module; ``fill(placeholder, whole)`` keeps this
    rank's part of each parameter. Collective (rank 0's random state is broadcast first)."""
    deferred, bases = placeholders
    root = process_set.ranks[0] if process_set.ranks else 0
    torch.set_rng_state(broadcast(torch.get_rng_state(), root, name="sharded3.init.rng",
                                  process_set=process_set))
    names = {id(m): n for n, m in model.named_modules()}
    done = set()
    with torch.no_grad():
        for module, members in _groups(model, param_init_fn):
            own = [(m, n, p) for m in members for n, p in m._parameters.items()
                   if p is not None and id(p) in deferred]
            bufs = [(m, n, b) for m in members for n, b in m._buffers.items() if _is_meta(b)]
            if not own and not bufs:
                continue
            where = "%s (%s)" % (names[id(module)] or "the model", type(module).__name__)
            together = _TOGETHER.get(type(module)) if len(members) > 1 else None
            init = param_init_fn or (together[1] if together else None) or \
                getattr(module, "reset_parameters", None)
            if init is None:
                raise ValueError(
                    "shard_model: %s has parameters or buffers on the meta device (%s) and no "
                    "reset_parameters(); give shard_model a param_init_fn(module) that "
                    "initialises a module's own parameters and buffers"
                    % (where, ", ".join(n for _, n, _ in own + bufs)))
            whole = []
            for m, n, p in own:
                whole.append(torch.empty(p.shape, dtype=p.dtype))
                _unset(whole[-1])
                m._parameters[n] = torch.nn.Parameter(whole[-1], requires_grad=p.requires_grad)
            for m, n, b in bufs:
                m._buffers[n] = torch.empty(b.shape, dtype=b.dtype, device=device)
                _unset(m._buffers[n])
            for base in bases:  # (written to by the initialisation: another's parameter)
                _unset(base)
            try:
                if param_init_fn is not None or together:
                    init(module)
                else:
                    init()
            except RuntimeError as e:
                # (Writing to a placeholder: "more than one element of the written-to tensor
                # refers to a single memory location".)
                raise RuntimeError("shard_model: initialising %s failed: %s (%s)"
                                   % (where, e, _ONLY_OWN)) from e
            finally:
                for m, n, p in own:
                    m._parameters[n] = p
            if any(not _left_unset(b) for b in bases if b.is_floating_point()):
                raise RuntimeError("shard_model: initialising %s set parameters of other "
                                   "modules (%s)" % (where, _ONLY_OWN))
            unset = [n for (_, n, _), t in zip(own, whole) if _left_unset(t)] + \
                [n for m, n, _ in bufs if _left_unset(m._buffers[n])]
            if unset:
                raise ValueError(
                    "shard_model: %s's %s left %s uninitialised; give shard_model a "
                    "param_init_fn(module) that initialises a module's own parameters and "
                    "buffers" % (where, "param_init_fn" if param_init_fn else
                                 "reset_parameters()", ", ".join(unset)))
            for (_, _, p), t in zip(own, whole):
                if id(p) not in done:  # (a tied one: the first module's initialisation)
                    done.add(id(p))
                    fill(p, t)
            del whole


@contextlib.contextmanager
def sharded_init():
    """Builds the modules made inside the block on the meta device, holding no memory, for
    ``hvd.shard_model`` to initialise slice by slice (see its ``param_init_fn``). The random
    state is that of the block's start again at its end: seed before the block::

        with hvd.sharded_init():
            model = Transformer(config)
        model = hvd.shard_model(model, auto_wrap={Block})"""
    state = torch.get_rng_state()
    meta = torch.device("meta")
    if hasattr(meta, "__enter__"):  # PyTorch >= 2.0: the meta device as the default
        with meta:
            try:
                yield
            finally:
                torch.set_rng_state(state)
        return
    # PyTorch 1.x: parameters and buffers moved to the meta device as modules register them
    # (each allocated on the CPU first, one at a time).
    module = torch.nn.Module
    register_parameter, register_buffer = module.register_parameter, module.register_buffer

    def on_meta_parameter(self, name, param):
        if param is not None and not _is_meta(param):
            param = torch.nn.Parameter(param.detach().to(meta), requires_grad=param.requires_grad)
        register_parameter(self, name, param)

    def on_meta_buffer(self, name, tensor, persistent=True):
        if tensor is not None and not _is_meta(tensor):
            tensor = tensor.to(meta)
        register_buffer(self, name, tensor, persistent)

    module.register_parameter, module.register_buffer = on_meta_parameter, on_meta_buffer
    try:
        yield
    finally:
        module.register_parameter, module.register_buffer = register_parameter, register_buffer
        torch.set_rng_state(state)
