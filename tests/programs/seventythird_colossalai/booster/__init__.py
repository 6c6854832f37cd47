"""colossalai.booster: the Booster, which boosts a model, optimizer, criterion, dataloader and lr
scheduler with a plugin's wrappers and saves/loads them with the plugin's checkpoint IO."""

from __future__ import annotations

from .plugin import HybridParallelPlugin, LowLevelZeroPlugin, TorchDDPPlugin

__all__ = ["Booster", "HybridParallelPlugin", "LowLevelZeroPlugin", "TorchDDPPlugin"]


class Booster:
    def __init__(self, plugin=None, mixed_precision: str | None = None) -> None:
        self.plugin = plugin
        self.mixed_precision = mixed_precision
        if mixed_precision is not None:
            plugin.set_mixed_precision(mixed_precision)
        self.checkpoint_io = plugin.get_checkpoint_io()

    def boost(self, model, optimizer=None, criterion=None, dataloader=None, lr_scheduler=None):
        return self.plugin.configure(model, optimizer, criterion, dataloader, lr_scheduler)

    def backward(self, loss, optimizer) -> None:
        optimizer.backward(loss)

    def save_model(
        self,
        model,
        checkpoint: str,
        shard: bool = False,
        size_per_shard: int = 1024,
        use_async: bool = False,
    ) -> None:
        self.checkpoint_io.save_model(
            model, checkpoint, shard=shard, size_per_shard=size_per_shard, use_async=use_async
        )

    def load_model(self, model, checkpoint: str) -> None:
        self.checkpoint_io.load_model(model, checkpoint)

    def save_optimizer(
        self, optimizer, checkpoint: str, shard: bool = False, size_per_shard: int = 1024
    ) -> None:
        self.checkpoint_io.save_optimizer(
            optimizer, checkpoint, shard=shard, size_per_shard=size_per_shard
        )

    def load_optimizer(self, optimizer, checkpoint: str) -> None:
        self.checkpoint_io.load_optimizer(optimizer, checkpoint)

    def save_lr_scheduler(self, lr_scheduler, checkpoint: str) -> None:
        self.checkpoint_io.save_lr_scheduler(lr_scheduler, checkpoint)

    def load_lr_scheduler(self, lr_scheduler, checkpoint: str) -> None:
        self.checkpoint_io.load_lr_scheduler(lr_scheduler, checkpoint)
