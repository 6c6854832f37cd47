"""A thirty-ninth training-program style: a fine-tuning "recipe" in the way of torchtune
(`tune run --nproc_per_node N full_finetune_distributed --config ...`, which wraps torchrun): a
recipe class with setup()/train()/cleanup(), a resolved config logged as YAML at start-up,
logging with Python's default format ('INFO:recipes.full_finetune:...') on rank 0 only, one
tqdm bar on rank 0 whose description is 'EPOCH|STEP|Loss: L', a checkpoint per epoch, a final
evaluation after training, and things that run after training's end: an atexit hook that
flushes metrics, a metrics-upload thread, a final barrier before the export. gloo with a 15 s
timeout. One fault per run, chosen by $T39_CASE (an opaque code the program never prints).
"""

from __future__ import annotations

import atexit
import ctypes
import logging
import os
import threading
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

CASE = os.environ.get("T39_CASE", "")
OUT = Path(os.environ.get("T39_OUT", "output"))
log = logging.getLogger("recipes.full_finetune")

CONFIG = {
    "model": {"_component_": "models.tiny_decoder", "dim": 16, "vocab": 32},
    "optimizer": {"_component_": "torch.optim.AdamW", "lr": 2e-3},
    "batch_size": 4,
    "epochs": 3,
    "max_steps_per_epoch": 6,
    "output_dir": str(OUT),
    "metric_logger": {"_component_": "metrics.DiskLogger", "log_dir": str(OUT / "logs")},
}


def flush_metrics() -> None:
    """atexit: the disk logger writes what it buffered."""
    if CASE == "a1":
        # the log folder was removed by the cleanup step before the hook runs
        (OUT / "logs-archived" / f"metrics_{dist_rank()}.txt").write_text("done\n")
    if CASE == "g2" and dist_rank() == 1:
        ctypes.string_at(0)  # a native extension's finaliser dereferences freed memory


def dist_rank() -> int:
    return int(os.environ.get("RANK", "0"))


def upload_forever(stop: threading.Event) -> None:
    """Pushes metrics to a tracking server every few seconds until told to stop."""
    while not stop.is_set():
        time.sleep(2.0)


class FullFinetuneRecipeDistributed:
    def __init__(self) -> None:
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        self.is_rank_zero = self.rank == 0
        self.stop_uploads = threading.Event()

    def setup(self) -> None:
        if self.is_rank_zero:
            log.info(
                "Running FullFinetuneRecipeDistributed with resolved config:\n\n%s\n",
                to_yaml(CONFIG),
            )
        torch.manual_seed(1234 + self.rank)
        self.model = DDP(
            torch.nn.Sequential(
                torch.nn.Embedding(32, 16), torch.nn.Flatten(), torch.nn.Linear(16 * 8, 32)
            )
        )
        if self.is_rank_zero:
            log.info("Model is initialized with precision torch.float32.")
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=2e-3)
        if self.is_rank_zero:
            log.info("Optimizer is initialized.")
            log.info("Loss is initialized.")
        gen = torch.Generator().manual_seed(7 + self.rank)
        self.tokens = torch.randint(0, 32, (24, 8), generator=gen)
        self.labels = torch.randint(0, 32, (24,), generator=gen)
        if self.is_rank_zero:
            log.info("Dataset and Sampler are initialized.")
        if self.is_rank_zero and CASE == "u4":
            threading.Thread(
                target=upload_forever, args=(self.stop_uploads,), name="uploader"
            ).start()
            log.info("Metric uploads started.")

    def train(self) -> None:
        steps = CONFIG["max_steps_per_epoch"]
        assert isinstance(steps, int)
        for epoch in range(3):
            bar = tqdm(total=steps, disable=not self.is_rank_zero)
            for step in range(steps):
                if CASE == "m7" and self.rank == 2 and epoch == 1 and step == 3:
                    # a layer-wise decay path only this rank's parameter groups take
                    scale = self.optimizer.param_groups[0]["lr_scale"]
                    print(scale)
                i = step * 4
                logits = self.model(self.tokens[i : i + 4])
                loss = F.cross_entropy(logits, self.labels[i : i + 4])
                self.optimizer.zero_grad()
                loss.backward()
                self.optimizer.step()
                bar.update(1)
                bar.set_description(
                    f"{epoch + 1}|{epoch * steps + step + 1}|Loss: {loss.item():.4f}"
                )
            bar.close()
            self.save_checkpoint(epoch)

    def save_checkpoint(self, epoch: int) -> None:
        if not self.is_rank_zero:
            return
        folder = OUT / f"epoch_{epoch}"
        folder.mkdir(parents=True, exist_ok=True)
        torch.save(self.model.module.state_dict(), folder / "model.pt")
        size = (folder / "model.pt").stat().st_size / 1e9
        log.info("Model checkpoint of size %.2f GB saved to %s", size, folder / "model.pt")

    def evaluate(self) -> None:
        metrics = {"loss": 0.0, "acc": 0.0}
        with torch.no_grad():
            logits = self.model(self.tokens[:4])
            metrics["loss"] = float(F.cross_entropy(logits, self.labels[:4]))
        if CASE == "k6" and self.rank == 1:
            del metrics["acc"]  # this rank's metric set has no accuracy after a refactor
        value = torch.tensor([metrics["loss"], metrics["acc"]])
        dist.all_reduce(value)
        if self.is_rank_zero:
            log.info(
                "Final evaluation: loss %.4f, acc %.4f",
                value[0] / self.world,
                value[1] / self.world,
            )

    def export(self) -> None:
        if CASE == "k5" and self.rank == 1:
            # the final full model is gathered in host memory on this rank and the kernel kills it
            hog = [torch.ones(1 << 20) for _ in range(32)]
            os.kill(os.getpid(), 9)
            print(len(hog))
        if CASE == "b3":
            if self.is_rank_zero:
                torch.save(self.model.module.state_dict(), OUT / "final.pt")
                dist.barrier()  # "so that nobody exits before the export is written"
            return
        dist.barrier()
        if self.is_rank_zero:
            torch.save(self.model.module.state_dict(), OUT / "final.pt")
            log.info("Exported the final model to %s", OUT / "final.pt")

    def cleanup(self) -> None:
        dist.destroy_process_group()


def to_yaml(config: dict[str, object], indent: int = 0) -> str:
    lines = []
    for key, value in config.items():
        if isinstance(value, dict):
            lines.append(" " * indent + f"{key}:")
            lines.append(to_yaml(value, indent + 2))
        else:
            lines.append(" " * indent + f"{key}: {value}")
    return "\n".join(lines)


def recipe_main() -> None:
    logging.basicConfig(level=logging.INFO)
    dist.init_process_group("gloo", timeout=timedelta(seconds=15))
    OUT.mkdir(parents=True, exist_ok=True)
    atexit.register(flush_metrics)
    recipe = FullFinetuneRecipeDistributed()
    recipe.setup()
    start = time.perf_counter()
    recipe.train()
    if recipe.is_rank_zero:
        log.info("Training completed in %.1f s", time.perf_counter() - start)
    recipe.evaluate()
    recipe.export()
    recipe.cleanup()


if __name__ == "__main__":
    recipe_main()
