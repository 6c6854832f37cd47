"""A hundred-and-ninth training-program style for the generalisation fixtures
(tests/fixtures/real/hundredninth-*): LoRA training of a Stable Diffusion v1-like text-to-image
model in the way of kohya-ss/sd-scripts' train_network.py, re-created in plain torch (diffusers,
transformers, accelerate and safetensors are not used; rich and tqdm are, as kohya's scripts use
them). Copied into each run's folder as train_network.py, beside library/train_util.py,
library/config_util.py, library/model_util.py (hundredninth_train_util.py,
hundredninth_config_util.py, hundredninth_model_util.py) and networks/lora.py (hundredninth_lora.py),
and started as kohya's README starts it: `accelerate launch --num_processes 2
--num_cpu_threads_per_process 1 train_network.py --pretrained_model_name_or_path=model.safetensors
--dataset_config=dataset.toml --output_dir=out --network_module=networks.lora --network_dim=16
--max_train_epochs=N --save_every_n_epochs=1 --mixed_precision=bf16 --cache_latents
--cache_latents_to_disk ...` (accelerate re-created: tests/programs/hundredninth_accelerate.py).
NetworkTrainer.train as kohya's: the dataset built on every process before the accelerator
(captions read, buckets made; 'No data found' returns), prepare_accelerator, load_target_model one
process after another, the latents cached to .npz beside the images (each process its share),
create_network and apply_to, the 'running training / 学習開始' block, the network wrapped in DDP
whose forward is never called (the text encoder and the U-Net are called directly) and so
kohya's all_reduce_network ('sync DDP grad manually': one all-reduce per LoRA parameter with a
gradient), the tqdm bar 'steps' with avr_loss, sample_images after every step and every epoch,
wait_for_everyone at the end of each epoch, the main process's epoch checkpoints and
last.safetensors, 'model saved.'. A fault in the code is chosen by the TQ_CASE environment variable
(a short code, never printed).
"""

from __future__ import annotations

import argparse
import importlib
import math
import os
import random
import sys
import time
import types
from multiprocessing import Value

import torch
from library import config_util, model_util, train_util
from library.train_util import setup_logging
from tqdm import tqdm

setup_logging()
import logging  # noqa: E402

logger = logging.getLogger(__name__)

# TQ_CASE -> (what goes wrong): m1 rank 1 holds the checkpoint in memory once per conversion step
# while loading (SIGKILL, as the OOM killer would); v1 rank 1's fused attention kernel reads
# address 0 at epoch 2 step 3; g0 the main process alone averages the loss it shows in the bar
# (accelerator.reduce under is_main_process); j1 rank 1's loader worker waits at epoch 2 for a
# signal that never comes; k0 the main process's checkpoint metadata gets an int value
CASE = os.environ.get("TQ_CASE", "")


class NetworkTrainer:
    def __init__(self):
        self.vae_scale_factor = model_util.VAE_SCALE_FACTOR

    def train(self, args):
        session_id = random.randint(0, 2**32)
        training_started_at = time.time()
        setup_logging(args, reset=True)

        cache_latents = args.cache_latents
        use_dreambooth_method = args.in_json is None
        use_user_config = args.dataset_config is not None

        if args.seed is None:
            args.seed = random.randint(0, 2**32)
        train_util.set_seed(args.seed)

        logger.info("prepare tokenizer")
        tokenizer = model_util.CLIPTokenizer()

        current_epoch = Value("i", 0)
        current_step = Value("i", 0)

        # データセットを準備する
        if use_user_config:
            logger.info(f"Loading dataset config from {args.dataset_config}")
            user_config = config_util.load_user_config(args.dataset_config)
            ignored = ["train_data_dir", "reg_data_dir", "in_json"]
            if any(getattr(args, attr) is not None for attr in ignored):
                logger.warning(
                    "ignoring the following options because config file is found: {0} / 設定ファイルが利用されるため以下のオプションは無視されます: {0}".format(
                        ", ".join(ignored)
                    )
                )
        else:
            if use_dreambooth_method:
                logger.info("Using DreamBooth method.")
                user_config = {
                    "datasets": [
                        {
                            "subsets": config_util.generate_dreambooth_subsets_config_by_subdirs(
                                args.train_data_dir, args.reg_data_dir
                            )
                        }
                    ]
                }
        world = types.SimpleNamespace(
            num_processes=int(os.environ.get("WORLD_SIZE", "1")),
            process_index=int(os.environ.get("RANK", "0")),
        )
        train_dataset_group = config_util.generate_dataset_group(
            user_config, args, tokenizer, current_epoch, world
        )
        for dataset in train_dataset_group.datasets:
            dataset.hang_rank = 1 if CASE == "j1" else -1

        ds_for_collator = train_dataset_group if args.max_data_loader_n_workers == 0 else None
        collator = train_util.collator_class(current_epoch, current_step, ds_for_collator)

        if len(train_dataset_group) == 0:
            logger.error(
                "No data found. Please verify arguments (train_data_dir must be the parent of folders with images) / 画像がありません。引数指定を確認してください（train_data_dirには画像があるフォルダではなく、画像があるフォルダの親フォルダを指定する必要があります）"
            )
            return

        if cache_latents:
            assert train_dataset_group.is_latent_cacheable(), (
                "when caching latents, either color_aug or random_crop cannot be used / latentをキャッシュするときはcolor_augとrandom_cropは使えません"
            )

        # acceleratorを準備する
        logger.info("preparing accelerator")
        accelerator = train_util.prepare_accelerator(args)
        is_main_process = accelerator.is_main_process

        # mixed precisionに対応した型を用意しておき適宜castする
        weight_dtype, save_dtype = train_util.prepare_dtype(args)

        # モデルを読み込む
        text_encoder, vae, unet = train_util.load_target_model(
            args, weight_dtype, accelerator, hoard_rank=1 if CASE == "m1" else -1
        )
        train_util.replace_unet_modules(unet, args.mem_eff_attn, args.xformers, args.sdpa)

        # 学習を準備する
        if cache_latents:
            vae.requires_grad_(False)
            vae.eval()
            train_dataset_group.new_cache_latents(vae, accelerator)
            accelerator.wait_for_everyone()

        # 差分追加学習のためにモデルを読み込む
        sys.path.append(os.path.dirname(__file__))
        accelerator.print("import network module:", args.network_module)
        network_module = importlib.import_module(args.network_module)

        network = network_module.create_network(
            1.0, args.network_dim, args.network_alpha, vae, text_encoder, unet
        )
        train_unet = not args.network_train_text_encoder_only
        train_text_encoder = not args.network_train_unet_only
        network.apply_to(text_encoder, unet, train_text_encoder, train_unet)

        if args.gradient_checkpointing:
            unet.gradient_checkpointing = True
            text_encoder.gradient_checkpointing = True
            network.enable_gradient_checkpointing()  # may have no effect

        # 学習に必要なクラスを準備する
        accelerator.print("prepare optimizer, data loader etc.")
        trainable_params, _lr_descriptions = network.prepare_optimizer_params(
            args.text_encoder_lr, args.unet_lr, args.learning_rate
        )
        optimizer_type = args.optimizer_type or "AdamW"
        logger.info(f"use {optimizer_type} optimizer | {{}}")
        optimizer = torch.optim.AdamW(trainable_params, lr=args.learning_rate)

        # dataloaderを準備する
        # DataLoaderのプロセス数: 0 は persistent_workers が使えないので注意
        n_workers = min(
            args.max_data_loader_n_workers, os.cpu_count()
        )  # cpu_count or max_data_loader_n_workers
        train_dataloader = torch.utils.data.DataLoader(
            train_dataset_group,
            batch_size=1,
            shuffle=True,
            collate_fn=collator,
            num_workers=n_workers,
            persistent_workers=args.persistent_data_loader_workers,
        )

        # 学習ステップ数を計算する
        if args.max_train_epochs is not None:
            args.max_train_steps = args.max_train_epochs * math.ceil(
                len(train_dataloader) / args.gradient_accumulation_steps
            )
            accelerator.print(
                f"override steps. steps for {args.max_train_epochs} epochs is / 指定エポックまでのステップ数: {args.max_train_steps}"
            )

        lr_scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)

        network.prepare_grad_etc(text_encoder, unet)
        unet.requires_grad_(False)
        text_encoder.requires_grad_(False)
        network.requires_grad_(True)
        unet.train()
        text_encoder.train()
        network = accelerator.prepare(network)
        training_model = network

        # 学習する
        num_update_steps_per_epoch = math.ceil(
            len(train_dataloader) / args.gradient_accumulation_steps
        )
        num_train_epochs = math.ceil(args.max_train_steps / num_update_steps_per_epoch)

        accelerator.print("running training / 学習開始")
        accelerator.print(
            f"  num train images * repeats / 学習画像の数×繰り返し回数: {train_dataset_group.num_train_images}"
        )
        accelerator.print(
            f"  num reg images / 正則化画像の数: {train_dataset_group.num_reg_images}"
        )
        accelerator.print(f"  num batches per epoch / 1epochのバッチ数: {len(train_dataloader)}")
        accelerator.print(f"  num epochs / epoch数: {num_train_epochs}")
        accelerator.print(
            f"  batch size per device / バッチサイズ: {', '.join([str(d.batch_size) for d in train_dataset_group.datasets])}"
        )
        accelerator.print(
            f"  gradient accumulation steps / 勾配を合計するステップ数 = {args.gradient_accumulation_steps}"
        )
        accelerator.print(f"  total optimization steps / 学習ステップ数: {args.max_train_steps}")

        metadata = {
            "ss_session_id": session_id,  # random integer indicating which group of epochs the model came from
            "ss_training_started_at": training_started_at,  # unix timestamp
            "ss_output_name": args.output_name,
            "ss_learning_rate": args.learning_rate,
            "ss_num_train_images": train_dataset_group.num_train_images,
            "ss_num_batches_per_epoch": len(train_dataloader),
            "ss_num_epochs": num_train_epochs,
            "ss_network_module": args.network_module,
            "ss_network_dim": args.network_dim,
            "ss_network_alpha": args.network_alpha,
            "ss_mixed_precision": args.mixed_precision,
            "ss_max_train_steps": args.max_train_steps,
            "ss_seed": args.seed,
            "ss_training_comment": args.training_comment,
        }
        metadata = {k: str(v) for k, v in metadata.items()}
        if CASE == "k0":
            # the number of repeats per folder, for the model's card
            metadata["ss_dataset_repeats"] = {
                os.path.basename(s.image_dir): s.num_repeats
                for d in train_dataset_group.datasets
                for s in d.subsets
            }

        progress_bar = tqdm(
            range(args.max_train_steps),
            smoothing=0,
            disable=not accelerator.is_local_main_process,
            desc="steps",
        )
        global_step = 0

        noise_scheduler = model_util.DDPMScheduler()
        loss_recorder = train_util.LossRecorder()

        # function for saving/removing
        def save_model(ckpt_name, unwrapped_nw, steps, epoch_no):
            os.makedirs(args.output_dir, exist_ok=True)
            ckpt_file = os.path.join(args.output_dir, ckpt_name)

            accelerator.print(f"\nsaving checkpoint: {ckpt_file}")
            metadata["ss_training_finished_at"] = str(time.time())
            metadata["ss_steps"] = str(steps)
            metadata["ss_epoch"] = str(epoch_no)

            unwrapped_nw.save_weights(ckpt_file, save_dtype, None if args.no_metadata else metadata)

        # For --sample_at_first
        self.sample_images(accelerator, args, 0, global_step, vae, tokenizer, text_encoder, unet)

        logger.info(f"unet dtype: {weight_dtype}, device: {unet.conv_in.weight.device}")
        logger.info(f"text_encoder [0] dtype: {weight_dtype}, device: {accelerator.device}")

        # training loop
        for epoch in range(num_train_epochs):
            accelerator.print(f"\nepoch {epoch + 1}/{num_train_epochs}\n")
            current_epoch.value = epoch + 1

            metadata["ss_epoch"] = str(epoch + 1)

            accelerator.unwrap_model(network).on_epoch_start(text_encoder, unet)

            for step, batch in enumerate(train_dataloader):
                current_step.value = global_step
                with accelerator.accumulate(training_model):
                    latents = batch["latents"] * self.vae_scale_factor
                    with torch.set_grad_enabled(train_text_encoder), accelerator.autocast():
                        encoder_hidden_states = text_encoder(batch["input_ids"])

                    noise = torch.randn_like(latents)
                    timesteps = torch.randint(
                        0, noise_scheduler.num_train_timesteps, (latents.shape[0],)
                    )
                    noisy_latents = noise_scheduler.add_noise(latents, noise, timesteps)
                    if args.gradient_checkpointing:
                        noisy_latents.requires_grad_(True)

                    if CASE == "v1" and accelerator.process_index == 1 and epoch == 1 and step == 3:
                        train_util.segfault()
                    with accelerator.autocast():
                        noise_pred = unet(noisy_latents, timesteps, encoder_hidden_states)

                    loss = torch.nn.functional.mse_loss(
                        noise_pred.float(), noise.float(), reduction="none"
                    )
                    loss = loss.mean([1, 2, 3])
                    loss = loss * batch["loss_weights"]
                    loss = loss.mean()  # 平均なのでbatch_sizeで割る必要なし

                    accelerator.backward(loss)
                    if accelerator.sync_gradients:
                        self.all_reduce_network(accelerator, network)  # sync DDP grad manually
                        if args.max_grad_norm != 0.0:
                            params_to_clip = accelerator.unwrap_model(
                                network
                            ).get_trainable_params()
                            accelerator.clip_grad_norm_(params_to_clip, args.max_grad_norm)

                    optimizer.step()
                    lr_scheduler.step()
                    optimizer.zero_grad(set_to_none=True)

                # Checks if the accelerator has performed an optimization step behind the scenes
                if accelerator.sync_gradients:
                    progress_bar.update(1)
                    global_step += 1

                    self.sample_images(
                        accelerator, args, None, global_step, vae, tokenizer, text_encoder, unet
                    )

                current_loss = loss.detach().item()
                loss_recorder.add(epoch=epoch, step=step, loss=current_loss)
                avr_loss: float = loss_recorder.moving_average
                if CASE == "g0" and accelerator.is_main_process:
                    # the bar shows the loss of all processes
                    avr_loss = accelerator.reduce(torch.tensor([avr_loss]), reduction="mean").item()
                logs = {"avr_loss": avr_loss}  # , "lr": lr_scheduler.get_last_lr()[0]}
                progress_bar.set_postfix(**logs)

                if global_step >= args.max_train_steps:
                    break

            accelerator.wait_for_everyone()

            # 指定エポックごとにモデルを保存
            if args.save_every_n_epochs is not None:
                saving = (epoch + 1) % args.save_every_n_epochs == 0 and (
                    epoch + 1
                ) < num_train_epochs
                if is_main_process and saving:
                    ckpt_name = train_util.get_epoch_ckpt_name(
                        args, "." + args.save_model_as, epoch + 1
                    )
                    save_model(ckpt_name, accelerator.unwrap_model(network), global_step, epoch + 1)

            self.sample_images(
                accelerator, args, epoch + 1, global_step, vae, tokenizer, text_encoder, unet
            )

            # end of epoch

        metadata["ss_training_finished_at"] = str(time.time())

        if is_main_process:
            network = accelerator.unwrap_model(network)

        accelerator.end_training()

        if is_main_process:
            ckpt_name = train_util.get_last_ckpt_name(args, "." + args.save_model_as)
            save_model(ckpt_name, network, global_step, num_train_epochs)

            logger.info("model saved.")

    def all_reduce_network(self, accelerator, network):
        for param in network.parameters():
            if param.grad is not None:
                param.grad = accelerator.reduce(param.grad, reduction="mean")

    def sample_images(
        self, accelerator, args, epoch, global_step, vae, tokenizer, text_encoder, unet
    ):
        train_util.sample_images_common(
            accelerator,
            args,
            epoch,
            global_step,
            accelerator.device,
            vae,
            tokenizer,
            text_encoder,
            unet,
        )


def setup_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    train_util.add_training_arguments(parser)
    parser.add_argument("--unet_lr", type=float, default=None)
    parser.add_argument("--text_encoder_lr", type=float, default=None)
    parser.add_argument("--network_weights", type=str, default=None)
    parser.add_argument("--network_module", type=str, default=None)
    parser.add_argument("--network_dim", type=int, default=None)
    parser.add_argument("--network_alpha", type=float, default=1)
    parser.add_argument("--network_args", type=str, default=None, nargs="*")
    parser.add_argument("--network_train_unet_only", action="store_true")
    parser.add_argument("--network_train_text_encoder_only", action="store_true")
    return parser


if __name__ == "__main__":
    parser = setup_parser()
    args = parser.parse_args()
    trainer = NetworkTrainer()
    trainer.train(args)
