"""A hundred-and-sixty-eighth training-program style for the generalisation fixtures
(tests/fixtures/real/hundredsixtyeighth-*): reinforcement learning the way of CleanRL's
ppo_atari_multigpu.py (vwxyzjn/cleanrl), a lab's fork of it for a small classic-control task,
re-created in plain torch without gymnasium, tyro or tensorboard installed. Each "node" of the
job is a docker compose service whose image holds this file as /srv/cleanrl/ppo_multigpu.py and
runs `torchrun --nnodes 2 --node_rank N --nproc_per_node 2 --master_addr 127.0.0.1 --master_port
P ppo_multigpu.py --env-id CartPoleMini-v1 ...` (tests/programs/hundredsixtyeighth_compose.py
plays docker compose v2).

As in CleanRL's ppo_atari_multigpu.py (and ppo.py for the classic-control agent): a dataclass
`Args` parsed tyro's way (`--flag value`, `--flag` / `--no-flag` for booleans), LOCAL_RANK and
WORLD_SIZE from torchrun, `run_name = f"{env_id}__{exp_name}__{seed}__{int(time.time())}"`,
a writer and rich's `pprint(args)` on `local_rank == 0` (so on the first process of EVERY node:
CleanRL's script was written for one node), `args.seed += local_rank`, a vectorised environment
of `local_num_envs` copies per process (CartPoleMini-v1: gymnasium's CartPole-v1 dynamics
re-implemented in numpy, with RecordEpisodeStatistics' `final_info` and autoreset), rollouts of
num_steps, GAE, update epochs over shuffled minibatches, the gradients concatenated and
all-reduced BY HAND (`dist.all_reduce(all_grads, op=dist.ReduceOp.SUM)` then divided by the world
size, no DDP), `print(f"global_step={global_step}, episodic_return={info['episode']['r']}")` and
`print("SPS:", ...)` from the writer processes, the per-iteration `local_rank: 0, action.sum():
..., iteration: 3, agent.actor.weight.sum(): ...` from every process, the writer's scalars
(charts/learning_rate, losses/value_loss, ...) in a tensorboard-like CSV under runs/{run_name}/.
The lab's fork adds: the global RANK for init_process_group (CleanRL passes the local rank) and a
--dist-timeout; a behaviour-cloning warm start from each rank's shard of demonstrations on the
node's data disk (--demo-dir); --save-episodes (rank 0 appends each finished episode to
runs/{run_name}/episodes.jsonl); --stop-return (stop once the mean episodic return, averaged over
the ranks, reaches it); --eval-every (rank 0 evaluates the policy as cleanrl_utils' evaluate does,
--capture-video rendering every frame); --save-model (CleanRL's, then cleanrl_utils' evaluate);
--resume from the fork's checkpoint.pt; destroy_process_group at the end (CleanRL has none). The
writers share runs/ and take its lock file (runs/.scalars.lock, fcntl.flock) to append rows.

`python ppo_multigpu.py prepare DIR` writes what the images and the nodes' disks hold: DIR/image
(cleanrl_utils/evals/ppo_eval.py beside this file's copy), DIR/data/demos/CartPoleMini-v1/
shard-0R-{obs,actions}.npy, and an earlier run's checkpoint under DIR/runs/.

A fault in the code is chosen by the MT_CASE environment variable (a letter and a rank) and never
printed; the others come from what each service is given. Re-capture with
tests/fixtures/real/capture_hundredsixtyeighth.sh after any edit.
"""

# docs and experiment results can be found at https://docs.cleanrl.dev/rl-algorithms/ppo/#ppo_atari_multigpupy
from __future__ import annotations

import argparse
import dataclasses
import fcntl
import json
import math
import os
import random
import shutil
import signal
import sys
import time
import warnings
import zlib
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
from rich.pretty import pprint
from torch.distributions.categorical import Categorical

CASE = os.environ.get("MT_CASE", "")
HOARD: list[np.ndarray] = []


def fault(letter: str, rank: int | None = None) -> bool:
    """MT_CASE is a letter and, for most faults, the global rank it strikes."""
    if not CASE.startswith(letter):
        return False
    which = CASE[len(letter) :]
    return which == "" or rank is None or int(which) == rank


@dataclass
class Args:
    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    """the name of this experiment"""
    seed: int = 1
    """seed of the experiment"""
    torch_deterministic: bool = True
    """if toggled, `torch.backends.cudnn.deterministic=False`"""
    cuda: bool = True
    """if toggled, cuda will be enabled by default"""
    track: bool = False
    """if toggled, this experiment will be tracked with Weights and Biases"""
    wandb_project_name: str = "cleanRL"
    """the wandb's project name"""
    wandb_entity: str | None = None
    """the entity (team) of wandb's project"""
    capture_video: bool = False
    """whether to capture videos of the agent performances (check out `videos` folder)"""

    # Algorithm specific arguments
    env_id: str = "CartPoleMini-v1"
    """the id of the environment"""
    total_timesteps: int = 500000
    """total timesteps of the experiments"""
    learning_rate: float = 2.5e-4
    """the learning rate of the optimizer"""
    local_num_envs: int = 4
    """the number of parallel game environments (in the local rank)"""
    num_steps: int = 128
    """the number of steps to run in each environment per policy rollout"""
    anneal_lr: bool = True
    """Toggle learning rate annealing for policy and value networks"""
    gamma: float = 0.99
    """the discount factor gamma"""
    gae_lambda: float = 0.95
    """the lambda for the general advantage estimation"""
    num_minibatches: int = 4
    """the number of mini-batches"""
    update_epochs: int = 4
    """the K epochs to update the policy"""
    norm_adv: bool = True
    """Toggles advantages normalization"""
    clip_coef: float = 0.2
    """the surrogate clipping coefficient"""
    clip_vloss: bool = True
    """Toggles whether or not to use a clipped loss for the value function, as per the paper."""
    ent_coef: float = 0.01
    """coefficient of the entropy"""
    vf_coef: float = 0.5
    """coefficient of the value function"""
    max_grad_norm: float = 0.5
    """the maximum norm for the gradient clipping"""
    target_kl: float | None = None
    """the target KL divergence threshold"""
    device_ids: list[int] = field(default_factory=lambda: [])
    """the device ids that subprocess workers will use"""
    backend: str = "gloo"
    """the backend for distributed training"""

    # the lab's fork
    dist_timeout: int = 1800
    """seconds a collective may wait before the process group gives up"""
    demo_dir: str | None = None
    """behaviour-cloning warm start: shard-{rank:02d}-{obs,actions}.npy of each rank"""
    bc_updates: int = 8
    """behaviour-cloning updates before the first rollout"""
    save_episodes: bool = False
    """append each finished episode of rank 0 to runs/{run_name}/episodes.jsonl"""
    stop_return: float | None = None
    """stop once the mean episodic return (averaged over the ranks) reaches this"""
    eval_every: int = 0
    """evaluate the policy on rank 0 every N iterations (0: never)"""
    eval_episodes: int = 10
    """the number of episodes of each evaluation"""
    save_model: bool = False
    """whether to save model into the `runs/{run_name}` folder"""
    resume: str | None = None
    """a checkpoint.pt of the fork to resume from"""
    save_every: int = 0
    """write runs/{run_name}/checkpoint.pt every N iterations on rank 0 (0: never)"""

    # to be filled in runtime
    local_batch_size: int = 0
    """the local batch size in the local rank (computed in runtime)"""
    local_minibatch_size: int = 0
    """the local mini-batch size in the local rank (computed in runtime)"""
    num_envs: int = 0
    """the number of parallel game environments (computed in runtime)"""
    batch_size: int = 0
    """the batch size (computed in runtime)"""
    minibatch_size: int = 0
    """the mini-batch size (computed in runtime)"""
    num_iterations: int = 0
    """the number of iterations (computed in runtime)"""
    world_size: int = 0
    """the number of processes (computed in runtime)"""


def cli(cls: type[Args], argv: list[str]) -> Args:
    """tyro.cli(Args) for the flags this script uses: `--local-num-envs 8`, `--no-anneal-lr`."""
    parser = argparse.ArgumentParser(prog=os.path.basename(sys.argv[0]))
    for f in dataclasses.fields(cls):
        flag = "--" + f.name.replace("_", "-")
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        kind = str(f.type)
        if kind == "bool":
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=default)
        elif kind.startswith("list"):
            parser.add_argument(flag, type=int, nargs="*", default=default)
        elif "int" in kind:
            parser.add_argument(flag, type=int, default=default)
        elif "float" in kind:
            parser.add_argument(flag, type=float, default=default)
        else:
            parser.add_argument(flag, type=str, default=default)
    return cls(**vars(parser.parse_args(argv)))


# ------------------------------------------------------------------------------ the environment
class Discrete:
    def __init__(self, n: int):
        self.n = n
        self.shape: tuple[int, ...] = ()


class Box:
    def __init__(self, shape: tuple[int, ...]):
        self.shape = shape


class CartPoleMiniVecEnv:
    """gymnasium's CartPole-v1 (classic_control/cartpole.py) for `num_envs` copies at once, as
    SyncVectorEnv([RecordEpisodeStatistics(gym.make("CartPole-v1"))] * n) returns it: autoreset,
    and `final_info` / `final_observation` for the copies whose episode ended."""

    gravity = 9.8
    masscart = 1.0
    masspole = 0.1
    total_mass = masspole + masscart
    length = 0.5  # actually half the pole's length
    polemass_length = masspole * length
    force_mag = 10.0
    tau = 0.02  # seconds between state updates
    theta_threshold_radians = 12 * 2 * math.pi / 360
    x_threshold = 2.4
    max_episode_steps = 500

    def __init__(self, num_envs: int):
        self.num_envs = num_envs
        self.single_observation_space = Box((4,))
        self.single_action_space = Discrete(2)
        self.state = np.zeros((num_envs, 4))
        self.returns = np.zeros(num_envs, dtype=np.float32)
        self.lengths = np.zeros(num_envs, dtype=np.int32)
        self.starts = np.zeros(num_envs)
        self.np_random = np.random.default_rng()

    def reset(self, seed: int | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        self.np_random = np.random.default_rng(seed)
        self.state = self.np_random.uniform(-0.05, 0.05, size=(self.num_envs, 4))
        self.returns[:] = 0
        self.lengths[:] = 0
        self.starts[:] = time.perf_counter()
        return self.state.astype(np.float32), {}

    def step(
        self, action: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        x, x_dot, theta, theta_dot = self.state.T
        force = np.where(action == 1, self.force_mag, -self.force_mag)
        costheta, sintheta = np.cos(theta), np.sin(theta)
        temp = (force + self.polemass_length * theta_dot**2 * sintheta) / self.total_mass
        thetaacc = (self.gravity * sintheta - costheta * temp) / (
            self.length * (4.0 / 3.0 - self.masspole * costheta**2 / self.total_mass)
        )
        xacc = temp - self.polemass_length * thetaacc * costheta / self.total_mass
        x = x + self.tau * x_dot
        x_dot = x_dot + self.tau * xacc
        theta = theta + self.tau * theta_dot
        theta_dot = theta_dot + self.tau * thetaacc
        self.state = np.stack([x, x_dot, theta, theta_dot], axis=1)
        terminated = (
            (x < -self.x_threshold)
            | (x > self.x_threshold)
            | (theta < -self.theta_threshold_radians)
            | (theta > self.theta_threshold_radians)
        )
        reward = np.ones(self.num_envs, dtype=np.float32)
        self.returns += reward
        self.lengths += 1
        truncated = self.lengths >= self.max_episode_steps
        obs = self.state.astype(np.float32)
        infos: dict[str, Any] = {}
        done = terminated | truncated
        if done.any():
            final_info = np.full(self.num_envs, None, dtype=object)
            final_obs = np.full(self.num_envs, None, dtype=object)
            now = time.perf_counter()
            for i in np.flatnonzero(done):
                final_obs[i] = obs[i].copy()
                final_info[i] = {
                    "episode": {
                        "r": np.array([self.returns[i]], dtype=np.float32),
                        "l": np.array([self.lengths[i]], dtype=np.int32),
                        "t": np.array([round(now - self.starts[i], 6)], dtype=np.float32),
                    }
                }
                self.state[i] = self.np_random.uniform(-0.05, 0.05, size=4)
                self.returns[i] = 0
                self.lengths[i] = 0
                self.starts[i] = now
            obs = self.state.astype(np.float32)
            infos["final_observation"] = final_obs
            infos["_final_observation"] = done.copy()
            infos["final_info"] = final_info
            infos["_final_info"] = done.copy()
        return obs, reward, terminated, truncated, infos

    def render(self) -> np.ndarray:
        """rgb_array of copy 0, 400x600, the way classic_control draws it (cart, pole, axle)."""
        screen_width, screen_height = 600, 400
        world_width = self.x_threshold * 2
        scale = screen_width / world_width
        polewidth, polelen = 10.0, scale * (2 * self.length)
        cartwidth, cartheight = 50.0, 30.0
        x = self.state[0]
        frame = np.full((screen_height, screen_width, 3), 255, dtype=np.uint8)
        yy, xx = np.mgrid[0:screen_height, 0:screen_width]
        cartx = x[0] * scale + screen_width / 2.0
        carty = 100
        cart = (np.abs(xx - cartx) <= cartwidth / 2) & (np.abs(yy - carty) <= cartheight / 2)
        frame[cart] = (0, 0, 0)
        # the pole: every pixel within polewidth/2 of the segment from the axle
        ux, uy = math.sin(x[2]), math.cos(x[2])
        px, py = xx - cartx, yy - carty
        along = np.clip(px * ux + py * uy, 0, polelen)
        dist2 = (px - along * ux) ** 2 + (py - along * uy) ** 2
        frame[dist2 <= (polewidth / 2) ** 2] = (202, 152, 101)
        axle = (px**2 + py**2) <= (polewidth / 2) ** 2
        frame[axle] = (129, 132, 203)
        frame[int(carty - cartheight / 2) - 1, :] = (0, 0, 0)
        return np.flipud(frame)

    def close(self) -> None:
        pass


def make_env(env_id: str, num_envs: int) -> CartPoleMiniVecEnv:
    if env_id != "CartPoleMini-v1":
        raise ValueError(f"Environment {env_id} doesn't exist.")
    return CartPoleMiniVecEnv(num_envs)


# ------------------------------------------------------------------------------------ the agent
def layer_init(layer: nn.Linear, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Linear:
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    def __init__(self, envs: CartPoleMiniVecEnv):
        super().__init__()
        obs_dim = int(np.array(envs.single_observation_space.shape).prod())
        self.critic = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 1), std=1.0),
        )
        self.actor = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, envs.single_action_space.n), std=0.01),
        )

    def get_value(self, x: torch.Tensor) -> torch.Tensor:
        return self.critic(x)

    def get_action_and_value(
        self, x: torch.Tensor, action: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        logits = self.actor(x)
        probs = Categorical(logits=logits)
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action), probs.entropy(), self.critic(x)


# ----------------------------------------------------------------------- the writer (tensorboard)
class SummaryWriter:
    """torch.utils.tensorboard's SummaryWriter as this image has it: scalars appended to
    runs/{run_name}/scalars.csv (wall_time,tag,step,value) at each flush. Two writers share runs/
    (one per node, CleanRL's `local_rank == 0`), so a flush holds runs/.scalars.lock."""

    def __init__(self, log_dir: str):
        self.log_dir = log_dir
        os.makedirs(log_dir, exist_ok=True)
        self.path = os.path.join(log_dir, "scalars.csv")
        self.lock_path = os.path.join(os.path.dirname(log_dir.rstrip("/")), ".scalars.lock")
        self.rows: list[str] = []
        self.flushes = 0
        self.held: Any = None

    def add_text(self, tag: str, text: str) -> None:
        with open(os.path.join(self.log_dir, f"{tag}.md"), "w") as f:
            f.write(text)

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        value = np.asarray(value, dtype=np.float64).reshape(-1)[0].item()
        self.rows.append(f"{time.time():.3f},{tag},{step},{value!r}\n")

    def flush(self) -> None:
        lock = self.held or open(self.lock_path, "a")  # noqa: SIM115 (held across flushes below)
        fcntl.flock(lock, fcntl.LOCK_EX)
        with open(self.path, "a") as f:
            f.writelines(self.rows)
        self.rows = []
        self.flushes += 1
        if fault("h", RANK) and self.flushes >= 3:
            # a fork keeps the run folder locked from its third flush on, so that a checkpoint
            # copied off the node sees the scalars that go with it; the lock goes only at close()
            self.held = lock
            return
        fcntl.flock(lock, fcntl.LOCK_UN)
        lock.close()

    def close(self) -> None:
        self.flush()
        if self.held is not None:
            fcntl.flock(self.held, fcntl.LOCK_UN)
            self.held.close()


# ------------------------------------------------------------------------------- the fork's parts
def load_demos(demo_dir: str, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank R's shard of the demonstrations on the node's data disk."""
    obs = np.load(os.path.join(demo_dir, f"shard-{rank:02d}-obs.npy"))
    actions = np.load(os.path.join(demo_dir, f"shard-{rank:02d}-actions.npy"))
    return torch.from_numpy(obs), torch.from_numpy(actions)


def allreduce_grads(agent: nn.Module, world_size: int) -> None:
    # batch allreduce ops: see https://github.com/entity-neural-network/incubator/pull/220
    all_grads_list = []
    for param in agent.parameters():
        if param.grad is not None:
            all_grads_list.append(param.grad.view(-1))
    all_grads = torch.cat(all_grads_list)
    dist.all_reduce(all_grads, op=dist.ReduceOp.SUM)
    offset = 0
    for param in agent.parameters():
        if param.grad is not None:
            param.grad.data.copy_(
                all_grads[offset : offset + param.numel()].view_as(param.grad.data) / world_size
            )
            offset += param.numel()


def evaluate_inline(
    agent: Agent, args: Args, run_name: str, iteration: int, capture_video: bool
) -> list[float]:
    """cleanrl_utils.evals.ppo_eval.evaluate, on the training agent: `eval_episodes` episodes of
    one copy with a greedy policy; with --capture-video each frame is rendered and the episode
    written as videos/{run_name}-eval/rl-video-episode-N.npz (frames deflated, no codec here)."""
    envs = make_env(args.env_id, 1)
    obs, _ = envs.reset(seed=args.seed + 1000 * iteration)
    episodic_returns: list[float] = []
    frames: list[bytes] = []
    video_dir = f"videos/{run_name}-eval"
    if capture_video:
        os.makedirs(video_dir, exist_ok=True)
    while len(episodic_returns) < args.eval_episodes:
        if capture_video:
            frames.append(zlib.compress(envs.render().tobytes(), 6))
        with torch.no_grad():
            actions, _, _, _ = agent.get_action_and_value(torch.Tensor(obs))
        obs, _, _, _, infos = envs.step(actions.numpy())
        if "final_info" in infos:
            for info in infos["final_info"]:
                if info is None or "episode" not in info:
                    continue
                print(
                    f"eval_episode={len(episodic_returns)}, episodic_return={info['episode']['r']}"
                )
                if capture_video:
                    np.savez(
                        f"{video_dir}/rl-video-episode-{len(episodic_returns)}.npz",
                        frames=np.array(frames, dtype=object),
                    )
                    frames = []
                episodic_returns += [float(info["episode"]["r"][0])]
    return episodic_returns


# -------------------------------------------------------------------------------- prepare (setup)
PPO_EVAL = """from typing import Callable

import numpy as np
import torch


def evaluate(
    model_path: str,
    make_env: Callable,
    env_id: str,
    eval_episodes: int,
    run_name: str,
    Model: torch.nn.Module,
    device: torch.device = torch.device("cpu"),
    capture_video: bool = True,
    gamma: float = 0.99,
):
    envs = make_env(env_id, 1)
    agent = Model(envs).to(device)
    agent.load_state_dict(torch.load(model_path, map_location=device))
    agent.eval()

    obs, _ = envs.reset()
    episodic_returns = []
    while len(episodic_returns) < eval_episodes:
        actions, _, _, _ = agent.get_action_and_value(torch.Tensor(obs).to(device))
        next_obs, _, _, _, infos = envs.step(actions.cpu().numpy())
        if "final_info" in infos:
            for info in infos["final_info"]:
                if info is None or "episode" not in info:
                    continue
                print(f"eval_episode={len(episodic_returns)}, episodic_return={info['episode']['r']}")
                episodic_returns += [info["episode"]["r"]]
        obs = next_obs

    return episodic_returns
"""


def prepare(root: str) -> None:
    """The image's /srv/cleanrl (this file is copied there by the capture as ppo_multigpu.py),
    the demonstrations every node's data disk holds, and an earlier run of the fork that saved
    its checkpoint.pt with the run's Args in it."""
    image = os.path.join(root, "image")
    os.makedirs(os.path.join(image, "cleanrl_utils", "evals"), exist_ok=True)
    open(os.path.join(image, "cleanrl_utils", "__init__.py"), "w").close()
    open(os.path.join(image, "cleanrl_utils", "evals", "__init__.py"), "w").close()
    with open(os.path.join(image, "cleanrl_utils", "evals", "ppo_eval.py"), "w") as f:
        f.write(PPO_EVAL)
    # demonstrations: a hand-made controller on CartPoleMini-v1, 512 steps per rank's shard
    demos = os.path.join(root, "data", "demos", "CartPoleMini-v1")
    os.makedirs(demos, exist_ok=True)
    for rank in range(4):
        env = CartPoleMiniVecEnv(1)
        obs, _ = env.reset(seed=100 + rank)
        all_obs, all_actions = [], []
        for _ in range(512):
            action = np.array([int(obs[0, 2] + 0.5 * obs[0, 3] > 0)])
            all_obs.append(obs[0])
            all_actions.append(action[0])
            obs, _, _, _, _ = env.step(action)
        np.save(os.path.join(demos, f"shard-{rank:02d}-obs.npy"), np.array(all_obs))
        np.save(os.path.join(demos, f"shard-{rank:02d}-actions.npy"), np.array(all_actions))
    # an earlier run of the fork (before it saved the args as a dict): its last checkpoint
    args = Args(exp_name="ppo_multigpu", total_timesteps=200000, save_every=4)
    run = os.path.join(root, "runs", "CartPoleMini-v1__ppo_multigpu__1__1733603321")
    os.makedirs(run, exist_ok=True)
    torch.manual_seed(1)
    agent = Agent(CartPoleMiniVecEnv(1))
    optimizer = optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)
    torch.save(
        {
            "args": args,
            "agent": agent.state_dict(),
            "optimizer": optimizer.state_dict(),
            "iteration": 24,
            "global_step": 24 * 2048,
        },
        os.path.join(run, "checkpoint.pt"),
    )


# ---------------------------------------------------------------------------------------- main
RANK = int(os.getenv("RANK", "0"))


def main() -> None:
    # torchrun --standalone --nnodes=1 --nproc_per_node=2 ppo_atari_multigpu.py
    # taken from https://pytorch.org/docs/stable/elastic/run.html
    args = cli(Args, sys.argv[1:])
    local_rank = int(os.getenv("LOCAL_RANK", "0"))
    rank = int(os.getenv("RANK", "0"))
    args.world_size = int(os.getenv("WORLD_SIZE", "1"))
    args.local_batch_size = int(args.local_num_envs * args.num_steps)
    args.local_minibatch_size = int(args.local_batch_size // args.num_minibatches)
    args.num_envs = args.local_num_envs * args.world_size
    args.batch_size = int(args.num_envs * args.num_steps)
    args.minibatch_size = int(args.batch_size // args.num_minibatches)
    args.num_iterations = args.total_timesteps // args.batch_size
    if args.world_size > 1:
        # the fork passes the global rank: CleanRL's `rank=local_rank` is right on one node only
        dist.init_process_group(
            args.backend,
            rank=local_rank if fault("a") else rank,
            world_size=args.world_size,
            timeout=timedelta(seconds=args.dist_timeout),
        )
    else:
        warnings.warn(
            """
Not using distributed mode!
If you want to use distributed mode, please execute this script with 'torchrun'.
E.g., `torchrun --standalone --nnodes=1 --nproc_per_node=2 ppo_atari_multigpu.py`
        """,
            stacklevel=1,
        )
    run_name = f"{args.env_id}__{args.exp_name}__{args.seed}__{int(time.time())}"
    writer = None
    if local_rank == 0:
        if args.track:
            import wandb

            wandb.init(
                project=args.wandb_project_name,
                entity=args.wandb_entity,
                sync_tensorboard=True,
                config=vars(args),
                name=run_name,
                monitor_gym=True,
                save_code=True,
            )
        writer = SummaryWriter(f"runs/{run_name}")
        writer.add_text(
            "hyperparameters",
            "|param|value|\n|-|-|\n{}".format(
                "\n".join([f"|{key}|{value}|" for key, value in vars(args).items()])
            ),
        )
        pprint(args)

    # TRY NOT TO MODIFY: seeding
    # CRUCIAL: note that we needed to pass a different seed for each data parallelism worker
    args.seed += local_rank
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed - local_rank)
    torch.backends.cudnn.deterministic = args.torch_deterministic

    if args.cuda and not torch.cuda.is_available():
        warnings.warn(
            "--cuda is set but torch.cuda.is_available() is False: training on the CPU",
            stacklevel=1,
        )
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")

    # env setup
    envs = make_env(args.env_id, args.local_num_envs)
    assert isinstance(envs.single_action_space, Discrete), "only discrete action space is supported"

    agent = Agent(envs).to(device)
    torch.manual_seed(args.seed)
    optimizer = optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)
    start_iteration, global_step = 1, 0
    if args.resume:
        checkpoint = torch.load(args.resume, map_location=device)
        agent.load_state_dict(checkpoint["agent"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        start_iteration = checkpoint["iteration"] + 1
        global_step = checkpoint["global_step"]
        print(
            f"local_rank: {local_rank}, resumed from {args.resume} at iteration {start_iteration}"
        )

    if args.demo_dir:
        # the fork's behaviour-cloning warm start of the actor, on each rank's own shard
        demo_obs, demo_actions = load_demos(args.demo_dir, rank)
        for _ in range(args.bc_updates):
            logits = agent.actor(demo_obs)
            bc_loss = nn.functional.cross_entropy(logits, demo_actions.long())
            optimizer.zero_grad()
            bc_loss.backward()
            if args.world_size > 1:
                allreduce_grads(agent, args.world_size)
            optimizer.step()
        print(f"local_rank: {local_rank}, demos: {len(demo_obs)}, bc_loss: {bc_loss.item():.4f}")

    # ALGO Logic: Storage setup
    obs = torch.zeros((args.num_steps, args.local_num_envs, *envs.single_observation_space.shape))
    actions = torch.zeros((args.num_steps, args.local_num_envs, *envs.single_action_space.shape))
    logprobs = torch.zeros((args.num_steps, args.local_num_envs))
    rewards = torch.zeros((args.num_steps, args.local_num_envs))
    dones = torch.zeros((args.num_steps, args.local_num_envs))
    values = torch.zeros((args.num_steps, args.local_num_envs))

    # TRY NOT TO MODIFY: start the game
    start_time = time.time()
    start_step = global_step
    next_obs_np, _ = envs.reset(seed=args.seed)
    next_obs = torch.Tensor(next_obs_np).to(device)
    next_done = torch.zeros(args.local_num_envs).to(device)
    recent_returns: list[float] = []
    episode_rows: list[list[list[float]]] = [[] for _ in range(args.local_num_envs)]
    episodes_file = None
    if args.save_episodes and rank == 0:
        episodes_file = open(f"runs/{run_name}/episodes.jsonl", "a")  # noqa: SIM115

    for iteration in range(start_iteration, args.num_iterations + 1):
        # Annealing the rate if instructed to do so.
        if args.anneal_lr:
            frac = 1.0 - (iteration - 1.0) / args.num_iterations
            lrnow = frac * args.learning_rate
            optimizer.param_groups[0]["lr"] = lrnow

        for step in range(0, args.num_steps):
            global_step += args.num_envs
            obs[step] = next_obs
            dones[step] = next_done

            # ALGO LOGIC: action logic
            with torch.no_grad():
                action, logprob, _, value = agent.get_action_and_value(next_obs)
                values[step] = value.flatten()
            actions[step] = action
            logprobs[step] = logprob

            # TRY NOT TO MODIFY: execute the game and log data.
            if episodes_file is not None:
                for i in range(args.local_num_envs):
                    episode_rows[i].append(
                        [round(float(v), 5) for v in next_obs[i]] + [int(action[i])]
                    )
            next_obs_np, reward, terminations, truncations, infos = envs.step(action.numpy())
            next_done_np = np.logical_or(terminations, truncations)
            rewards[step] = torch.tensor(reward).to(device).view(-1)
            next_obs = torch.Tensor(next_obs_np).to(device)
            next_done = torch.Tensor(next_done_np).to(device)

            if "final_info" in infos:
                for i, info in enumerate(infos["final_info"]):
                    if info and "episode" in info:
                        recent_returns = ([*recent_returns, float(info["episode"]["r"][0])])[-20:]
                        if episodes_file is not None:
                            episodes_file.write(
                                json.dumps(
                                    {
                                        "global_step": global_step,
                                        "env": i,
                                        "return": float(info["episode"]["r"][0]),
                                        "steps": episode_rows[i],
                                    }
                                )
                                + "\n"
                            )
                            episodes_file.flush()
                            episode_rows[i] = []
            if not writer:
                continue

            if "final_info" in infos:
                for i, info in enumerate(infos["final_info"]):
                    if info and "episode" in info:
                        logging_step = global_step - args.num_envs + i
                        print(f"global_step={global_step}, episodic_return={info['episode']['r']}")
                        writer.add_scalar(
                            "charts/episodic_return", info["episode"]["r"], logging_step
                        )
                        writer.add_scalar(
                            "charts/episodic_length", info["episode"]["l"], logging_step
                        )
                        if fault("r"):
                            # a fork's return averaged over the processes for the chart, in the
                            # writer's branch: only the processes with a writer reach it
                            mean_r = torch.tensor([float(info["episode"]["r"][0])])
                            dist.all_reduce(mean_r, op=dist.ReduceOp.SUM)
                            writer.add_scalar(
                                "charts/episodic_return_all", mean_r.item() / 2, logging_step
                            )

        if fault("k", rank) and iteration >= 3:
            # a fork's rollout cache for replays keeps 64 MiB an iteration on this rank; the
            # container's memory limit is reached at the fifth and the kernel's OOM killer ends
            # the process (SIGKILL, no Python traceback)
            HOARD.append(np.ones(64 * 1024 * 1024 // 8))
            if len(HOARD) >= 5:
                os.kill(os.getpid(), signal.SIGKILL)

        print(
            f"local_rank: {local_rank}, action.sum(): {action.sum()}, iteration: {iteration}, agent.actor.weight.sum(): {agent.actor[-1].weight.sum()}"
        )
        # bootstrap value if not done
        with torch.no_grad():
            next_value = agent.get_value(next_obs).reshape(1, -1)
            advantages = torch.zeros_like(rewards).to(device)
            lastgaelam = 0
            for t in reversed(range(args.num_steps)):
                if t == args.num_steps - 1:
                    nextnonterminal = 1.0 - next_done
                    nextvalues = next_value
                else:
                    nextnonterminal = 1.0 - dones[t + 1]
                    nextvalues = values[t + 1]
                delta = rewards[t] + args.gamma * nextvalues * nextnonterminal - values[t]
                advantages[t] = lastgaelam = (
                    delta + args.gamma * args.gae_lambda * nextnonterminal * lastgaelam
                )
            returns = advantages + values

        # flatten the batch
        b_obs = obs.reshape((-1, *envs.single_observation_space.shape))
        b_logprobs = logprobs.reshape(-1)
        b_actions = actions.reshape((-1, *envs.single_action_space.shape))
        b_advantages = advantages.reshape(-1)
        b_returns = returns.reshape(-1)
        b_values = values.reshape(-1)

        # Optimizing the policy and value network
        b_inds = np.arange(args.local_batch_size)
        clipfracs = []
        for _epoch in range(args.update_epochs):
            np.random.shuffle(b_inds)
            for start in range(0, args.local_batch_size, args.local_minibatch_size):
                end = start + args.local_minibatch_size
                mb_inds = b_inds[start:end]

                _, newlogprob, entropy, newvalue = agent.get_action_and_value(
                    b_obs[mb_inds], b_actions.long()[mb_inds]
                )
                logratio = newlogprob - b_logprobs[mb_inds]
                ratio = logratio.exp()

                with torch.no_grad():
                    # calculate approx_kl http://joschu.net/blog/kl-approx.html
                    old_approx_kl = (-logratio).mean()
                    approx_kl = ((ratio - 1) - logratio).mean()
                    clipfracs += [((ratio - 1.0).abs() > args.clip_coef).float().mean().item()]

                mb_advantages = b_advantages[mb_inds]
                if args.norm_adv:
                    mb_advantages = (mb_advantages - mb_advantages.mean()) / (
                        mb_advantages.std() + 1e-8
                    )

                # Policy loss
                pg_loss1 = -mb_advantages * ratio
                pg_loss2 = -mb_advantages * torch.clamp(
                    ratio, 1 - args.clip_coef, 1 + args.clip_coef
                )
                pg_loss = torch.max(pg_loss1, pg_loss2).mean()

                # Value loss
                newvalue = newvalue.view(-1)
                if args.clip_vloss:
                    v_loss_unclipped = (newvalue - b_returns[mb_inds]) ** 2
                    v_clipped = b_values[mb_inds] + torch.clamp(
                        newvalue - b_values[mb_inds],
                        -args.clip_coef,
                        args.clip_coef,
                    )
                    v_loss_clipped = (v_clipped - b_returns[mb_inds]) ** 2
                    v_loss_max = torch.max(v_loss_unclipped, v_loss_clipped)
                    v_loss = 0.5 * v_loss_max.mean()
                else:
                    v_loss = 0.5 * ((newvalue - b_returns[mb_inds]) ** 2).mean()

                entropy_loss = entropy.mean()
                loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef

                optimizer.zero_grad()
                loss.backward()

                if args.world_size > 1:
                    allreduce_grads(agent, args.world_size)

                nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                optimizer.step()

            if args.target_kl is not None and approx_kl > args.target_kl:
                break

        y_pred, y_true = b_values.cpu().numpy(), b_returns.cpu().numpy()
        var_y = np.var(y_true)
        explained_var = np.nan if var_y == 0 else 1 - np.var(y_true - y_pred) / var_y

        # TRY NOT TO MODIFY: record rewards for plotting purposes
        if local_rank == 0:
            assert writer is not None
            writer.add_scalar("charts/learning_rate", optimizer.param_groups[0]["lr"], global_step)
            writer.add_scalar("losses/value_loss", v_loss.item(), global_step)
            writer.add_scalar("losses/policy_loss", pg_loss.item(), global_step)
            writer.add_scalar("losses/entropy", entropy_loss.item(), global_step)
            writer.add_scalar("losses/old_approx_kl", old_approx_kl.item(), global_step)
            writer.add_scalar("losses/approx_kl", approx_kl.item(), global_step)
            writer.add_scalar("losses/clipfrac", np.mean(clipfracs), global_step)
            writer.add_scalar("losses/explained_variance", explained_var, global_step)
            sps = int((global_step - start_step) / (time.time() - start_time))
            print("SPS:", sps)
            writer.add_scalar("charts/SPS", sps, global_step)
            writer.flush()

        if args.save_every and iteration % args.save_every == 0 and rank == 0:
            torch.save(
                {
                    "args": dataclasses.asdict(args),
                    "agent": agent.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "iteration": iteration,
                    "global_step": global_step,
                },
                f"runs/{run_name}/checkpoint.pt",
            )

        if args.eval_every and iteration % args.eval_every == 0 and rank == 0:
            evaluate_inline(agent, args, run_name, iteration, args.capture_video)

        if args.stop_return is not None:
            mean_return = float(np.mean(recent_returns)) if recent_returns else 0.0
            if fault("s"):
                # a fork's stop test: rank 0 decides on its own recent episodes and tells no one
                stop = rank == 0 and mean_return >= args.stop_return
            else:
                mean_t = torch.tensor([mean_return])
                dist.all_reduce(mean_t, op=dist.ReduceOp.SUM)
                mean_return = mean_t.item() / args.world_size
                stop = mean_return >= args.stop_return
            if stop:
                if rank == 0:
                    print(
                        f"mean episodic return {mean_return:.2f} >= {args.stop_return}: "
                        f"stopping at global_step={global_step}"
                    )
                break

    if episodes_file is not None:
        episodes_file.close()
    if args.save_model and rank == 0:
        model_path = f"runs/{run_name}/{args.exp_name}.cleanrl_model"
        torch.save(agent.state_dict(), model_path)
        print(f"model saved to {model_path}")
        from cleanrl_utils.evals.ppo_eval import evaluate

        episodic_returns = evaluate(
            model_path,
            make_env,
            args.env_id,
            eval_episodes=args.eval_episodes,
            run_name=f"{run_name}-eval",
            Model=Agent,
            device=device,
            capture_video=False,
        )
        for idx, episodic_return in enumerate(episodic_returns):
            assert writer is not None
            writer.add_scalar("eval/episodic_return", episodic_return, idx)

    envs.close()
    if local_rank == 0:
        assert writer is not None
        writer.close()
        if args.track:
            wandb.finish()
    if args.world_size > 1:
        dist.destroy_process_group()  # the fork's: without it gloo's threads may abort at exit


if __name__ == "__main__":
    if sys.argv[1:2] == ["prepare"]:
        prepare(sys.argv[2])
        shutil.copyfile(__file__, os.path.join(sys.argv[2], "image", "ppo_multigpu.py"))
    else:
        main()
