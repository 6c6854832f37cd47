"""A tiny GPT-2 (2 layers, built from a GPT2Config, never downloaded) trained on synthetic token
ids the way transformers users do: `Trainer` with `TrainingArguments`, callbacks, launched by
`torchrun --nproc-per-node 2` on CPU (gloo).

FAULT (argv[1]) picks the mistake or accident injected where users meet it:
  healthy             a short run with evaluation, exit 0 (transformers' usual warnings only)
  unused-parameters   GPT2DoubleHeadsModel trained on language modelling only: its
                      multiple-choice head gets no gradient, with ddp_find_unused_parameters=False
  evaluate-main-only  after training, `trainer.evaluate()` runs under
                      `if trainer.is_world_process_zero()` (its gather waits for rank 1)
  eval-exception      an evaluation example of the wrong length lands on rank 1: collating fails
  sigkill             rank 1 is SIGKILLed at step 3 (as by the OOM killer)
  checkpoint-missing  `train(resume_from_checkpoint=True)` with output_dir on each node's local
                      disk: the Trainer saved checkpoints on the main node only
Each rank plays a node with its own local disk: `node<local rank>/` under the working directory.
"""

import os
import signal
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.utils.data import Dataset
from transformers import (
    GPT2Config,
    GPT2DoubleHeadsModel,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

FAULT = sys.argv[1] if len(sys.argv) > 1 else "healthy"
FAIL_RANK = 1
FAIL_STEP = 3
NODE_DISK = f"node{os.environ.get('LOCAL_RANK', '0')}"
SEQ = 16


class Tokens(Dataset[dict[str, torch.Tensor]]):
    """Synthetic token ids: counting sequences modulo the vocabulary (easy to learn)."""

    def __init__(self, n: int, short: int | None = None) -> None:
        self.n, self.short = n, short

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        length = SEQ - 4 if i == self.short else SEQ
        ids = (torch.arange(length) + i) % 64
        return {"input_ids": ids, "labels": ids.clone()}


class KillAtStep(TrainerCallback):
    """Stands for the kernel's OOM killer: SIGKILL to rank 1 at step FAIL_STEP."""

    def on_step_end(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
        if state.global_step == FAIL_STEP and int(os.environ.get("RANK", 0)) == FAIL_RANK:
            os.kill(os.getpid(), signal.SIGKILL)


def arguments(**overrides: object) -> TrainingArguments:
    settings: dict[str, object] = {
        "output_dir": NODE_DISK,
        "per_device_train_batch_size": 4,
        "per_device_eval_batch_size": 4,
        "max_steps": 8,
        "learning_rate": 1e-3,
        "logging_steps": 2,
        "eval_strategy": "steps",
        "eval_steps": 4,
        "save_strategy": "no",
        "report_to": "none",
        "use_cpu": True,
    }
    return TrainingArguments(**{**settings, **overrides})  # type: ignore[arg-type]


def main() -> None:
    # transformers 5 ignores ddp_timeout with use_cpu=True: a short timeout needs the group made
    # here (the Trainer then uses it)
    dist.init_process_group("gloo", timeout=timedelta(seconds=10))
    config = GPT2Config(vocab_size=64, n_positions=SEQ, n_embd=32, n_layer=2, n_head=2)
    model = (GPT2DoubleHeadsModel if FAULT == "unused-parameters" else GPT2LMHeadModel)(config)
    train = Tokens(64)
    # the 6th evaluation example is short; batches of 4 alternate between the 2 ranks
    evaluation = Tokens(16, short=5 if FAULT == "eval-exception" else None)
    callbacks: list[TrainerCallback] = []
    overrides: dict[str, object] = {}
    if FAULT == "unused-parameters":
        overrides["ddp_find_unused_parameters"] = False  # "faster, and silences the warning"
    if FAULT == "sigkill":
        callbacks.append(KillAtStep())
    if FAULT == "checkpoint-missing":
        # a first job ran until it was preempted after saving checkpoint-4 ...
        first = arguments(save_strategy="steps", save_steps=4, max_steps=4)
        Trainer(model=model, args=first, train_dataset=train, eval_dataset=evaluation).train()
        # ... and its resubmission resumes from the last checkpoint in output_dir
        again = Trainer(model=model, args=arguments(), train_dataset=train, eval_dataset=evaluation)
        again.train(resume_from_checkpoint=True)
        dist.destroy_process_group()
        return
    trainer = Trainer(
        model=model,
        args=arguments(**overrides),
        train_dataset=train,
        eval_dataset=evaluation,
        callbacks=callbacks,
    )
    trainer.train()
    if FAULT == "evaluate-main-only":
        if trainer.is_world_process_zero():  # report the final metrics once
            print(trainer.evaluate())
        return  # rank 1 ends here while rank 0 waits in evaluate(): no teardown to wait on
    trainer.evaluate()
    if FAULT == "healthy":
        trainer.save_model()
    # this script made the group, so it ends it: in torch 2.13 a gloo group left to interpreter
    # exit may abort the process ("terminate called without an active exception"), or hang it
    # when DDP's reducer frees the group while gloo's thread still frees the last gather's
    # tensors (both need the GIL); the barrier lets that thread finish first
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
