"""Adaptive training's framework-free parts, shared by the training side
(``horovod_cpp.torch.adaptive``) and a cluster scheduler: the goodput model (``goodput``), the
gradient noise scale (``noise``), the learning-rate scaling rules (``scaling``) and the online
throughput fit (``throughput``)."""
