"""Adaptive training's framework-free parts: the goodput model (``goodput``), shared by the
training side (``horovod_cpp.torch.adaptive``) and a cluster scheduler."""
