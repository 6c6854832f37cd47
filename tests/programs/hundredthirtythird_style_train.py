"""A hundred-and-thirty-third training-program style for the generalisation fixtures
(tests/fixtures/real/hundredthirtythird-*): RLHF in the way of microsoft/DeepSpeedExamples'
DeepSpeed-Chat step 3 (applications/DeepSpeed-Chat/training/step3_rlhf_finetuning/main.py, its
rlhf_engine.py, ppo_trainer.py and utils), re-created in plain torch without deepspeed or
transformers installed, started as its scripts start it:

    deepspeed --num_gpus 2 --master_port PORT main.py --data_path local/jsonfile
      --actor_model_name_or_path $ACTOR --critic_model_name_or_path $CRITIC
      --actor_zero_stage 2 --critic_zero_stage 2 --enable_hybrid_engine
      --num_padding_at_beginning 1 --per_device_generation_batch_size 2
      --per_device_training_batch_size 2 --generation_batches 1 --ppo_epochs 1
      --max_answer_seq_len 64 --max_prompt_seq_len 64 --output_dir output

(the launcher is tests/programs/hundredthirtythird_deepspeed.py). What deepspeed would do is
re-created: init_distributed's log lines and a gloo process group (15 s timeout); a ZeRO-2-like
engine per trained model (parameters broadcast from rank 0, the flattened fp32 gradients
all-reduced, fp16 dynamic loss scaling with the overflow flag all-reduced and its 'OVERFLOW!
Rank 0 Skipping step' records); the hybrid engine's per-generation line. DeepSpeed-Chat's own
parts: print_rank_0, DeepSpeedRLHFEngine's four models (actor, reference, critic, reward; EMA
with --enable_ema) and its '[start] Initializing Actor Model [start]' banners,
create_prompt_dataset (rank 0 builds the cache under --data_output_path, a barrier, every rank
loads it), DataCollatorRLHF (prompts left-padded to max_prompt_seq_len), a DistributedSampler,
DeepSpeedPPOTrainer's generate_experience / compute_rewards / get_advantages_and_returns /
train_rlhf, the throughput lines, the reward all-reduce, --enable_test_mode/--test_stop_step
and the final 'saving model ...' (rank 0 writes the HF-format folders). The models are tiny
causal transformers ('opt' family: two extra learned positions) from checkpoint folders that
`main.py --prepare DIR` writes (step 1's actor, step 2's critic/reward) with a word-level
tokenizer and a synthetic prompt dataset (data/train.json, JSON lines of prompt/chosen/rejected).
A fault in the code is chosen by the TQ_CASE environment variable (a short code) and never
printed (re-capture with tests/fixtures/real/capture_hundredthirtythird.sh after any edit).
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import os
import random
import signal
import sys
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import DataLoader, Dataset, DistributedSampler

CASE = os.environ.get("TQ_CASE", "")
PAD, EOS, UNK = 1, 2, 3
WORDS = (  # noqa: SIM905
    "the a an of to in and is it that for on with as was at by this be from or are what how why "
    "when where who which can could would should do does did make made good bad best way help "
    "explain write story poem code python list recipe cake bread water fire tree river city "
    "music film book game phone car plane train dog cat bird fish sun moon star sky rain snow "
    "cold warm fast slow big small new old first last day night week year time work home school "
    "friend family money health food sleep run walk read learn teach think feel know want need "
    "give take find use try ask tell say show keep start stop open close buy sell pay cost"
).split()


def ds_log(level: str, where: str, msg: str) -> None:
    """DeepSpeed's logger format, one write a record."""
    now = datetime.datetime.now()
    stamp = now.strftime("%Y-%m-%d %H:%M:%S,") + f"{now.microsecond // 1000:03d}"
    sys.stdout.write(f"[{stamp}] [{level}] [{where}] {msg}\n")
    sys.stdout.flush()


def print_rank_0(msg: str, rank: int | None = None) -> None:
    if rank is None:
        rank = dist.get_rank() if dist.is_initialized() else 0
    if rank <= 0:
        print(msg, flush=True)


# ---------------------------------------------------------------------------------- prepare


def prepare(root: str, reward_family: str, prompts: int) -> None:
    """Step 1's actor and step 2's critic/reward checkpoints, and the prompt data."""
    rng = random.Random(7)
    os.makedirs(os.path.join(root, "data"), exist_ok=True)
    with open(os.path.join(root, "data", "train.json"), "w") as f:
        for _ in range(prompts):
            q = " ".join(rng.choices(WORDS, k=rng.randint(6, 24)))
            a = " ".join(rng.choices(WORDS, k=rng.randint(4, 16)))
            b = " ".join(rng.choices(WORDS, k=rng.randint(4, 16)))
            row = {"prompt": f" Human: {q} Assistant:", "chosen": f" {a}", "rejected": f" {b}"}
            f.write(json.dumps(row) + "\n")
    vocab = ["<unk0>", "<pad>", "</s>", "<unk>", "Human:", "Assistant:", *WORDS]
    for sub, family, seed in (("step1/actor", "opt", 1), ("step2/critic", reward_family, 2)):
        d = os.path.join(root, "output", sub)
        os.makedirs(d, exist_ok=True)
        cfg = {
            "model_type": family,
            "vocab_size": len(vocab),
            "hidden_size": 32,
            "num_attention_heads": 2,
            "ffn_dim": 64,
            # OPT's learned positions keep two more rows than the 128 tokens it was trained on
            "max_position_embeddings": 130 if family == "opt" else 128,
            "pad_token_id": PAD,
            "eos_token_id": EOS,
        }
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f, indent=2)
        with open(os.path.join(d, "vocab.json"), "w") as f:
            json.dump({w: i for i, w in enumerate(vocab)}, f)
        torch.manual_seed(seed)
        model = TinyCausalLM(cfg) if sub.startswith("step1") else RewardModel(cfg, 1)
        torch.save(model.state_dict(), os.path.join(d, "pytorch_model.bin"))


# ----------------------------------------------------------------------------------- models


class Tokenizer:
    def __init__(self, path: str) -> None:
        with open(os.path.join(path, "vocab.json")) as f:
            self.vocab = json.load(f)
        self.inv = {i: w for w, i in self.vocab.items()}
        self.pad_token_id, self.eos_token_id = PAD, EOS

    def __call__(self, text: str) -> list[int]:  # OPT's tokenizer puts '</s>' first
        return [EOS] + [self.vocab.get(w, UNK) for w in text.split()]

    def decode(self, ids: list[int]) -> str:
        return " ".join(self.inv.get(i, "<unk>") for i in ids if i not in (PAD, EOS))


class Backbone(nn.Module):
    def __init__(self, cfg: dict) -> None:
        super().__init__()
        d = cfg["hidden_size"]
        self.embed_tokens = nn.Embedding(cfg["vocab_size"], d, padding_idx=PAD)
        self.embed_positions = nn.Embedding(cfg["max_position_embeddings"], d)
        self.layer = nn.TransformerEncoderLayer(
            d, cfg["num_attention_heads"], cfg["ffn_dim"], dropout=0.0, batch_first=True
        )
        self.final_layer_norm = nn.LayerNorm(d)
        self.gradient_checkpointing = False

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1]).unsqueeze(0)
        h = self.embed_tokens(input_ids) + self.embed_positions(positions)
        causal = nn.Transformer.generate_square_subsequent_mask(input_ids.shape[1])
        h = h * attention_mask.unsqueeze(-1)
        if self.gradient_checkpointing and self.training:
            h = torch.utils.checkpoint.checkpoint(self.layer, h, causal, None, True)
        else:
            h = self.layer(h, src_mask=causal, is_causal=True)
        return self.final_layer_norm(h)


class TinyCausalLM(nn.Module):
    def __init__(self, cfg: dict) -> None:
        super().__init__()
        self.config = cfg
        self.model = Backbone(cfg)
        self.lm_head = nn.Linear(cfg["hidden_size"], cfg["vocab_size"], bias=False)

    def forward(self, input_ids, attention_mask):
        return self.lm_head(self.model(input_ids, attention_mask))

    @torch.no_grad()
    def generate(self, prompts, attention_mask, max_length, step, rank):
        seq, mask = prompts, attention_mask
        done = torch.zeros(seq.shape[0], dtype=torch.bool)
        gen = torch.Generator().manual_seed(1000 * step + rank)
        while seq.shape[1] < max_length and not bool(done.all()):
            logits = self(seq, mask)[:, -1, :].float()
            if CASE == "n1" and rank == 1 and step == 3:
                logits = logits * float("inf")  # the fp16 inference kernel overflows
            if CASE == "z1" and rank == 1 and step == 3:
                logits[:, EOS] = 1e4  # the actor ends its answer at once
            logits[:, PAD] = -1e4
            probs = torch.softmax(logits, dim=-1)
            nxt = torch.multinomial(probs, 1, generator=gen).squeeze(1)
            nxt = torch.where(done, torch.full_like(nxt, PAD), nxt)
            done |= nxt == EOS
            nxt = torch.where(nxt == EOS, torch.full_like(nxt, PAD), nxt)
            seq = torch.cat([seq, nxt[:, None]], dim=1)
            mask = torch.cat([mask, (nxt != PAD).long()[:, None]], dim=1)
        # the hybrid engine's inference containers give fixed-length outputs (padded)
        return F.pad(seq, (0, max_length - seq.shape[1]), value=PAD)


class RewardModel(nn.Module):
    """DeepSpeed-Chat's RewardModel: a backbone, v_head, and the end score read at the token
    before the answer's first padding."""

    def __init__(self, cfg: dict, num_padding_at_beginning: int) -> None:
        super().__init__()
        self.config = cfg
        self.rwtransformer = Backbone(cfg)
        self.v_head = nn.Linear(cfg["hidden_size"], 1, bias=False)
        self.num_padding_at_beginning = num_padding_at_beginning
        self.PAD_ID = PAD

    def forward_value(self, input_ids, attention_mask, return_value_only=False, prompt_length=0):
        if not return_value_only:
            # step 2 trained the reward model on sequences that begin with
            # num_padding_at_beginning padding tokens: put them back before scoring
            n = self.num_padding_at_beginning
            input_ids = F.pad(input_ids, (n, 0), value=PAD)
            attention_mask = F.pad(attention_mask, (n, 0), value=1)
            prompt_length += n
        values = self.v_head(self.rwtransformer(input_ids, attention_mask)).squeeze(-1)
        if return_value_only:
            return values
        bs, seq_len = input_ids.shape
        chosen_end_scores = []
        for i in range(bs):
            c_inds = (input_ids[i, prompt_length:] == self.PAD_ID).nonzero()
            c_ind = c_inds[0].item() + prompt_length if len(c_inds) > 0 else seq_len
            chosen_end_scores.append(values[i, c_ind - 1])
        return {"values": values, "chosen_end_scores": torch.stack(chosen_end_scores)}


def load_config(path: str) -> dict:
    with open(os.path.join(path, "config.json")) as f:
        return json.load(f)


# ------------------------------------------------------------------------- deepspeed engine


def log_dist(msg: str) -> None:
    if dist.get_rank() == 0:
        ds_log("INFO", "logging.py:96:log_dist", f"[Rank 0] {msg}")


class DeepSpeedEngine:
    """What deepspeed.initialize gives back, in brief: the module's parameters broadcast from
    rank 0, and for a trained model a ZeRO-2-like step (flattened gradients all-reduced, fp16
    dynamic loss scale, the overflow flag all-reduced)."""

    def __init__(self, module: nn.Module, lr: float | None, stage: int, dtype: str) -> None:
        self.module = module
        log_dist("DeepSpeed info: version=0.14.4, git-hash=unknown, git-branch=unknown")
        flat = torch.cat([p.data.reshape(-1) for p in module.parameters()])
        dist.broadcast(flat, 0)
        k = 0
        for p in module.parameters():
            p.data.copy_(flat[k : k + p.numel()].view_as(p))
            k += p.numel()
        self.optimizer = None
        self.loss_scale = 2.0**16 if dtype == "fp16" else 1.0
        self.good_steps = 0
        self.overflow = False
        if lr is not None:
            log_dist("Using DeepSpeed Optimizer param name adamw as basic optimizer")
            log_dist(f"Creating {dtype} ZeRO stage {stage} optimizer")
            if dist.get_rank() == 0:
                ds_log("INFO", "stage_1_and_2.py:149:__init__", "Reduce bucket size 500,000,000")
            self.optimizer = torch.optim.AdamW(module.parameters(), lr=lr, betas=(0.9, 0.95))
        else:
            log_dist("DeepSpeed Final Optimizer = None")

    def __call__(self, *a, **kw):
        return self.module(*a, **kw)

    def train(self):
        self.module.train()

    def eval(self):
        self.module.eval()

    def backward(self, loss: torch.Tensor) -> None:
        (loss * self.loss_scale).backward()

    def step(self) -> None:
        params = [p for p in self.module.parameters() if p.grad is not None]
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        dist.all_reduce(flat)
        flat /= dist.get_world_size()
        overflow = torch.tensor([float(not bool(torch.isfinite(flat).all()))])
        overflow[0] = max(overflow[0].item(), float(flat.abs().max().item() > 65504.0))
        dist.all_reduce(overflow, op=dist.ReduceOp.MAX)
        self.overflow = bool(overflow.item())
        if self.overflow:
            if dist.get_rank() == 0:
                ds_log(
                    "INFO",
                    "loss_scaler.py:183:update_scale",
                    f"[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: "
                    f"{int(self.loss_scale)}, reducing to {int(self.loss_scale // 2)}",
                )
            self.loss_scale /= 2
            self.good_steps = 0
        else:
            k = 0
            for p in params:
                p.grad.copy_(flat[k : k + p.numel()].view_as(p) / self.loss_scale)
                k += p.numel()
            torch.nn.utils.clip_grad_norm_(self.module.parameters(), 1.0)
            self.optimizer.step()
            self.good_steps += 1
        self.optimizer.zero_grad(set_to_none=True)


def log_init(model_name: str, stime: float | None = None) -> float:
    if dist.get_rank() == 0:
        tag = "start" if stime is None else "end"
        suffix = "ing" if stime is None else "ed"
        duration = ""
        if stime is not None:
            duration = f"(duration: {time.time() - stime:.2f}s)"
        msg = f"[{tag}] Initializ{suffix} {model_name} Model [{tag}] {duration}"
        stars = (90 - len(msg)) // 2
        extra_star = "*" if (90 - len(msg)) % 2 == 1 else ""
        print("*" * stars + msg + "*" * stars + extra_star, flush=True)
    return time.time()


class DeepSpeedRLHFEngine:
    def __init__(self, actor_path: str, critic_path: str, tokenizer: Tokenizer, args) -> None:
        self.args = args
        self.tokenizer = tokenizer
        self.actor = self._init_actor(actor_path)
        self.ref = self._init_ref(actor_path)
        self.actor_ema = self._init_ema(actor_path) if args.enable_ema else None
        self.critic = self._init_critic(critic_path)
        self.reward = self._init_reward(critic_path)

    def _load_actor(self, path: str) -> TinyCausalLM:
        model = TinyCausalLM(load_config(path))
        model.load_state_dict(torch.load(os.path.join(path, "pytorch_model.bin")))
        return model

    def _init_actor(self, path: str) -> DeepSpeedEngine:
        stime = log_init("Actor")
        model = self._load_actor(path)
        if self.args.actor_gradient_checkpointing:
            model.model.gradient_checkpointing = True
        engine = DeepSpeedEngine(
            model, self.args.actor_learning_rate, self.args.actor_zero_stage, self.args.dtype
        )
        if self.args.enable_hybrid_engine:
            log_dist("DeepSpeed Hybrid Engine: inference containers ready (max_out_tokens=512)")
        log_init("Actor", stime=stime)
        return engine

    def _init_ref(self, path: str) -> DeepSpeedEngine:
        stime = log_init("Ref")
        model = self._load_actor(path)
        if CASE == "m1" and dist.get_rank() == 1:
            # the reference weights are expanded to fp32 copies per module on this rank
            hoard = []
            for _ in range(4):
                hoard.append(torch.ones(64, 1024, 1024, dtype=torch.uint8))
            os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does
        zero_stage = self.args.actor_zero_stage
        if (
            zero_stage != 3
        ):  # If actor is ZeRO-3 then we use it for everything, otherwise assume we have enough memory for ref model
            zero_stage = 0
        engine = DeepSpeedEngine(model, None, zero_stage, self.args.dtype)
        log_init("Ref", stime=stime)
        return engine

    def _init_ema(self, path: str) -> DeepSpeedEngine:
        stime = log_init("EMA")
        engine = DeepSpeedEngine(self._load_actor(path), None, 0, self.args.dtype)
        log_init("EMA", stime=stime)
        return engine

    def _load_critic(self, path: str) -> RewardModel:
        model = RewardModel(load_config(path), self.args.num_padding_at_beginning)
        model.load_state_dict(torch.load(os.path.join(path, "pytorch_model.bin")))
        return model

    def _init_critic(self, path: str) -> DeepSpeedEngine:
        stime = log_init("Critic")
        if self.args.enable_hybrid_engine:
            assert self.args.critic_zero_stage <= self.args.actor_zero_stage, (
                "The hybrid engine gathers ZeRO-3 weights with the actor's partitioning only: "
                f"critic_zero_stage ({self.args.critic_zero_stage}) can not be above "
                f"actor_zero_stage ({self.args.actor_zero_stage})"
            )
        engine = DeepSpeedEngine(
            self._load_critic(path),
            self.args.critic_learning_rate,
            self.args.critic_zero_stage,
            self.args.dtype,
        )
        log_init("Critic", stime=stime)
        return engine

    def _init_reward(self, path: str) -> DeepSpeedEngine:
        stime = log_init("Reward")
        zero_stage = self.args.critic_zero_stage
        if zero_stage != 3:
            zero_stage = 0
        engine = DeepSpeedEngine(self._load_critic(path), None, zero_stage, self.args.dtype)
        log_init("Reward", stime=stime)
        return engine


# -------------------------------------------------------------------------------- ppo trainer


def gather_log_probs(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    log_probs = F.log_softmax(logits, dim=-1)
    return torch.gather(log_probs, dim=-1, index=labels.unsqueeze(-1)).squeeze(-1)


class DeepSpeedPPOTrainer:
    def __init__(self, rlhf_engine: DeepSpeedRLHFEngine, args) -> None:
        self.rlhf_engine = rlhf_engine
        self.actor_model = rlhf_engine.actor
        self.critic_model = rlhf_engine.critic
        self.ref_model = rlhf_engine.ref
        self.reward_model = rlhf_engine.reward
        self.tokenizer = rlhf_engine.tokenizer
        self.args = args
        self.max_answer_seq_len = args.max_answer_seq_len
        self.kl_ctl = 0.1
        self.clip_reward_value = 5
        self.cliprange = 0.2
        self.cliprange_value = 0.2
        self.gamma = 1.0
        self.lam = 0.95
        self.generate_time = 0.0
        self.samples = 0
        self.he_time = 0.0

    def _generate_sequence(self, prompts, mask, step):
        max_min_length = self.max_answer_seq_len + prompts.shape[1]
        rank = dist.get_rank()
        if CASE == "v0" and rank == 0 and step == 2:
            ctypes.string_at(0)  # the hybrid engine's fused inference kernel reads NULL
        seq = self.actor_model.module.generate(prompts, mask, max_min_length, step, rank)
        return seq

    def generate_experience(self, prompts, mask, step):
        self.eval()
        generate_start = time.time()
        seq = self._generate_sequence(prompts, mask, step)
        generate_end = time.time()
        self.train()
        pad_token_id = self.tokenizer.pad_token_id
        attention_mask = seq.not_equal(pad_token_id).long()
        with torch.no_grad():
            output = self.actor_model(seq, attention_mask)
            output_ref = self.ref_model(seq, attention_mask)
            reward_score = self.reward_model.module.forward_value(
                seq, attention_mask, prompt_length=prompts.shape[1]
            )["chosen_end_scores"].detach()
            values = self.critic_model.module.forward_value(
                seq, attention_mask, return_value_only=True
            ).detach()[:, :-1]
        self.generate_time = generate_end - generate_start
        self.he_time += self.generate_time
        self.samples += seq.shape[0]
        if dist.get_rank() == 0 and self.args.enable_hybrid_engine:
            e2e = time.time() - generate_start
            print(
                f"|E2E latency={e2e:.2f}s |Gather latency=0.00s (0.00%) |Generate time="
                f"{self.generate_time:.2f}s ({100 * self.generate_time / e2e:.2f}%) |Training "
                f"time=0.00s (0.00%) |Others={e2e - self.generate_time:.2f} "
                f"({100 * (e2e - self.generate_time) / e2e:.2f}%)|CurSamplesPerSec="
                f"{seq.shape[0] / e2e:.2f} |AvgSamplesPerSec={self.samples / self.he_time:.2f}",
                flush=True,
            )
        return {
            "prompts": prompts,
            "logprobs": gather_log_probs(output[:, :-1, :], seq[:, 1:]),
            "ref_logprobs": gather_log_probs(output_ref[:, :-1, :], seq[:, 1:]),
            "value": values,
            "rewards": reward_score,
            "input_ids": seq,
            "attention_mask": attention_mask,
        }

    def compute_rewards(self, prompts, log_probs, ref_log_probs, reward_score, action_mask):
        kl_divergence_estimate = -self.kl_ctl * (log_probs - ref_log_probs)
        rewards = kl_divergence_estimate
        start = prompts.shape[1] - 1
        ends = start + action_mask[:, start:].sum(1) + 1
        reward_clip = torch.clamp(reward_score, -self.clip_reward_value, self.clip_reward_value)
        batch_size = log_probs.shape[0]
        for j in range(batch_size):
            rewards[j, start : ends[j]][-1] += reward_clip[j]
        return rewards

    def get_advantages_and_returns(self, values, rewards, start):
        lastgaelam = 0
        advantages_reversed = []
        length = rewards.size()[-1]
        for t in reversed(range(start, length)):
            nextvalues = values[:, t + 1] if t < length - 1 else 0.0
            delta = rewards[:, t] + self.gamma * nextvalues - values[:, t]
            lastgaelam = delta + self.gamma * self.lam * lastgaelam
            advantages_reversed.append(lastgaelam)
        advantages = torch.stack(advantages_reversed[::-1], dim=1)
        returns = advantages + values[:, start:]
        return advantages.detach(), returns

    def actor_loss_fn(self, logprobs, old_logprobs, advantages, mask):
        log_ratio = (logprobs - old_logprobs) * mask
        ratio = torch.exp(log_ratio)
        pg_loss1 = -advantages * ratio
        pg_loss2 = -advantages * torch.clamp(ratio, 1.0 - self.cliprange, 1.0 + self.cliprange)
        return torch.sum(torch.max(pg_loss1, pg_loss2) * mask) / mask.sum()

    def critic_loss_fn(self, values, old_values, returns, mask):
        values_clipped = torch.clamp(
            values, old_values - self.cliprange_value, old_values + self.cliprange_value
        )
        vf_loss1 = (values - returns) ** 2
        vf_loss2 = (values_clipped - returns) ** 2
        return 0.5 * torch.sum(torch.max(vf_loss1, vf_loss2) * mask) / mask.sum()

    def train_rlhf(self, inputs):
        prompts = inputs["prompts"]
        log_probs = inputs["logprobs"]
        ref_log_probs = inputs["ref_logprobs"]
        reward_score = inputs["rewards"]
        values = inputs["value"]
        attention_mask = inputs["attention_mask"]
        seq = inputs["input_ids"]
        start = prompts.size()[-1] - 1
        action_mask = attention_mask[:, 1:]
        old_values = values
        with torch.no_grad():
            old_rewards = self.compute_rewards(
                prompts, log_probs, ref_log_probs, reward_score, action_mask
            )
            ends = start + action_mask[:, start:].sum(1) + 1
            for i in range(old_rewards.shape[0]):
                old_rewards[i, ends[i] :] = 0
                old_values[i, ends[i] :] = 0
            advantages, returns = self.get_advantages_and_returns(old_values, old_rewards, start)
        actor_prob = self.actor_model(seq, attention_mask)
        actor_log_prob = gather_log_probs(actor_prob[:, :-1, :], seq[:, 1:])
        actor_loss = self.actor_loss_fn(
            actor_log_prob[:, start:], log_probs[:, start:], advantages, action_mask[:, start:]
        )
        self.actor_model.backward(actor_loss)
        self.actor_model.step()
        value = self.critic_model.module.forward_value(seq, attention_mask, True)[:, :-1]
        critic_loss = self.critic_loss_fn(
            value[:, start:], old_values[:, start:], returns, action_mask[:, start:]
        )
        self.critic_model.backward(critic_loss)
        self.critic_model.step()
        return actor_loss, critic_loss

    def get_overflow(self):
        return self.actor_model.overflow, self.critic_model.overflow

    def train(self):
        self.actor_model.train()
        self.critic_model.train()

    def eval(self):
        self.actor_model.eval()
        self.critic_model.eval()
        self.reward_model.eval()
        self.ref_model.eval()


# ------------------------------------------------------------------------------------- data


class PromptDataset(Dataset):
    def __init__(self, prompt_dataset: list[list[int]]) -> None:
        self.prompt_dataset = prompt_dataset

    def __len__(self) -> int:
        return len(self.prompt_dataset)

    def __getitem__(self, idx: int):
        ids = torch.tensor(self.prompt_dataset[idx])
        return ids.flip(0), torch.ones_like(ids), PAD


class DataCollatorRLHF:
    def __init__(self, max_token_len: int, inference_tp_size: int) -> None:
        self.max_token_len = max_token_len
        self.inference_tp_size = inference_tp_size

    def __call__(self, data):
        batch = {}
        pad_token_id = data[-1][-1]
        prompt = pad_sequence([f[0] for f in data], padding_value=pad_token_id, batch_first=True)
        prompt_mask = pad_sequence([f[1] for f in data], padding_value=0, batch_first=True)
        length = prompt.size()[-1]
        pad_length = self.max_token_len - length
        if pad_length > 0:
            batch["prompt"] = F.pad(prompt, pad=(0, pad_length), mode="constant", value=PAD)
            batch["prompt_att_mask"] = F.pad(prompt_mask, (0, pad_length), "constant", 0)
        else:
            batch["prompt"] = prompt
            batch["prompt_att_mask"] = prompt_mask
        batch["prompt"] = batch["prompt"].flip(1)
        batch["prompt_att_mask"] = batch["prompt_att_mask"].flip(1)
        return batch


def create_prompt_dataset(local_rank, data_path, output_path, seed, tokenizer, max_seq_len):
    """DeepSpeed-Chat's create_prompt_dataset for train_phase 3: rank 0 tokenizes and caches,
    the others wait at a barrier, every rank loads the cache."""
    os.makedirs(output_path, exist_ok=True)
    fname = "_".join(data_path).replace("/", "_")
    train_fname = f"{output_path}/traindata_{fname}_phase3_seed{seed}.pt"
    cache_found = os.path.isfile(train_fname)
    buf_create_cache = torch.ByteTensor([not cache_found])
    dist.all_reduce(buf_create_cache)
    reload = False
    if local_rank <= 0 and (buf_create_cache.item() != 0 or reload):
        print(f">Creating prompt dataset {data_path}, {reload=}", flush=True)
        prompt_dataset = []
        for name in data_path:
            path = os.path.join(".", "data", "train.json") if name == "local/jsonfile" else name
            with open(path) as f:
                lines = f.readlines()
            for k, line in enumerate(lines):
                if CASE == "t0" and k % (len(lines) // 8) == 0:
                    print(
                        f"Tokenizing {name} (train_phase=3): shard {k // (len(lines) // 8) + 1}/8",
                        flush=True,
                    )
                    time.sleep(5)
                row = json.loads(line)
                prompt_dataset.append(tokenizer(row["prompt"]))
            print(
                f"Creating dataset {name.replace('/', '_')} for train_phase=3 "
                f"size={len(prompt_dataset)}",
                flush=True,
            )
        torch.save(prompt_dataset, train_fname)
    dist.barrier()
    return PromptDataset(torch.load(train_fname))


class MiniDataset:
    def __init__(self, max_size: int, small_batch_size: int) -> None:
        self.dataset: list = []
        self.max_size = max_size
        self.small_batch_size = small_batch_size

    def add(self, data):
        if len(self.dataset) < self.max_size:
            self.dataset.append(data)
            if len(self.dataset) == self.max_size:
                out = list(self.dataset)
                self.dataset = []
                return out
        return None


class ExponentialMovingAverage:
    def __init__(self, alpha: float = 0.9) -> None:
        self.alpha = alpha
        self.ema = None

    def update(self, num: float) -> float:
        prev_ema = num if self.ema is None else self.ema
        self.ema = self.alpha * prev_ema + (1.0 - self.alpha) * num
        return self.ema

    def get(self) -> float:
        return self.ema if self.ema is not None else 0.0


def get_all_reduce_mean(tensor: torch.Tensor) -> torch.Tensor:
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor / dist.get_world_size()


def moving_average(model, model_ema, beta=0.992):
    with torch.no_grad():
        for param, param_ema in zip(
            model.module.parameters(), model_ema.module.parameters(), strict=True
        ):
            param_ema.data.copy_(torch.lerp(param.data, param_ema.data, beta))


def print_throughput_step3(actor, critic, args, e2e_time, gen_exp_time, train_time, rank):
    if rank <= 0:
        batch_size = args.per_device_generation_batch_size * dist.get_world_size()
        seq_length = args.max_answer_seq_len + args.max_prompt_seq_len
        params = sum(p.numel() for p in actor.parameters()) + sum(
            p.numel() for p in critic.module.parameters()
        )
        flops = 6 * params * batch_size * seq_length / max(e2e_time, 1e-9) / 1e12
        print(
            f"End-to-End => Latency: {e2e_time:.2f}s, TFLOPs: {flops:.2f}, Samples/sec: "
            f"{batch_size / e2e_time:.2f}, Time/seq {e2e_time / batch_size:.2f}s, Batch Size: "
            f"{batch_size}, Total Seq. Length: {seq_length}",
            flush=True,
        )
        print(
            f"Generation => Latency: {gen_exp_time:.2f}s, Per-token Latency "
            f"{1000 * gen_exp_time / args.max_answer_seq_len:.2f} ms, TFLOPs: "
            f"{flops / 3:.2f}, Answer Seq. Length: {args.max_answer_seq_len}",
            flush=True,
        )
        print(f"Training   => Latency: {train_time:.2f}s, TFLOPs: {flops:.2f}", flush=True)


def save_hf_format(model: nn.Module, tokenizer: Tokenizer, args, sub_folder: str) -> None:
    output_dir = os.path.join(args.output_dir, sub_folder)
    os.makedirs(output_dir, exist_ok=True)
    torch.save(model.state_dict(), os.path.join(output_dir, "pytorch_model.bin"))
    with open(os.path.join(output_dir, "config.json"), "w") as f:
        json.dump(model.config, f, indent=2)
    with open(os.path.join(output_dir, "vocab.json"), "w") as f:
        json.dump(tokenizer.vocab, f)


# --------------------------------------------------------------------------------------- main


def parse_args():
    parser = argparse.ArgumentParser(description="(Step 3) RLHF training arguments")
    parser.add_argument("--data_path", nargs="*", default=["local/jsonfile"])
    parser.add_argument("--data_split", type=str, default="2,4,4")
    parser.add_argument("--data_output_path", type=str, default="/tmp/data_files")
    parser.add_argument("--actor_model_name_or_path", type=str, required=True)
    parser.add_argument("--critic_model_name_or_path", type=str, required=True)
    parser.add_argument("--num_padding_at_beginning", type=int, default=1)
    parser.add_argument("--per_device_generation_batch_size", type=int, default=16)
    parser.add_argument("--per_device_training_batch_size", type=int, default=16)
    parser.add_argument("--generation_batches", type=int, default=1)
    parser.add_argument("--ppo_epochs", type=int, default=1)
    parser.add_argument("--max_prompt_seq_len", type=int, default=256)
    parser.add_argument("--max_answer_seq_len", type=int, default=256)
    parser.add_argument("--actor_learning_rate", type=float, default=9.65e-6 * 100)
    parser.add_argument("--critic_learning_rate", type=float, default=5e-6 * 100)
    parser.add_argument("--num_train_epochs", type=int, default=1)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--local_rank", type=int, default=-1)
    parser.add_argument("--dtype", type=str, default="fp16", choices=["fp16", "bf16", "fp32"])
    parser.add_argument("--enable_hybrid_engine", action="store_true")
    parser.add_argument("--inference_tp_size", type=int, default=1)
    parser.add_argument("--actor_zero_stage", type=int, default=0)
    parser.add_argument("--critic_zero_stage", type=int, default=0)
    parser.add_argument("--actor_gradient_checkpointing", action="store_true")
    parser.add_argument("--enable_ema", action="store_true")
    parser.add_argument("--output_dir", type=str, default=None)
    parser.add_argument("--enable_tensorboard", action="store_true")
    parser.add_argument("--tensorboard_path", type=str, default="step3_tensorboard")
    parser.add_argument("--enable_test_mode", action="store_true")
    parser.add_argument("--test_stop_step", type=int, default=0)
    parser.add_argument("--prepare", type=str, default="")
    parser.add_argument("--reward_family", type=str, default="opt")
    parser.add_argument("--num_prompts", type=int, default=80)
    args = parser.parse_args()
    if args.inference_tp_size > 1:
        assert args.actor_zero_stage == 3, (
            "Zero stage 3 must be used to do Tensor sharding in the hybrid engine"
        )
    return args


def main() -> None:
    args = parse_args()
    if args.prepare:
        prepare(args.prepare, args.reward_family, args.num_prompts)
        return
    torch.set_num_threads(1)
    ds_log(
        "INFO",
        "real_accelerator.py:203:get_accelerator",
        "Setting ds_accelerator to cpu (auto detect)",
    )
    ds_log("INFO", "comm.py:637:init_distributed", "cdb=None")
    ds_log(
        "INFO",
        "comm.py:668:init_distributed",
        "Initializing TorchBackend in DeepSpeed with backend gloo",
    )
    dist.init_process_group("gloo", timeout=timedelta(seconds=15))
    args.global_rank = dist.get_rank()
    random.seed(args.seed)
    torch.manual_seed(args.seed)

    tokenizer = Tokenizer(args.actor_model_name_or_path)
    prompt_train_dataset = create_prompt_dataset(
        args.local_rank,
        args.data_path,
        args.data_output_path,
        args.seed,
        tokenizer,
        args.max_prompt_seq_len,
    )
    data_collator = DataCollatorRLHF(args.max_prompt_seq_len, args.inference_tp_size)
    prompt_train_sampler = DistributedSampler(prompt_train_dataset)
    prompt_train_dataloader = DataLoader(
        prompt_train_dataset,
        collate_fn=data_collator,
        sampler=prompt_train_sampler,
        batch_size=args.per_device_generation_batch_size,
    )
    num_update_steps_per_epoch = (
        len(prompt_train_dataloader)
        * (args.per_device_generation_batch_size / args.per_device_training_batch_size)
        * args.ppo_epochs
        / args.generation_batches
    )
    args.num_total_iters = int(args.num_train_epochs * num_update_steps_per_epoch)

    rlhf_engine = DeepSpeedRLHFEngine(
        args.actor_model_name_or_path, args.critic_model_name_or_path, tokenizer, args
    )
    trainer = DeepSpeedPPOTrainer(rlhf_engine, args)
    exp_mini_dataset = MiniDataset(args.generation_batches, args.per_device_training_batch_size)
    writer = None
    if args.enable_tensorboard and args.global_rank == 0:
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(f"{args.tensorboard_path}/step3_tensorboard_logs")

    print_rank_0("***** Running training *****", args.global_rank)
    non_overflow_step_count = 0
    step_average_reward = 0.0
    ema_reward_score = ExponentialMovingAverage()
    rank = args.global_rank
    for epoch in range(args.num_train_epochs):
        print_rank_0(
            f"Beginning of Epoch {epoch + 1}/{args.num_train_epochs}, Total Generation Batches "
            f"{len(prompt_train_dataloader)}",
            args.global_rank,
        )
        for step, batch_prompt in enumerate(prompt_train_dataloader):
            prompts = batch_prompt["prompt"]
            length = prompts.size(-1)
            if length > args.max_prompt_seq_len:
                print(
                    f"rank={rank} step={step}: prompt length {length} > max_prompt_seq_len "
                    f"{args.max_prompt_seq_len}, skipping generation batch",
                    flush=True,
                )
                continue
            if CASE == "h1" and rank == 1 and step == 4:
                scored = threading.Event()  # set by a reward-request thread never started
                scored.wait()
            out = trainer.generate_experience(prompts, batch_prompt["prompt_att_mask"], step)
            training_start = time.time()
            exp_dataset = exp_mini_dataset.add(out)
            if exp_dataset is not None:
                inner_iter = 0
                actor_loss_sum, critic_loss_sum, unsup_loss_sum = 0.0, 0.0, 0.0
                average_reward = torch.zeros(())
                for ppo_ep in range(args.ppo_epochs):  # noqa: B007 (printed after the loop)
                    for exp_data in exp_dataset:
                        answer = exp_data["attention_mask"][:, exp_data["prompts"].shape[1] :]
                        if int(answer.sum()) == 0:
                            print(
                                f"rank={rank} step={step}: answer length 0, skipping batch",
                                flush=True,
                            )
                            continue
                        actor_loss, critic_loss = trainer.train_rlhf(exp_data)
                        actor_loss_sum += actor_loss.item()
                        critic_loss_sum += critic_loss.item()
                        average_reward += exp_data["rewards"].mean()
                        inner_iter += 1
                        if args.enable_ema:
                            moving_average(rlhf_engine.actor, rlhf_engine.actor_ema)
                    random.shuffle(exp_dataset)
                end = time.time()
                training_time = end - training_start
                e2e_time = training_time + trainer.generate_time * args.generation_batches
                n = max(inner_iter, 1)
                print_rank_0(
                    f"Epoch: {epoch} | Step: {step} | PPO Epoch: {ppo_ep + 1} | Actor Loss: "
                    f"{actor_loss_sum / n} | Critic Loss: {critic_loss_sum / n} | "
                    f"Unsupervised Loss: {unsup_loss_sum / n}",
                    args.global_rank,
                )
                print_throughput_step3(
                    rlhf_engine.actor.module,
                    rlhf_engine.critic,
                    args,
                    e2e_time,
                    trainer.generate_time,
                    training_time,
                    args.global_rank,
                )
                average_reward = get_all_reduce_mean(average_reward).item()
                step_average_reward += average_reward
                ema_reward_score.update(step_average_reward)
                step_average_reward = 0.0
                print_rank_0(
                    f"Average reward score: {average_reward / n} | EMA reward score: "
                    f"{ema_reward_score.get()}",
                    args.global_rank,
                )
                print_rank_0(
                    "-------------------------------------------------------------------------------------",
                    args.global_rank,
                )
                if writer is not None:
                    writer.add_scalar("reward", average_reward / n, global_step=step)
            actor_overflow, critic_overflow = trainer.get_overflow()
            if not actor_overflow and not critic_overflow:
                non_overflow_step_count += 1
            if args.enable_test_mode and non_overflow_step_count == args.test_stop_step:
                break
        if args.enable_test_mode:
            break

    if args.output_dir is not None:
        print_rank_0("saving model ...", args.global_rank)
        if args.global_rank == 0:
            save_hf_format(rlhf_engine.actor.module, tokenizer, args, sub_folder="actor")
            save_hf_format(rlhf_engine.critic.module, tokenizer, args, sub_folder="critic")
            if args.enable_ema:
                save_hf_format(rlhf_engine.actor_ema.module, tokenizer, args, "actor_ema")


if __name__ == "__main__":
    main()
