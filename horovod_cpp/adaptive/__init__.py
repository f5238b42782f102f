"""Adaptive training's framework-free parts: the goodput model (``goodput``), the noise scale
(``noise``), the scaling rules (``scaling``) and the online throughput fit (``throughput``), shared by the
training side (``horovod_cpp.torch.adaptive``) and a cluster scheduler."""
