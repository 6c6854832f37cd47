"""A small in-process helper for people who write raw DDP: the four things whose absence turns
into the classic multi-rank failures.

    from ddpdoctor import instrument

    model = DistributedDataParallel(net)
    state = instrument.load_checkpoint("ckpt.pt")         # onto this rank's device
    for step, batch in enumerate(loader):
        loss = model(batch).mean()
        loss.backward()
        instrument.report_unused_parameters(model, step=step)  # names them before DDP fails
        optimizer.step(); optimizer.zero_grad()
        instrument.heartbeat(step)                           # progress for `ddpdoctor run`
        if instrument.agree_to_stop(no_improvement, step=step):  # every rank stops together
            break
    instrument.finish()                                      # barrier + destroy_process_group

Importing this module imports no torch; each helper imports it when called. `heartbeat` and
`report_unused_parameters` never raise into the training loop; `agree_to_stop` and `finish` are
collectives (every rank calls them at the same point) and fail as collectives do when a peer is
gone; `load_checkpoint` raises CheckpointError naming the rank, host and path.
"""

from __future__ import annotations

from ddpdoctor.probe.checkpoint import CheckpointError, load_checkpoint, rank_device
from ddpdoctor.probe.heartbeat import beat as heartbeat
from ddpdoctor.probe.stop import agree_to_stop, finish
from ddpdoctor.probe.unused import report_unused_parameters, unused_parameters

__all__ = [
    "CheckpointError",
    "agree_to_stop",
    "finish",
    "heartbeat",
    "load_checkpoint",
    "rank_device",
    "report_unused_parameters",
    "unused_parameters",
]
