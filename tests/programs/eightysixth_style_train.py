"""An eighty-sixth training-program style for the generalisation fixtures
(tests/fixtures/real/eightysixth-*): federated averaging simulated with torch.distributed in the
way of FedML's and the research repos' cross-silo simulations, one file (linked into each run's
folder as fedavg.py). `python fedavg.py --world N --port PORT [flags]` starts N processes with
torch.multiprocessing.spawn; each joins gloo itself (tcp://127.0.0.1:PORT, a 15 s timeout). Rank 0
is the server, ranks 1..N-1 are the clients (silos). Every communication round the server
broadcasts the global model's flat state (every state_dict tensor as float, then the round and a
stop flag), every client loads it, trains --epochs local epochs on its own non-IID shard
(data/client_<k>.pt, Dirichlet label skew, written by `fedavg.py --prepare`) and returns its
flat state and its sample count to the server with dist.gather; the server averages the states
weighted by the sample counts (shaoxiongji/federated-learning's weighted FedAvg: a deep copy of
the first state scaled in place, the others added), evaluates on data/test.pt and logs FedML's
stats dict. A per-silo config file config/client_<k>.json, when present, overrides that client's
arguments (cross-silo deployments give every silo its own config). Logging as FedML's:
'[FedML-Server(0) @device-id-0] [Sat, 05 Dec 2026 12:00:01] [INFO] [fedavg.py:85:train]
################Communication round : 3', the clients '[FedML-Client(2) @device-id-2] ...'.
A fault in the code is chosen by the TQ_CASE environment variable (a letter, the round and the
rank it hits) and never printed (re-capture with tests/fixtures/real/capture_eightysixth.sh after
any edit).
"""

from __future__ import annotations

import argparse
import copy
import ctypes
import json
import logging
import os
import queue
import random
import signal
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

FEATURES = 20
CLASSES = 4
ROWS = 600
TEST_ROWS = 200


def prepare(world: int, alpha: float, seed: int) -> None:
    """Synthetic 4-class data (a Gaussian blob a class), split over the clients with FedML's
    Dirichlet label skew ('hetero' partition) without its minimum-size retry, and a test set."""
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    centers = 0.3 * torch.randn(CLASSES, FEATURES, generator=g)
    y = torch.randint(0, CLASSES, (ROWS + TEST_ROWS,), generator=g)
    x = centers[y] + torch.randn(ROWS + TEST_ROWS, FEATURES, generator=g)
    clients = world - 1
    parts: list[list[int]] = [[] for _ in range(clients)]
    for c in range(CLASSES):
        ids = (y[:ROWS] == c).nonzero().flatten()
        ids = ids[torch.randperm(len(ids), generator=g)]
        p = torch.distributions.Dirichlet(torch.full((clients,), alpha)).sample()
        cuts = (torch.cumsum(p, 0) * len(ids)).long()[:-1]
        for k, part in enumerate(torch.tensor_split(ids, cuts)):
            parts[k] += part.tolist()
    os.makedirs("data", exist_ok=True)
    for k, ids in enumerate(parts, start=1):
        t = torch.tensor(ids, dtype=torch.long)
        torch.save({"x": x[t].clone(), "y": y[t].clone()}, f"data/client_{k}.pt")
        print(f"client {k}: {len(ids)} samples, labels {torch.bincount(y[t], minlength=4)}")
    torch.save({"x": x[ROWS:].clone(), "y": y[ROWS:].clone()}, "data/test.pt")


class LogisticMLP(nn.Module):
    def __init__(self, hidden: int, norm: str, log_softmax: bool) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Linear(FEATURES, hidden)]
        if norm == "bn":
            layers.append(nn.BatchNorm1d(hidden))
        layers += [nn.ReLU(), nn.Linear(hidden, CLASSES)]
        self.net = nn.Sequential(*layers)
        self.log_softmax = log_softmax

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.net(x)
        if self.log_softmax:
            out = F.log_softmax(out)
        return out


def create_model(args: argparse.Namespace) -> nn.Module:
    return LogisticMLP(args.hidden_dim, args.norm, args.log_softmax)


def flatten(model: nn.Module) -> torch.Tensor:
    return torch.cat([v.detach().float().flatten() for v in model.state_dict().values()])


def unflatten(model: nn.Module, flat: torch.Tensor) -> dict[str, torch.Tensor]:
    out, o = {}, 0
    for k, v in model.state_dict().items():
        out[k] = flat[o : o + v.numel()].view_as(v).to(v.dtype).clone()
        o += v.numel()
    return out


def fault() -> tuple[str, int, int]:
    """(fault letter, round, rank) from TQ_CASE ("", -1, -1 where none)."""
    case = os.environ.get("TQ_CASE", "")
    if not case:
        return "", -1, -1
    return case[0], int(case[1]), int(case[2])


def setup_logging(rank: int) -> logging.Logger:
    role = f"FedML-Server({rank})" if rank == 0 else f"FedML-Client({rank})"
    logging.basicConfig(
        level=logging.INFO,
        format=f"[{role} @device-id-{rank}] [%(asctime)s] [%(levelname)s] "
        "[%(filename)s:%(lineno)d:%(funcName)s] %(message)s",
        datefmt="%a, %d %b %Y %H:%M:%S",
    )
    return logging.getLogger()


def loss_fn(args: argparse.Namespace):
    return F.nll_loss if args.log_softmax else F.cross_entropy


def local_train(model, loader, args, rnd, rank, hoard) -> tuple[float, float]:
    """FedML's MyModelTrainer.train: E local epochs of SGD on the client's shard."""
    what, when, who = fault()
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, weight_decay=args.wd)
    epoch_loss = []
    correct = seen = 0
    for epoch in range(args.epochs):
        if args.slow_client == rank:
            logging.info(
                "client %d (simulated slow device, %dx): local epoch %d/%d",
                rank,
                args.slowdown,
                epoch + 1,
                args.epochs,
            )
        batch_loss = []
        for x, y in loader:
            if what == "m" and rank == who and rnd >= when:
                hoard.append(torch.ones(64 << 20, dtype=torch.uint8))  # 64 MiB a batch
                if len(hoard) >= 6:
                    os.kill(os.getpid(), signal.SIGKILL)  # the host's OOM killer
            if what == "n" and rank == who and rnd == when:
                ctypes.memmove(ctypes.c_void_p(8), ctypes.c_char_p(b"mixup"), 5)
            if args.slow_client == rank:
                time.sleep(args.slowdown * 0.05)
            opt.zero_grad()
            out = model(x)
            loss = loss_fn(args)(out, y)
            loss.backward()
            opt.step()
            batch_loss.append(loss.item())
            correct += (out.argmax(1) == y).sum().item()
            seen += len(y)
        epoch_loss.append(sum(batch_loss) / len(batch_loss))
    return sum(epoch_loss) / len(epoch_loss), correct / max(seen, 1)


def aggregate(w_locals: list[tuple[int, dict[str, torch.Tensor]]]) -> dict[str, torch.Tensor]:
    """Weighted FedAvg over (sample number, state) of every client."""
    training_num = sum(n for n, _ in w_locals)
    weights = [n / training_num for n, _ in w_locals]
    w_avg = copy.deepcopy(w_locals[0][1])
    for k in w_avg.keys():  # noqa: SIM118
        w_avg[k] *= weights[0]
        for i in range(1, len(w_locals)):
            w_avg[k] += w_locals[i][1][k] * weights[i]
    return w_avg


def evaluate(model, test, args) -> dict[str, float]:
    model.eval()
    with torch.no_grad():
        out = model(test["x"])
        loss = loss_fn(args)(out, test["y"]).item()
        acc = (out.argmax(1) == test["y"]).float().mean().item()
    return {"test_acc": round(acc, 4), "test_loss": round(loss, 4)}


def server(args, world: int, log: logging.Logger) -> None:
    model = create_model(args)
    n_params = sum(p.numel() for p in model.parameters())
    log.info("model = %s, %d parameters", type(model).__name__, n_params)
    log.info("client_num_in_total = %d, client_num_per_round = %d", world - 1, world - 1)
    test = torch.load("data/test.pt")
    flat = flatten(model)
    stop = 0
    rnd = 0
    final = {}
    while True:
        if rnd == args.comm_round:
            stop = 1
        packet = torch.cat([flat, torch.tensor([float(rnd), float(stop)])])
        dist.broadcast(packet, src=0)
        if stop:
            break
        log.info("################Communication round : %d", rnd)
        log.info("client_indexes = %s", list(range(1, world)))
        mine = torch.zeros(len(flat) + 1)
        gather_list = [torch.zeros(len(flat) + 1) for _ in range(world)]
        dist.gather(mine, gather_list=gather_list, dst=0)
        w_locals = []
        for k in range(1, world):
            n = int(gather_list[k][-1].item())
            w_locals.append((n, unflatten(model, gather_list[k][:-1])))
        model.load_state_dict(aggregate(w_locals))
        flat = flatten(model)
        if rnd % args.frequency_of_the_test == 0 or rnd == args.comm_round - 1:
            final = evaluate(model, test, args)
            log.info("################local_test_on_all_clients : %d", rnd)
            log.info(final)
            if args.target_acc is not None and final["test_acc"] >= args.target_acc:
                log.info(
                    "target test accuracy %.2f reached at round %d (test_acc %.4f), stopping",
                    args.target_acc,
                    rnd,
                    final["test_acc"],
                )
                stop = 1
        rnd += 1
    os.makedirs("checkpoints", exist_ok=True)
    torch.save(model.state_dict(), "checkpoints/global_model.pt")
    log.info(
        "training finished after %d rounds, test_acc %s, global model saved to "
        "checkpoints/global_model.pt",
        rnd,
        final.get("test_acc"),
    )


def client(args, rank: int, log: logging.Logger) -> None:
    path = f"config/client_{rank}.json"
    if os.path.exists(path):  # the silo's own config
        with open(path) as f:
            for key, value in json.load(f).items():
                setattr(args, key, value)
        log.info("loaded silo config %s", path)
    what, when, who = fault()
    model = create_model(args)
    shard = torch.load(f"data/client_{rank}.pt")
    n = len(shard["y"])
    log.info("client_idx = %d, local_sample_number = %d, local epochs = %s", rank, n, args.epochs)
    loader = DataLoader(
        TensorDataset(shard["x"], shard["y"]), batch_size=args.batch_size, shuffle=True
    )
    numel = len(flatten(model))
    rng = random.Random(args.seed * 1000 + rank)
    hoard: list[torch.Tensor] = []
    while True:
        packet = torch.zeros(numel + 2)
        dist.broadcast(packet, src=0)
        rnd, stop = int(packet[-2].item()), int(packet[-1].item())
        if stop:
            break
        if args.copy_weights:  # noqa: SIM108
            global_flat = torch.tensor(packet[:-2])
        else:
            global_flat = packet[:-2]
        model.load_state_dict(unflatten(model, global_flat))
        if args.client_dropout and rng.random() < args.client_dropout:
            log.info("client %d drops out of round %d (simulated unavailability)", rank, rnd)
            continue
        if what == "h" and rank == who and rnd == when:
            masks: queue.Queue = queue.Queue()  # filled by the key-exchange thread (never started)
            masks.get()  # this round's secure-aggregation mask
        log.info("#######training########### round_idx = %d", rnd)
        loss, acc = local_train(model, loader, args, rnd, rank, hoard)
        log.info(
            "client_idx = %d, round %d, train_loss = %.4f, train_acc = %.4f", rank, rnd, loss, acc
        )
        payload = torch.cat([flatten(model), torch.tensor([float(n)])])
        dist.gather(payload, dst=0)
        if args.local_target is not None and acc >= args.local_target:
            log.info(
                "client %d converged (train_acc %.4f >= %.2f), leaving the federation",
                rank,
                acc,
                args.local_target,
            )
            break
    log.info("client %d finished", rank)


def run(rank: int, world: int, args: argparse.Namespace) -> None:
    """One spawned process: join the group, then serve or train."""
    torch.set_num_threads(1)
    log = setup_logging(rank)
    torch.manual_seed(args.seed + rank)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{args.port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=15),
    )
    torch.manual_seed(args.seed)
    if rank == 0:
        server(args, world, log)
    else:
        client(args, rank, log)
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description="FedAvg cross-silo simulation")
    p.add_argument("--prepare", action="store_true")
    p.add_argument("--world", type=int, default=3, help="server + clients")
    p.add_argument("--port", type=int, default=29500)
    p.add_argument("--partition-alpha", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--comm_round", type=int, default=6)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--wd", type=float, default=0.0)
    p.add_argument("--hidden_dim", type=int, default=32)
    p.add_argument("--norm", default="none")
    p.add_argument("--log_softmax", action="store_true")
    p.add_argument("--copy_weights", action="store_true")
    p.add_argument("--frequency_of_the_test", type=int, default=1)
    p.add_argument("--target_acc", type=float, default=None)
    p.add_argument("--local_target", type=float, default=None)
    p.add_argument("--client_dropout", type=float, default=0.0)
    p.add_argument("--slow_client", type=int, default=-1)
    p.add_argument("--slowdown", type=int, default=1)
    args = p.parse_args()
    if args.prepare:
        prepare(args.world, args.partition_alpha, args.seed)
        return
    mp.spawn(run, args=(args.world, args), nprocs=args.world, join=True)


if __name__ == "__main__":
    main()
