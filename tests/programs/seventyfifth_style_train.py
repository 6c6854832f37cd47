"""A seventy-fifth training-program style for the generalisation fixtures
(tests/fixtures/real/seventyfifth-*): a click-through recommender trained with torch.distributed.rpc
in the way of PyTorch's RPC examples (examples/distributed/rpc/parameter_server/rpc_parameter_server.py
and the "Combining Distributed DataParallel with Distributed RPC Framework" tutorial,
examples/distributed/rpc/ddp_rpc/main.py). Rank 0 is the parameter server, worker "ps", which
holds the embedding table (an EmbeddingBag, the recommender's remote embedding) and does nothing
but serve RPCs until rpc.shutdown(); ranks 1..N-1 are the trainers "trainer1".."trainerN-1", each
with a TrainerNet whose forward looks its items up on the server (rpc_sync through an RRef made
by rpc.remote, the examples' remote_method/call_method helpers) and whose dense head is a local
DDP model over a process group of the trainers only (dist.new_group), trained with
dist_autograd.context(), dist_autograd.backward and a DistributedOptimizer over the server's RRefs
and the head's. Launched with torchrun (RANK, WORLD_SIZE, MASTER_ADDR/PORT from it):
init_process_group("gloo", timeout 15 s) and init_rpc(name, rank, world_size,
TensorPipeRpcBackendOptions(rpc_timeout=..., init_method="env://")). Every process prints as the
examples do (plain print: "Rank 1 training batch 5 loss 0.69", "Training done for epoch 0"); each
trainer reads its own click-log shard data/part-0000K.csv (label, then the item ids it saw),
evaluates on data/valid.csv after each epoch, and trainer1 saves a checkpoint (the server's table
through an RPC, the head locally). A fault in the code is chosen by the RECQ_CASE environment
variable (a short code) and never printed (re-capture with
tests/fixtures/real/capture_seventyfifth.sh after any edit).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import sys
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.distributed.autograd as dist_autograd
import torch.distributed.rpc as rpc
from torch import nn, optim
from torch.distributed.optim import DistributedOptimizer
from torch.distributed.rpc import RRef
from torch.nn.parallel import DistributedDataParallel as DDP

NUM_EMBEDDINGS = 100
EMBEDDING_DIM = 16

CASE = os.environ.get("RECQ_CASE", "")
# what goes wrong in the code (the default: nothing)
FIND_UNUSED = CASE == "w"  # find_unused_parameters=True, an optimizer without a functional twin
FLOAT_IDS_RANK = 2 if CASE == "x2" else -1  # this trainer hashes new items into float ids
HOARD_PS = CASE == "k0"  # the server keeps every lookup for its "hot items" statistics
SLOW_PS = CASE == "s0"  # the server rebalances its table inside a lookup
STUCK_RANK = 3 if CASE == "h3" else -1  # this trainer waits for a prefetch never started
OWN_STOP = CASE == "e1"  # trainer1 alone checks the target, on its own training loss
PS_NAME = "parameter_server" if CASE == "n" else "ps"  # what the trainers call the server
SEGV_RANK = 1 if CASE == "v1" else -1  # this trainer's native hashing fast path reads NULL
COUNT_ON_RANK = 1 if CASE == "c1" else -1  # this trainer alone all-reduces the clicks seen
NO_SHUTDOWN_RANK = 3 if CASE == "q3" else -1  # this trainer leaves without rpc.shutdown()


# --------- Helper Methods --------------------
# On the local node, call a method with first arg as the value held by the RRef. Other args are
# passed in as arguments to the function called.
def call_method(method, rref, *args, **kwargs):
    return method(rref.local_value(), *args, **kwargs)


# Given an RRef, return the result of calling the passed in method on the value held by the
# RRef. This call is done on the remote node that owns the RRef.
def remote_method(method, rref, *args, **kwargs):
    args = [method, rref] + list(args)  # noqa: RUF005 (as the example writes it)
    return rpc.rpc_sync(rref.owner(), call_method, args=args, kwargs=kwargs)


# --------- Parameter Server --------------------
class ParameterServer(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.EmbeddingBag(NUM_EMBEDDINGS, EMBEDDING_DIM, mode="sum")
        self.lookups = 0
        self.hot = []
        self.lock = threading.Lock()

    def forward(self, indices, offsets):
        with self.lock:
            self.lookups += 1
            if HOARD_PS:
                # "hot item" statistics: every lookup's bags are kept, never trimmed
                self.hot.append(torch.ones(8 * 1024 * 1024))
                if len(self.hot) >= 40:
                    os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does
            if SLOW_PS and self.lookups == 70:
                for k in range(1, 9):
                    print(f"Rebalancing embedding table shards ({k}/8)...", flush=True)
                    time.sleep(5)
        return self.emb(indices, offsets)

    # Use dist autograd to retrieve gradients accumulated for this model.
    # Primarily used for verification.
    def get_dist_gradients(self, cid):
        grads = dist_autograd.get_gradients(cid)
        # This output is forwarded over RPC, which as of 1.5.0 only accepts CPU tensors.
        cpu_grads = {}
        for k, v in grads.items():
            k_cpu, v_cpu = k.to("cpu"), v.to("cpu")
            cpu_grads[k_cpu] = v_cpu
        return cpu_grads

    # Wrap local parameters in a RRef. Needed for building the DistributedOptimizer which
    # optimizes parameters remotely.
    def get_param_rrefs(self):
        param_rrefs = [rpc.RRef(param) for param in self.emb.parameters()]
        return param_rrefs

    def save(self, path):
        torch.save(self.emb.state_dict(), path)
        return path


param_server = None
global_lock = threading.Lock()


def get_parameter_server():
    """Returns a singleton parameter server to all trainer processes"""
    global param_server
    # Ensure that we get only one handle to the ParameterServer.
    with global_lock:
        if not param_server:
            # construct it once
            param_server = ParameterServer()
        return param_server


def run_parameter_server(rank, world_size, rpc_timeout):
    # The parameter server just acts as a host for the model and responds to requests from
    # trainers. rpc.shutdown() will wait for all workers to complete by default, which in this
    # case means that the parameter server will wait for all trainers to complete, and then exit.
    print("PS master initializing RPC")
    options = rpc.TensorPipeRpcBackendOptions(rpc_timeout=rpc_timeout, init_method="env://")
    rpc.init_rpc(name="ps", rank=rank, world_size=world_size, rpc_backend_options=options)
    print("RPC initialized! Running parameter server...")
    rpc.shutdown()
    print("RPC shutdown on parameter server.")


# --------- Trainers --------------------
class TrainerNet(nn.Module):
    """The remote embedding on the parameter server, then a local dense head under DDP."""

    def __init__(self, group):
        super().__init__()
        self.param_server_rref = rpc.remote(PS_NAME, get_parameter_server)
        head = nn.Sequential(nn.Linear(EMBEDDING_DIM, 8), nn.ReLU(), nn.Linear(8, 1))
        self.fc = DDP(head, process_group=group, find_unused_parameters=FIND_UNUSED)

    def get_global_param_rrefs(self):
        remote_params = remote_method(ParameterServer.get_param_rrefs, self.param_server_rref)
        return remote_params + [RRef(p) for p in self.fc.parameters()]

    def forward(self, indices, offsets):
        emb = remote_method(ParameterServer.forward, self.param_server_rref, indices, offsets)
        return self.fc(emb).squeeze(1)


def read_clicks(path):
    """A click log: 'label,item item item' a line; returns (bags, labels)."""
    bags, labels = [], []
    with open(path) as f:
        for line in f:
            label, items = line.strip().split(",")
            labels.append(float(label))
            bags.append([int(i) for i in items.split()])
    return bags, labels


def hash_items(bag, rank, step):
    """Item ids of a bag; the float path is the 'new category' hashing of a later change."""
    if rank == SEGV_RANK and step == 14:
        ctypes.string_at(0)  # the native fast path of the feature hasher dereferences NULL
    if rank == FLOAT_IDS_RANK and step == 12:
        return [i * 1.0 for i in bag]
    return bag


def get_next_batch(bags, labels, batch_size, rank, step0):
    for b in range(len(bags) // batch_size):
        chunk = range(b * batch_size, (b + 1) * batch_size)
        ids, offsets = [], []
        for j in chunk:
            offsets.append(len(ids))
            ids.extend(hash_items(bags[j], rank, step0 + b))
        yield (
            torch.tensor(ids),
            torch.tensor(offsets, dtype=torch.long),
            torch.tensor([labels[j] for j in chunk]),
        )


def evaluate(net, bags, labels):
    criterion = nn.BCEWithLogitsLoss()
    total, n = 0.0, 0
    with dist_autograd.context():
        for indices, offsets, target in get_next_batch(bags, labels, 32, -1, -1):
            with torch.no_grad():
                total += criterion(net(indices, offsets), target).item()
            n += 1
    return total / max(n, 1)


def run_trainer(args, rank, world_size, group):
    print(f"Worker rank {rank} initializing RPC")
    options = rpc.TensorPipeRpcBackendOptions(rpc_timeout=args.rpc_timeout, init_method="env://")
    rpc.init_rpc(
        name=f"trainer{rank}", rank=rank, world_size=world_size, rpc_backend_options=options
    )
    print(f"Worker {rank} done initializing RPC")
    torch.manual_seed(0)
    bags, labels = read_clicks(os.path.join(args.data_dir, f"part-{rank - 1:05d}.csv"))
    vbags, vlabels = read_clicks(os.path.join(args.data_dir, "valid.csv"))
    net = TrainerNet(group)
    param_rrefs = net.get_global_param_rrefs()
    if FIND_UNUSED:
        opt = DistributedOptimizer(optim.NAdam, param_rrefs, lr=0.01)
    else:
        opt = DistributedOptimizer(optim.SGD, param_rrefs, lr=args.lr)
    criterion = nn.BCEWithLogitsLoss()
    per_epoch = len(bags) // args.batch_size
    stopped = False
    for epoch in range(args.epochs):
        epoch_loss = 0.0
        for i, (indices, offsets, target) in enumerate(
            get_next_batch(bags, labels, args.batch_size, rank, epoch * per_epoch)
        ):
            if rank == STUCK_RANK and epoch == 1 and i == 3:
                threading.Event().wait()  # set by a prefetch thread that was never started
            with dist_autograd.context() as cid:
                model_output = net(indices, offsets)
                loss = criterion(model_output, target)
                epoch_loss += loss.item() / per_epoch
                if i % 5 == 0:
                    print(f"Rank {rank} training batch {i} loss {loss.item()}")
                dist_autograd.backward(cid, [loss])
                # Ensure that dist autograd ran successfully and gradients were returned.
                assert (
                    remote_method(ParameterServer.get_dist_gradients, net.param_server_rref, cid)
                    != {}
                )
                opt.step(cid)
        print(f"Training done for epoch {epoch}")
        val = evaluate(net, vbags, vlabels)
        agreed = torch.tensor([val])
        dist.all_reduce(agreed, group=group)
        val = agreed.item() / (world_size - 1)
        print(f"Rank {rank} epoch {epoch} validation loss {val:.4f}")
        if rank == 1:
            clicks = torch.tensor([float(len(bags) * (epoch + 1))])
            if rank == COUNT_ON_RANK:
                dist.all_reduce(clicks, group=group)
            os.makedirs(args.save_dir, exist_ok=True)
            path = os.path.join(args.save_dir, f"epoch_{epoch}")
            remote_method(ParameterServer.save, net.param_server_rref, path + "_emb.pt")
            torch.save(net.fc.module.state_dict(), path + "_head.pt")
            print(f"Saved checkpoint to {path} ({int(clicks.item())} clicks seen)")
        if OWN_STOP:  # trainer1 decides on its own loss of the epoch; the others never check
            val = epoch_loss if rank == 1 else float("inf")
        if args.target_loss is not None and val < args.target_loss:
            print(f"Loss {val:.4f} is below the target {args.target_loss}, stopping early")
            stopped = True
            break
    print("Training complete!" if not stopped else "Training stopped early.")
    if rank == NO_SHUTDOWN_RANK:
        sys.exit(0)  # the results are saved; nothing left to do here
    rpc.shutdown()


def main():
    parser = argparse.ArgumentParser(description="Parameter-Server RPC based training")
    parser.add_argument(
        "--world_size", type=int, default=None, help="Total number of participating processes."
    )
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--rpc_timeout", type=float, default=15)
    parser.add_argument("--target_loss", type=float, default=None)
    parser.add_argument("--data_dir", default="data")
    parser.add_argument("--save_dir", default="checkpoints")
    args = parser.parse_args()
    rank = int(os.environ["RANK"])
    world_size = args.world_size or int(os.environ["WORLD_SIZE"])
    dist.init_process_group(
        backend="gloo", rank=rank, world_size=world_size, timeout=timedelta(seconds=15)
    )
    # the trainers' DDP group
    group = dist.new_group(list(range(1, world_size)), timeout=timedelta(seconds=15))
    if rank == 0:
        run_parameter_server(rank, world_size, args.rpc_timeout)
    else:
        run_trainer(args, rank, world_size, group)


def make_data(folder):
    """Click logs: a user likes the items of one of two halves of the catalogue."""
    os.makedirs(folder, exist_ok=True)
    g = torch.Generator().manual_seed(1)

    def write(path, n):
        with open(path, "w") as f:
            for _ in range(n):
                label = int(torch.randint(0, 2, (1,), generator=g))
                k = int(torch.randint(2, 6, (1,), generator=g))
                lo = 0 if label else NUM_EMBEDDINGS // 2
                items = torch.randint(lo, lo + NUM_EMBEDDINGS // 2, (k,), generator=g)
                f.write(f"{label}," + " ".join(str(int(i)) for i in items) + "\n")

    for part in range(3):
        write(os.path.join(folder, f"part-{part:05d}.csv"), 160)
    write(os.path.join(folder, "valid.csv"), 64)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--make_data":
        make_data(sys.argv[2])
    else:
        main()
