"""log_utils.py of the sixtieth style (tests/programs/sixtieth_style_train.py), as PyTorch's
examples/distributed/tensor_parallelism/log_utils.py has it: one logger for the script, and
rank_log, which logs on global rank 0 only."""

import logging

logging.basicConfig(format="%(asctime)s %(message)s", level=logging.INFO)


def get_logger():
    return logging.getLogger(__name__)


def rank_log(_rank, logger, msg):
    """helper function to log only on global rank 0"""
    if _rank == 0:
        logger.info(f" {msg}")
