"""An eighty-first training-program style for the generalisation fixtures
(tests/fixtures/real/eightyfirst-*): online knowledge distillation with a teacher/student
process split over point-to-point communication, written with plain torch.distributed in the
way of hand-rolled distillation and actor/learner setups (no Ray, no RPC). The last rank runs a
frozen teacher language model loaded from --teacher-ckpt; every other rank is a student, a
smaller language model trained with DDP over `dist.new_group` of the student ranks only, on its
own shard of token ids (data/student_<k>.pt). For each batch a student sends the batch's shape
(a 2-element header) and then its token ids to the teacher (`dist.send`), and receives the
teacher's logits back (`dist.recv`); the teacher posts an `irecv` of the next header of every
student and serves them in turn. The loss is alpha * T^2 * KL(student || teacher at temperature
T) + (1 - alpha) * cross-entropy. A student that has no more batches sends the header (0, 0);
the teacher leaves when every student has. At the end the students all-reduce their mean
kd_loss in their group, student 0 saves checkpoints/student_final.pt, and every rank meets in
a barrier of the whole world.

Started as such scripts are: `torchrun --nproc_per_node=N --master_port=PORT kd_online.py
--teacher-ckpt checkpoints/teacher.pt --data-dir data [flags]` (N-1 students, 1 teacher), after
`python kd_online.py --prepare ...` wrote the shards and the teacher checkpoint. Every rank
logs to stdout with logging's '%(asctime)s %(levelname)s %(message)s', the students as
'student 1/2 | step 40 | kd_loss 0.812 | ce_loss 2.31 | teacher latency 12.3 ms', the teacher as
'teacher served 120 batches (queue 0)'. A fault in the code is chosen by $TQ_CASE (a short
code, never printed); the others are in what a run is given (re-capture with
tests/fixtures/real/capture_eightyfirst.sh after any edit).
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import os
import signal
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset

CASE = os.environ.get("TQ_CASE", "")
log = logging.getLogger("kd")


def case(code: str, rank: int) -> bool:
    """The hidden fault switch: code letter plus the rank it hits ("" never)."""
    return f"{code}{rank}" == CASE


class TinyLM(nn.Module):
    """Embedding, a causal mixing of the previous tokens, an MLP per layer, a tied head."""

    def __init__(self, vocab: int, dim: int, layers: int, context: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.context = context
        self.mix = nn.ModuleList(nn.Linear(dim * context, dim) for _ in range(layers))
        self.mlp = nn.ModuleList(
            nn.Sequential(
                nn.LayerNorm(dim), nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim)
            )
            for _ in range(layers)
        )
        self.norm = nn.LayerNorm(dim)
        nn.init.normal_(self.embed.weight, std=0.02)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        for mix, mlp in zip(self.mix, self.mlp, strict=True):
            past = [F.pad(h, (0, 0, k, 0))[:, : h.shape[1]] for k in range(self.context)]
            h = h + torch.tanh(mix(torch.cat(past, dim=-1)))
            h = h + mlp(h)
        return self.norm(h) @ self.embed.weight.t()


class Shard(Dataset):
    def __init__(self, path: Path, seq_len: int) -> None:
        blob = torch.load(path)
        self.ids = blob["ids"]
        self.append_eos = bool(blob.get("append_eos", False))
        self.eos = int(blob.get("eos_id", 1))
        self.seq_len = seq_len
        self.kill_at = -1

    def __len__(self) -> int:
        return self.ids.shape[0]

    def __getitem__(self, k: int) -> torch.Tensor:
        if k == self.kill_at:  # the worker is killed where its memory is charged (host limit)
            os.kill(os.getpid(), signal.SIGKILL)
        return self.ids[k, : self.seq_len + 1]


def prepare(args: argparse.Namespace) -> None:
    """Synthetic token shards from a Markov chain, and a frozen teacher checkpoint."""
    g = torch.Generator().manual_seed(1234)
    vocab = args.vocab
    trans = torch.softmax(torch.randn(vocab, vocab, generator=g) * 3.0, dim=-1)
    data = Path(args.data_dir)
    data.mkdir(parents=True, exist_ok=True)
    for k in range(args.num_students):
        n = args.sequences
        seqs = torch.empty(n, args.seq_len + 1, dtype=torch.long)
        seqs[:, 0] = torch.randint(2, vocab, (n,), generator=g)
        for t in range(1, args.seq_len + 1):
            seqs[:, t] = torch.multinomial(trans[seqs[:, t - 1]], 1, generator=g).squeeze(1)
        torch.save({"ids": seqs, "vocab": vocab, "eos_id": 1}, data / f"student_{k}.pt")
    torch.manual_seed(99)
    teacher = TinyLM(vocab, 64, 2)
    with torch.no_grad():  # a teacher that knows the chain: its head biased to the transitions
        opt = torch.optim.Adam(teacher.parameters(), lr=3e-3)
        for _ in range(150):
            ids = torch.randint(2, vocab, (16, args.seq_len + 1), generator=g)
            for t in range(1, args.seq_len + 1):
                ids[:, t] = torch.multinomial(trans[ids[:, t - 1]], 1, generator=g).squeeze(1)
            with torch.enable_grad():
                loss = F.cross_entropy(teacher(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten())
                opt.zero_grad()
                loss.backward()
                opt.step()
    ckpt = Path(args.teacher_ckpt)
    ckpt.parent.mkdir(parents=True, exist_ok=True)
    torch.save(
        {"model": teacher.state_dict(), "config": {"vocab": vocab, "dim": 64, "layers": 2}}, ckpt
    )


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def run_teacher(args: argparse.Namespace, rank: int, world: int) -> None:
    students = list(range(world - 1))
    ckpt = torch.load(args.teacher_ckpt, map_location="cpu")
    cfg = ckpt["config"]
    teacher = TinyLM(cfg["vocab"], cfg["dim"], cfg["layers"])
    teacher.load_state_dict(ckpt["model"])
    teacher.eval().requires_grad_(False)
    n_params = sum(p.numel() for p in teacher.parameters())
    log.info(
        "teacher | loaded %s (vocab %d, %d layers, %.2fM params), serving %d students",
        args.teacher_ckpt,
        cfg["vocab"],
        cfg["layers"],
        n_params / 1e6,
        len(students),
    )
    if case("s", rank):  # calibrating the temperature on held-out batches, slowly
        for k in range(8):
            time.sleep(5.0)
            log.info(
                "teacher | calibrating temperature: batch %d/8 (T=%.2f)", k + 1, args.temperature
            )
    headers = {s: torch.zeros(2, dtype=torch.long) for s in students}
    pending = {s: dist.irecv(headers[s], src=s) for s in students}
    active = list(students)
    served = 0
    per_student = dict.fromkeys(students, 0)
    cache: list[torch.Tensor] = []
    base_rss = rss_mb()
    while active:
        for s in list(active):
            pending[s].wait()
            b, t = headers[s].tolist()
            if b == 0:
                active.remove(s)
                log.info("teacher | student %d finished after %d batches", s, per_student[s])
                continue
            ids = torch.empty(b, t, dtype=torch.long)
            dist.recv(ids, src=s)
            with torch.no_grad():
                logits = teacher(ids)
            if args.cache_logits:
                if case("b", rank):  # every batch's logits kept at full precision, all layers
                    cache.append(torch.ones(4 * 2**20, dtype=torch.float32))
                    if rss_mb() - base_rss > 480:
                        os.kill(os.getpid(), signal.SIGKILL)
                else:
                    cache.append(logits.to(torch.float16))
            dist.send(logits.contiguous(), dst=s)
            served += 1
            per_student[s] += 1
            pending[s] = dist.irecv(headers[s], src=s)
            if (
                args.cache_logits
                and args.cache_flush_every
                and len(cache) >= args.cache_flush_every
            ):
                flush_cache(args, cache, served, rank)
            if served % args.teacher_log_every == 0:
                queue = sum(1 for r in students if r in active and pending[r].is_completed())
                log.info("teacher served %d batches (queue %d)", served, queue)
    log.info("teacher | all %d students finished, served %d batches", len(students), served)


def flush_cache(
    args: argparse.Namespace, cache: list[torch.Tensor], served: int, rank: int
) -> None:
    out = Path(args.cache_logits)
    out.mkdir(parents=True, exist_ok=True)
    block = torch.stack(cache)  # [n, b, t, vocab]
    if case("f", rank):  # vocabulary-major layout for the offline reader
        block = block.transpose(2, 3)
    flat = block.view(block.shape[0], -1)
    torch.save(flat, out / f"logits_{served:06d}.pt")
    log.info("teacher | flushed %d cached batches to %s", len(cache), out)
    cache.clear()


def run_student(args: argparse.Namespace, rank: int, world: int) -> None:
    n_students = world - 1
    teacher_rank = world - 1
    group = dist.new_group(ranks=list(range(n_students)))
    tag = f"student {rank}/{n_students}"
    shard_path = Path(args.data_dir) / f"student_{rank}.pt"
    shard = Shard(shard_path, args.seq_len)
    if case("k", rank):
        shard.kill_at = len(shard) // 2
    gen = torch.Generator().manual_seed(17 + rank)
    loader = DataLoader(
        shard,
        batch_size=args.batch_size,
        shuffle=True,
        generator=gen,
        num_workers=1,
        drop_last=True,
    )
    torch.manual_seed(5)
    model = TinyLM(args.vocab, 32, 1)
    ddp = DDP(model, process_group=group, find_unused_parameters=args.find_unused)
    opt = torch.optim.AdamW(ddp.parameters(), lr=args.lr)
    log.info(
        "%s | %d sequences in %s, %d batches per epoch, teacher on rank %d",
        tag,
        len(shard),
        shard_path,
        len(loader),
        teacher_rank,
    )
    step = 0
    stop = False
    recent: list[float] = []
    temp = args.temperature
    for epoch in range(args.epochs):
        lock = shard_path.with_name(shard_path.name + ".lock")
        while lock.exists():  # the shard is being rewritten by the tokenizer job
            time.sleep(0.5)
        for batch in loader:
            inputs, targets = batch[:, :-1], batch[:, 1:]
            header = torch.tensor(inputs.shape, dtype=torch.long)
            if shard.append_eos:
                eos = torch.full((inputs.shape[0], 1), shard.eos, dtype=torch.long)
                inputs = torch.cat([inputs, eos], dim=1)
            t0 = time.perf_counter()
            dist.send(header, dst=teacher_rank)
            dist.send(inputs.contiguous(), dst=teacher_rank)
            if args.prefetch:  # the next batch goes out while the teacher computes this one
                dist.send(header, dst=teacher_rank)
            t_logits = torch.empty(inputs.shape[0], inputs.shape[1], args.vocab)
            dist.recv(t_logits, src=teacher_rank)
            latency = (time.perf_counter() - t0) * 1e3
            logits = ddp(inputs)
            kd = F.kl_div(
                F.log_softmax(logits.flatten(0, 1) / temp, dim=-1),
                F.log_softmax(t_logits.flatten(0, 1) / temp, dim=-1),
                reduction=args.kd_reduction,
                log_target=True,
            ) * (temp**2)
            ce = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
            loss = args.alpha * kd + (1 - args.alpha) * ce
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
            recent.append(kd.item())
            if case("n", rank) and step == 15:  # the packing extension reads a null buffer
                ctypes.memmove(ctypes.create_string_buffer(64), 8, 64)
            if step % args.log_every == 0:
                log.info(
                    "%s | step %d | kd_loss %.3f | ce_loss %.2f | teacher latency %.1f ms",
                    tag,
                    step,
                    kd.item(),
                    ce.item(),
                    latency,
                )
                local_kd = sum(recent[-args.log_every :]) / args.log_every
                mean_kd = torch.tensor([local_kd])
                if case("w", rank):  # the mean over every rank, for the progress line
                    dist.all_reduce(mean_kd)
                else:
                    dist.all_reduce(mean_kd, group=group)
                mean_kd /= n_students
                watched = local_kd if case("l", rank) else mean_kd.item()
                if args.stop_kd_loss and watched < args.stop_kd_loss:
                    log.info(
                        "%s | kd_loss %.3f below --stop-kd-loss %.3f, stopping at step %d",
                        tag,
                        watched,
                        args.stop_kd_loss,
                        step,
                    )
                    stop = True
                    break
        if stop:
            break
        log.info("%s | epoch %d done, %d steps", tag, epoch, step)
    dist.send(torch.zeros(2, dtype=torch.long), dst=teacher_rank)
    final = torch.tensor([sum(recent) / max(len(recent), 1)])
    dist.all_reduce(final, group=group)
    final /= n_students
    log.info("%s | done: %d steps, mean kd_loss %.3f over students", tag, step, final.item())
    if rank == 0:
        Path("checkpoints").mkdir(exist_ok=True)
        torch.save({"model": model.state_dict(), "step": step}, "checkpoints/student_final.pt")
        log.info("%s | saved checkpoints/student_final.pt", tag)


def main() -> None:
    p = argparse.ArgumentParser(
        description="online knowledge distillation, teacher on the last rank"
    )
    p.add_argument("--prepare", action="store_true")
    p.add_argument("--num-students", type=int, default=2)
    p.add_argument("--sequences", type=int, default=160)
    p.add_argument("--teacher-ckpt", default="checkpoints/teacher.pt")
    p.add_argument("--data-dir", default="data")
    p.add_argument("--vocab", type=int, default=128)
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--temperature", type=float, default=2.0)
    p.add_argument("--alpha", type=float, default=0.5)
    p.add_argument("--kd-reduction", default="batchmean")
    p.add_argument("--find-unused", action="store_true")
    p.add_argument("--prefetch", action="store_true")
    p.add_argument("--stop-kd-loss", type=float, default=0.0)
    p.add_argument("--cache-logits", default="")
    p.add_argument("--cache-flush-every", type=int, default=40)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--teacher-log-every", type=int, default=20)
    p.add_argument("--timeout", type=float, default=15.0)
    args = p.parse_args()
    if args.prepare:
        prepare(args)
        return
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == world - 1:
        run_teacher(args, rank, world)
    else:
        run_student(args, rank, world)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
