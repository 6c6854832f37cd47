# %% [markdown]
# Tiny image classifier, trained with Accelerate from a notebook (converted to a script).
# A fault for the test set is picked by $NBK_CASE (a code this notebook never prints).

# %%
import os
import sys
import time
from datetime import timedelta

import torch
from accelerate import Accelerator, notebook_launcher
from accelerate.utils import InitProcessGroupKwargs, set_seed
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from tqdm.auto import tqdm

# %%
config = {
    "lr": 3e-3,
    "num_epochs": 3,
    "seed": 42,
    "batch_size": 16,
    "image_size": 8,
    "n_train": 288,
}
print("   key         value")
for i, (k, v) in enumerate(config.items()):
    print(f"{i}  {k:<11} {v}")

# %%
CASE = os.environ.pop("NBK_CASE", "")
PORT = int(sys.argv[1]) if len(sys.argv) > 1 else 29500


def case_rank():
    return int(CASE[1:]) if len(CASE) > 1 and CASE[1:].isdigit() else -1


class TinyNet(nn.Module):
    def __init__(self, size):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.head = nn.Linear(8 * size * size, 4)

    def forward(self, x):
        return self.head(torch.relu(self.conv(x)).flatten(1))


def make_data(size, n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, size, size, generator=g)
    y = (x[:, 0].mean((1, 2)) > 0).long() + 2 * (x[:, 1].mean((1, 2)) > 0).long()
    return TensorDataset(x, y)


# %%
def training_function(config):
    kwargs = InitProcessGroupKwargs(backend="gloo", timeout=timedelta(seconds=15))
    accelerator = Accelerator(cpu=True, kwargs_handlers=[kwargs])
    set_seed(config["seed"])
    rank = accelerator.process_index
    faulty = rank == case_rank()
    kind = CASE[:1]
    if kind == "m" and faulty:
        import timm  # noqa: F401  (augmentations)
    if kind == "f" and faulty:
        open("data/labels.csv").read()  # noqa: SIM115
    train_ds = make_data(config["image_size"], config["n_train"], 0)
    if kind == "u" and faulty:
        train_ds = TensorDataset(*train_ds[: config["n_train"] // 2])
    eval_ds = make_data(config["image_size"], 96, 1)
    train_dl = DataLoader(train_ds, batch_size=config["batch_size"], shuffle=True)
    eval_dl = DataLoader(eval_ds, batch_size=config["batch_size"])
    model = TinyNet(config["image_size"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=config["lr"])
    if kind == "u":  # per-rank shards prepared by hand: no split by accelerate
        model, optimizer = accelerator.prepare(model, optimizer)
    else:
        model, optimizer, train_dl, eval_dl = accelerator.prepare(
            model, optimizer, train_dl, eval_dl
        )
    if kind == "r":
        state = torch.load("checkpoints/best.pt", map_location="cuda:0")
        accelerator.unwrap_model(model).load_state_dict(state)
    if kind == "w":
        state = torch.load("checkpoints/best.pt")
    accelerator.print(
        f"Training on {accelerator.num_processes} processes, {len(train_dl)} steps per epoch"
    )
    history = {}
    best = 0.0
    for epoch in range(config["num_epochs"]):
        model.train()
        bar = tqdm(train_dl, disable=not accelerator.is_local_main_process, desc=f"epoch {epoch}")
        for step, (x, y) in enumerate(bar):
            if epoch == 0 and step == 5 and faulty:
                if kind == "k":
                    history[f"step_{step}"]["loss"]
                if kind == "o":
                    hoard = [torch.ones(16 << 20) for _ in range(4)]  # noqa: F841
                    os.kill(os.getpid(), 9)
                if kind == "s":
                    import ctypes

                    ctypes.string_at(0)
                if kind == "d":
                    time.sleep(40)
                if kind == "h":
                    while True:
                        time.sleep(1)
            if epoch == 0 and step == 5 and kind == "c" and rank == 0:
                norms = torch.stack([p.detach().norm() for p in model.parameters()])
                accelerator.reduce(norms, reduction="mean")
            if kind == "n" and faulty and epoch == 1:
                x = x * float("nan")
            out = model(x)
            loss = nn.functional.cross_entropy(out, y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            if not torch.isfinite(loss):
                print(f"Loss is {loss.item()}, stopping training")
                raise SystemExit(1)
            bar.set_postfix(loss=f"{loss.item():.4f}")
        model.eval()
        correct = total = 0
        for x, y in eval_dl:
            with torch.no_grad():
                pred = model(x).argmax(-1)
            pred, y = accelerator.gather_for_metrics((pred, y))
            correct += (pred == y).sum().item()
            total += y.numel()
        acc = correct / total
        accelerator.print(f"epoch {epoch}: eval accuracy {acc:.3f}")
        accelerator.save_state(f"state/epoch_{epoch}")
        if kind == "e" and rank == 0 and epoch == 0:
            accelerator.print("accuracy good enough, stopping")
            return
        if kind == "a":
            flag = torch.tensor([1.0 if acc >= best else 0.0])
            if accelerator.reduce(flag, reduction="sum").item() == 0 and epoch > 0:
                accelerator.print("no improvement on any process, stopping early")
                break
            best = max(best, acc) + 1.0
        best = max(best, acc)
    accelerator.wait_for_everyone()
    accelerator.print(f"done, best accuracy {best:.3f}")
    accelerator.end_training()


# %%
notebook_launcher(
    training_function, args=(config,), num_processes=3, mixed_precision="no", use_port=PORT
)
