"""The learning-rate scaling rules at AdaptDL's path (``adaptdl.torch.scaling_rules``); they
live in ``horovod_cpp.adaptive.scaling``, framework-free."""
from horovod_cpp.adaptive.scaling import (AdamScale, AdaScale, LEGWScale, LinearScale,
                                          ScalingRule, SqrtScale)

ScalingRuleBase = ScalingRule  # AdaptDL's name of the base class

__all__ = ["ScalingRuleBase", "AdaScale", "AdamScale", "LinearScale", "SqrtScale", "LEGWScale"]
