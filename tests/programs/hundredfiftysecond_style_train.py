"""A hundred-and-fifty-second training-program style for the generalisation fixtures
(tests/fixtures/real/hundredfiftysecond-*): multi-GPU reinforcement learning with Denys88's
rl_games (1.6.1, the version NVIDIA's IsaacGymEnvs pins) driven by IsaacGymEnvs' Hydra train.py,
re-created in plain torch in one file without rl_games, Hydra or Isaac Gym installed: the Ant
task is a tiny vectorised torch "physics" step (eight joints, a torso height, a forward speed).
Each run's folder links this file as train.py; it is started as IsaacGymEnvs' README says:
`torchrun --standalone --nnodes=1 --nproc_per_node=2 train.py multi_gpu=True task=Ant
<OTHER_ARGS>` (or with --master_port, or --nnodes=2 --node_rank=K for two nodes).

As there: Hydra parses `key=value` overrides (its argparse usage and error on anything else;
'Error executing job with overrides: [...]', the traceback from the task function down and 'Set
the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.' on any exception, exit
1); every rank prints the whole config (print_dict), 'Setting seed: 43', 'Using rl_device:
cuda:0', the train config as one dict line, rl_games' 'global_rank = 1 local_rank = 1
world_size = 2', 'self.seed = 43', 'Started to train', 'WARNING: seq_len is deprecated, use
seq_length instead', 'seq_length: 4', 'current training device: cuda:1', 'build mlp: 28',
'RunningMeanStd:  (1,)', torch's FutureWarnings of torch.cuda.amp.GradScaler/autocast and
'====================broadcasting parameters' (broadcast_object_list of the model's state from
rank 0); only rank 0 prints 'fps step: 48213 fps step and policy inference: 41234 fps total:
38765 epoch: 12/16 frames: 196608', 'saving next best rewards:  [23.45]', "=> saving checkpoint
'runs/Ant_07-12-10-00/nn/Ant.pth'", 'Maximum reward achieved. Network won!', 'MAX EPOCHS NUM!'.
Every minibatch all-reduces the flattened gradients (trancate_gradients_and_step) and, with the
'legacy' schedule, the KL, then broadcasts rank 0's adaptive learning rate; every mini-epoch
all-reduces the mean KL; every epoch broadcasts rank 0's should_exit. This fork splits
num_envs over the ranks (the first ranks take the remainder) and keeps a last partial
minibatch. The process group is gloo with a 15 s timeout, never destroyed (as in rl_games).

A fault in the code is chosen by the MT_CASE environment variable (a letter and a rank) and never
printed (re-capture with tests/fixtures/real/capture_hundredfiftysecond.sh after any edit).
"""

from __future__ import annotations

import argparse
import ctypes
import math
import os
import random
import sys
import threading
import time
import traceback
from collections.abc import Callable
from copy import deepcopy
from datetime import datetime, timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn

CASE = os.environ.get("MT_CASE", "")


def fault(letter: str, rank: int) -> bool:
    if not CASE.startswith(letter):
        return False
    which = CASE[len(letter) :]
    return which == "" or int(which) == rank


Config = dict[str, Any]
MAX_RESET_TRIES = 200_000


# ------------------------------------------------------------------ isaacgymenvs/cfg (as composed)
def default_config() -> Config:
    """cfg/config.yaml with task=Ant (cfg/task/Ant.yaml) and train=AntPPO (cfg/train/AntPPO.yaml)."""
    return {
        "task_name": "Ant",
        "experiment": "",
        "num_envs": "",
        "seed": 42,
        "torch_deterministic": False,
        "max_iterations": "",
        "physics_engine": "physx",
        "pipeline": "gpu",
        "sim_device": "cuda:0",
        "rl_device": "cuda:0",
        "graphics_device_id": 0,
        "num_threads": 4,
        "solver_type": 1,
        "num_subscenes": 4,
        "test": False,
        "checkpoint": "",
        "sigma": "",
        "multi_gpu": False,
        "wandb_activate": False,
        "wandb_group": "",
        "wandb_name": "Ant",
        "wandb_entity": "",
        "wandb_project": "isaacgymenvs",
        "wandb_tags": [],
        "wandb_logcode_dir": "",
        "capture_video": False,
        "capture_video_freq": 1464,
        "capture_video_len": 100,
        "force_render": True,
        "headless": False,
        "task": {
            "name": "Ant",
            "physics_engine": "physx",
            "env": {
                "numEnvs": 128,
                "envSpacing": 5,
                "episodeLength": 40,
                "enableDebugVis": False,
                "clipActions": 1.0,
                "powerScale": 1.0,
                "controlFrequencyInv": 1,
                "headingWeight": 0.5,
                "upWeight": 0.1,
                "actionsCost": 0.005,
                "energyCost": 0.05,
                "dofVelocityScale": 0.2,
                "contactForceScale": 0.1,
                "jointsAtLimitCost": 0.1,
                "deathCost": -2.0,
                "terminationHeight": 0.31,
                "plane": {"staticFriction": 1.0, "dynamicFriction": 1.0, "restitution": 0.0},
                "asset": {"assetFileName": "mjcf/nv_ant.xml"},
                "enableCameraSensors": False,
            },
            "sim": {
                "dt": 0.0166,
                "substeps": 2,
                "up_axis": "z",
                "use_gpu_pipeline": True,
                "gravity": [0.0, 0.0, -9.81],
            },
            "task": {"randomize": False},
        },
        "train": {
            "params": {
                "seed": 42,
                "algo": {"name": "a2c_continuous"},
                "model": {"name": "continuous_a2c_logstd"},
                "network": {
                    "name": "actor_critic",
                    "separate": False,
                    "space": {
                        "continuous": {
                            "mu_activation": "None",
                            "sigma_activation": "None",
                            "mu_init": {"name": "default"},
                            "sigma_init": {"name": "const_initializer", "val": 0},
                            "fixed_sigma": True,
                        }
                    },
                    "mlp": {
                        "units": [64, 32],
                        "activation": "elu",
                        "d2rl": False,
                        "initializer": {"name": "default"},
                        "regularizer": {"name": "None"},
                    },
                },
                "load_checkpoint": False,
                "load_path": "",
                "config": {
                    "name": "Ant",
                    "full_experiment_name": None,
                    "env_name": "rlgpu",
                    "multi_gpu": False,
                    "ppo": True,
                    "mixed_precision": False,
                    "normalize_input": True,
                    "normalize_value": True,
                    "value_bootstrap": True,
                    "num_actors": 128,
                    "reward_shaper": {"scale_value": 0.01},
                    "normalize_advantage": True,
                    "gamma": 0.99,
                    "tau": 0.95,
                    "learning_rate": 0.0003,
                    "lr_schedule": "adaptive",
                    "schedule_type": "legacy",
                    "kl_threshold": 0.008,
                    "score_to_win": 20000,
                    "max_epochs": 500,
                    "save_best_after": 5,
                    "save_frequency": 50,
                    "grad_norm": 1.0,
                    "entropy_coef": 0.0,
                    "truncate_grads": False,
                    "e_clip": 0.2,
                    "horizon_length": 16,
                    "minibatch_size": 256,
                    "mini_epochs": 2,
                    "critic_coef": 2,
                    "clip_value": True,
                    "seq_len": 4,
                    "bounds_loss_coef": 0.0001,
                    "use_diagnostics": False,
                    "epochs_between_resets": 0,
                },
            }
        },
        "pbt": {"enabled": False},
    }


# ------------------------------------------------------------------ hydra (1.3, as it behaves)
def hydra_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(add_help=False, description="Hydra")
    parser.add_argument("--help", "-h", action="store_true", help="Application's help")
    parser.add_argument("--hydra-help", action="store_true", help="Hydra's help")
    parser.add_argument("--version", action="version", version="Hydra 1.3.2")
    parser.add_argument("--cfg", "-c", choices=["job", "hydra", "all"])
    parser.add_argument("--resolve", action="store_true")
    parser.add_argument("--package", "-p")
    parser.add_argument("--run", "-r", action="store_true")
    parser.add_argument("--multirun", "-m", action="store_true")
    parser.add_argument("--shell-completion", "-sc", action="store_true")
    parser.add_argument("--config-path", "-cp")
    parser.add_argument("--config-name", "-cn")
    parser.add_argument("--config-dir", "-cd")
    parser.add_argument("--experimental-rerun")
    parser.add_argument(
        "--info",
        "-i",
        const="all",
        nargs="?",
        choices=["all", "config", "defaults", "defaults-tree", "dirs", "plugins", "searchpath"],
    )
    parser.add_argument("overrides", nargs="*")
    return parser


def parse_value(text: str) -> Any:
    if text in ("True", "true"):
        return True
    if text in ("False", "false"):
        return False
    if text in ("null", "None"):
        return None
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def compose(overrides: list[str]) -> Config:
    cfg = default_config()
    for item in overrides:
        key, _, value = item.partition("=")
        if key in ("task", "train", "pbt"):  # a config group: task=Ant chooses cfg/task/Ant.yaml
            if value not in ("Ant", "AntPPO", "no_pbt"):
                raise FileNotFoundError(f"In 'config': Could not find '{key}/{value}'")
            continue
        node = cfg
        *path, last = key.split(".")
        for p in path:
            node = node[p]
        if last not in node:
            raise KeyError(f"Could not override '{key}'.\nKey '{last}' is not in struct")
        node[last] = parse_value(value)
    # the interpolations of the yaml files
    env, train = cfg["task"]["env"], cfg["train"]["params"]
    if cfg["num_envs"] != "":
        env["numEnvs"] = cfg["num_envs"]
    train["config"]["num_actors"] = env["numEnvs"]
    train["config"]["multi_gpu"] = cfg["multi_gpu"]
    if cfg["max_iterations"] != "":
        train["config"]["max_epochs"] = cfg["max_iterations"]
    train["seed"] = cfg["seed"]
    train["load_checkpoint"] = bool(cfg["checkpoint"])
    train["load_path"] = cfg["checkpoint"]
    return cfg


def hydra_main(task_function: Callable[[Config], None]) -> Callable[[], None]:
    def run_job(overrides: list[str]) -> None:
        task_function(compose(overrides))

    def main() -> None:
        args = hydra_parser().parse_args()
        try:
            run_job(args.overrides)
        except Exception as ex:
            sys.stderr.write(f"Error executing job with overrides: {args.overrides}" + os.linesep)
            tb = ex.__traceback__
            while tb is not None and tb.tb_frame.f_code.co_name != "run_job":
                tb = tb.tb_next
            tb = tb.tb_next if tb is not None else None  # from the task function down
            traceback.print_exception(type(ex), ex, tb)
            sys.stderr.write(
                "\nSet the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.\n"
            )
            sys.exit(1)

    return main


def print_dict(val: Any, nesting: int = -4, start: bool = True) -> None:
    """isaacgymenvs.utils.reformat.print_dict"""
    if type(val) is dict:
        if not start:
            print("")
        nesting += 4
        for k in val:
            print(nesting * " ", end="")
            print(k, end=": ")
            print_dict(val[k], nesting, start=False)
    else:
        print(val)


def set_np_formatting() -> None:
    np.set_printoptions(
        edgeitems=30, infstr="inf", linewidth=4000, nanstr="nan", precision=2, threshold=10000
    )


def set_seed(seed: int, torch_deterministic: bool = False, rank: int = 0) -> int:
    seed = seed + rank
    print(f"Setting seed: {seed}")
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    os.environ["PYTHONHASHSEED"] = str(seed)
    return seed


# ------------------------------------------------------------------ the Ant task (a tiny "physics")
class AntTask:
    """VecTask: eight joints driven by the actions, a torso height held up by the legs and a
    forward speed; obs = height, speed (3), joint positions (8), joint velocities (8), last
    actions (8)."""

    NUM_OBS, NUM_ACTIONS = 28, 8

    def __init__(self, cfg: Config, num_envs: int, rank: int, seed: int, headless: bool) -> None:
        env = cfg["env"]
        self.num_envs, self.rank = num_envs, rank
        self.dt = cfg["sim"]["dt"] * cfg["sim"]["substeps"]
        self.max_episode_length = env["episodeLength"]
        self.termination_height = env["terminationHeight"]
        self.power = env["powerScale"]
        self.actions_cost, self.death_cost = env["actionsCost"], env["deathCost"]
        self.headless = headless
        self.gen = torch.Generator().manual_seed(seed)
        n = num_envs
        self.height = torch.zeros(n)
        self.vel = torch.zeros(n, 3)
        self.dof_pos = torch.zeros(n, 8)
        self.dof_vel = torch.zeros(n, 8)
        self.actions = torch.zeros(n, 8)
        self.progress_buf = torch.zeros(n, dtype=torch.long)
        self.frames = 0
        self.viewer_open = not headless

    def get_env_info(self) -> Config:
        return {"observation_space": (self.NUM_OBS,), "action_space": (self.NUM_ACTIONS,)}

    def reset_idx(self, ids: torch.Tensor, full: bool = False) -> None:
        k = len(ids)
        if k == 0:
            return
        # initial poses with no foot below the ground: rejection sampling of the joint angles
        pos = torch.zeros(k, 8)
        todo = torch.ones(k, dtype=torch.bool)
        # this rank's terrain after a full reset: almost no pose clears it
        clearance = 0.299 if fault("p", self.rank) and full and self.frames > 0 else 0.0
        for _ in range(MAX_RESET_TRIES):
            cand = torch.rand(int(todo.sum()), 64, 8, generator=self.gen) * 0.4 - 0.2
            feet = torch.cos(cand * 4).sum(2) / 8 - 0.7  # lowest foot's height
            ok = feet >= clearance
            hit = ok.any(1)
            idx = todo.nonzero().squeeze(1)
            first = ok.float().argmax(1)
            pos[idx[hit]] = cand[hit, first[hit]]
            todo[idx[hit]] = False
            if not bool(todo.any()):
                break
        self.dof_pos[ids] = pos
        self.dof_vel[ids] = 0.0
        self.height[ids] = 0.55
        self.vel[ids] = 0.0
        self.actions[ids] = 0.0
        self.progress_buf[ids] = 0

    def reset(self) -> torch.Tensor:
        self.reset_idx(torch.arange(self.num_envs), full=True)
        return self.obs()

    def obs(self) -> torch.Tensor:
        return torch.cat(
            [self.height[:, None], self.vel, self.dof_pos, self.dof_vel * 0.2, self.actions], 1
        )

    def step(self, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        self.frames += 1
        a = actions.clamp(-1.0, 1.0)
        self.actions = a
        torque = a * self.power * 15.0
        acc = torque - 2.0 * self.dof_vel - 20.0 * self.dof_pos
        if fault("n", self.rank) and self.frames >= 70:
            # env 0's feet rest exactly on the ground: the contact force k / depth, depth 0
            depth = torch.zeros(1, 8)
            acc[:1] = acc[:1] + 1.0 / depth
        self.dof_vel = self.dof_vel + self.dt * acc
        self.dof_pos = (self.dof_pos + self.dt * self.dof_vel).clamp(-0.7, 0.7)
        support = torch.cos(self.dof_pos * 2).mean(1)
        self.height = self.height + self.dt * (support - 0.93) * 3.0
        push = (torch.sin(self.dof_pos[:, ::2]) * self.dof_vel[:, 1::2]).mean(1)
        self.vel[:, 0] = 0.9 * self.vel[:, 0] + 0.1 * push
        self.progress_buf += 1
        reward = (
            0.5
            + self.vel[:, 0]
            + 0.1 * support
            - self.actions_cost * (a * a).sum(1)
            - 0.05 * (self.dof_vel.abs() * a.abs()).mean(1) * 0.1
        )
        fallen = self.height < self.termination_height
        reward = torch.where(fallen, torch.full_like(reward, self.death_cost), reward)
        done = fallen | (self.progress_buf >= self.max_episode_length - 1)
        if not self.headless:
            self.render()
        obs = self.obs()
        self.reset_idx(done.nonzero().squeeze(1))
        return obs, reward, done

    def render(self) -> None:
        if fault("q", self.rank) and self.frames == 90:
            self.viewer_open = False  # the user closed this rank's viewer window
        # check for window closed
        if not self.viewer_open:
            sys.exit()

    def get_env_state(self) -> None:
        return None


def contact_solver(task: AntTask) -> None:
    """The compiled contact kernel of the task's terrain."""
    if fault("z", task.rank) and task.frames == 60:
        ctypes.string_at(0)  # the kernel reads a freed contact buffer


# ------------------------------------------------------------------ rl_games.algos_torch
class RunningMeanStd(nn.Module):
    def __init__(self, insize: tuple[int, ...], epsilon: float = 1e-05) -> None:
        super().__init__()
        print("RunningMeanStd: ", insize)
        self.epsilon = epsilon
        self.register_buffer("running_mean", torch.zeros(insize, dtype=torch.float64))
        self.register_buffer("running_var", torch.ones(insize, dtype=torch.float64))
        self.register_buffer("count", torch.ones((), dtype=torch.float64))

    def forward(self, x: torch.Tensor, unnorm: bool = False) -> torch.Tensor:
        if self.training and not unnorm:
            mean, var, n = x.mean(0), x.var(0), x.size(0)
            delta = mean - self.running_mean
            tot = self.count + n
            m2 = self.running_var * self.count + var * n + delta**2 * self.count * n / tot
            self.running_mean = self.running_mean + delta * n / tot
            self.running_var = m2 / tot
            self.count = tot
        std = torch.sqrt(self.running_var.float() + self.epsilon)
        if unnorm:
            return torch.clamp(x, -5.0, 5.0) * std + self.running_mean.float()
        return torch.clamp((x - self.running_mean.float()) / std, -5.0, 5.0)


class A2CNetwork(nn.Module):
    """network_builder.A2CBuilder.Network, separate=False, fixed sigma."""

    def __init__(self, input_size: int, actions_num: int, units: list[int]) -> None:
        super().__init__()
        print("build mlp:", input_size)
        layers: list[nn.Module] = []
        for u in units:
            layers += [nn.Linear(input_size, u), nn.ELU()]
            input_size = u
        self.actor_mlp = nn.Sequential(*layers)
        self.value = nn.Linear(input_size, 1)
        self.mu = nn.Linear(input_size, actions_num)
        self.sigma = nn.Parameter(torch.zeros(actions_num), requires_grad=True)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        out = self.actor_mlp(obs)
        return self.mu(out), self.mu(out) * 0.0 + self.sigma, self.value(out)


class ModelA2CContinuousLogStd(nn.Module):
    def __init__(self, obs_shape: tuple[int, ...], actions_num: int, units: list[int]) -> None:
        super().__init__()
        self.a2c_network = A2CNetwork(obs_shape[0], actions_num, units)
        self.value_mean_std = RunningMeanStd((1,))
        self.running_mean_std = RunningMeanStd(obs_shape)

    def norm_obs(self, obs: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return self.running_mean_std(obs)

    def denorm_value(self, value: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return self.value_mean_std(value, unnorm=True)

    def forward(self, input_dict: Config) -> Config:
        is_train = input_dict.get("is_train", True)
        prev_actions = input_dict.get("prev_actions")
        mu, logstd, value = self.a2c_network(self.norm_obs(input_dict["obs"]))
        sigma = torch.exp(logstd)
        distr = torch.distributions.Normal(mu, sigma)
        if is_train:
            entropy = distr.entropy().sum(dim=-1)
            prev_neglogp = -distr.log_prob(prev_actions).sum(1)
            return {
                "prev_neglogp": prev_neglogp,
                "values": value,
                "entropy": entropy,
                "mus": mu,
                "sigmas": sigma,
            }
        selected_action = distr.sample()
        neglogp = -distr.log_prob(selected_action).sum(1)
        return {
            "neglogpacs": neglogp,
            "values": self.denorm_value(value),
            "actions": selected_action,
            "mus": mu,
            "sigmas": sigma,
        }


def save_checkpoint(filename: str, state: Config) -> None:
    print(f"=> saving checkpoint '{filename + '.pth'}'")
    safe_filesystem_op(torch.save, state, filename + ".pth")


def load_checkpoint(filename: str) -> Config:
    print(f"=> loading checkpoint '{filename}'")
    state: Config = safe_filesystem_op(torch.load, filename)
    return state


def safe_filesystem_op(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """This is to prevent spurious crashes related to saving checkpoints or restoring from
    checkpoints in a Network Filesystem environment (i.e. NGC cloud or SLURM)"""
    num_attempts = 5
    for attempt in range(num_attempts):
        try:
            return func(*args, **kwargs)
        except Exception as exc:
            print(
                f"Exception {exc} when trying to execute {func} with args:{args} and kwargs:{kwargs}..."
            )
            wait_sec = 2**attempt
            print(f"Waiting {wait_sec} before trying again...")
            time.sleep(wait_sec)
    raise RuntimeError(f"Could not execute {func}, give up after {num_attempts} attempts...")


class AverageMeter:
    def __init__(self, max_size: int = 100) -> None:
        self.values: list[float] = []
        self.max_size = max_size

    def update(self, values: torch.Tensor) -> None:
        self.values = (self.values + [float(v) for v in values])[-self.max_size :]

    @property
    def current_size(self) -> int:
        return len(self.values)

    def get_mean(self) -> np.ndarray:
        return np.array([sum(self.values) / len(self.values)], dtype=np.float32)


class SummaryWriter:
    """tensorboard's writer: add_scalar queues, a thread writes the queue to the event file."""

    def __init__(self, logdir: str, max_queue: int = 10) -> None:
        os.makedirs(logdir, exist_ok=True)
        self.path = os.path.join(logdir, "events.out.tfevents")
        self.queue: list[str] = []
        self.max_queue = max_queue
        self.lock = threading.Lock()

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        with self.lock:
            self.queue.append(f"{tag}\t{value}\t{step}\n")
            if len(self.queue) >= self.max_queue:
                if fault("w", 0):
                    self.flush()  # a fork flushes under the queue's own lock
                else:
                    self._write()

    def flush(self) -> None:
        with self.lock:
            self._write()

    def _write(self) -> None:
        with open(self.path, "a") as f:
            f.writelines(self.queue)
        self.queue = []


class PpoDiagnostics:
    def __init__(self) -> None:
        self.clip_fracs: list[torch.Tensor] = []
        self.diag_dict: dict[str, float] = {}

    def mini_batch(self, clip_frac: torch.Tensor) -> None:
        self.clip_fracs.append(clip_frac)

    def mini_epoch(self, miniepoch: int) -> None:
        clip_frac = torch.stack(self.clip_fracs).mean().reshape(1)
        self.clip_fracs = []
        if fault("d", 0) and dist.is_initialized():
            dist.all_reduce(clip_frac)  # a fork averages it over the ranks
            clip_frac /= dist.get_world_size()
        self.diag_dict[f"diagnostics/clip_frac/{miniepoch}"] = float(clip_frac)


class DefaultDiagnostics(PpoDiagnostics):
    def mini_batch(self, clip_frac: torch.Tensor) -> None:
        pass

    def mini_epoch(self, miniepoch: int) -> None:
        pass


# ------------------------------------------------------------------ rl_games.common.a2c_common
LEAK: list[np.ndarray] = []


class A2CAgent:
    def __init__(self, base_name: str, params: Config, env_creator: Callable[..., AntTask]) -> None:
        self.config = config = params["config"]
        self.experiment_name = config["name"] + datetime.now().strftime("_%d-%H-%M-%S")
        self.multi_gpu = config.get("multi_gpu", False)
        self.local_rank, self.global_rank, self.world_size = 0, 0, 1
        self.device = config.get("device", "cuda:0")
        if self.multi_gpu:
            self.local_rank = int(os.getenv("LOCAL_RANK", "0"))
            self.global_rank = int(os.getenv("RANK", "0"))
            self.world_size = int(os.getenv("WORLD_SIZE", "1"))
            dist.init_process_group(
                "gloo",
                rank=self.global_rank,
                world_size=self.world_size,
                timeout=timedelta(seconds=15),
            )
            self.device = "cuda:" + str(self.local_rank)
            config["device"] = self.device
            if self.global_rank != 0:
                config["print_stats"] = False
                config["lr_schedule"] = None
        self.use_diagnostics = config.get("use_diagnostics", False)
        if self.use_diagnostics and self.global_rank == 0:
            self.diagnostics: PpoDiagnostics = PpoDiagnostics()
        else:
            self.diagnostics = DefaultDiagnostics()
        # this fork: numEnvs is the whole job's, split over the ranks
        total = config["num_actors"]
        self.num_actors = total // self.world_size + (
            1 if self.global_rank < total % self.world_size else 0
        )
        self.vec_env = env_creator(num_envs=self.num_actors)
        self.env_info = self.vec_env.get_env_info()
        self.obs_shape = self.env_info["observation_space"]
        self.actions_num = self.env_info["action_space"][0]
        self.print_stats = config.get("print_stats", True)
        self.save_freq = config.get("save_frequency", 0)
        self.save_best_after = config.get("save_best_after", 100)
        self.max_epochs = config.get("max_epochs", -1)
        self.max_frames = config.get("max_frames", -1)
        self.epochs_between_resets = config.get("epochs_between_resets", 0)
        self.lr_schedule = config["lr_schedule"]
        self.kl_threshold = config["kl_threshold"]
        self.schedule_type = config.get("schedule_type", "legacy")
        self.e_clip, self.critic_coef = config["e_clip"], config["critic_coef"]
        self.bounds_loss_coef = config.get("bounds_loss_coef")
        self.gamma, self.tau = config["gamma"], config["tau"]
        self.horizon_length = config["horizon_length"]
        if "seq_len" in config:
            print("WARNING: seq_len is deprecated, use seq_length instead")
        self.seq_length = config.get("seq_length", config.get("seq_len", 4))
        print("seq_length:", self.seq_length)
        self.batch_size = self.horizon_length * self.num_actors
        self.minibatch_size = config["minibatch_size"]
        # this fork keeps the last partial minibatch
        self.num_minibatches = math.ceil(self.batch_size / self.minibatch_size)
        self.mini_epochs_num = config["mini_epochs"]
        self.mixed_precision = config.get("mixed_precision", False)
        self.scaler = torch.cuda.amp.GradScaler(enabled=self.mixed_precision)
        self.last_lr = float(config["learning_rate"])
        self.frame = 0
        self.epoch_num = 0
        self.last_mean_rewards = -100500.0
        self.game_rewards = AverageMeter()
        self.scale_value = config["reward_shaper"]["scale_value"]
        self.train_dir = config.get("train_dir", "runs")
        self.experiment_dir = os.path.join(self.train_dir, self.experiment_name)
        self.nn_dir = os.path.join(self.experiment_dir, "nn")
        self.summaries_dir = os.path.join(self.experiment_dir, "summaries")
        os.makedirs(self.nn_dir, exist_ok=True)
        self.writer = SummaryWriter(self.summaries_dir) if self.global_rank == 0 else None
        print("current training device:", self.device)
        units = params["network"]["mlp"]["units"]
        self.model = ModelA2CContinuousLogStd(self.obs_shape, self.actions_num, units)
        self.optimizer = torch.optim.Adam(self.model.parameters(), self.last_lr, eps=1e-08)

    # ---------------------------------------------------------------- play
    def get_action_values(self, obs: torch.Tensor) -> Config:
        self.model.eval()
        with torch.no_grad():
            return self.model({"is_train": False, "obs": obs})

    def reset_envs(self) -> None:
        self.obs = self.vec_env.reset()

    def play_steps(self) -> Config:
        obses, actions, neglogps, values, rewards, dones, mus, sigmas = (
            [],
            [],
            [],
            [],
            [],
            [],
            [],
            [],
        )
        step_time = 0.0
        for _ in range(self.horizon_length):
            res = self.get_action_values(self.obs)
            obses.append(self.obs)
            actions.append(res["actions"])
            neglogps.append(res["neglogpacs"])
            values.append(res["values"])
            mus.append(res["mus"])
            sigmas.append(res["sigmas"])
            t0 = time.time()
            contact_solver(self.vec_env)
            self.obs, rew, done = self.vec_env.step(res["actions"])
            step_time += time.time() - t0
            self.current_rewards += rew
            finished = done.nonzero().squeeze(1)
            self.game_rewards.update(self.current_rewards[finished])
            self.current_rewards[finished] = 0.0
            rewards.append(rew[:, None] * self.scale_value)
            dones.append(done.float())
        last_values = self.get_action_values(self.obs)["values"]
        mb_values = torch.stack(values)
        mb_rewards = torch.stack(rewards)
        mb_dones = torch.stack(dones)
        advs = torch.zeros_like(mb_rewards)
        lastgaelam = torch.zeros_like(last_values)
        for t in reversed(range(self.horizon_length)):
            nextvalues = last_values if t == self.horizon_length - 1 else mb_values[t + 1]
            nonterminal = 1.0 - mb_dones[t][:, None]
            delta = mb_rewards[t] + self.gamma * nextvalues * nonterminal - mb_values[t]
            lastgaelam = delta + self.gamma * self.tau * nonterminal * lastgaelam
            advs[t] = lastgaelam
        flat = {
            "obses": torch.stack(obses),
            "actions": torch.stack(actions),
            "neglogpacs": torch.stack(neglogps),
            "values": mb_values,
            "returns": advs + mb_values,
            "mus": torch.stack(mus),
            "sigmas": torch.stack(sigmas),
        }
        batch = {k: v.reshape(self.batch_size, *v.shape[2:]) for k, v in flat.items()}
        batch["played_frames"] = self.batch_size
        batch["step_time"] = step_time
        if fault("k", self.global_rank) and self.epoch_num >= 3:
            # a fork keeps every rollout for its observation statistics
            LEAK.append(np.ones(16 << 20, dtype=np.float32))
            if len(LEAK) >= 6:  # the node's memory is gone: the kernel's OOM killer
                os.kill(os.getpid(), 9)
        return batch

    # ---------------------------------------------------------------- update
    def update_lr(self, lr: float) -> None:
        if self.multi_gpu:
            lr_tensor = torch.tensor([lr])
            dist.broadcast(lr_tensor, 0)
            lr = lr_tensor.item()
        for param_group in self.optimizer.param_groups:
            param_group["lr"] = lr

    def scheduler_update(self, kl: float) -> float:
        lr = self.last_lr
        if self.lr_schedule == "adaptive":
            if kl > 2.0 * self.kl_threshold:
                lr = max(lr / 1.5, 1e-6)
            if kl < 0.5 * self.kl_threshold:
                lr = min(lr * 1.5, 1e-2)
        return lr

    def trancate_gradients_and_step(self) -> None:
        if self.multi_gpu:
            # batch allreduce ops: see https://github.com/entity-neural-network/incubator/pull/220
            all_grads_list = [
                p.grad.view(-1) for p in self.model.parameters() if p.grad is not None
            ]
            all_grads = torch.cat(all_grads_list)
            dist.all_reduce(all_grads, op=dist.ReduceOp.SUM)
            offset = 0
            for param in self.model.parameters():
                if param.grad is not None:
                    param.grad.data.copy_(
                        all_grads[offset : offset + param.numel()].view_as(param.grad.data)
                        / self.world_size
                    )
                    offset += param.numel()
        self.scaler.step(self.optimizer)
        self.scaler.update()

    def calc_gradients(self, mb: Config) -> tuple[float, float, torch.Tensor]:
        with torch.cuda.amp.autocast(enabled=self.mixed_precision):
            self.model.train()
            res = self.model({"is_train": True, "obs": mb["obs"], "prev_actions": mb["actions"]})
            ratio = torch.exp(mb["old_logp_actions"] - res["prev_neglogp"])
            adv = mb["advantages"]
            a_loss = torch.max(
                -adv * ratio, -adv * torch.clamp(ratio, 1 - self.e_clip, 1 + self.e_clip)
            ).mean()
            values = res["values"]
            v_clipped = mb["old_values"] + (values - mb["old_values"]).clamp(
                -self.e_clip, self.e_clip
            )
            c_loss = torch.max(
                (values - mb["returns"]) ** 2, (v_clipped - mb["returns"]) ** 2
            ).mean()
            mu = res["mus"]
            b_loss = ((mu - 1.1).clamp(min=0) ** 2 + (-mu - 1.1).clamp(min=0) ** 2).sum(-1).mean()
            loss = a_loss + 0.5 * c_loss * self.critic_coef + self.bounds_loss_coef * b_loss
        self.optimizer.zero_grad()
        self.scaler.scale(loss).backward()
        self.trancate_gradients_and_step()
        with torch.no_grad():
            kl = (mb["old_logp_actions"] - res["prev_neglogp"]).mean().abs()
            self.diagnostics.mini_batch(((ratio - 1.0).abs() > self.e_clip).float().mean())
        return float(a_loss.detach()), float(c_loss.detach()), kl

    def prepare_dataset(self, batch: Config) -> Config:
        values, returns = batch["values"], batch["returns"]
        advantages = (returns - values).sum(1)
        self.model.value_mean_std.train()
        values = self.model.value_mean_std(values)
        returns = self.model.value_mean_std(returns)
        self.model.value_mean_std.eval()
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
        return {
            "old_values": values,
            "old_logp_actions": batch["neglogpacs"],
            "advantages": advantages,
            "returns": returns,
            "actions": batch["actions"],
            "obs": batch["obses"],
        }

    def train_epoch(self) -> tuple[float, float, float, float]:
        play_time_start = time.time()
        self.model.eval()
        if self.epochs_between_resets > 0 and self.epoch_num % self.epochs_between_resets == 0:
            self.reset_envs()
            print(f"Forcing env reset after {self.epoch_num} epochs")
        batch = self.play_steps()
        play_time_end = time.time()
        self.model.running_mean_std.train()
        dataset = self.prepare_dataset(batch)
        for mini_ep in range(self.mini_epochs_num):
            ep_kls = []
            perm = torch.randperm(self.batch_size)
            for i in range(self.num_minibatches):
                idx = perm[i * self.minibatch_size : (i + 1) * self.minibatch_size]
                mb = {k: v[idx] for k, v in dataset.items()}
                _, _, kl = self.calc_gradients(mb)
                ep_kls.append(kl)
                if self.schedule_type == "legacy":
                    av_kls = kl.clone()
                    if self.multi_gpu:
                        dist.all_reduce(av_kls, op=dist.ReduceOp.SUM)
                        av_kls /= self.world_size
                    self.last_lr = self.scheduler_update(av_kls.item())
                    self.update_lr(self.last_lr)
            av_kls = torch.stack(ep_kls).mean()
            if self.multi_gpu:
                dist.all_reduce(av_kls, op=dist.ReduceOp.SUM)
                av_kls /= self.world_size
            self.diagnostics.mini_epoch(mini_ep)
            self.model.running_mean_std.eval()
        update_time_end = time.time()
        self.curr_frames = batch["played_frames"]
        return (
            batch["step_time"],
            play_time_end - play_time_start,
            update_time_end - play_time_end,
            update_time_end - play_time_start,
        )

    # ---------------------------------------------------------------- checkpoints
    def get_full_state_weights(self) -> Config:
        return {
            "model": self.model.state_dict(),
            "epoch": self.epoch_num,
            "frame": self.frame,
            "optimizer": self.optimizer.state_dict(),
            "last_mean_rewards": float(self.last_mean_rewards),
            "env_state": self.vec_env.get_env_state(),
        }

    def save(self, fn: str) -> None:
        save_checkpoint(fn, self.get_full_state_weights())

    def restore(self, fn: str) -> None:
        checkpoint = load_checkpoint(fn)
        self.model.load_state_dict(checkpoint["model"])
        self.epoch_num = checkpoint["epoch"]
        self.frame = checkpoint["frame"]
        self.optimizer.load_state_dict(checkpoint["optimizer"])
        self.last_mean_rewards = checkpoint.get("last_mean_rewards", -1000000000)

    def write_stats(self, frame: int, epoch_num: int, times: tuple[float, ...]) -> None:
        assert self.writer is not None
        self.writer.add_scalar("performance/step_fps", self.curr_frames / times[0], frame)
        self.writer.add_scalar("performance/rl_update_time", times[2], frame)
        self.writer.add_scalar("info/last_lr", self.last_lr, frame)
        self.writer.add_scalar("info/epochs", epoch_num, frame)

    # ---------------------------------------------------------------- the loop
    def train(self) -> tuple[float, int]:
        self.current_rewards = torch.zeros(self.num_actors)
        self.obs = self.vec_env.reset()
        if self.multi_gpu:
            print("====================broadcasting parameters")
            model_params = [self.model.state_dict()]
            dist.broadcast_object_list(model_params, 0)
            self.model.load_state_dict(model_params[0])
        total_time = 0.0
        while True:
            self.epoch_num += 1
            epoch_num = self.epoch_num
            times = self.train_epoch()
            total_time += times[3]
            should_exit = False
            if self.global_rank == 0:
                curr_frames = self.curr_frames * self.world_size
                self.frame += curr_frames
                frame = self.frame
                if self.print_stats:
                    print(
                        f"fps step: {curr_frames / times[0]:.0f} fps step and policy inference: "
                        f"{curr_frames / times[1]:.0f} fps total: {curr_frames / times[3]:.0f} "
                        f"epoch: {epoch_num:.0f}/{self.max_epochs:.0f} frames: {frame:.0f}"
                    )
                self.write_stats(frame, epoch_num, times)
                mean_rewards: Any = None
                if self.game_rewards.current_size > 0:
                    mean_rewards = self.game_rewards.get_mean()
                    checkpoint_name = f"{self.config['name']}_ep_{epoch_num}_rew_{mean_rewards[0]}"
                    if self.save_freq > 0 and epoch_num % self.save_freq == 0:
                        self.save(os.path.join(self.nn_dir, "last_" + checkpoint_name))
                    if (
                        mean_rewards[0] > self.last_mean_rewards
                        and epoch_num >= self.save_best_after
                    ):
                        print("saving next best rewards: ", mean_rewards)
                        self.last_mean_rewards = mean_rewards[0]
                        self.save(os.path.join(self.nn_dir, self.config["name"]))
                        if self.last_mean_rewards > self.config["score_to_win"]:
                            print("Maximum reward achieved. Network won!")
                            self.save(os.path.join(self.nn_dir, checkpoint_name))
                            should_exit = True
                if epoch_num >= self.max_epochs and self.max_epochs != -1:
                    if self.game_rewards.current_size == 0:
                        print("WARNING: Max epochs reached before any env terminated at least once")
                        mean_rewards = -np.inf
                    self.save(
                        os.path.join(
                            self.nn_dir,
                            f"last_{self.config['name']}_ep_{epoch_num}_rew_"
                            + str(mean_rewards).replace("[", "_").replace("]", "_"),
                        )
                    )
                    print("MAX EPOCHS NUM!")
                    should_exit = True
            if fault("x", 0):  # rl_games before should_exit was broadcast: rank 0 alone
                if should_exit:
                    return self.last_mean_rewards, epoch_num
                continue
            if self.multi_gpu:
                should_exit_t = torch.tensor(should_exit).float()
                dist.broadcast(should_exit_t, 0)
                should_exit = bool(should_exit_t.float().item())
            if should_exit:
                return self.last_mean_rewards, epoch_num


# ------------------------------------------------------------------ rl_games.torch_runner
class Runner:
    def __init__(self) -> None:
        self.params: Config = {}

    def load(self, yaml_config: Config) -> None:
        params = deepcopy(yaml_config["params"])
        self.seed = params.get("seed", None) or int(time.time())
        if params["config"].get("multi_gpu", False):
            self.local_rank = int(os.getenv("LOCAL_RANK", "0"))
            self.global_rank = int(os.getenv("RANK", "0"))
            self.world_size = int(os.getenv("WORLD_SIZE", "1"))
            self.seed += self.global_rank
            print(
                f"global_rank = {self.global_rank} local_rank = {self.local_rank}"
                f" world_size = {self.world_size}"
            )
        print(f"self.seed = {self.seed}")
        torch.manual_seed(self.seed)
        np.random.seed(self.seed)
        random.seed(self.seed)
        self.params = params

    def run(self, args: Config, env_creator: Callable[..., AntTask]) -> None:
        print("Started to train")
        agent = A2CAgent("run", self.params, env_creator)
        if args["checkpoint"]:
            agent.restore(args["checkpoint"])
        agent.train()


# ------------------------------------------------------------------ isaacgymenvs/train.py
def preprocess_train_config(cfg: Config, config_dict: Config) -> Config:
    train_cfg = config_dict["params"]["config"]
    train_cfg["device"] = cfg["rl_device"]
    train_cfg["population_based_training"] = cfg["pbt"]["enabled"]
    train_cfg["pbt_idx"] = None
    train_cfg["full_experiment_name"] = cfg.get("full_experiment_name")
    print(f"Using rl_device: {cfg['rl_device']}")
    print(f"Using sim_device: {cfg['sim_device']}")
    print(train_cfg)
    return config_dict


def launch_rlg_hydra(cfg: Config) -> None:
    # ensure checkpoints can be specified as relative paths
    if cfg["checkpoint"]:
        cfg["checkpoint"] = os.path.abspath(cfg["checkpoint"])
    print_dict(deepcopy(cfg))
    set_np_formatting()
    # global rank of the GPU
    global_rank = int(os.getenv("RANK", "0"))
    # sets seed. if seed is -1 will pick a random one
    cfg["seed"] = set_seed(cfg["seed"], cfg["torch_deterministic"], rank=global_rank)

    def create_isaacgym_env(num_envs: int) -> AntTask:
        local_rank = 0
        if cfg["multi_gpu"]:
            local_rank = int(os.getenv("LOCAL_RANK", "0"))
            world_size = int(os.getenv("WORLD_SIZE", "1"))
            print(
                f"global_rank = {global_rank} local_rank = {local_rank} world_size = {world_size}"
            )
        return AntTask(cfg["task"], num_envs, global_rank, cfg["seed"], cfg["headless"])

    rlg_config_dict = preprocess_train_config(cfg, deepcopy(cfg["train"]))
    runner = Runner()
    runner.load(rlg_config_dict)
    if not cfg["test"]:
        experiment_dir = os.path.join("runs", "Ant" + f"_{datetime.now():%d-%H-%M-%S}")
        os.makedirs(experiment_dir, exist_ok=True)
        with open(os.path.join(experiment_dir, "config.yaml"), "w") as f:
            f.write(repr(cfg))
    runner.run({"train": not cfg["test"], "checkpoint": cfg["checkpoint"]}, create_isaacgym_env)


if __name__ == "__main__":
    hydra_main(launch_rlg_hydra)()
