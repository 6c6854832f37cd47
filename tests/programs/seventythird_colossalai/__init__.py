"""A plain-torch re-creation of the parts of ColossalAI that its examples use, for the
seventythird-* generalisation fixtures (ColossalAI is not installed here): launch_from_torch,
get_dist_logger, DistCoordinator, a Booster with the torch_ddp, low_level_zero and
hybrid_parallel plugins (gloo on CPU), sharded checkpoints and the `colossalai run` command. The
capture copies this folder as `colossalai` onto the runs' PYTHONPATH."""

from .initialize import launch, launch_from_torch

__version__ = "0.4.6"
__all__ = ["launch", "launch_from_torch"]
