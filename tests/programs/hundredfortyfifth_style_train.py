"""A hundred-and-forty-fifth training-program style for the generalisation fixtures
(tests/fixtures/real/hundredfortyfifth-*): embodied-AI reinforcement learning the way
facebookresearch/habitat-lab's DD-PPO trainer (habitat_baselines) trains a PointNav agent,
re-created in plain torch without habitat installed. Each run's folder links this file as run.py
beside ddppo_pointnav.yaml and a data/ tree; it is started as the DD-PPO README says: `python -u
-m torch.distributed.launch --use_env --nproc_per_node 2 run.py --exp-config ddppo_pointnav.yaml
--run-type train` (or torchrun, or one launcher per simulated node).

As there: the rank from LOCAL_RANK/RANK/WORLD_SIZE (or SLURM_LOCALID/SLURM_PROCID/SLURM_NTASKS);
DD-PPO's own TCPStore on MAIN_ADDR:MAIN_PORT (plus SLURM_JOB_ID % 127) with the process group
(gloo here, a 15 s timeout) and a PrefixStore 'rollout_tracker' counting finished rollouts;
signal handlers (SIGUSR1: 'Got signal to requeue', SIGTERM: 'Exiting cleanly and saving state')
that make every rank save a resume state (.habitat-resume-state.pth) and leave the update loop,
then rank 0 logs 'Requeueing job N' and calls `scontrol requeue N`; a VectorEnv per rank whose
environments each live in a forkserver worker PROCESS talking over a duplex pipe (a toy grid
PointNav simulator: scenes stored as .glb files, episodes as json.gz per scene, split over the
ranks and their environments), workers that ignore the job's signals in a Slurm batch job; rollouts of 16 steps,
PPO (2 epochs, 2 mini-batches split by environment) on a tiny actor-critic with a GRU state
encoder in DDP. Only rank 0 logs, through the 'habitat' logger ('%(asctime)-15s %(message)s',
stderr): 'config: ...' (the whole config as YAML), 'Initialized DD-PPO with 2 workers', 'agent
number of parameters: N', every 5 updates 'update: 10\\tfps: 123.456\\t', 'update: 10\\tenv-time:
1.234s\\tpth-time: 0.567s\\tframes: 2560', 'Average window size: 50  distance_to_goal: 1.234
reward: 0.123  success: 0.500'; checkpoints data/new_checkpoints/ckpt.N.pth, nothing printed.
Every rank's own errors reach the console (torch's '[rankN]:' prefix); an environment worker's
uncaught exception is printed by multiprocessing ('Process ForkServerProcess-1:').

A fault in the code is chosen by the MT_CASE environment variable (a letter and a rank) and never
printed (re-capture with tests/fixtures/real/capture_hundredfortyfifth.sh after any edit).
`python run.py --generate DIR NSCENES` writes the toy scenes, episodes and ddppo_pointnav.yaml.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import glob
import gzip
import json
import logging
import math
import multiprocessing
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as distrib
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

CASE = os.environ.get("MT_CASE", "")
GRID = 12
OBS = 27


def fault(letter: str, rank: int) -> bool:
    if not CASE.startswith(letter):
        return False
    which = CASE[len(letter) :]
    return which == "" or int(which) == rank


# ------------------------------------------------------------------ habitat.core.logging
class HabitatLogger(logging.Logger):
    def __init__(self, name: str, level: int, format_str: str) -> None:
        super().__init__(name, level)
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter(format_str))
        self.addHandler(handler)


logger = HabitatLogger(name="habitat", level=logging.INFO, format_str="%(asctime)-15s %(message)s")


# ------------------------------------------------------------------ a tiny YAML (the config)
def load_yaml(path: str) -> dict[str, Any]:
    root: dict[str, Any] = {}
    stack: list[tuple[int, dict[str, Any]]] = [(-1, root)]
    with open(path) as f:
        for raw in f:
            if not raw.strip() or raw.lstrip().startswith("#"):
                continue
            indent = len(raw) - len(raw.lstrip())
            key, _, value = raw.strip().partition(":")
            while stack[-1][0] >= indent:
                stack.pop()
            if value.strip() == "":
                child: dict[str, Any] = {}
                stack[-1][1][key] = child
                stack.append((indent, child))
            else:
                stack[-1][1][key] = parse_scalar(value.strip())
    return root


def parse_scalar(v: str) -> Any:
    if v in ("True", "true"):
        return True
    if v in ("False", "false"):
        return False
    for cast in (int, float):
        try:
            return cast(v)
        except ValueError:
            pass
    return v.strip("'\"")


def to_yaml(d: dict[str, Any], indent: int = 0) -> str:
    out = []
    for k, v in d.items():
        if isinstance(v, dict):
            out.append(" " * indent + f"{k}:\n" + to_yaml(v, indent + 2))
        else:
            out.append(" " * indent + f"{k}: {v}\n")
    return "".join(out)


def merge_opts(config: dict[str, Any], opts: list[str]) -> None:
    for opt in opts:
        key, _, value = opt.partition("=")
        *path, last = key.split(".")
        node = config
        for p in path:
            node = node[p]
        if last not in node:
            raise KeyError(f"Key '{key}' is not in the config")
        node[last] = parse_scalar(value)


CONFIG_YAML = """\
habitat:
  seed: 100
  environment:
    max_episode_steps: 40
    max_scene_repeat_episodes: 4
  simulator:
    scene_dataset: data/scene_datasets/toy
    forward_step_size: 1
    turn_angle: 90
  task:
    type: Nav-v0
    success_distance: 1
    measurements: distance_to_goal,success,spl
  dataset:
    type: PointNav-v1
    split: train
    data_path: data/datasets/pointnav/toy/v1/train/content
habitat_baselines:
  trainer_name: ddppo
  torch_gpu_id: 0
  num_environments: 2
  num_updates: 40
  num_checkpoints: 4
  checkpoint_folder: data/new_checkpoints
  log_interval: 5
  verbose: True
  force_distributed: True
  rl:
    ppo:
      clip_param: 0.2
      ppo_epoch: 2
      num_mini_batch: 2
      value_loss_coef: 0.5
      entropy_coef: 0.01
      lr: 0.00025
      num_steps: 16
      hidden_size: 32
      rnn_dropout: 0.0
      gamma: 0.99
      tau: 0.95
      reward_window_size: 50
      target_success: 0.0
    ddppo:
      sync_frac: 0.6
      distrib_backend: gloo
      find_unused_params: False
    preemption:
      append_slurm_job_id: False
"""


# ------------------------------------------------------------------ the toy data set
def generate(folder: str, n_scenes: int) -> None:
    rng = np.random.RandomState(0)
    scenes = os.path.join(folder, "data", "scene_datasets", "toy")
    content = os.path.join(folder, "data", "datasets", "pointnav", "toy", "v1", "train", "content")
    os.makedirs(scenes, exist_ok=True)
    os.makedirs(content, exist_ok=True)
    for s in range(n_scenes):
        grid = (rng.random_sample((GRID, GRID)) < 0.12).astype(np.uint8)
        grid[0, :] = grid[-1, :] = grid[:, 0] = grid[:, -1] = 1
        with open(os.path.join(scenes, f"scene{s}.glb"), "wb") as f:
            f.write(b"glTF" + grid.tobytes())
        free = np.argwhere(grid == 0)
        episodes = []
        for e in range(24):
            a, b = free[rng.randint(len(free))], free[rng.randint(len(free))]
            episodes.append(
                {
                    "episode_id": str(e),
                    "scene_id": f"data/scene_datasets/toy/scene{s}.glb",
                    "start_position": [int(a[0]), int(a[1])],
                    "start_rotation": int(rng.randint(4)),
                    "goals": [{"position": [int(b[0]), int(b[1])], "radius": None}],
                    "info": {"geodesic_distance": float(np.abs(a - b).sum())},
                }
            )
        with gzip.open(os.path.join(content, f"scene{s}.json.gz"), "wt") as f:
            json.dump({"episodes": episodes}, f)
    with open(os.path.join(folder, "ddppo_pointnav.yaml"), "w") as f:
        f.write(CONFIG_YAML)


# ------------------------------------------------------------------ habitat.Env (a toy simulator)
HEADINGS = [(-1, 0), (0, 1), (1, 0), (0, -1)]


class NavEnv:
    def __init__(self, config: dict[str, Any], scenes: list[str], rank: int, index: int) -> None:
        self.config = config
        self.rank, self.index = rank, index
        data_path = config["habitat"]["dataset"]["data_path"]
        self.episodes: list[dict[str, Any]] = []
        for scene in scenes:
            with gzip.open(os.path.join(data_path, f"{scene}.json.gz"), "rt") as f:
                self.episodes += json.load(f)["episodes"]
        random.Random(config["habitat"]["seed"] + index).shuffle(self.episodes)
        # the episode iterator: at most max_scene_repeat_episodes in a row from one scene
        repeat = config["habitat"]["environment"]["max_scene_repeat_episodes"]
        by_scene: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
        for ep in self.episodes:
            by_scene[ep["scene_id"]].append(ep)
        rounds = max(len(v) for v in by_scene.values())
        self.episodes = [
            ep
            for r in range(0, rounds, repeat)
            for scene in sorted(by_scene)
            for ep in by_scene[scene][r : r + repeat]
        ]
        self.scene_loads = 0
        self._iter = 0
        self._scene_id = ""
        self.grid = np.zeros((GRID, GRID), dtype=np.uint8)
        self.max_steps = config["habitat"]["environment"]["max_episode_steps"]
        self.steps = 0
        self._lock = threading.Lock()

    def _load_scene(self, scene_id: str) -> None:
        self.scene_loads += 1
        if fault("c", self.rank) and self.index == 0 and self.scene_loads == 3:
            time.sleep(40)  # this scene comes from a slow network mount
        with open(scene_id, "rb") as f:
            raw = f.read()
        self.grid = np.frombuffer(raw[4:], dtype=np.uint8).reshape(GRID, GRID)
        self._scene_id = scene_id

    @property
    def number_of_episodes(self) -> int:
        return len(self.episodes)

    @property
    def observation_space(self) -> tuple[int]:
        return (OBS,)

    @property
    def action_space(self) -> int:
        return 4

    def _obs(self) -> np.ndarray:
        x, y = self.pos
        padded = np.pad(self.grid, 2, constant_values=1)
        patch = np.rot90(padded[x : x + 5, y : y + 5], self.heading).astype(np.float32)
        gx, gy = self.goal
        rho = math.hypot(gx - x, gy - y)
        phi = math.atan2(gy - y, gx - x) - self.heading * math.pi / 2
        return np.concatenate([patch.ravel(), [rho / GRID, phi]]).astype(np.float32)

    def reset(self) -> np.ndarray:
        ep = self.episodes[self._iter % len(self.episodes)]
        self._iter += 1
        if ep["scene_id"] != self._scene_id:
            self._load_scene(ep["scene_id"])
        self.pos = tuple(ep["start_position"])
        self.heading = ep["start_rotation"]
        self.goal = tuple(ep["goals"][0]["position"])
        self.geodesic = max(ep["info"]["geodesic_distance"], 1.0)
        self.steps, self.path = 0, 0.0
        self.called_stop = False
        return self._obs()

    def distance_to_goal(self) -> float:
        return float(abs(self.pos[0] - self.goal[0]) + abs(self.pos[1] - self.goal[1]))

    def step(self, action: int) -> tuple[np.ndarray, float, bool, dict[str, float]]:
        before = self.distance_to_goal()
        self.steps += 1
        if action == 0:
            self.called_stop = True
        elif action == 1:
            dx, dy = HEADINGS[self.heading]
            nx, ny = self.pos[0] + dx, self.pos[1] + dy
            if self.grid[nx, ny] == 0:
                self.pos = (nx, ny)
                self.path += 1
        else:
            self.heading = (self.heading + (1 if action == 2 else -1)) % 4
        after = self.distance_to_goal()
        success = self.called_stop and after <= self.config["habitat"]["task"]["success_distance"]
        reward = -0.01 + (before - after) + (2.5 if success else 0.0)
        done = self.called_stop or self.steps >= self.max_steps
        info = {"distance_to_goal": after, "success": float(success)}
        if fault("w", self.rank) and self.index == 1 and self._iter > 12 and done:
            self._lock.acquire()
            self._lock.acquire()  # the SPL measure takes the episode lock again
        if fault("x", self.rank) and self._iter > 10 and done:
            info["spl"] = float(success) * self.geodesic / max(self.path, self.geodesic)
            info["spl"] += info["soft_spl"]  # a fork's SPL reads a measure it never registered
        return self._obs(), reward, done, info

    def close(self) -> None:
        pass


def make_env_fn(config: dict[str, Any], scenes: list[str], rank: int, index: int) -> NavEnv:
    return NavEnv(config, scenes, rank, index)


# ------------------------------------------------------------------ habitat.core.vector_env
STEP_COMMAND, RESET_COMMAND, CLOSE_COMMAND, CALL_COMMAND = "step", "reset", "close", "call"


def _worker_env(
    connection_read_fn: Callable[[], Any],
    connection_write_fn: Callable[[Any], None],
    env_fn: Callable[..., NavEnv],
    env_fn_args: tuple[Any, ...],
    auto_reset_done: bool,
    mask_signals: bool = False,
    child_pipe: Any = None,
    parent_pipe: Any = None,
) -> None:
    if mask_signals:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(sig, signal.SIG_IGN)
    env = env_fn(*env_fn_args)
    if parent_pipe is not None:
        parent_pipe.close()
    steps = 0
    try:
        command, data = connection_read_fn()
        while command != CLOSE_COMMAND:
            if command == STEP_COMMAND:
                observations, reward, done, info = env.step(data)
                if auto_reset_done and done:
                    observations = env.reset()
                connection_write_fn((observations, reward, done, info))
                steps += 1
                if fault("g", env.rank) and env.index == 1 and steps == 150:
                    ctypes.string_at(0)  # the renderer frees the frame it just sent
            elif command == RESET_COMMAND:
                connection_write_fn(env.reset())
            elif command == CALL_COMMAND:
                function_name, _ = data
                connection_write_fn(getattr(env, function_name))
            else:
                raise NotImplementedError(f"Unknown command {command}")
            command, data = connection_read_fn()
    except KeyboardInterrupt:
        logger.info("Worker KeyboardInterrupt")
    finally:
        if child_pipe is not None:
            child_pipe.close()
        env.close()


class VectorEnv:
    def __init__(
        self,
        make_env_fn: Callable[..., NavEnv],
        env_fn_args: list[tuple[Any, ...]],
        auto_reset_done: bool = True,
        multiprocessing_start_method: str = "forkserver",
        workers_ignore_signals: bool = False,
    ) -> None:
        assert len(env_fn_args) > 0, "number of environments to be created should be greater than 0"
        self._num_envs = len(env_fn_args)
        self._mp_ctx = multiprocessing.get_context(multiprocessing_start_method)
        self._workers: list[Any] = []
        self._read, self._write = [], []
        for args in env_fn_args:
            parent_conn, worker_conn = self._mp_ctx.Pipe(duplex=True)
            ps = self._mp_ctx.Process(  # type: ignore[attr-defined]
                target=_worker_env,
                args=(
                    worker_conn.recv,
                    worker_conn.send,
                    make_env_fn,
                    args,
                    auto_reset_done,
                    workers_ignore_signals,
                    worker_conn,
                    parent_conn,
                ),
            )
            self._workers.append(ps)
            ps.daemon = True
            ps.start()
            worker_conn.close()
            self._read.append(parent_conn.recv)
            self._write.append(parent_conn.send)
        self._is_closed = False
        for write_fn in self._write:
            write_fn((CALL_COMMAND, ("observation_space", None)))
        self.observation_spaces = [read_fn() for read_fn in self._read]
        for write_fn in self._write:
            write_fn((CALL_COMMAND, ("number_of_episodes", None)))
        self.number_of_episodes = [read_fn() for read_fn in self._read]

    @property
    def num_envs(self) -> int:
        return self._num_envs

    def reset(self) -> list[Any]:
        for write_fn in self._write:
            write_fn((RESET_COMMAND, None))
        return [read_fn() for read_fn in self._read]

    def async_step(self, data: list[int]) -> None:
        for write_fn, act in zip(self._write, data, strict=True):
            write_fn((STEP_COMMAND, act))

    def wait_step(self) -> list[Any]:
        return [read_fn() for read_fn in self._read]

    def close(self) -> None:
        if self._is_closed:
            return
        for write_fn in self._write:
            write_fn((CLOSE_COMMAND, None))
        for process in self._workers:
            process.join()
        self._is_closed = True


# ------------------------------------------------------------------ habitat_baselines ddp_utils
EXIT = threading.Event()
REQUEUE = threading.Event()
SAVE_STATE = threading.Event()
DEFAULT_PORT = 8738
DEFAULT_PORT_RANGE = 127
SLURM_JOBID = os.environ.get("SLURM_JOB_ID", None)
RESUME_STATE_BASE_NAME = ".habitat-resume-state"


def _clean_exit_handler(signum: int, frame: Any) -> None:
    EXIT.set()
    print("Exiting cleanly", flush=True)


def _clean_exit_and_save_handler(signum: int, frame: Any) -> None:
    EXIT.set()
    SAVE_STATE.set()
    print("Exiting cleanly and saving state", flush=True)


def _requeue_handler(signum: int, frame: Any) -> None:
    REQUEUE.set()
    SAVE_STATE.set()
    EXIT.set()
    print("Got signal to requeue", flush=True)


def add_signal_handlers() -> None:
    signal.signal(signal.SIGINT, _clean_exit_handler)
    signal.signal(signal.SIGUSR2, _clean_exit_handler)
    signal.signal(signal.SIGTERM, _clean_exit_and_save_handler)
    signal.signal(signal.SIGUSR1, _requeue_handler)


def rank0_only() -> bool:
    return not distrib.is_initialized() or distrib.get_rank() == 0


def is_slurm_batch_job() -> bool:
    return SLURM_JOBID is not None and os.environ.get("SLURM_JOB_NAME") not in (
        None,
        "bash",
        "zsh",
        "sh",
        "interactive",
    )


def resume_state_filename(config: dict[str, Any]) -> str:
    fname = RESUME_STATE_BASE_NAME
    if (
        SLURM_JOBID is not None
        and config["habitat_baselines"]["rl"]["preemption"]["append_slurm_job_id"]
    ):
        fname += f"-{SLURM_JOBID}"
    folder = config["habitat_baselines"]["checkpoint_folder"]
    rank = distrib.get_rank() if distrib.is_initialized() else 0
    return os.path.join(folder, fname + (f"-rank{rank}" if rank else "") + ".pth")


def save_resume_state(state: Any, config: dict[str, Any]) -> None:
    torch.save(state, resume_state_filename(config))


def requeue_job() -> None:
    if not is_slurm_batch_job() or not REQUEUE.is_set():
        return
    if distrib.is_initialized():
        distrib.barrier()
    if rank0_only():
        logger.info(f"Requeueing job {SLURM_JOBID}")
        subprocess.check_call(["scontrol", "requeue", str(SLURM_JOBID)])


def get_distrib_size() -> tuple[int, int, int]:
    if os.environ.get("LOCAL_RANK", None) is not None:
        return int(os.environ["LOCAL_RANK"]), int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if os.environ.get("SLURM_JOBID", None) is not None:
        return (
            int(os.environ["SLURM_LOCALID"]),
            int(os.environ["SLURM_PROCID"]),
            int(os.environ["SLURM_NTASKS"]),
        )
    return 0, 0, 1


def init_distrib_slurm(backend: str = "gloo") -> tuple[int, distrib.TCPStore]:
    local_rank, world_rank, world_size = get_distrib_size()
    main_port = int(os.environ.get("MAIN_PORT", DEFAULT_PORT))
    if SLURM_JOBID is not None:
        main_port += int(SLURM_JOBID) % int(os.environ.get("MAIN_PORT_RANGE", DEFAULT_PORT_RANGE))
    main_addr = os.environ.get("MAIN_ADDR", "127.0.0.1")
    tcp_store = distrib.TCPStore(  # type: ignore[call-arg]
        main_addr, main_port, world_size, world_rank == 0, timeout=timedelta(seconds=60)
    )
    distrib.init_process_group(
        backend,
        store=tcp_store,
        rank=world_rank,
        world_size=world_size,
        timeout=timedelta(seconds=15),
    )
    return local_rank, tcp_store


# ------------------------------------------------------------------ the policy
class PointNavBaselinePolicy(nn.Module):
    def __init__(self, hidden_size: int, rnn_dropout: float) -> None:
        super().__init__()
        self.visual_encoder = nn.Sequential(nn.Linear(25, hidden_size), nn.ReLU())
        self.goal_encoder = nn.Linear(2, 8)
        self.state_encoder = nn.GRU(hidden_size + 8, hidden_size, dropout=rnn_dropout)
        self.action_distribution = nn.Linear(hidden_size, 4)
        self.critic = nn.Linear(hidden_size, 1)

    def forward(
        self, obs: torch.Tensor, hidden: torch.Tensor, masks: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = torch.cat([self.visual_encoder(obs[:, :25]), self.goal_encoder(obs[:, 25:])], 1)
        out, h = self.state_encoder(x[None], (hidden * masks)[None])
        feats = out[0]
        return self.action_distribution(feats), self.critic(feats).squeeze(1), h[0]


# ------------------------------------------------------------------ habitat_baselines ppo_trainer
LEAK: list[np.ndarray] = []


class PPOTrainer:
    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.hb = config["habitat_baselines"]
        self.ppo = self.hb["rl"]["ppo"]

    def _construct_envs(self, rank: int, world: int) -> VectorEnv:
        data_path = self.config["habitat"]["dataset"]["data_path"]
        scenes = sorted(
            os.path.basename(p)[: -len(".json.gz")]
            for p in glob.glob(os.path.join(data_path, "*.json.gz"))
        )
        scenes = scenes[rank::world]
        num_environments = self.hb["num_environments"]
        if len(scenes) < num_environments:
            if fault("u", rank):  # a fork runs what scenes there are
                num_environments = len(scenes)
            else:
                raise RuntimeError(
                    "reduce the number of environments as there "
                    "aren't enough number of scenes.\n"
                    f"num_environments: {num_environments}\tnum_scenes: {len(scenes)}"
                )
        splits: list[list[str]] = [[] for _ in range(num_environments)]
        for i, scene in enumerate(scenes):
            splits[i % num_environments].append(scene)
        args = [(self.config, splits[i], rank, i) for i in range(num_environments)]
        return VectorEnv(make_env_fn, args, workers_ignore_signals=is_slurm_batch_job())

    def train(self) -> None:
        _local_rank, tcp_store = init_distrib_slurm(self.hb["rl"]["ddppo"]["distrib_backend"])
        rank, world = distrib.get_rank(), distrib.get_world_size()
        if rank0_only():
            logger.info(f"Initialized DD-PPO with {world} workers")
            if self.hb["verbose"]:
                logger.info(f"config: {to_yaml(self.config)}")
        store = distrib.PrefixStore("rollout_tracker", tcp_store)
        store.set("num_done", "0")
        self.config["habitat"]["seed"] += rank * self.hb["num_environments"]
        random.seed(self.config["habitat"]["seed"])
        torch.manual_seed(self.config["habitat"]["seed"])

        envs = self._construct_envs(rank, world)
        n = envs.num_envs
        hs = self.ppo["hidden_size"]
        torch.manual_seed(0)
        policy = PointNavBaselinePolicy(hs, self.ppo["rnn_dropout"])
        model = DistributedDataParallel(
            policy, find_unused_parameters=self.hb["rl"]["ddppo"]["find_unused_params"]
        )
        if rank0_only():
            n_params = sum(p.numel() for p in policy.parameters())
            logger.info(f"agent number of parameters: {n_params}")
        optimizer = torch.optim.Adam(model.parameters(), lr=self.ppo["lr"], eps=1e-5)
        os.makedirs(self.hb["checkpoint_folder"], exist_ok=True)

        obs = torch.from_numpy(np.stack(envs.reset()))
        hidden = torch.zeros(n, hs)
        masks = torch.zeros(n, 1)
        window: dict[str, collections.deque[float]] = collections.defaultdict(
            lambda: collections.deque(maxlen=self.ppo["reward_window_size"])
        )
        running_reward = torch.zeros(n)
        env_time = pth_time = 0.0
        count_steps = 0
        count_checkpoints = 0
        t_start = time.time()
        num_updates = self.hb["num_updates"]
        ckpt_every = max(num_updates // self.hb["num_checkpoints"], 1)
        T = self.ppo["num_steps"]
        for update in range(num_updates):
            if rank0_only():
                store.set("num_done", "0")
            # ---------------------------------------------------------- rollout
            b_obs, b_hid, b_mask, b_act, b_logp, b_val, b_rew = [], [], [], [], [], [], []
            for step in range(T):
                t0 = time.time()
                with torch.no_grad():
                    logits, value, new_hidden = policy(obs, hidden, masks)
                    dist_ = torch.distributions.Categorical(logits=logits)
                    action = dist_.sample()
                b_obs.append(obs)
                b_hid.append(hidden)
                b_mask.append(masks)
                b_act.append(action)
                b_logp.append(dist_.log_prob(action))
                b_val.append(value)
                pth_time += time.time() - t0
                t0 = time.time()
                envs.async_step(action.tolist())
                outputs = envs.wait_step()
                env_time += time.time() - t0
                o, r, d, infos = zip(*outputs, strict=True)
                rew = torch.tensor(r, dtype=torch.float32)
                done = torch.tensor(d, dtype=torch.float32)
                running_reward += rew
                for i in range(n):
                    if d[i]:
                        window["reward"].append(float(running_reward[i]))
                        window["count"].append(1.0)
                        for k, v in infos[i].items():
                            window[k].append(v)
                running_reward *= 1 - done
                b_rew.append(rew)
                obs = torch.from_numpy(np.stack(o))
                hidden = new_hidden
                masks = (1 - done)[:, None]
                count_steps += n
                if fault("k", rank) and update >= 3:  # a fork keeps every frame it rendered
                    LEAK.append(np.ones(8 << 20, dtype=np.float32))
                    if len(LEAK) >= 12:  # the node's memory is gone: the kernel's OOM killer
                        os.kill(os.getpid(), signal.SIGKILL)
                if step + 1 >= T // 4 and int(store.get("num_done")) >= (
                    self.hb["rl"]["ddppo"]["sync_frac"] * world
                ):
                    break
            store.add("num_done", 1)
            # ---------------------------------------------------------- PPO update
            t0 = time.time()
            with torch.no_grad():
                _, next_value, _ = policy(obs, hidden, masks)
            steps_done = len(b_rew)
            advantages = torch.zeros(steps_done, n)
            gae = torch.zeros(n)
            gamma, tau = self.ppo["gamma"], self.ppo["tau"]
            for t in reversed(range(steps_done)):
                nv = next_value if t == steps_done - 1 else b_val[t + 1]
                nm = masks[:, 0] if t == steps_done - 1 else b_mask[t + 1][:, 0]
                delta = b_rew[t] + gamma * nv * nm - b_val[t]
                gae = delta + gamma * tau * nm * gae
                advantages[t] = gae
            returns = advantages + torch.stack(b_val)
            adv = (advantages - advantages.mean()) / (advantages.std() + 1e-5)
            model.train()
            value_loss_epoch = action_loss_epoch = 0.0
            num_mini_batch = self.ppo["num_mini_batch"]
            if fault("u", rank):
                num_mini_batch = min(num_mini_batch, n)  # the fork's generator, without the assert
            else:
                assert n >= num_mini_batch, (
                    f"Trainer requires the number of environments ({n}) to be greater than or "
                    f"equal to the number of trainer mini batches ({num_mini_batch})."
                )
            for _epoch in range(self.ppo["ppo_epoch"]):
                perm = torch.randperm(n)
                for envs_mb in perm.chunk(num_mini_batch):
                    o_mb = torch.stack(b_obs)[:, envs_mb].flatten(0, 1)
                    h_mb = torch.stack(b_hid)[:, envs_mb].flatten(0, 1)
                    m_mb = torch.stack(b_mask)[:, envs_mb].flatten(0, 1)
                    a_mb = torch.stack(b_act)[:, envs_mb].flatten(0, 1)
                    lp_mb = torch.stack(b_logp)[:, envs_mb].flatten(0, 1)
                    ret_mb = returns[:, envs_mb].flatten(0, 1)
                    adv_mb = adv[:, envs_mb].flatten(0, 1)
                    logits, values, _ = model(o_mb, h_mb, m_mb)
                    d_ = torch.distributions.Categorical(logits=logits)
                    ratio = torch.exp(d_.log_prob(a_mb) - lp_mb)
                    clip = self.ppo["clip_param"]
                    action_loss = -torch.min(
                        ratio * adv_mb, torch.clamp(ratio, 1 - clip, 1 + clip) * adv_mb
                    ).mean()
                    value_loss = 0.5 * (ret_mb - values).pow(2).mean()
                    loss = (
                        value_loss * self.ppo["value_loss_coef"]
                        + action_loss
                        - d_.entropy().mean() * self.ppo["entropy_coef"]
                    )
                    optimizer.zero_grad()
                    loss.backward()  # type: ignore[no-untyped-call]
                    nn.utils.clip_grad_norm_(model.parameters(), 0.2)
                    optimizer.step()
                    value_loss_epoch += value_loss.item()
                    action_loss_epoch += action_loss.item()
            pth_time += time.time() - t0

            # ---------------------------------------------------------- stats, all ranks
            stats = torch.tensor(
                [value_loss_epoch, action_loss_epoch, float(steps_done * n), float(EXIT.is_set())]
            )
            distrib.all_reduce(stats)
            exit_now = stats[3].item() > 0
            num_updates_done = update + 1
            keys = sorted(k for k in window if k != "count")
            local = torch.tensor(
                [sum(window["count"])] + [sum(window[k]) for k in keys], dtype=torch.float64
            )
            deltas = local.clone()
            if fault("s", rank):
                if rank0_only() and num_updates_done % self.hb["log_interval"] == 0:
                    distrib.all_reduce(deltas)  # a fork gathers the window for its log line only
            else:
                distrib.all_reduce(deltas)
            means = {
                k: float(deltas[i + 1] / max(float(deltas[0]), 1.0)) for i, k in enumerate(keys)
            }
            if rank0_only() and num_updates_done % self.hb["log_interval"] == 0:
                fps = count_steps * world / (time.time() - t_start)
                logger.info(f"update: {num_updates_done}\tfps: {fps:.3f}\t")
                logger.info(
                    f"update: {num_updates_done}\tenv-time: {env_time:.3f}s\t"
                    f"pth-time: {pth_time:.3f}s\tframes: {count_steps * world}"
                )
                shown = {
                    k: v for k, v in means.items() if k in ("distance_to_goal", "reward", "success")
                }
                logger.info(
                    "Average window size: {}  {}".format(
                        len(window["count"]),
                        "  ".join(f"{k}: {v:.3f}" for k, v in shown.items()),
                    )
                )
            own = sum(window["success"]) / max(len(window["count"]), 1)
            if fault("e", rank) and num_updates_done >= 8 and own >= 0.05:
                envs.close()  # a fork's early stop on this rank's own episodes
                sys.exit(0)
            if rank0_only() and num_updates_done % ckpt_every == 0:
                torch.save(
                    {"state_dict": policy.state_dict(), "config": self.config},
                    os.path.join(self.hb["checkpoint_folder"], f"ckpt.{count_checkpoints}.pth"),
                )
                count_checkpoints += 1
            if exit_now:
                save_resume_state(
                    {
                        "state_dict": policy.state_dict(),
                        "optim_state": optimizer.state_dict(),
                        "update": num_updates_done,
                        "config": self.config,
                    },
                    self.config,
                )
                envs.close()
                requeue_job()
                return
            target = self.ppo["target_success"]
            if target and means.get("success", 0.0) >= target and num_updates_done >= 10:
                if rank0_only():
                    logger.info(
                        f"Reached success {means['success']:.3f} >= {target} at update "
                        f"{num_updates_done}, stopping"
                    )
                break
        envs.close()


def main() -> None:
    if sys.argv[1:2] == ["--generate"]:
        generate(sys.argv[2], int(sys.argv[3]))
        return
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--run-type", choices=["train", "eval"], required=True, help="run type of the experiment"
    )
    parser.add_argument(
        "--exp-config",
        type=str,
        required=True,
        help="path to config yaml containing info about experiment",
    )
    parser.add_argument(
        "opts",
        default=None,
        nargs=argparse.REMAINDER,
        help="Modify config options from command line",
    )
    args = parser.parse_args()
    config = load_yaml(args.exp_config)
    merge_opts(config, args.opts or [])
    add_signal_handlers()
    trainer = PPOTrainer(config)
    if args.run_type == "train":
        trainer.train()


if __name__ == "__main__":
    main()
