"""colossalai.logging: the distributed logger (a RichHandler when rich is installed, as here)."""

from __future__ import annotations

import inspect
import logging

import torch.distributed as dist

_FORMAT = "colossalai - %(name)s - %(levelname)s: %(message)s"


class DistributedLogger:
    __instances: dict[str, DistributedLogger] = {}

    @staticmethod
    def get_instance(name: str) -> DistributedLogger:
        if name in DistributedLogger.__instances:
            return DistributedLogger.__instances[name]
        return DistributedLogger(name=name)

    def __init__(self, name: str) -> None:
        formatter = logging.Formatter(_FORMAT)
        try:
            from rich.logging import RichHandler

            handler: logging.Handler = RichHandler(
                show_path=False, markup=False, rich_tracebacks=True
            )
        except ImportError:
            handler = logging.StreamHandler()
        handler.setFormatter(formatter)
        self._name = name
        self._logger = logging.getLogger(name)
        self._logger.setLevel(logging.INFO)
        self._logger.addHandler(handler)
        self._logger.propagate = False
        DistributedLogger.__instances[name] = self
        self.rank = dist.get_rank() if dist.is_initialized() else 0

    @staticmethod
    def __get_call_info() -> tuple[str, int, str]:
        stack = inspect.stack()
        # stack[1] is info/warning, stack[2] its caller
        return stack[2][1], stack[2][2], stack[2][3]

    def _log(self, level: str, message: str, ranks: list[int] | None = None) -> None:
        if ranks is None or self.rank in ranks:
            getattr(self._logger, level)(message)

    def info(self, message: str, ranks: list[int] | None = None) -> None:
        prefix = "{}:{} {}".format(*self.__get_call_info())
        self._log("info", prefix, ranks)
        self._log("info", message, ranks)

    def warning(self, message: str, ranks: list[int] | None = None) -> None:
        prefix = "{}:{} {}".format(*self.__get_call_info())
        self._log("warning", prefix, ranks)
        self._log("warning", message, ranks)

    def error(self, message: str, ranks: list[int] | None = None) -> None:
        prefix = "{}:{} {}".format(*self.__get_call_info())
        self._log("error", prefix, ranks)
        self._log("error", message, ranks)


def get_dist_logger(name: str = "colossalai") -> DistributedLogger:
    return DistributedLogger.get_instance(name=name)
