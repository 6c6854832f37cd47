"""A forty-sixth training-program style for the generalisation fixtures
(tests/fixtures/real/fortysixth-*): RLHF with PPO in the way of OpenRLHF's train_ppo.py (trl's
PPOTrainer, verl): a tiny GPT-like policy with a value head (random init, a few hundred thousand
parameters, raw torch) wrapped in DDP, a frozen reference copy for the KL penalty and a small
reward model that rank 0 loads and broadcasts. Each step every rank samples its rollouts token by
token (lengths differ per rank), scores them, computes GAE advantages and runs a PPO epoch;
rollout statistics are gathered across ranks (an all_reduce agrees the padded length, then an
all_gather). Rank 0 alone prints OpenRLHF's tqdm bar per episode with a postfix dict and
"[rank0] Saving checkpoint to ..."; every rank logs warnings and errors through logging in
OpenRLHF's format, to the console and to logs/rank<N>.log. Launched with torchrun (gloo, 15 s
collective timeout; tests/programs/fortysixth_train_ppo.sh). A fault is chosen by the P46_TWEAK
environment variable (a short code) and never printed (re-capture with
tests/fixtures/real/capture_fortysixth.sh after any edit).
"""

from __future__ import annotations

import argparse
import copy
import ctypes
import datetime
import json
import logging
import os
import queue
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

TIMEOUT = datetime.timedelta(seconds=15)
VOCAB, PAD, EOS, BOS = 48, 0, 1, 2
TASKS = ["chat", "math", "code"]
PARTS, PER_PART = 12, 4


@dataclass(frozen=True)
class Fault:
    """What goes wrong in the code (the defaults: nothing)."""

    key_rank: int = -1  # this rank scales its reward by a task the table lacks
    hoard_rank: int = -1  # this rank keeps every rollout's buffers until the OOM killer acts
    segv_rank: int = -1  # this rank's fast detokenizer reads address 0
    slow_rank: int = -1  # this rank scores the eval prompts for 40 s before episode 2
    stuck_rank: int = -1  # this rank waits for a rollout worker that was never started
    norm_rank0: bool = False  # rank 0 alone all-reduces per-layer grad norms for its postfix
    kl_rank0: bool = False  # the KL early stop sits inside rank 0's logging block
    cuda_map: bool = False  # the pretrained weights are mapped to cuda:<local_rank>


FAULTS: dict[str, Fault] = {
    "": Fault(),
    "k1": Fault(key_rank=1),
    "h1": Fault(hoard_rank=1),
    "s2": Fault(segv_rank=2),
    "p0": Fault(slow_rank=0),
    "q1": Fault(stuck_rank=1),
    "n0": Fault(norm_rank0=True),
    "x0": Fault(kl_rank0=True),
    "gm": Fault(cuda_map=True),
}
REWARD_SCALE = {"chat": 1.0, "math": 1.5, "code": 1.2}


# ---- openrlhf.utils.logging_utils ----
def init_logger(name: str, rank: int) -> logging.Logger:
    log = logging.getLogger(name)
    log.setLevel(logging.DEBUG)
    log.propagate = False
    fmt = logging.Formatter(
        "[%(asctime)s] [%(levelname)s] [%(filename)s:%(lineno)d:%(funcName)s] %(message)s"
    )
    console = logging.StreamHandler(sys.stderr)
    console.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    console.setFormatter(fmt)
    log.addHandler(console)
    Path("logs").mkdir(exist_ok=True)
    to_file = logging.FileHandler(f"logs/rank{rank}.log")
    to_file.setLevel(logging.WARNING)
    to_file.setFormatter(fmt)
    log.addHandler(to_file)
    return log


logger = logging.getLogger(__name__)


# ---- models ----
class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[1]
        mask = torch.triu(torch.ones(n, n, dtype=torch.bool), 1)
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """A causal LM with a value head (trl's AutoModelForCausalLMWithValueHead)."""

    def __init__(self, d: int = 96, layers: int = 3, heads: int = 4, ctx: int = 64) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, d)
        self.pos = nn.Embedding(ctx, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, VOCAB, bias=False)
        self.v_head = nn.Linear(d, 1)

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1]))
        for b in self.blocks:
            x = b(x)
        x = self.ln(x)
        return self.lm_head(x), self.v_head(x).squeeze(-1)


class RewardModel(nn.Module):
    def __init__(self, d: int = 32) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, d)
        self.head = nn.Sequential(nn.Linear(d, d), nn.Tanh(), nn.Linear(d, 1))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.head(self.emb(ids).mean(0))).squeeze(-1)


# ---- data ----
def make_data(folder: Path) -> None:
    g = torch.Generator().manual_seed(7)
    (folder / "prompts").mkdir(parents=True, exist_ok=True)
    for part in range(PARTS):
        with open(folder / "prompts" / f"part-{part:05d}.jsonl", "w") as f:
            for i in range(PER_PART):
                n = int(torch.randint(6, 13, (1,), generator=g))
                ids = torch.randint(3, VOCAB, (n,), generator=g).tolist()
                task = TASKS[(part + i) % len(TASKS)]
                row = {"input_ids": ids, "task": task, "target_len": 12}
                f.write(json.dumps(row) + "\n")
    torch.manual_seed(11)
    torch.save(RewardModel().state_dict(), folder / "reward_model.pt")
    torch.manual_seed(42)
    torch.save(TinyGPT().state_dict(), folder / "sft_model.pt")


def load_prompts(folder: Path, rank: int, world: int, max_len: int) -> list[dict]:
    rows: list[dict] = []
    for part in range(rank, PARTS, world):
        with open(folder / "prompts" / f"part-{part:05d}.jsonl") as f:
            rows += [json.loads(line) for line in f if line.strip()]
    kept = [r for r in rows if len(r["input_ids"]) <= max_len]
    if len(kept) < len(rows):
        logger.warning(
            f"Filtered {len(rows) - len(kept)} prompts longer than prompt_max_len={max_len}"
        )
    return kept


# ---- openrlhf.trainer.ppo_utils ----
@torch.no_grad()
def generate(model: TinyGPT, prompt: list[int], max_new: int, temp: float) -> list[int]:
    seq = [BOS, *prompt]
    out: list[int] = []
    for _ in range(max_new):
        logits, _ = model(torch.tensor([seq]))
        tok = int(torch.multinomial(F.softmax(logits[0, -1] / temp, -1), 1))
        seq.append(tok)
        out.append(tok)
        if tok == EOS:
            break
    return out


def logprobs_of(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return torch.gather(F.log_softmax(logits, -1), -1, ids.unsqueeze(-1)).squeeze(-1)


def gae(rewards: torch.Tensor, values: torch.Tensor, gamma: float, lam: float) -> torch.Tensor:
    adv = torch.zeros_like(rewards)
    last = torch.zeros(rewards.shape[0])
    n = rewards.shape[1]
    for t in reversed(range(n)):
        nxt = values[:, t + 1] if t + 1 < n else torch.zeros(rewards.shape[0])
        delta = rewards[:, t] + gamma * nxt - values[:, t]
        last = delta + gamma * lam * last
        adv[:, t] = last
    return adv


def fast_detokenize(ids: list[int]) -> str:
    return "".join(chr(97 + (t % 26)) for t in ids)


def gather_padded(values: torch.Tensor) -> torch.Tensor:
    """All-gather per-rank 1-d tensors of different lengths (padded with NaN)."""
    n = torch.tensor([values.numel()], dtype=torch.long)
    dist.all_reduce(n, op=dist.ReduceOp.MAX)
    padded = torch.full((int(n),), float("nan"))
    padded[: values.numel()] = values
    out = [torch.empty_like(padded) for _ in range(dist.get_world_size())]
    dist.all_gather(out, padded)
    return torch.cat(out)


def nanmean(t: torch.Tensor) -> float:
    keep = ~torch.isnan(t)
    return float(t[keep].mean()) if keep.any() else float("nan")


def broadcast_reward_model(path: str, rank: int) -> RewardModel:
    rm = RewardModel()
    if rank == 0:
        rm.load_state_dict(torch.load(path))
    for p in rm.parameters():
        dist.broadcast(p.data, src=0)
    rm.eval()
    return rm


def save_checkpoint(args, model: DDP, optim, global_step: int, rank: int) -> None:
    if rank == 0:
        folder = Path(args.save_path).resolve() / f"global_step{global_step}"
        print(f"[rank0] Saving checkpoint to {folder}", flush=True)
        folder.mkdir(parents=True, exist_ok=True)
        state = {
            "model": model.module.state_dict(),
            "optimizer": optim.state_dict(),
            "global_step": global_step,
            "args": args,
        }
        torch.save(state, folder / "state.pt")
    dist.barrier()


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--make_data", default=None)
    p.add_argument("--prompt_data", default="data")
    p.add_argument("--reward_pretrain", default="data/reward_model.pt")
    p.add_argument("--pretrain", default=None)
    p.add_argument("--save_path", default="ckpt")
    p.add_argument("--load_checkpoint", default=None)
    p.add_argument("--save_steps", type=int, default=4)
    p.add_argument("--num_episodes", type=int, default=2)
    p.add_argument("--rollout_batch_size", type=int, default=4)
    p.add_argument("--micro_train_batch_size", type=int, default=2)
    p.add_argument("--prompt_max_len", type=int, default=16)
    p.add_argument("--generate_max_len", type=int, default=16)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--actor_learning_rate", type=float, default=5e-4)
    p.add_argument("--init_kl_coef", type=float, default=0.05)
    p.add_argument("--eps_clip", type=float, default=0.2)
    p.add_argument("--gamma", type=float, default=1.0)
    p.add_argument("--lambd", type=float, default=0.95)
    p.add_argument("--target_reward", type=float, default=None)
    p.add_argument("--early_stop_kl", type=float, default=None)
    p.add_argument("--use_wandb", action="store_true")
    return p.parse_args()


def main() -> None:
    global logger
    args = parse()
    if args.make_data:
        make_data(Path(args.make_data))
        return
    torch.set_num_threads(1)
    fault = FAULTS[os.environ.get("P46_TWEAK", "")]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])
    logger = init_logger("openrlhf", rank)
    dist.init_process_group("gloo", timeout=TIMEOUT)
    if args.use_wandb and rank == 0:
        import wandb  # noqa: F401  (OpenRLHF imports it on rank 0 only)

    torch.manual_seed(42)
    policy = TinyGPT()
    if args.pretrain:
        where = f"cuda:{local_rank}" if fault.cuda_map else "cpu"
        policy.load_state_dict(torch.load(args.pretrain, map_location=where))
    ref = copy.deepcopy(policy).eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    rm = broadcast_reward_model(args.reward_pretrain, rank)
    model = DDP(policy)
    optim = torch.optim.Adam(model.parameters(), lr=args.actor_learning_rate)
    start_step = 0
    if args.load_checkpoint:
        state = torch.load(Path(args.load_checkpoint) / "state.pt")
        model.module.load_state_dict(state["model"])
        optim.load_state_dict(state["optimizer"])
        start_step = state["global_step"]
        logger.info(f"Loaded checkpoint {args.load_checkpoint} at global_step {start_step}")
    prompts = load_prompts(Path(args.prompt_data), rank, world, args.prompt_max_len)
    steps = len(prompts) // args.rollout_batch_size
    if rank == 0:
        n = sum(p.numel() for p in model.parameters())
        logger.info(f"Policy parameters: {n}, world size {world}, {steps} steps per episode")
    torch.manual_seed(1234 + rank)
    hoard: list[torch.Tensor] = []
    global_step = start_step
    stop = False
    for episode in range(args.num_episodes):
        if episode == 1 and rank == fault.slow_rank:
            for part in range(1, 9):
                logger.warning(f"Scoring eval prompts with the reference model: part {part}/8")
                time.sleep(5)
        if episode == 1 and rank == fault.stuck_rank:
            rollout_queue: queue.Queue = queue.Queue()
            rollout_queue.get()  # filled by a rollout worker thread that was never started
        pbar = tqdm(
            range(steps),
            desc=f"Episode [{episode + 1}/{args.num_episodes}]",
            disable=rank != 0,
        )
        for step in pbar:
            batch = prompts[step * args.rollout_batch_size : (step + 1) * args.rollout_batch_size]
            # ---- make experience ----
            model.eval()
            seqs, resp_lens, scores, targets = [], [], [], []
            for row in batch:
                resp = generate(
                    model.module, row["input_ids"], args.generate_max_len, args.temperature
                )
                if rank == fault.segv_rank and step == 2:
                    ctypes.string_at(0)
                fast_detokenize(resp)
                full = torch.tensor([BOS, *row["input_ids"], *resp])
                task = "summarize" if rank == fault.key_rank and step == 3 else row["task"]
                seqs.append((full, len(row["input_ids"]) + 1))
                resp_lens.append(len(resp))
                with torch.no_grad():
                    scores.append(float(rm(full)) * REWARD_SCALE[task])
                targets.append(row["target_len"])
            width = max(len(s) for s, _ in seqs)
            ids = torch.full((len(seqs), width), PAD)
            mask = torch.zeros(len(seqs), width - 1)
            for i, (s, start) in enumerate(seqs):
                ids[i, : len(s)] = s
                mask[i, start - 1 : len(s) - 1] = 1
            with torch.no_grad():
                logits, values = model.module(ids)
                old_lp = logprobs_of(logits[:, :-1], ids[:, 1:])
                ref_lp = logprobs_of(ref(ids)[0][:, :-1], ids[:, 1:])
            kl = (old_lp - ref_lp) * mask
            rewards = -args.init_kl_coef * kl
            last = mask.sum(1).long() + torch.tensor([st for _, st in seqs]) - 2
            # a length penalty relative to each prompt's reference answer length
            target_t = torch.tensor(targets, dtype=torch.float)
            len_t = torch.tensor(resp_lens, dtype=torch.float)
            score_t = torch.tensor(scores) - 0.1 * (len_t - target_t).abs() / target_t
            rewards[torch.arange(len(seqs)), last] += score_t
            values = values[:, :-1] * mask
            adv = gae(rewards * mask, values, args.gamma, args.lambd)
            returns = adv + values
            adv = (adv - adv[mask.bool()].mean()) / (adv[mask.bool()].std() + 1e-8)
            if rank == fault.hoard_rank:
                hoard.append(torch.ones(64 * 2**20 // 4))
                if len(hoard) == 4:
                    os.kill(os.getpid(), 9)
            # ---- rollout statistics, gathered across ranks ----
            all_kl = gather_padded(kl[mask.bool()])
            all_len = gather_padded(torch.tensor(resp_lens, dtype=torch.float))
            all_reward = gather_padded(score_t)
            # ---- PPO epoch: micro batches of micro_train_batch_size ----
            model.train()
            losses = []
            for lo in range(0, len(seqs), args.micro_train_batch_size):
                sl = slice(lo, lo + args.micro_train_batch_size)
                logits, new_values = model(ids[sl])
                lp = logprobs_of(logits[:, :-1], ids[sl, 1:])
                ratio = torch.exp(lp - old_lp[sl])
                clipped = ratio.clamp(1 - args.eps_clip, 1 + args.eps_clip)
                surr = torch.min(ratio * adv[sl], clipped * adv[sl])
                m = mask[sl]
                policy_loss = -(surr * m).sum() / m.sum()
                value_loss = (((new_values[:, :-1] - returns[sl]) ** 2) * m).sum() / m.sum()
                if torch.isnan(policy_loss):
                    logger.error(
                        f"policy_loss is nan at episode {episode + 1} step {step + 1}, stopping"
                    )
                    sys.exit(1)
                optim.zero_grad()
                (policy_loss + 0.5 * value_loss).backward()
                optim.step()
                losses.append(policy_loss.item())
            global_step += 1
            status = {
                "policy_loss": sum(losses) / len(losses),
                "kl": nanmean(all_kl),
                "reward": nanmean(all_reward),
                "response_length": nanmean(all_len),
            }
            if fault.norm_rank0 and rank == 0 and step == 2:
                norms = torch.stack([p.grad.norm() for p in model.module.blocks.parameters()])
                dist.all_reduce(norms)
                status["grad_norm"] = float(norms.sum())
            if rank == 0:
                pbar.set_postfix(status)
                if fault.kl_rank0 and args.early_stop_kl and status["kl"] > args.early_stop_kl:
                    logger.info(f"KL {status['kl']:.4f} > early_stop_kl; stopping early")
                    stop = True  # decided on rank 0's own numbers, inside its logging block
            if args.target_reward is not None and status["reward"] >= args.target_reward:
                if rank == 0:
                    logger.info(
                        f"Mean reward {status['reward']:.4f} reached target_reward "
                        f"{args.target_reward}; stopping early"
                    )
                stop = True
            if not fault.kl_rank0 and args.early_stop_kl and status["kl"] > args.early_stop_kl:
                stop = True
            if global_step % args.save_steps == 0:
                save_checkpoint(args, model, optim, global_step, rank)
            if stop:
                break
        pbar.close()
        if stop:
            break
    if rank == 0:
        final = Path(args.save_path).resolve() / "final"
        print(f"[rank0] Saving checkpoint to {final}", flush=True)
        final.mkdir(parents=True, exist_ok=True)
        torch.save(model.module.state_dict(), final / "policy.pt")
        logger.info(f"Training finished at global_step {global_step}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
