"""A ninety-second training-program style for the generalisation fixtures
(tests/fixtures/real/ninetysecond-*): reinforcement learning with an IMPALA / TorchBeast
actor-learner split, the way the distributed forks of facebookresearch/torchbeast's
monobeast.py are written. Every torchrun rank is a learner (a DDP process, gloo on CPU, 15 s
collective timeout) that owns a few actor processes started with torch.multiprocessing's spawn
context; the actors run a tiny gridworld written in numpy (walls from the learner's own level
file data/levels_<rank>.npy, written by `monobeast.py --prepare`), step a shared-memory copy of
the policy, and write unrolls into shared-memory buffers whose indices travel through a
free_queue and a full_queue (ctx.SimpleQueue). The learner takes batch_size full buffers,
computes the V-trace loss, DDP all-reduces the gradients, returns the buffers to the
free_queue and copies the weights into the actors' model; every log_every updates the episode
returns are all-reduced and learner 0 logs TorchBeast's 'Steps N @ X SPS. Loss L. Stats: ...'.
Logging as TorchBeast's ('[%(levelname)s:%(process)d %(module)s:%(lineno)d %(asctime)s]
%(message)s', level 0, set at import so the spawned actors log alike: 'Actor 3 started.').
Launched with `torchrun --nproc_per_node=N --master_port=PORT monobeast.py --num_actors A ...`.
A fault in the code is chosen by the TQ_CASE environment variable (a letter and a rank) and
never printed (re-capture with tests/fixtures/real/capture_ninetysecond.sh after any edit).
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import logging
import os
import signal
import time
import timeit
import traceback

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

logging.basicConfig(
    format=("[%(levelname)s:%(process)d %(module)s:%(lineno)d %(asctime)s] %(message)s"),
    level=0,
)

SIZE = 5  # the gridworld is SIZE x SIZE, the goal in the far corner
NUM_ACTIONS = 4
MOVES = np.array([[-1, 0], [1, 0], [0, -1], [0, 1]])
OBS = 3 * SIZE * SIZE


def fault() -> tuple[str, int]:
    """(letter, rank) of the fault in the code, from TQ_CASE ("", -1 where none)."""
    case = os.environ.get("TQ_CASE", "")
    if not case:
        return "", -1
    return case[0], int(case[1:] or 0)


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description="PyTorch Scalable Agent (distributed learners)")
    p.add_argument("--prepare", action="store_true", help="write the level files and exit")
    p.add_argument("--num_learners", type=int, default=2, help="level files to write (--prepare)")
    p.add_argument("--num_levels", type=int, default=64)
    p.add_argument("--wall_density", type=float, default=0.2)
    p.add_argument("--levels", default="data", help="folder of levels_<rank>.npy")
    p.add_argument("--xpid", default="monobeast-dist", help="experiment id")
    p.add_argument("--savedir", default="logs/torchbeast")
    p.add_argument("--num_actors", type=int, default=4, help="actors over all learners")
    p.add_argument("--total_steps", type=int, default=24000, help="environment steps to train")
    p.add_argument("--batch_size", type=int, default=4, help="learner batch size")
    p.add_argument("--unroll_length", type=int, default=20)
    p.add_argument("--num_buffers", type=int, default=None, help="buffers per learner")
    p.add_argument("--max_episode_steps", type=int, default=40)
    p.add_argument("--mmap_levels", action="store_true", help="memory-map the level files")
    p.add_argument("--target_return", type=float, default=None, help="stop at this return")
    p.add_argument("--log_every", type=int, default=10, help="updates between log lines")
    p.add_argument("--entropy_cost", type=float, default=0.01)
    p.add_argument("--baseline_cost", type=float, default=0.5)
    p.add_argument("--discounting", type=float, default=0.95)
    p.add_argument("--learning_rate", type=float, default=2e-3)
    p.add_argument("--grad_norm_clipping", type=float, default=40.0)
    return p.parse_args()


def prepare(folder: str, learners: int, n: int, density: float) -> None:
    """Each learner's own set of random wall layouts (start and goal corners always free)."""
    rng = np.random.default_rng(92)
    os.makedirs(folder, exist_ok=True)
    for rank in range(learners):
        walls = (rng.random((n, SIZE, SIZE)) < density).astype(np.uint8)
        walls[:, 0, 0] = 0
        walls[:, SIZE - 1, SIZE - 1] = 0
        np.save(os.path.join(folder, f"levels_{rank}.npy"), walls)


class GridWorld:
    """Walk to the goal corner: reward 1 there, -0.01 a step, at most max_steps steps."""

    def __init__(self, levels: torch.Tensor, seed: int, max_steps: int) -> None:
        self.levels = levels
        self.rng = np.random.default_rng(seed)
        self.max_steps = max_steps
        self.episode_return = 0.0
        self.episode_step = 0

    def _reset(self) -> None:
        self.walls = self.levels[self.rng.integers(len(self.levels))].numpy()
        while True:  # a random free start cell
            self.pos = self.rng.integers(0, SIZE, 2)
            if not self.walls[tuple(self.pos)] and tuple(self.pos) != (SIZE - 1, SIZE - 1):
                break

    def _obs(self) -> torch.Tensor:
        frame = np.zeros((3, SIZE, SIZE), dtype=np.float32)
        frame[0] = self.walls
        frame[1][tuple(self.pos)] = 1.0
        frame[2][SIZE - 1, SIZE - 1] = 1.0
        return torch.from_numpy(frame.reshape(-1))

    def _output(self, reward: float, done: bool, action: int) -> dict[str, torch.Tensor]:
        return dict(
            frame=self._obs(),
            reward=torch.tensor(reward),
            done=torch.tensor(done),
            episode_return=torch.tensor(self.episode_return),
            episode_step=torch.tensor(self.episode_step),
            last_action=torch.tensor(action),
        )

    def initial(self) -> dict[str, torch.Tensor]:
        self._reset()
        return self._output(0.0, False, 0)

    def step(self, action: int) -> dict[str, torch.Tensor]:
        nxt = np.clip(self.pos + MOVES[action], 0, SIZE - 1)
        if not self.walls[tuple(nxt)]:
            self.pos = nxt
        self.episode_step += 1
        at_goal = tuple(self.pos) == (SIZE - 1, SIZE - 1)
        reward = 1.0 if at_goal else -0.01
        self.episode_return += reward
        done = at_goal or self.episode_step >= self.max_steps
        out = self._output(reward, done, action)
        if done:  # the returned output still carries the finished episode's return
            self.episode_return, self.episode_step = 0.0, 0
            self._reset()
            out["frame"] = self._obs()
        return out


class AtariNet(nn.Module):  # the name the torchbeast forks keep for any policy network
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Sequential(nn.Linear(OBS + NUM_ACTIONS, 64), nn.ReLU(), nn.Linear(64, 64))
        self.policy = nn.Linear(64, NUM_ACTIONS)
        self.baseline = nn.Linear(64, 1)

    def forward(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        x = inputs["frame"]
        T, B = x.shape[:2]
        last = F.one_hot(inputs["last_action"].view(T * B), NUM_ACTIONS).float()
        core = F.relu(self.fc(torch.cat([x.reshape(T * B, -1), last], dim=-1)))
        logits = self.policy(core)
        baseline = self.baseline(core)
        if self.training:
            action = torch.multinomial(F.softmax(logits, dim=1), num_samples=1)
        else:
            action = torch.argmax(logits, dim=1)
        return dict(
            policy_logits=logits.view(T, B, NUM_ACTIONS),
            baseline=baseline.view(T, B),
            action=action.view(T, B),
        )


def create_buffers(flags: argparse.Namespace, num_buffers: int) -> dict[str, list[torch.Tensor]]:
    T = flags.unroll_length
    specs = dict(
        frame=dict(size=(T + 1, OBS), dtype=torch.float32),
        reward=dict(size=(T + 1,), dtype=torch.float32),
        done=dict(size=(T + 1,), dtype=torch.bool),
        episode_return=dict(size=(T + 1,), dtype=torch.float32),
        episode_step=dict(size=(T + 1,), dtype=torch.int32),
        last_action=dict(size=(T + 1,), dtype=torch.int64),
        policy_logits=dict(size=(T + 1, NUM_ACTIONS), dtype=torch.float32),
        baseline=dict(size=(T + 1,), dtype=torch.float32),
        action=dict(size=(T + 1,), dtype=torch.int64),
    )
    buffers: dict[str, list[torch.Tensor]] = {key: [] for key in specs}
    for _ in range(num_buffers):
        for key in buffers:
            buffers[key].append(torch.empty(**specs[key]).share_memory_())
    return buffers


def act(
    flags: argparse.Namespace,
    actor_index: int,
    levels_path: str,
    free_queue: mp.SimpleQueue,
    full_queue: mp.SimpleQueue,
    model: nn.Module,
    buffers: dict[str, list[torch.Tensor]],
    unroll_length: int,
) -> None:
    try:
        logging.info("Actor %i started.", actor_index)
        torch.set_num_threads(1)
        levels = np.load(levels_path, mmap_mode="r" if flags.mmap_levels else None)
        env = GridWorld(torch.from_numpy(levels), actor_index, flags.max_episode_steps)
        env_output = {k: v.view(1, 1, *v.shape) for k, v in env.initial().items()}
        with torch.no_grad():
            agent_output = model(env_output)
        while True:
            index = free_queue.get()
            if index is None:
                break
            for key in env_output:
                buffers[key][index][0, ...] = env_output[key]
            for key in agent_output:
                buffers[key][index][0, ...] = agent_output[key]
            for t in range(unroll_length):
                with torch.no_grad():
                    agent_output = model(env_output)
                out = env.step(int(agent_output["action"].item()))
                env_output = {k: v.view(1, 1, *v.shape) for k, v in out.items()}
                for key in env_output:
                    buffers[key][index][t + 1, ...] = env_output[key]
                for key in agent_output:
                    buffers[key][index][t + 1, ...] = agent_output[key]
            full_queue.put(index)
    except KeyboardInterrupt:
        pass  # Return silently.
    except Exception as e:
        logging.error("Exception in worker process %i", actor_index)
        traceback.print_exc()
        print()
        raise e


def get_batch(
    flags: argparse.Namespace,
    free_queue: mp.SimpleQueue,
    full_queue: mp.SimpleQueue,
    buffers: dict[str, list[torch.Tensor]],
    recycle: bool,
) -> dict[str, torch.Tensor]:
    indices = [full_queue.get() for _ in range(flags.batch_size)]
    batch = {key: torch.stack([buffers[key][m] for m in indices], dim=1) for key in buffers}
    if recycle:
        for m in indices:
            free_queue.put(m)
    return batch


def vtrace(
    behavior_logits: torch.Tensor,
    target_logits: torch.Tensor,
    actions: torch.Tensor,
    discounts: torch.Tensor,
    rewards: torch.Tensor,
    values: torch.Tensor,
    bootstrap_value: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """V-trace targets and policy-gradient advantages (Espeholt et al. 2018), rho and c at 1."""
    with torch.no_grad():
        target_lp = torch.log_softmax(target_logits, -1).gather(-1, actions[..., None])[..., 0]
        behavior_lp = torch.log_softmax(behavior_logits, -1).gather(-1, actions[..., None])
        rhos = torch.exp(target_lp - behavior_lp[..., 0])
        clipped = torch.clamp(rhos, max=1.0)
        values_t_plus_1 = torch.cat([values[1:], bootstrap_value[None]], dim=0)
        deltas = clipped * (rewards + discounts * values_t_plus_1 - values)
        acc = torch.zeros_like(bootstrap_value)
        result = []
        for t in reversed(range(discounts.shape[0])):
            acc = deltas[t] + discounts[t] * clipped[t] * acc
            result.append(acc)
        vs = torch.stack(result[::-1]) + values
        vs_t_plus_1 = torch.cat([vs[1:], bootstrap_value[None]], dim=0)
        pg_advantages = clipped * (rewards + discounts * vs_t_plus_1 - values)
    return vs, pg_advantages


def learn(
    flags: argparse.Namespace,
    model: DDP,
    actor_model: nn.Module,
    batch: dict[str, torch.Tensor],
    optimizer: torch.optim.Optimizer,
) -> float:
    learner_outputs = model(batch)
    bootstrap_value = learner_outputs["baseline"][-1]
    batch = {key: tensor[1:] for key, tensor in batch.items()}
    learner_outputs = {key: tensor[:-1] for key, tensor in learner_outputs.items()}
    rewards = torch.clamp(batch["reward"], -1, 1)
    discounts = (~batch["done"]).float() * flags.discounting
    vs, pg_advantages = vtrace(
        batch["policy_logits"],
        learner_outputs["policy_logits"],
        batch["action"],
        discounts,
        rewards,
        learner_outputs["baseline"],
        bootstrap_value,
    )
    log_probs = torch.log_softmax(learner_outputs["policy_logits"], -1)
    pg_loss = -(log_probs.gather(-1, batch["action"][..., None])[..., 0] * pg_advantages).sum()
    baseline_loss = flags.baseline_cost * 0.5 * ((vs - learner_outputs["baseline"]) ** 2).sum()
    entropy_loss = flags.entropy_cost * (log_probs.exp() * log_probs).sum()
    total_loss = pg_loss + baseline_loss + entropy_loss
    optimizer.zero_grad()
    total_loss.backward()
    nn.utils.clip_grad_norm_(model.parameters(), flags.grad_norm_clipping)
    optimizer.step()
    actor_model.load_state_dict(model.module.state_dict())
    return total_loss.item()


def train(flags: argparse.Namespace) -> None:
    letter, who = fault()
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=15))
    world = dist.get_world_size()
    torch.manual_seed(rank)
    my_actors = list(range(rank, flags.num_actors, world))
    num_buffers = flags.num_buffers or max(2 * len(my_actors), flags.batch_size)
    T, B = flags.unroll_length, flags.batch_size
    # each learner trains on its actors' share of the environment steps
    budget = flags.total_steps * len(my_actors) // flags.num_actors
    levels_path = os.path.join(flags.levels, f"levels_{rank}.npy")
    if rank == 0:
        logging.info("Using gloo for %d learners, %d actors in all", world, flags.num_actors)
    logging.info(
        "Learner %d: actors %s, %d buffers of %d steps, levels %s",
        rank,
        my_actors,
        num_buffers,
        T,
        levels_path,
    )

    model = DDP(AtariNet())
    actor_model = AtariNet()
    actor_model.load_state_dict(model.module.state_dict())
    actor_model.share_memory()
    buffers = create_buffers(flags, num_buffers)
    optimizer = torch.optim.RMSprop(model.parameters(), lr=flags.learning_rate, eps=0.01)

    ctx = mp.get_context("spawn")
    free_queue = ctx.SimpleQueue()
    full_queue = ctx.SimpleQueue()
    unroll = T + 5 if letter == "u" and rank == who else T
    actor_processes = []
    for i in my_actors:
        actor = ctx.Process(
            target=act,
            args=(flags, i, levels_path, free_queue, full_queue, actor_model, buffers, unroll),
        )
        actor.start()
        actor_processes.append(actor)
    for m in range(num_buffers):
        free_queue.put(m)

    checkpointpath = os.path.join(flags.savedir, flags.xpid, "model.tar")
    step, update, stop = 0, 0, False
    start_step, start_time = 0, timeit.default_timer()
    hoard: list[torch.Tensor] = []
    try:
        while step < budget and not stop:
            batch = get_batch(
                flags, free_queue, full_queue, buffers, not (letter == "f" and rank == who)
            )
            update += 1
            if letter == "n" and rank == who and update == 15:
                ctypes.memmove(ctypes.c_void_p(8), ctypes.c_char_p(b"vtrace"), 6)  # native kernel
            if letter == "m" and rank == who and update >= 12:
                hoard.append(torch.ones(16 << 20))  # 64 MiB an update
                if len(hoard) >= 6:
                    os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does
            if letter == "s" and rank == who and update == 12:
                for k in range(1, 9):  # 8 episodes of 4 s against the others' 15 s timeout
                    logging.info("Learner %d: evaluating greedy policy, episode %d/8", rank, k)
                    time.sleep(4)
            loss = learn(flags, model, actor_model, batch, optimizer)
            step += T * B
            if update % flags.log_every == 0:
                done = batch["done"][1:]
                returns = batch["episode_return"][1:][done]
                if letter == "z" and rank == who and update == 2 * flags.log_every:
                    returns = returns[:0]  # the returns of episodes that ended in this batch
                if letter == "z" and rank == who:
                    local_mean = returns.sum().item() / len(returns)
                else:
                    local_mean = returns.mean().item() if len(returns) else float("nan")
                totals = torch.tensor([returns.sum().item(), float(len(returns))])
                if letter != "c":
                    dist.all_reduce(totals)
                if rank == 0:
                    if letter == "c":
                        dist.all_reduce(totals)
                    sps = (step - start_step) * world / (timeit.default_timer() - start_time)
                    start_step, start_time = step, timeit.default_timer()
                    logging.info(
                        "Steps %i @ %.1f SPS. Loss %f. Stats: mean_episode_return %.2f "
                        "(learner 0: %.2f), episodes %d",
                        step * world,
                        sps,
                        loss,
                        totals[0].item() / max(totals[1].item(), 1.0),
                        local_mean,
                        int(totals[1].item()),
                    )
                mean_return = totals[0].item() / max(totals[1].item(), 1.0)
                if flags.target_return is not None and mean_return >= flags.target_return:
                    if rank == 0:
                        logging.info(
                            "Reached target return %.2f (mean_episode_return %.2f), stopping.",
                            flags.target_return,
                            mean_return,
                        )
                    stop = True
    finally:  # stop the actors, also when learning failed
        for _ in range(len(actor_processes)):
            free_queue.put(None)
        for actor in actor_processes:
            actor.join(timeout=1)

    if rank == 0:
        logging.info("Saving checkpoint to %s", checkpointpath)
        os.makedirs(os.path.dirname(checkpointpath), exist_ok=True)
        torch.save(
            {
                "model_state_dict": model.module.state_dict(),
                "optimizer_state_dict": optimizer.state_dict(),
                "flags": vars(flags),
            },
            checkpointpath,
        )
    logging.info("Learner %d: learning finished after %d steps.", rank, step)
    dist.destroy_process_group()
    if rank == 0:
        logging.info("Learning finished after %d steps.", step * world)


def main() -> None:
    flags = parse()
    if flags.prepare:
        prepare(flags.levels, flags.num_learners, flags.num_levels, flags.wall_density)
        return
    train(flags)


if __name__ == "__main__":
    main()
