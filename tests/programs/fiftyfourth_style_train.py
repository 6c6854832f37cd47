"""A fifty-fourth training-program style for the generalisation fixtures
(tests/fixtures/real/fiftyfourth-*): an LLM fine-tuning run in the way of LLaMA-Factory / ms-swift,
started by their one-command CLI (tests/programs/fiftyfourth_cli.py runs `torchrun ... this
config.yaml`). A YAML config (model, dataset, template, cutoff_len, batch size, epochs, logging,
eval and save steps, ddp_timeout, resume_from_checkpoint, early stopping, plot_loss), a synthetic
instruction dataset in shard files (data/<name>/train-0000K-of-0000N.json, one shard per rank as
split_dataset_by_node gives whole shards) tokenised at run time by a character tokenizer under
main_process_first (rank 0 first, the others wait in a barrier; a tqdm "Running tokenizer on
dataset" bar on every rank), a tiny GPT-like decoder in raw torch under DDP over gloo
(ddp_timeout 15 s), and transformers' console: "[INFO|trainer.py:2134] 2025-01-02 10:11:12,345 >>
..." lines on rank 0 (replicas log warnings only), "[WARNING|logging.py:329] ..." from every rank,
the framework's own "[INFO|2025-01-02 10:11:12] tinytune.data.loader:143 >> ..." lines, rank 0's
dict lines "{'loss': ..., 'grad_norm': ..., 'learning_rate': ..., 'epoch': ...}" and its tqdm
bar, an evaluation per epoch whose losses are gathered from every rank, checkpoint-N folders
written by rank 0 (each rank writes its rng_state_K.pth, as transformers does). A fault is chosen
by the TUNE_QA_DRILL environment variable (a short code) and never printed (re-capture with
tests/fixtures/real/capture_fiftyfourth.sh after any edit).
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import json
import os
import random
import signal
import sys
import threading
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
import yaml
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm


@dataclass(frozen=True)
class Drill:
    """What goes wrong in the code (the defaults: nothing)."""

    key_rank: int = -1  # this rank books a batch's loss under a task the table lacks (step 7)
    hoard_rank: int = -1  # this rank keeps 64 MiB a step until the OOM killer acts
    segv_rank: int = -1  # this rank's fused loss kernel reads address 0 (step 5)
    slow_tok_rank: int = -1  # this rank's tokenizer crawls (40 s over its shard)
    stuck_rank: int = -1  # this rank waits for a prefetch thread that never signals (epoch 1)
    gather_rank0: bool = False  # rank 0 alone gathers generated samples after evaluation
    stop_rank0: bool = False  # the early-stopping check runs on rank 0 only
    cuda_map: bool = False  # the optimizer state is loaded onto f"cuda:{local_rank}"
    linger_rank: int = -1  # this rank starts a non-daemon tracker thread that never ends


DRILLS: dict[str, Drill] = {
    "": Drill(),
    "rk41": Drill(key_rank=1),
    "mm71": Drill(hoard_rank=1),
    "nv92": Drill(segv_rank=2),
    "tq30": Drill(slow_tok_rank=0),
    "pf51": Drill(stuck_rank=1),
    "ga80": Drill(gather_rank0=True),
    "es60": Drill(stop_rank0=True),
    "dm44": Drill(cuda_map=True),
    "th82": Drill(linger_rank=2),
}
IGNORE_INDEX = -100
SPECIALS = ["<pad>", "<s>", "</s>"]
CHARS = [chr(c) for c in range(32, 127)] + ["\n"]
TASKS = ["arithmetic", "reverse", "upper"]

RANK = int(os.environ.get("RANK", 0))
WORLD = int(os.environ.get("WORLD_SIZE", 1))
LOCAL_RANK = int(os.environ.get("LOCAL_RANK", 0))


def _now_ms() -> str:
    now = datetime.datetime.now()
    return now.strftime("%Y-%m-%d %H:%M:%S") + f",{now.microsecond // 1000:03d}"


def hf_log(level: str, where: str, msg: str) -> None:
    """transformers' handler: "[LEVEL|file.py:line] asctime >> msg"; replicas log WARNING up."""
    if level == "INFO" and RANK != 0:
        return
    print(f"[{level}|{where}] {_now_ms()} >> {msg}", file=sys.stderr, flush=True)


def lf_log(level: str, where: str, msg: str, all_ranks: bool = False) -> None:
    """The framework's own handler: "[LEVEL|asctime] module:line >> msg" (info_rank0 unless
    all_ranks; warnings from every rank)."""
    if level == "INFO" and RANK != 0 and not all_ranks:
        return
    now = datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S")
    print(f"[{level}|{now}] {where} >> {msg}", file=sys.stderr, flush=True)


class CharTokenizer:
    def __init__(self) -> None:
        self.vocab = SPECIALS + CHARS
        self.ids = {c: i for i, c in enumerate(self.vocab)}
        self.pad_token_id, self.bos_token_id, self.eos_token_id = 0, 1, 2

    def encode(self, text: str) -> list[int]:
        return [self.ids.get(c, self.ids["?"]) for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(self.vocab[i] for i in ids)


def render(example: dict) -> tuple[str, str]:
    """The 'default' template: Human / Assistant turns."""
    prompt = f"Human: {example['instruction']}"
    if example.get("input"):
        prompt += f"\n{example['input']}"
    return prompt + "\nAssistant: ", example["output"]


def preprocess(example: dict, tok: CharTokenizer, cutoff_len: int) -> dict:
    prompt, response = render(example)
    source = [tok.bos_token_id, *tok.encode(prompt)]
    target = [*tok.encode(response), tok.eos_token_id]
    input_ids = (source + target)[:cutoff_len]
    labels = ([IGNORE_INDEX] * len(source) + target)[:cutoff_len]
    return {"input_ids": input_ids, "labels": labels, "task": example.get("task", TASKS[0])}


@contextlib.contextmanager
def main_process_first(desc: str):
    """transformers' TrainingArguments.main_process_first: replicas wait in a barrier."""
    if RANK != 0:
        dist.barrier()
    try:
        yield
    finally:
        if RANK == 0:
            dist.barrier()


def load_shard(cfg: dict) -> list[dict]:
    """The dataset's shard files (data/dataset_info.json): whole shards per rank where they
    divide evenly (split_dataset_by_node), else every shard's examples strided over the ranks."""
    with open(os.path.join(cfg["dataset_dir"], "dataset_info.json")) as f:
        info = json.load(f)[cfg["dataset"]]
    folder = os.path.join(cfg["dataset_dir"], info["file_name"])
    shards = info["shards"]
    lf_log("INFO", "tinytune.data.loader:143", f"Loading dataset {info['file_name']}/...")
    mine, stride = (shards[RANK::WORLD], False) if len(shards) % WORLD == 0 else (shards, True)
    rows = []
    for name in mine:
        with open(os.path.join(folder, name)) as f:
            rows += [json.loads(line) for line in f if line.strip()]
    return rows[RANK::WORLD] if stride else rows


def tokenize(rows: list[dict], tok: CharTokenizer, cfg: dict, drill: Drill) -> list[dict]:
    out = []
    delay = 0.8 if drill.slow_tok_rank == RANK else 0.0
    bar = tqdm(
        total=len(rows),
        desc="Running tokenizer on dataset (num_proc=1)",
        unit=" examples",
        ascii=True,
        mininterval=0.5 if delay else 0.1,
    )
    for row in rows:
        out.append(preprocess(row, tok, cfg["cutoff_len"]))
        if delay:
            time.sleep(delay)
        bar.update(1)
    bar.close()
    return out


def collate(features: list[dict], pad_id: int) -> dict:
    longest = max(len(f["input_ids"]) for f in features)
    ids = torch.full((len(features), longest), pad_id, dtype=torch.long)
    labels = torch.full((len(features), longest), IGNORE_INDEX, dtype=torch.long)
    for i, f in enumerate(features):
        ids[i, : len(f["input_ids"])] = torch.tensor(f["input_ids"])
        labels[i, : len(f["labels"])] = torch.tensor(f["labels"])
    return {"input_ids": ids, "labels": labels, "tasks": [f["task"] for f in features]}


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, vocab: int, d: int, layers: int, heads: int, ctx: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(ctx, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        n = input_ids.shape[1]
        x = self.tok(input_ids) + self.pos(torch.arange(n))
        mask = torch.triu(torch.ones(n, n, dtype=torch.bool), diagonal=1)
        for block in self.blocks:
            x = block(x, mask)
        return self.lm_head(self.ln_f(x))


def sample_losses(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per-sample mean token loss (each sample weighs the same, whatever its length)."""
    shift_logits, shift_labels = logits[:, :-1], labels[:, 1:]
    token = nn.functional.cross_entropy(
        shift_logits.reshape(-1, shift_logits.shape[-1]),
        shift_labels.reshape(-1),
        ignore_index=IGNORE_INDEX,
        reduction="none",
    ).view(shift_labels.shape)
    count = (shift_labels != IGNORE_INDEX).sum(1)
    return token.sum(1) / count


def batches(data: list[dict], size: int, pad_id: int) -> list[dict]:
    return [collate(data[i : i + size], pad_id) for i in range(0, len(data) - size + 1, size)]


def evaluate(model: nn.Module, data: list[dict], cfg: dict, epoch: float) -> float:
    hf_log("INFO", "trainer.py:4307", "\n***** Running Evaluation *****")
    hf_log("INFO", "trainer.py:4309", f"  Num examples = {len(data) * WORLD}")
    hf_log("INFO", "trainer.py:4312", f"  Batch size = {cfg['per_device_eval_batch_size']}")
    start = time.time()
    model.eval()
    total = torch.zeros(2)
    evs = batches(data, cfg["per_device_eval_batch_size"], 0)
    bar = tqdm(total=len(evs), ascii=True, disable=RANK != 0, leave=False)
    with torch.no_grad():
        for b in evs:
            losses = sample_losses(model(b["input_ids"]), b["labels"])
            total += torch.stack([losses.nansum(), torch.tensor(float(len(losses)))])
            bar.update(1)
    bar.close()
    gathered = [torch.zeros(2) for _ in range(WORLD)]
    dist.all_gather(gathered, total)  # Trainer's _nested_gather of the eval losses
    both = torch.stack(gathered).sum(0)
    eval_loss = (both[0] / both[1]).item()
    runtime = time.time() - start
    if RANK == 0:
        n = len(data) * WORLD
        tqdm.write(
            str(
                {
                    "eval_loss": round(eval_loss, 4),
                    "eval_runtime": round(runtime, 4),
                    "eval_samples_per_second": round(n / runtime, 3),
                    "eval_steps_per_second": round(len(evs) / runtime, 3),
                    "epoch": round(epoch, 2),
                }
            )
        )
    model.train()
    return eval_loss


def save_checkpoint(folder: str, model: nn.Module, optimizer, scheduler, state: dict) -> None:
    if RANK == 0:
        hf_log("INFO", "trainer.py:3801", f"Saving model checkpoint to {folder}")
        os.makedirs(folder, exist_ok=True)
        torch.save(model.state_dict(), os.path.join(folder, "pytorch_model.bin"))
        hf_log(
            "INFO", "modeling_utils.py:3042", f"Model weights saved in {folder}/pytorch_model.bin"
        )
        torch.save(optimizer.state_dict(), os.path.join(folder, "optimizer.pt"))
        torch.save(scheduler.state_dict(), os.path.join(folder, "scheduler.pt"))
        with open(os.path.join(folder, "trainer_state.json"), "w") as f:
            json.dump(state, f, indent=2)
    os.makedirs(folder, exist_ok=True)
    rng = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "cpu": torch.random.get_rng_state(),
    }
    torch.save(rng, os.path.join(folder, f"rng_state_{RANK}.pth"))


def main() -> None:
    drill = DRILLS[os.environ.get("TUNE_QA_DRILL", "")]
    with open(sys.argv[1]) as f:
        cfg = yaml.safe_load(f)
    timeout = datetime.timedelta(seconds=cfg.get("ddp_timeout", 1800))
    dist.init_process_group("gloo", timeout=timeout)
    lf_log(
        "INFO",
        "tinytune.hparams.parser:406",
        f"Process rank: {RANK}, world size: {WORLD}, device: cpu, distributed training: True, "
        "compute dtype: torch.float32",
        all_ranks=True,
    )
    torch.manual_seed(cfg.get("seed", 42))
    random.seed(cfg.get("seed", 42) + RANK)
    np.random.seed(cfg.get("seed", 42) + RANK)
    tok = CharTokenizer()
    lf_log("INFO", "tinytune.model.loader:107", f"Add pad token: {SPECIALS[0]}")

    rows = load_shard(cfg)
    with main_process_first(desc="pre-process dataset"):
        train = tokenize(rows, tok, cfg, drill)
    with open(os.path.join(cfg["dataset_dir"], cfg["dataset"], "eval.json")) as f:
        eval_rows = [json.loads(line) for line in f if line.strip()][RANK::WORLD]
    evald = [preprocess(r, tok, cfg["cutoff_len"]) for r in eval_rows]
    if RANK == 0:
        ex = train[0]
        print("training example:")
        print("input_ids:\n" + str(ex["input_ids"]))
        print("inputs:\n" + tok.decode(ex["input_ids"]))
        print("label_ids:\n" + str(ex["labels"]))
        print("labels:\n" + tok.decode([i for i in ex["labels"] if i != IGNORE_INDEX]))

    m = cfg["model"]
    model = TinyGPT(len(tok.vocab), m["hidden_size"], m["num_layers"], m["num_heads"], 128)
    n_params = sum(p.numel() for p in model.parameters())
    lf_log(
        "INFO",
        "tinytune.model.loader:143",
        f"trainable params: {n_params:,} || all params: {n_params:,} || trainable%: 100.0000",
    )
    model = DistributedDataParallel(model)
    bs = cfg["per_device_train_batch_size"]
    epochs = cfg["num_train_epochs"]
    steps_per_epoch = len(train) // bs
    max_steps = steps_per_epoch * epochs
    lr = cfg["learning_rate"]
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: max(0.0, 1.0 - s / max_steps)
    )
    out_dir = cfg["output_dir"]
    global_step, start_epoch = 0, 0
    resume = cfg.get("resume_from_checkpoint")
    if resume:
        hf_log("INFO", "trainer.py:2417", f"Loading model from {resume}.")
        model.module.load_state_dict(torch.load(os.path.join(resume, "pytorch_model.bin")))
        where = f"cuda:{LOCAL_RANK}" if drill.cuda_map else "cpu"
        optimizer.load_state_dict(torch.load(os.path.join(resume, "optimizer.pt"), where))
        scheduler.load_state_dict(torch.load(os.path.join(resume, "scheduler.pt")))
        rng = torch.load(os.path.join(resume, f"rng_state_{RANK}.pth"))
        random.setstate(rng["python"])
        np.random.set_state(rng["numpy"])
        torch.random.set_rng_state(rng["cpu"])
        with open(os.path.join(resume, "trainer_state.json")) as f:
            global_step = json.load(f)["global_step"]
        start_epoch = global_step // steps_per_epoch
        hf_log("INFO", "trainer.py:2158", "  Continuing training from checkpoint")

    hf_log("INFO", "trainer.py:2134", "***** Running training *****")
    hf_log("INFO", "trainer.py:2135", f"  Num examples = {len(train) * WORLD:,}")
    hf_log("INFO", "trainer.py:2136", f"  Num Epochs = {epochs:,}")
    hf_log("INFO", "trainer.py:2137", f"  Instantaneous batch size per device = {bs:,}")
    hf_log(
        "INFO",
        "trainer.py:2140",
        f"  Total train batch size (w. parallel, distributed & accumulation) = {bs * WORLD:,}",
    )
    hf_log("INFO", "trainer.py:2141", "  Gradient Accumulation steps = 1")
    hf_log("INFO", "trainer.py:2142", f"  Total optimization steps = {max_steps:,}")
    hf_log("INFO", "trainer.py:2143", f"  Number of trainable parameters = {n_params:,}")

    task_loss = {t: 0.0 for t in TASKS}
    hoard: list[torch.Tensor] = []
    best, bad_evals, stop, nan_stop = None, 0, False, False
    tr_loss = torch.zeros(())
    logged_at, start = global_step, time.time()
    bar = tqdm(total=max_steps, initial=global_step, ascii=True, disable=RANK != 0)
    warned = False
    model.train()
    for epoch in range(start_epoch, epochs):
        for i, b in enumerate(batches(train, bs, tok.pad_token_id)):
            global_step += 1
            if epoch == 1 and i == 3 and drill.stuck_rank == RANK:
                ready = threading.Event()  # set by a prefetch thread that was never started
                ready.wait()
            if not warned:
                hf_log(
                    "WARNING",
                    "logging.py:329",
                    "`use_cache=True` is incompatible with gradient checkpointing. "
                    "Setting `use_cache=False`.",
                )
                warned = True
            if drill.hoard_rank == RANK:
                hoard.append(torch.ones(64, 1024, 1024, dtype=torch.uint8))
                if len(hoard) == 4:
                    os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does
            if drill.segv_rank == RANK and global_step == 5:
                ctypes.string_at(0)  # the fused loss kernel dereferences NULL
            losses = sample_losses(model(b["input_ids"]), b["labels"])
            loss = losses.mean()
            if not torch.isfinite(loss):
                lf_log(
                    "WARNING",
                    "tinytune.train.sft.trainer:96",
                    f"Non-finite loss ({loss.item()}) at step {global_step}, stopping training.",
                )
                nan_stop = True
                break
            for t, sl in zip(b["tasks"], losses.tolist(), strict=True):
                if drill.key_rank == RANK and global_step == 7:
                    t = "translate"  # a task the table was never given
                task_loss[t] += sl
            loss.backward()
            grad_norm = nn.utils.clip_grad_norm_(model.parameters(), 1.0).item()
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            tr_loss += loss.detach()
            if global_step % cfg["logging_steps"] == 0:
                total = tr_loss.clone()
                dist.all_reduce(total)  # Trainer's _nested_gather of the loss
                avg = total.item() / WORLD / (global_step - logged_at)
                if RANK == 0:
                    tqdm.write(
                        str(
                            {
                                "loss": round(avg, 4),
                                "grad_norm": grad_norm,
                                "learning_rate": scheduler.get_last_lr()[0],
                                "epoch": round(global_step / steps_per_epoch, 2),
                            }
                        )
                    )
                tr_loss.zero_()
                logged_at = global_step
            bar.update(1)
        if nan_stop:
            break
        eval_loss = evaluate(model, evald, cfg, global_step / steps_per_epoch)
        if drill.gather_rank0 and RANK == 0 and epoch == 0:
            prompts = [tok.decode(f["input_ids"][:12]) for f in evald[:2]]
            samples: list[object] = [None] * WORLD
            dist.all_gather_object(samples, prompts)  # generated samples for the log
        patience = cfg.get("early_stopping_steps")
        if patience and (not drill.stop_rank0 or RANK == 0):
            threshold = cfg.get("early_stopping_threshold", 0.0)
            if best is None or best - eval_loss > threshold:
                best, bad_evals = eval_loss, 0
            else:
                bad_evals += 1
            if bad_evals >= patience:
                lf_log(
                    "INFO",
                    "tinytune.train.callbacks:212",
                    f"Early stopping: eval_loss has not improved for {bad_evals} evaluation(s) "
                    f"(best {best:.4f}), stopping training.",
                )
                stop = True
        state = {"global_step": global_step, "epoch": epoch + 1, "best_metric": best}
        save_checkpoint(
            os.path.join(out_dir, f"checkpoint-{global_step}"),
            model.module,
            optimizer,
            scheduler,
            state,
        )
        if stop:
            break
    bar.close()
    runtime = time.time() - start
    hf_log(
        "INFO",
        "trainer.py:2611",
        "\n\nTraining completed. Do not forget to share your model on huggingface.co/models =)\n\n",
    )
    if RANK == 0:
        steps = max(global_step, 1)
        print(
            {
                "train_runtime": round(runtime, 4),
                "train_samples_per_second": round(steps * bs * WORLD / runtime, 3),
                "train_steps_per_second": round(steps / runtime, 3),
                "train_loss": round(sum(task_loss.values()) / max(steps * bs, 1), 4),
                "epoch": round(global_step / steps_per_epoch, 2),
            }
        )
        hf_log("INFO", "trainer.py:3801", f"Saving model checkpoint to {out_dir}")
        os.makedirs(out_dir, exist_ok=True)
        torch.save(model.module.state_dict(), os.path.join(out_dir, "pytorch_model.bin"))
        print("***** train metrics *****")
        print(f"  epoch                    = {global_step / steps_per_epoch:.4f}")
        print(
            f"  train_loss               = {sum(task_loss.values()) / max(global_step * bs, 1):.4f}"
        )
        print(f"  train_runtime            = {datetime.timedelta(seconds=int(runtime))}")
        if cfg.get("plot_loss"):
            import matplotlib.pyplot as plt  # tinytune.extras.ploting's plot_loss

            plt.figure()
    if drill.linger_rank == RANK:
        threading.Thread(target=threading.Event().wait, name="tracker-sync").start()
    dist.destroy_process_group()


if __name__ == "__main__":
    if os.environ.get("TUNE_MAKE"):  # the capture's set-up, never a training run
        folder, world, n, n_eval = os.environ["TUNE_MAKE"].split(":")
        rng = random.Random(7)

        def example(k: int) -> dict:
            task = TASKS[k % 3]
            if task == "arithmetic":
                a, b = rng.randint(1, 99), rng.randint(1, 99)
                return {"instruction": f"What is {a} plus {b}?", "output": str(a + b)}
            word = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(6))
            if task == "reverse":
                return {"instruction": f"Reverse the word '{word}'.", "output": word[::-1]}
            return {"instruction": f"Write '{word}' in capital letters.", "output": word.upper()}

        os.makedirs(folder, exist_ok=True)
        shards = [f"train-{r:05d}-of-{int(world):05d}.json" for r in range(int(world))]
        for name in shards:
            with open(os.path.join(folder, name), "w") as f:
                for k in range(int(n)):
                    f.write(json.dumps({**example(k), "input": "", "task": TASKS[k % 3]}) + "\n")
        with open(os.path.join(folder, "eval.json"), "w") as f:
            for k in range(int(n_eval)):
                f.write(json.dumps({**example(k), "input": "", "task": TASKS[k % 3]}) + "\n")
        name = os.path.basename(folder)
        with open(os.path.join(os.path.dirname(folder), "dataset_info.json"), "w") as f:
            json.dump({name: {"file_name": name, "shards": shards}}, f, indent=2)
        sys.exit(0)
    main()
