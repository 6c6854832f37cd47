"""A seventy-seventh training-program style for the generalisation fixtures
(tests/fixtures/real/seventyseventh-*): PPO with several processes in the way of CleanRL's
multi-GPU PPO (cleanrl/ppo_atari_multigpu.py, ppo_continuous_action): one file, argparse
arguments with CleanRL's names (--exp-name, --seed, --track, --wandb-project-name,
--total-timesteps, --num-envs, --num-steps, --num-minibatches, --update-epochs, ...), started
with `torchrun --nnodes=1 --nproc_per_node=N --master_port=PORT ppo_multigpu.py ...`, gloo as
CleanRL's multi-GPU scripts use it (rank = LOCAL_RANK). Every rank steps its own vectorised
environments (a CartPole written in numpy here, gymnasium's physics and its
RecordEpisodeStatistics bookkeeping, seeds offset by the rank), collects a rollout, computes
GAE, and after backward all-reduces the gradients by hand over one flattened buffer (no DDP
wrapper). Rank 0 prints 'global_step=..., episodic_return=[..]' and 'SPS: ..' and writes a
scalars CSV into runs/<env>__<exp>__<seed>__<time>/ (tensorboard is not installed here).
A fault in the code is chosen by the CRL_K environment variable (a short code) and never
printed (re-capture with tests/fixtures/real/capture_seventyseventh.sh after any edit).
"""

# CleanRL's own idioms, kept as its users write them
# ruff: noqa: B007, B008, B028, F541, RUF005, SIM115, UP031

from __future__ import annotations

import argparse
import csv
import ctypes
import os
import random
import signal
import threading
import time
import warnings
from dataclasses import dataclass
from datetime import timedelta
from distutils.util import strtobool

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
from torch.distributions.categorical import Categorical


@dataclass(frozen=True)
class Fault:
    """What goes wrong in the code (the defaults: nothing)."""

    sqrt_rank: int = -1  # this rank's pole-length jitter takes the root of a negative number
    hoard_rank: int = -1  # this rank archives every rollout for a replay it never samples
    null_rank: int = -1  # this rank's native physics fast path reads address 0
    crawl_rank: int = -1  # this rank regenerates its track layouts before an iteration
    park_rank: int = -1  # this rank waits for a render thread that was never started
    time_rank: int = -1  # this rank's envs append the time-step to the observation
    solo_mean: bool = False  # rank 0 alone all-reduces the episodic return it prints
    local_goal: bool = False  # the target return is checked on rank 0's own returns only
    split_envs: bool = False  # the envs are split over ranks with the remainder on the first
    copy_value: bool = False  # the stored value is copy-constructed with torch.tensor


FAULTS: dict[str, Fault] = {
    "": Fault(),
    "q1": Fault(sqrt_rank=1),
    "h1": Fault(hoard_rank=1),
    "n1": Fault(null_rank=1),
    "c1": Fault(crawl_rank=1),
    "p1": Fault(park_rank=1),
    "t2": Fault(time_rank=2),
    "s0": Fault(solo_mean=True),
    "g": Fault(local_goal=True),
    "u": Fault(split_envs=True),
    "w": Fault(copy_value=True),
}
FAULT = FAULTS[os.environ.get("CRL_K", "")]


def parse_args():
    # fmt: off
    parser = argparse.ArgumentParser()
    parser.add_argument("--exp-name", type=str, default=os.path.basename(__file__).rstrip(".py"),
        help="the name of this experiment")
    parser.add_argument("--seed", type=int, default=1,
        help="seed of the experiment")
    parser.add_argument("--torch-deterministic", type=lambda x: bool(strtobool(x)), default=True, nargs="?", const=True,
        help="if toggled, `torch.backends.cudnn.deterministic=False`")
    parser.add_argument("--cuda", type=lambda x: bool(strtobool(x)), default=True, nargs="?", const=True,
        help="if toggled, cuda will be enabled by default")
    parser.add_argument("--track", type=lambda x: bool(strtobool(x)), default=False, nargs="?", const=True,
        help="if toggled, this experiment will be tracked with Weights and Biases")
    parser.add_argument("--wandb-project-name", type=str, default="cleanRL",
        help="the wandb's project name")
    parser.add_argument("--wandb-entity", type=str, default=None,
        help="the entity (team) of wandb's project")
    parser.add_argument("--save-model", type=lambda x: bool(strtobool(x)), default=False, nargs="?", const=True,
        help="whether to save model into the `runs/{run_name}` folder")
    parser.add_argument("--resume", type=str, default=None,
        help="a `runs/{run_name}` folder to resume the agent and the observation statistics from")
    parser.add_argument("--dist-timeout", type=int, default=15,
        help="seconds a collective may wait")

    # Algorithm specific arguments
    parser.add_argument("--env-id", type=str, default="CartPole-v1",
        help="the id of the environment")
    parser.add_argument("--total-timesteps", type=int, default=24576,
        help="total timesteps of the experiments")
    parser.add_argument("--learning-rate", type=float, default=2.5e-3,
        help="the learning rate of the optimizer")
    parser.add_argument("--num-envs", type=int, default=8,
        help="the number of parallel game environments (over all processes)")
    parser.add_argument("--num-steps", type=int, default=128,
        help="the number of steps to run in each environment per policy rollout")
    parser.add_argument("--anneal-lr", type=lambda x: bool(strtobool(x)), default=True, nargs="?", const=True,
        help="Toggle learning rate annealing for policy and value networks")
    parser.add_argument("--gamma", type=float, default=0.99,
        help="the discount factor gamma")
    parser.add_argument("--gae-lambda", type=float, default=0.95,
        help="the lambda for the general advantage estimation")
    parser.add_argument("--num-minibatches", type=int, default=4,
        help="the number of mini-batches")
    parser.add_argument("--minibatch-size", type=int, default=0,
        help="the size of a mini-batch (0: batch size // num-minibatches)")
    parser.add_argument("--update-epochs", type=int, default=4,
        help="the K epochs to update the policy")
    parser.add_argument("--norm-adv", type=lambda x: bool(strtobool(x)), default=True, nargs="?", const=True,
        help="Toggles advantages normalization")
    parser.add_argument("--clip-coef", type=float, default=0.2,
        help="the surrogate clipping coefficient")
    parser.add_argument("--ent-coef", type=float, default=0.01,
        help="coefficient of the entropy")
    parser.add_argument("--vf-coef", type=float, default=0.5,
        help="coefficient of the value function")
    parser.add_argument("--max-grad-norm", type=float, default=0.5,
        help="the maximum norm for the gradient clipping")
    parser.add_argument("--target-return", type=float, default=None,
        help="stop once the mean episodic return over all processes reaches it")
    args = parser.parse_args()
    # fmt: on
    return args


class CartPoleVecEnv:
    """gymnasium's CartPole-v1 physics for num_envs copies at once, auto-reset, with
    RecordEpisodeStatistics' infos ('final_info' with an 'episode' dict of r, l, t)."""

    gravity, masscart, masspole, length, force_mag, tau = 9.8, 1.0, 0.1, 0.5, 10.0, 0.02
    theta_threshold, x_threshold, max_episode_steps = 12 * 2 * np.pi / 360, 2.4, 500

    def __init__(self, num_envs: int, seed: int, rank: int, time_feature: bool = False):
        self.num_envs = num_envs
        self.rank = rank
        self.rng = np.random.default_rng(seed)
        self.time_feature = time_feature
        self.single_observation_space_shape = (5,) if time_feature else (4,)
        self.single_action_space_n = 2
        self.state = np.zeros((num_envs, 4))
        self.steps = np.zeros(num_envs, dtype=np.int64)
        self.returns = np.zeros(num_envs)
        self.t0 = time.perf_counter()
        self.total_steps = 0
        self.render_ready = threading.Event()
        self.archive: list[np.ndarray] = []

    def _obs(self) -> np.ndarray:
        obs = self.state.astype(np.float32)
        if self.time_feature:
            obs = np.concatenate(
                [obs, (self.steps[:, None] / self.max_episode_steps).astype(np.float32)], 1
            )
        return obs

    def reset(self, seed=None):
        self.state = self.rng.uniform(-0.05, 0.05, size=(self.num_envs, 4))
        return self._obs(), {}

    def step(self, actions: np.ndarray):
        self.total_steps += 1
        if self.rank == FAULT.null_rank and self.total_steps == 300:
            ctypes.string_at(0)  # the native fast path of the physics step
        if self.rank == FAULT.park_rank and self.total_steps == 300:
            self.render_ready.wait()  # the render thread would set it after drawing a frame
        x, x_dot, theta, theta_dot = self.state.T
        length = self.length
        if self.rank == FAULT.sqrt_rank and self.total_steps >= 300:
            # pole-length domain randomisation: jitter with a variance that goes negative
            length = np.sqrt(
                self.length**2
                + self.rng.normal(0, 0.05, self.num_envs)
                - 0.02 * (self.total_steps - 299)
            )
        force = np.where(actions == 1, self.force_mag, -self.force_mag)
        costheta, sintheta = np.cos(theta), np.sin(theta)
        total_mass = self.masspole + self.masscart
        polemass_length = self.masspole * length
        temp = (force + polemass_length * theta_dot**2 * sintheta) / total_mass
        thetaacc = (self.gravity * sintheta - costheta * temp) / (
            length * (4.0 / 3.0 - self.masspole * costheta**2 / total_mass)
        )
        xacc = temp - polemass_length * thetaacc * costheta / total_mass
        x = x + self.tau * x_dot
        x_dot = x_dot + self.tau * xacc
        theta = theta + self.tau * theta_dot
        theta_dot = theta_dot + self.tau * thetaacc
        self.state = np.stack([x, x_dot, theta, theta_dot], 1)
        self.steps += 1
        reward = np.ones(self.num_envs, dtype=np.float32)
        self.returns += reward
        terminated = (np.abs(x) > self.x_threshold) | (np.abs(theta) > self.theta_threshold)
        truncated = self.steps >= self.max_episode_steps
        done = terminated | truncated
        infos: dict = {}
        if done.any():
            final = [None] * self.num_envs
            for i in np.flatnonzero(done):
                final[i] = {
                    "episode": {
                        "r": np.array([self.returns[i]], dtype=np.float32),
                        "l": np.array([self.steps[i]], dtype=np.int32),
                        "t": np.array([round(time.perf_counter() - self.t0, 6)], dtype=np.float32),
                    }
                }
                self.state[i] = self.rng.uniform(-0.05, 0.05, size=4)
                self.returns[i] = 0
                self.steps[i] = 0
            infos["final_info"] = final
        return self._obs(), reward, terminated, truncated, infos

    def regenerate_layouts(self) -> None:
        """Rebuilds the randomised track layouts of every env (slow in pure Python)."""
        for k in range(1, 9):
            time.sleep(5)
            print(f"regenerating track layouts for {self.num_envs} envs ({k}/8)", flush=True)

    def close(self) -> None:
        pass


def layer_init(layer, std=np.sqrt(2), bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    def __init__(self, envs):
        super().__init__()
        n_obs = np.array(envs.single_observation_space_shape).prod()
        self.critic = nn.Sequential(
            layer_init(nn.Linear(n_obs, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 1), std=1.0),
        )
        self.actor = nn.Sequential(
            layer_init(nn.Linear(n_obs, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, envs.single_action_space_n), std=0.01),
        )

    def get_value(self, x):
        return self.critic(x)

    def get_action_and_value(self, x, action=None):
        logits = self.actor(x)
        probs = Categorical(logits=logits)
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action), probs.entropy(), self.critic(x)


class ScalarWriter:
    """The scalars tensorboard's SummaryWriter would get, as runs/<run_name>/scalars.csv."""

    def __init__(self, folder: str):
        os.makedirs(folder, exist_ok=True)
        self.f = open(os.path.join(folder, "scalars.csv"), "w", newline="")
        self.w = csv.writer(self.f)
        self.w.writerow(["tag", "value", "step"])

    def add_scalar(self, tag, value, step):
        self.w.writerow([tag, value, step])

    def add_text(self, tag, text):
        with open(os.path.join(os.path.dirname(self.f.name), f"{tag}.md"), "w") as f:
            f.write(text)

    def close(self):
        self.f.close()


if __name__ == "__main__":
    # torchrun --standalone --nnodes=1 --nproc_per_node=2 ppo_multigpu.py
    # we will use gloo as the backend, see https://pytorch.org/docs/stable/distributed.html
    local_rank = int(os.getenv("LOCAL_RANK", "0"))
    world_size = int(os.getenv("WORLD_SIZE", "1"))
    args = parse_args()
    args.world_size = world_size
    args.num_updates = args.total_timesteps // (args.num_envs * args.num_steps)
    if FAULT.split_envs:
        args.num_envs = args.num_envs // world_size + (
            1 if local_rank < args.num_envs % world_size else 0
        )
    else:
        args.num_envs = int(args.num_envs / world_size)
    args.batch_size = int(args.num_envs * args.num_steps)
    args.minibatch_size = args.minibatch_size or int(args.batch_size // args.num_minibatches)
    if world_size > 1:
        dist.init_process_group(
            "gloo",
            rank=local_rank,
            world_size=world_size,
            timeout=timedelta(seconds=args.dist_timeout),
        )
    else:
        warnings.warn(
            """
Not using distributed mode!
If you want to use distributed mode, please execute this script with 'torchrun'.
E.g., `torchrun --standalone --nnodes=1 --nproc_per_node=2 ppo_multigpu.py`
        """
        )
    print(f"================================")
    print(
        f"args.num_envs: {args.num_envs}, args.batch_size: {args.batch_size}, args.minibatch_size: {args.minibatch_size}"
    )
    print(f"================================")
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
        writer = ScalarWriter(f"runs/{run_name}")
        table = "|param|value|\n|-|-|\n%s" % (
            "\n".join([f"|{key}|{value}|" for key, value in vars(args).items()])
        )
        writer.add_text("hyperparameters", table)
        print(table)

    # TRY NOT TO MODIFY: seeding
    # CRUCIAL: note that we needed to pass a different seed for each data parallelism worker
    args.seed += local_rank
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed - local_rank)
    torch.backends.cudnn.deterministic = args.torch_deterministic

    device = torch.device("cpu")
    if args.cuda and not torch.cuda.is_available():
        device = torch.device("cpu")

    # env setup
    envs = CartPoleVecEnv(
        args.num_envs, args.seed, local_rank, time_feature=local_rank == FAULT.time_rank
    )
    agent = Agent(envs).to(device)
    torch.manual_seed(args.seed)
    optimizer = optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)
    print(
        f"local_rank: {local_rank}, observation_shape: {envs.single_observation_space_shape}, num_envs: {args.num_envs}"
    )

    obs_mean = np.zeros(envs.single_observation_space_shape, dtype=np.float64)
    obs_var = np.ones(envs.single_observation_space_shape, dtype=np.float64)
    if args.resume:
        agent.load_state_dict(
            torch.load(os.path.join(args.resume, f"{args.exp_name}.cleanrl_model"))
        )
        rms = np.load(os.path.join(args.resume, f"obs_rms_{local_rank}.npz"))
        obs_mean, obs_var = rms["mean"], rms["var"]
        if local_rank == 0:
            print(f"resumed the agent and the observation statistics from {args.resume}")

    # ALGO Logic: Storage setup
    obs = torch.zeros((args.num_steps, args.num_envs) + envs.single_observation_space_shape).to(
        device
    )
    actions = torch.zeros((args.num_steps, args.num_envs)).to(device)
    logprobs = torch.zeros((args.num_steps, args.num_envs)).to(device)
    rewards = torch.zeros((args.num_steps, args.num_envs)).to(device)
    dones = torch.zeros((args.num_steps, args.num_envs)).to(device)
    values = torch.zeros((args.num_steps, args.num_envs)).to(device)

    # TRY NOT TO MODIFY: start the game
    global_step = 0
    start_time = time.time()
    next_obs, _ = envs.reset(seed=args.seed)
    next_obs = torch.Tensor(next_obs).to(device)
    next_done = torch.zeros(args.num_envs).to(device)
    recent_returns: list[float] = []
    stop = False

    for update in range(1, args.num_updates + 1):
        # Annealing the rate if instructed to do so.
        if args.anneal_lr:
            frac = 1.0 - (update - 1.0) / args.num_updates
            lrnow = frac * args.learning_rate
            optimizer.param_groups[0]["lr"] = lrnow

        if local_rank == FAULT.crawl_rank and update == 3:
            envs.regenerate_layouts()
        if local_rank == FAULT.hoard_rank:
            envs.archive.append(np.ones((8 << 20,), dtype=np.float64))  # 64 MiB a rollout
            if update == 4:
                os.kill(os.getpid(), signal.SIGKILL)  # the kernel's OOM killer

        for step in range(0, args.num_steps):
            global_step += 1 * args.num_envs * world_size
            obs[step] = next_obs
            dones[step] = next_done

            # ALGO LOGIC: action logic
            with torch.no_grad():
                action, logprob, _, value = agent.get_action_and_value(next_obs)
                value = value.flatten()
                if FAULT.copy_value:
                    value = torch.tensor(value)
                values[step] = value
            actions[step] = action
            logprobs[step] = logprob

            # TRY NOT TO MODIFY: execute the game and log data.
            next_obs, reward, terminations, truncations, infos = envs.step(action.cpu().numpy())
            next_done = np.logical_or(terminations, truncations)
            rewards[step] = torch.tensor(reward).to(device).view(-1)
            next_obs, next_done = (
                torch.Tensor(next_obs).to(device),
                torch.Tensor(next_done).to(device),
            )

            if "final_info" in infos:
                for info in infos["final_info"]:
                    if info and "episode" in info:
                        recent_returns = (recent_returns + [float(info["episode"]["r"][0])])[-20:]
                        if local_rank == 0:
                            if FAULT.solo_mean:
                                ep_r = torch.tensor(info["episode"]["r"])
                                dist.all_reduce(ep_r, op=dist.ReduceOp.SUM)
                                info["episode"]["r"] = ep_r.numpy() / world_size
                            print(
                                f"global_step={global_step}, episodic_return={info['episode']['r']}"
                            )
                            writer.add_scalar(
                                "charts/episodic_return", info["episode"]["r"], global_step
                            )
                            writer.add_scalar(
                                "charts/episodic_length", info["episode"]["l"], global_step
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
        b_obs = obs.reshape((-1,) + envs.single_observation_space_shape)
        b_logprobs = logprobs.reshape(-1)
        b_actions = actions.reshape(-1)
        b_advantages = advantages.reshape(-1)
        b_returns = returns.reshape(-1)
        b_values = values.reshape(-1)

        # Optimizing the policy and value network
        b_inds = np.arange(args.batch_size)
        clipfracs = []
        for epoch in range(args.update_epochs):
            np.random.shuffle(b_inds)
            for start in range(0, args.batch_size, args.minibatch_size):
                end = start + args.minibatch_size
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
                v_loss = 0.5 * ((newvalue - b_returns[mb_inds]) ** 2).mean()

                entropy_loss = entropy.mean()
                loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef

                optimizer.zero_grad()
                loss.backward()

                if world_size > 1:
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
                                all_grads[offset : offset + param.numel()].view_as(param.grad.data)
                                / world_size
                            )
                            offset += param.numel()

                nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                optimizer.step()

        y_pred, y_true = b_values.cpu().numpy(), b_returns.cpu().numpy()
        var_y = np.var(y_true)
        explained_var = np.nan if var_y == 0 else 1 - np.var(y_true - y_pred) / var_y

        if local_rank == 0:
            # TRY NOT TO MODIFY: record rewards for plotting purposes
            writer.add_scalar("charts/learning_rate", optimizer.param_groups[0]["lr"], global_step)
            writer.add_scalar("losses/value_loss", v_loss.item(), global_step)
            writer.add_scalar("losses/policy_loss", pg_loss.item(), global_step)
            writer.add_scalar("losses/entropy", entropy_loss.item(), global_step)
            writer.add_scalar("losses/old_approx_kl", old_approx_kl.item(), global_step)
            writer.add_scalar("losses/approx_kl", approx_kl.item(), global_step)
            writer.add_scalar("losses/clipfrac", np.mean(clipfracs), global_step)
            writer.add_scalar("losses/explained_variance", explained_var, global_step)
            print("SPS:", int(global_step / (time.time() - start_time)))
            writer.add_scalar(
                "charts/SPS", int(global_step / (time.time() - start_time)), global_step
            )

        if args.target_return is not None and recent_returns:
            mean_return = torch.tensor([np.mean(recent_returns)])
            if not FAULT.local_goal:
                dist.all_reduce(mean_return, op=dist.ReduceOp.SUM)
                mean_return /= world_size
            goal_rank = local_rank == 0 or not FAULT.local_goal
            if goal_rank and mean_return.item() >= args.target_return:
                print(
                    f"global_step={global_step}, mean episodic_return={mean_return.item():.2f} "
                    f">= target {args.target_return}, stopping"
                )
                stop = True
        if stop:
            break

    if args.save_model and local_rank == 0:
        model_path = f"runs/{run_name}/{args.exp_name}.cleanrl_model"
        torch.save(agent.state_dict(), model_path)
        print(f"model saved to {model_path}")
    if args.save_model:
        os.makedirs(f"runs/{run_name}", exist_ok=True)
        np.savez(f"runs/{run_name}/obs_rms_{local_rank}.npz", mean=obs_mean, var=obs_var)

    envs.close()
    if local_rank == 0:
        writer.close()
