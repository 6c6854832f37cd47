"""library/train_util.py of the hundred-and-ninth style (kohya-ss/sd-scripts re-created in plain
torch for the fixtures tests/fixtures/real/hundredninth-*; linked into each run's folder as
library/train_util.py). kohya's setup_logging (rich's RichHandler on stderr, '%(message)s' with
datefmt '%Y-%m-%d %H:%M:%S'), the DreamBooth dataset (image folders with a caption .txt beside each
image, read_caption and its 'illegal char in file (not UTF-8)', num_repeats, aspect-ratio buckets
from make_bucket_resolutions, 'bucket N: resolution (W, H), count: C'), new_cache_latents (each
process caches the images whose index modulo the number of processes is its own, to
<image>_<W>x<H>_sd.npz beside the image, after checking an existing file with np.load as
is_disk_cached_latents_expected does), the collator, the loss recorder, load_target_model (one
process after the other, 'loading model for process i/n', wait_for_everyone between them),
replace_unet_modules, sample_images_common (the prompts file split between the processes,
prompts[i::n], each process generating its share with a DDIM sampler and saving PNGs under
out/sample) and the part of accelerate's Accelerator and PartialState that kohya's scripts use
(accelerate is not installed): init_process_group on gloo with a 15 s timeout (kohya's
--ddp_timeout is in minutes; the captures need seconds), reduce, wait_for_everyone, prepare
(DistributedDataParallel around the network), autocast (bf16 on the CPU), print on the local main
process. Unlike accelerate's prepared DataLoader (even_batches), each process takes its own part
of every bucket (split_between_processes of the bucket's images, no padding, as SimpleTuner's
split_buckets_between_processes did) and batches it: a bucket whose images do not divide evenly
gives the processes different numbers of batches. A fault in the code is chosen by TQ_CASE (read
by train_network.py), never printed.
"""

# ruff: noqa: B904 (kohya's ImportError for a missing xformers keeps the original as context)
from __future__ import annotations

import contextlib
import ctypes
import datetime
import logging
import os
import random
import re
import struct
import sys
import threading
import time
import zlib

import numpy as np
import torch
import torch.distributed as dist
from library import model_util
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm


def setup_logging(args=None, log_level=None, reset=False):
    if logging.root.handlers:
        if reset:
            # remove all handlers
            for handler in logging.root.handlers[:]:
                logging.root.removeHandler(handler)
        else:
            return

    # log_level can be set by the caller or by the args, the caller has priority. If not set, use INFO
    if log_level is None and args is not None:
        log_level = args.console_log_level
    if log_level is None:
        log_level = "INFO"
    log_level = getattr(logging, log_level)

    msg_init = None
    if args is not None and args.console_log_file:
        handler = logging.FileHandler(args.console_log_file, mode="w")
    else:
        handler = None
        if not args or not args.console_log_simple:
            try:
                from rich.console import Console
                from rich.logging import RichHandler

                handler = RichHandler(console=Console(stderr=True))
            except ImportError:
                # print("rich is not installed, using basic logging")
                msg_init = "rich is not installed, using basic logging"

        if handler is None:
            handler = logging.StreamHandler(sys.stdout)  # same as print
            handler.propagate = False

    formatter = logging.Formatter(
        fmt="%(message)s",
        datefmt="%Y-%m-%d %H:%M:%S",
    )
    handler.setFormatter(formatter)
    logging.root.setLevel(log_level)
    logging.root.addHandler(handler)

    if msg_init is not None:
        logger = logging.getLogger(__name__)
        logger.info(msg_init)


setup_logging()
logger = logging.getLogger(__name__)

IMAGE_EXTENSIONS = [
    ".png",
    ".jpg",
    ".jpeg",
    ".webp",
    ".bmp",
    ".PNG",
    ".JPG",
    ".JPEG",
    ".WEBP",
    ".BMP",
]

# region accelerate (the part kohya's scripts use)


class PartialState:
    _shared: dict = {}

    def __init__(self, timeout: datetime.timedelta | None = None) -> None:
        self.__dict__ = self._shared
        if self._shared:
            return
        self.num_processes = int(os.environ.get("WORLD_SIZE", "1"))
        self.process_index = int(os.environ.get("RANK", "0"))
        self.local_process_index = int(os.environ.get("LOCAL_RANK", "0"))
        self.device = torch.device("cpu")
        if self.num_processes > 1 and not dist.is_initialized():
            dist.init_process_group(backend="gloo", timeout=timeout)

    @property
    def is_main_process(self) -> bool:
        return self.process_index == 0

    @property
    def is_local_main_process(self) -> bool:
        return self.local_process_index == 0

    @contextlib.contextmanager
    def split_between_processes(self, inputs: list):
        if self.num_processes == 1:
            yield inputs
            return
        n = len(inputs)
        per, extras = divmod(n, self.num_processes)
        start = self.process_index * per + min(self.process_index, extras)
        end = start + per + (1 if self.process_index < extras else 0)
        yield inputs[start:end]


class Accelerator:
    def __init__(self, gradient_accumulation_steps=1, mixed_precision=None, log_with=None,
                 project_dir=None, kwargs_handlers=None, dynamo_backend=None):  # fmt: skip
        timeout = datetime.timedelta(seconds=15)
        self.state = PartialState(timeout=timeout)
        if mixed_precision is None:
            mixed_precision = os.environ.get("ACCELERATE_MIXED_PRECISION", "no")
        self.mixed_precision = mixed_precision
        self.gradient_accumulation_steps = gradient_accumulation_steps
        self.sync_gradients = True
        self.trackers: list = []

    num_processes = property(lambda self: self.state.num_processes)
    process_index = property(lambda self: self.state.process_index)
    device = property(lambda self: self.state.device)
    is_main_process = property(lambda self: self.state.is_main_process)
    is_local_main_process = property(lambda self: self.state.is_local_main_process)

    def print(self, *args, **kwargs):
        if self.is_local_main_process:
            print(*args, **kwargs)

    def wait_for_everyone(self):
        if self.num_processes > 1:
            dist.barrier()

    def reduce(self, tensor, reduction="sum"):
        if self.num_processes == 1:
            return tensor
        cloned = tensor.clone()
        dist.all_reduce(cloned, op=dist.ReduceOp.SUM)
        if reduction == "mean":
            cloned /= self.num_processes
        return cloned

    def prepare(self, *objs):
        out = []
        for obj in objs:
            if isinstance(obj, torch.nn.Module) and self.num_processes > 1:
                obj = DistributedDataParallel(obj)
            out.append(obj)
        return out[0] if len(out) == 1 else tuple(out)

    def unwrap_model(self, model):
        return model.module if isinstance(model, DistributedDataParallel) else model

    def autocast(self):
        if self.mixed_precision == "bf16":
            return torch.autocast("cpu", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def accumulate(self, model):
        yield

    def backward(self, loss):
        loss.backward()

    def clip_grad_norm_(self, parameters, max_norm):
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm)

    def end_training(self):
        pass


def set_seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def prepare_accelerator(args) -> Accelerator:
    return Accelerator(
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        mixed_precision=args.mixed_precision,
        log_with=args.log_with,
        project_dir=args.logging_dir,
    )


def prepare_dtype(args):
    weight_dtype = torch.float32
    if args.mixed_precision == "fp16":
        weight_dtype = torch.float16
    elif args.mixed_precision == "bf16":
        weight_dtype = torch.bfloat16
    save_dtype = None
    if args.save_precision == "fp16":
        save_dtype = torch.float16
    elif args.save_precision == "float":
        save_dtype = torch.float32
    return weight_dtype, save_dtype


# endregion

# region images


def write_png(path: str, image: np.ndarray) -> None:
    """An 8-bit RGB PNG, every row with filter type 0."""
    h, w, _ = image.shape
    raw = b"".join(b"\x00" + image[y].astype(np.uint8).tobytes() for y in range(h))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n")
        f.write(chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)))
        f.write(chunk(b"IDAT", zlib.compress(raw, 6)))
        f.write(chunk(b"IEND", b""))


def png_size(path: str) -> tuple[int, int]:
    with open(path, "rb") as f:
        head = f.read(24)
    w, h = struct.unpack(">II", head[16:24])
    return w, h


def load_image(path: str) -> np.ndarray:
    with open(path, "rb") as f:
        data = f.read()
    pos, idat, w, h = 8, b"", 0, 0
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos : pos + 4])
        kind = data[pos + 4 : pos + 8]
        body = data[pos + 8 : pos + 8 + n]
        if kind == b"IHDR":
            w, h = struct.unpack(">II", body[:8])
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    rows = np.frombuffer(zlib.decompress(idat), dtype=np.uint8).reshape(h, 1 + 3 * w)
    return rows[:, 1:].reshape(h, w, 3)


def glob_images(directory: str) -> list[str]:
    return sorted(
        os.path.join(directory, name)
        for name in os.listdir(directory)
        if os.path.splitext(name)[1] in IMAGE_EXTENSIONS
    )


# endregion

# region dataset


class ImageInfo:
    def __init__(self, image_key, num_repeats, caption, is_reg, absolute_path):
        self.image_key = image_key
        self.num_repeats = num_repeats
        self.caption = caption
        self.is_reg = is_reg
        self.absolute_path = absolute_path
        self.image_size = None
        self.bucket_reso = None
        self.latents_npz = None


class DreamBoothSubset:
    def __init__(self, image_dir, num_repeats=1, class_tokens=None, caption_extension=".txt",
                 is_reg=False, shuffle_caption=False, keep_tokens=0, flip_aug=False):  # fmt: skip
        self.image_dir = image_dir
        self.num_repeats = num_repeats
        self.class_tokens = class_tokens
        self.caption_extension = caption_extension
        self.is_reg = is_reg
        self.shuffle_caption = shuffle_caption
        self.keep_tokens = keep_tokens
        self.flip_aug = flip_aug
        self.img_count = 0


class BucketManager:
    def __init__(self, max_reso, min_size, max_size, reso_steps) -> None:
        self.max_reso = max_reso
        self.min_size = min_size
        self.max_size = max_size
        self.reso_steps = reso_steps
        self.resos: list[tuple[int, int]] = []
        self.buckets: list[list[str]] = []

    def make_buckets(self):
        self.set_predefined_resos(
            model_util.make_bucket_resolutions(
                self.max_reso, self.min_size, self.max_size, self.reso_steps
            )
        )

    def set_predefined_resos(self, resos):
        self.resos = list(resos)
        self.buckets = [[] for _ in self.resos]

    def select_bucket(self, image_width, image_height):
        aspect_ratio = image_width / image_height
        ars = np.array([w / h for w, h in self.resos])
        errors = ars - aspect_ratio
        i = int(np.abs(errors).argmin())
        return self.resos[i], self.resos[i], float(errors[i])

    def add_image(self, reso, image_key):
        self.buckets[self.resos.index(reso)].append(image_key)


class DreamBoothDataset(torch.utils.data.Dataset):
    def __init__(self, subsets, batch_size, resolution, enable_bucket, min_bucket_reso,
                 max_bucket_reso, bucket_reso_steps, tokenizer, current_epoch) -> None:  # fmt: skip
        super().__init__()
        self.batch_size = batch_size
        self.width, self.height = resolution
        self.enable_bucket = enable_bucket
        self.min_bucket_reso = min_bucket_reso if enable_bucket else None
        self.max_bucket_reso = max_bucket_reso if enable_bucket else None
        self.bucket_reso_steps = bucket_reso_steps if enable_bucket else None
        self.bucket_no_upscale = False if enable_bucket else None
        self.tokenizer = tokenizer
        self.current_epoch_value = current_epoch
        self.subsets: list[DreamBoothSubset] = []
        self.image_data: dict[str, ImageInfo] = {}
        self.image_to_subset: dict[str, DreamBoothSubset] = {}
        self.num_train_images = 0
        self.num_reg_images = 0
        self.seed = 0
        self.hang_rank = -1

        def read_caption(img_path, caption_extension):
            base_name = os.path.splitext(img_path)[0]
            cap_paths = [base_name + caption_extension]
            caption = None
            for cap_path in cap_paths:
                if os.path.isfile(cap_path):
                    with open(cap_path, encoding="utf-8") as f:
                        try:
                            lines = f.readlines()
                        except UnicodeDecodeError as e:
                            logger.error(
                                f"illegal char in file (not UTF-8) / ファイルにUTF-8以外の文字があります: {cap_path}"
                            )
                            raise e
                        assert len(lines) > 0, (
                            f"caption file is empty / キャプションファイルが空です: {cap_path}"
                        )
                        caption = lines[0].strip()
                    break
            return caption

        def load_dreambooth_dir(subset: DreamBoothSubset):
            if not os.path.isdir(subset.image_dir):
                logger.warning(f"not directory: {subset.image_dir}")
                return [], []
            img_paths = glob_images(subset.image_dir)
            logger.info(f"found directory {subset.image_dir} contains {len(img_paths)} image files")
            captions = []
            for img_path in tqdm(img_paths, desc="read caption"):
                cap_for_img = read_caption(img_path, subset.caption_extension)
                if cap_for_img is None and subset.class_tokens is None:
                    logger.warning(
                        f"neither caption file nor class tokens are found. use empty caption for {img_path} / キャプションファイルもclass tokenも見つかりませんでした。空のキャプションを使用します: {img_path}"
                    )
                    captions.append("")
                else:
                    captions.append(cap_for_img if cap_for_img is not None else subset.class_tokens)
            return img_paths, captions

        logger.info("prepare images.")
        for subset in subsets:
            if subset.num_repeats < 1:
                logger.warning(
                    f"ignore subset with image_dir='{subset.image_dir}': num_repeats is less than 1 / num_repeatsが1を下回っているためサブセットを無視します: {subset.num_repeats}"
                )
                continue
            img_paths, captions = load_dreambooth_dir(subset)
            if len(img_paths) < 1:
                logger.warning(
                    f"ignore subset with image_dir='{subset.image_dir}': no images found / 画像が見つからないためサブセットを無視します"
                )
                continue
            if subset.is_reg:
                self.num_reg_images += subset.num_repeats * len(img_paths)
            else:
                self.num_train_images += subset.num_repeats * len(img_paths)
            for img_path, caption in zip(img_paths, captions, strict=True):
                info = ImageInfo(img_path, subset.num_repeats, caption, subset.is_reg, img_path)
                self.image_data[info.image_key] = info
                self.image_to_subset[info.image_key] = subset
            subset.img_count = len(img_paths)
            self.subsets.append(subset)

        logger.info(f"{self.num_train_images} train images with repeats.")
        logger.info(f"{self.num_reg_images} reg images with repeats.")
        if self.num_reg_images == 0:
            logger.warning("no regularization images / 正則化画像が見つかりませんでした")

    def set_seed(self, seed):
        self.seed = seed

    def make_buckets(self, num_processes: int = 1, process_index: int = 0):
        logger.info("loading image sizes.")
        for info in tqdm(self.image_data.values()):
            if info.image_size is None:
                info.image_size = png_size(info.absolute_path)
        if self.enable_bucket:
            logger.info("make buckets")
            self.bucket_manager = BucketManager(
                (self.width, self.height),
                self.min_bucket_reso,
                self.max_bucket_reso,
                self.bucket_reso_steps,
            )
            self.bucket_manager.make_buckets()
            img_ar_errors = []
            for info in self.image_data.values():
                info.bucket_reso, _, ar_error = self.bucket_manager.select_bucket(*info.image_size)
                img_ar_errors.append(abs(ar_error))
        else:
            logger.info("prepare dataset")
            self.bucket_manager = BucketManager((self.width, self.height), None, None, None)
            self.bucket_manager.set_predefined_resos([(self.width, self.height)])
            for info in self.image_data.values():
                info.bucket_reso, _, _ = self.bucket_manager.select_bucket(*info.image_size)

        for info in self.image_data.values():
            for _ in range(info.num_repeats):
                self.bucket_manager.add_image(info.bucket_reso, info.image_key)

        if self.enable_bucket:
            logger.info(
                "number of images (including repeats) / 各bucketの画像枚数（繰り返し回数を含む）"
            )
            for i, (reso, bucket) in enumerate(
                zip(self.bucket_manager.resos, self.bucket_manager.buckets, strict=True)
            ):
                if len(bucket) > 0:
                    logger.info(f"bucket {i}: resolution {reso}, count: {len(bucket)}")
            if len(img_ar_errors) == 0:
                mean_img_ar_error = 0  # avoid NaN
            else:
                mean_img_ar_error = np.mean(np.abs(np.array(img_ar_errors)))
            logger.info(f"mean ar error (without repeats): {mean_img_ar_error}")

        # this process's part of every bucket (split_between_processes, no padding)
        self.num_processes = num_processes
        self.process_index = process_index
        self._length = len(self.epoch_batches(0))

    def epoch_batches(self, epoch: int) -> list[list[str]]:
        rng = random.Random(self.seed + epoch)
        batches = []
        for bucket in self.bucket_manager.buckets:
            keys = list(bucket)
            rng.shuffle(keys)
            per, extras = divmod(len(keys), self.num_processes)
            start = self.process_index * per + min(self.process_index, extras)
            end = start + per + (1 if self.process_index < extras else 0)
            share = keys[start:end]
            batches += [
                share[i : i + self.batch_size] for i in range(0, len(share), self.batch_size)
            ]
        rng.shuffle(batches)
        return batches

    def __len__(self):
        return self._length

    def is_latent_cacheable(self):
        return True

    def new_cache_latents(self, vae, accelerator: Accelerator):
        logger.info("caching latents with caching strategy.")
        image_infos = list(self.image_data.values())
        image_infos.sort(key=lambda info: info.bucket_reso[0] * info.bucket_reso[1])
        num_processes = accelerator.num_processes
        process_index = accelerator.process_index
        logger.info("caching latents...")
        for i, info in enumerate(tqdm(image_infos)):
            info.latents_npz = (
                os.path.splitext(info.absolute_path)[0]
                + f"_{info.image_size[0]:04d}x{info.image_size[1]:04d}_sd.npz"
            )
            # if the modulo of num_processes is not equal to process_index, skip caching
            # this makes each process cache different latents
            if i % num_processes != process_index:
                continue
            if is_disk_cached_latents_expected(info.bucket_reso, info.latents_npz):
                continue
            image = load_image(info.absolute_path)
            w, h = info.bucket_reso
            if image.shape[:2] != (h, w):
                ys = np.arange(h) * image.shape[0] // h
                xs = np.arange(w) * image.shape[1] // w
                image = image[ys][:, xs]
            img = torch.from_numpy(image.astype(np.float32) / 127.5 - 1.0).permute(2, 0, 1)[None]
            with torch.no_grad():
                latents = vae.encode(img)[0]
            np.savez(
                info.latents_npz,
                latents=latents.float().numpy(),
                original_size=np.array(info.image_size),
                crop_ltrb=np.array([0, 0, w, h]),
            )

    def __getitem__(self, index):
        epoch = self.current_epoch_value.value
        if (
            self.process_index == self.hang_rank
            and epoch == 2
            and torch.utils.data.get_worker_info() is not None
        ):
            threading.Event().wait()  # the npz prefetch thread's signal never comes in the worker
        keys = self.epoch_batches(max(epoch - 1, 0))[index]
        latents, input_ids, captions = [], [], []
        for key in keys:
            info = self.image_data[key]
            npz = np.load(info.latents_npz)
            latents.append(torch.from_numpy(npz["latents"]))
            captions.append(info.caption)
            input_ids.append(self.tokenizer(info.caption))
        return {
            "latents": torch.stack(latents),
            "input_ids": torch.stack(input_ids),
            "captions": captions,
            "loss_weights": torch.ones(len(keys)),
        }


def is_disk_cached_latents_expected(bucket_reso, npz_path: str) -> bool:
    if not os.path.exists(npz_path):
        return False
    expected_latents_size = (bucket_reso[1] // 8, bucket_reso[0] // 8)
    try:
        npz = np.load(npz_path)
        if "latents" not in npz:
            return False
        if npz["latents"].shape[1:3] != expected_latents_size:
            return False
    except Exception as e:
        logger.error(f"Error loading file: {npz_path}")
        raise e
    return True


class DatasetGroup(torch.utils.data.ConcatDataset):
    def __init__(self, datasets):
        self.datasets = datasets
        super().__init__(datasets)
        self.num_train_images = sum(d.num_train_images for d in datasets)
        self.num_reg_images = sum(d.num_reg_images for d in datasets)
        self.image_data = {k: v for d in datasets for k, v in d.image_data.items()}

    def new_cache_latents(self, vae, accelerator):
        for i, dataset in enumerate(self.datasets):
            logger.info(f"[Dataset {i}]")
            dataset.new_cache_latents(vae, accelerator)

    def is_latent_cacheable(self):
        return all(d.is_latent_cacheable() for d in self.datasets)


class collator_class:
    def __init__(self, epoch, step, dataset):
        self.current_epoch = epoch
        self.current_step = step
        self.dataset = dataset  # not used if worker_info is not None, in case of multiprocessing

    def __call__(self, examples):
        return examples[0]


class LossRecorder:
    def __init__(self):
        self.loss_list: list[float] = []
        self.loss_total: float = 0.0

    def add(self, *, epoch: int, step: int, loss: float) -> None:
        if epoch == 0:
            self.loss_list.append(loss)
        else:
            while len(self.loss_list) <= step:
                self.loss_list.append(0.0)
            self.loss_total -= self.loss_list[step]
            self.loss_list[step] = loss
        self.loss_total += loss

    @property
    def moving_average(self) -> float:
        return self.loss_total / len(self.loss_list)


# endregion

# region models


def load_target_model(args, weight_dtype, accelerator, hoard_rank=-1):
    for pi in range(accelerator.state.num_processes):
        if pi == accelerator.state.local_process_index:
            logger.info(
                f"loading model for process {accelerator.state.local_process_index}/{accelerator.state.num_processes}"
            )
            logger.info(f"load StableDiffusion checkpoint: {args.pretrained_model_name_or_path}")
            if pi == hoard_rank:
                # the checkpoint is kept whole in memory once more per conversion step
                held = []
                for _ in range(4):
                    held.append(np.ones(64 << 20, dtype=np.uint8))
                    time.sleep(0.5)
                os.kill(os.getpid(), 9)  # what the kernel's OOM killer does
            text_encoder, vae, unet = model_util.load_models_from_stable_diffusion_checkpoint(
                args.pretrained_model_name_or_path
            )
        accelerator.wait_for_everyone()
    return text_encoder, vae, unet


def replace_unet_modules(unet, mem_eff_attn, xformers, sdpa):
    if mem_eff_attn:
        logger.info("Enable memory efficient attention for U-Net")
    elif xformers:
        logger.info("Enable xformers for U-Net")
        try:
            import xformers.ops
        except ImportError:
            raise ImportError("No xformers / xformersがインストールされていないようです")
    elif sdpa:
        logger.info("Enable SDPA for U-Net")
        unet.set_use_sdpa(True)


def get_epoch_ckpt_name(args, ext: str, epoch_no: int):
    model_name = args.output_name if args.output_name is not None else "epoch"
    return f"{model_name}-{epoch_no:06d}{ext}"


def get_last_ckpt_name(args, ext: str):
    model_name = args.output_name if args.output_name is not None else "last"
    return model_name + ext


def segfault():
    ctypes.string_at(0)  # the fused attention kernel reads address 0


# endregion

# region sample images


def line_to_prompt_dict(line: str) -> dict:
    # subset of gen_img_diffusers
    prompt_args = line.split(" --")
    prompt_dict = {"prompt": prompt_args[0]}
    for parg in prompt_args:
        try:
            m = re.match(r"w (\d+)", parg, re.IGNORECASE)
            if m:
                prompt_dict["width"] = int(m.group(1))
                continue
            m = re.match(r"h (\d+)", parg, re.IGNORECASE)
            if m:
                prompt_dict["height"] = int(m.group(1))
                continue
            m = re.match(r"d (\d+)", parg, re.IGNORECASE)
            if m:
                prompt_dict["seed"] = int(m.group(1))
                continue
            m = re.match(r"s (\d+)", parg, re.IGNORECASE)
            if m:  # steps
                prompt_dict["sample_steps"] = max(1, min(1000, int(m.group(1))))
                continue
            m = re.match(r"l ([\d\.]+)", parg, re.IGNORECASE)
            if m:  # scale
                prompt_dict["scale"] = float(m.group(1))
                continue
            m = re.match(r"n (.+)", parg, re.IGNORECASE)
            if m:  # negative prompt
                prompt_dict["negative_prompt"] = m.group(1)
                continue
            m = re.match(r"ss (.+)", parg, re.IGNORECASE)
            if m:
                prompt_dict["sample_sampler"] = m.group(1)
                continue
        except ValueError as ex:
            logger.error(f"Exception in parsing / 解析エラー: {parg}")
            logger.error(ex)
    return prompt_dict


class StableDiffusionLongPromptWeightingPipeline:
    def __init__(self, text_encoder, vae, unet, tokenizer, scheduler):
        self.text_encoder = text_encoder
        self.vae = vae
        self.unet = unet
        self.tokenizer = tokenizer
        self.scheduler = scheduler

    def progress_bar(self, total):
        return tqdm(total=total)

    def __call__(self, prompt, height, width, num_inference_steps, guidance_scale, negative_prompt):
        ids = torch.stack([self.tokenizer(negative_prompt or ""), self.tokenizer(prompt)])
        context = self.text_encoder(ids)
        latents = torch.randn(1, 4, height // 8, width // 8)
        ac = self.scheduler.alphas_cumprod
        timesteps = torch.linspace(999, 0, num_inference_steps).long()
        with self.progress_bar(total=num_inference_steps) as bar:
            for k, t in enumerate(timesteps):
                eps_u, eps_c = self.unet(torch.cat([latents, latents]), t.repeat(2), context).chunk(
                    2
                )
                eps = eps_u + guidance_scale * (eps_c - eps_u)
                a_t = ac[t]
                a_prev = ac[timesteps[k + 1]] if k + 1 < len(timesteps) else torch.tensor(1.0)
                x0 = (latents - (1 - a_t).sqrt() * eps) / a_t.sqrt()
                latents = a_prev.sqrt() * x0 + (1 - a_prev).sqrt() * eps
                bar.update(1)
        return latents.float()

    def latents_to_image(self, latents):
        image = self.vae.decode(latents / model_util.VAE_SCALE_FACTOR)
        image = ((image.clamp(-1, 1) + 1) * 127.5).round().byte()
        return [image[0].permute(1, 2, 0).numpy()]


def sample_images_common(
    accelerator, args, epoch, steps, device, vae, tokenizer, text_encoder, unet_wrapped
):
    if steps == 0:
        if not args.sample_at_first:
            return
    else:
        if args.sample_every_n_steps is None and args.sample_every_n_epochs is None:
            return
        if args.sample_every_n_epochs is not None:
            # sample_every_n_steps は無視する
            if epoch is None or epoch % args.sample_every_n_epochs != 0:
                return
        else:
            if (
                steps % args.sample_every_n_steps != 0 or epoch is not None
            ):  # steps is not divisible or end of epoch
                return

    logger.info("")
    logger.info(f"generating sample images at step / サンプル画像生成 ステップ: {steps}")
    if not os.path.isfile(args.sample_prompts):
        logger.error(f"No prompt file / プロンプトファイルがありません: {args.sample_prompts}")
        return

    distributed_state = (
        PartialState()
    )  # for multi gpu distributed inference. this is a singleton, so it's safe to use it here

    unet = accelerator.unwrap_model(unet_wrapped)
    text_encoder = accelerator.unwrap_model(text_encoder)

    with open(args.sample_prompts, encoding="utf-8") as f:
        lines = f.readlines()
    prompts = [line.strip() for line in lines if len(line.strip()) > 0 and line[0] != "#"]

    pipeline = StableDiffusionLongPromptWeightingPipeline(
        text_encoder=text_encoder,
        vae=vae,
        unet=unet,
        tokenizer=tokenizer,
        scheduler=model_util.DDPMScheduler(),
    )
    save_dir = args.output_dir + "/sample"
    os.makedirs(save_dir, exist_ok=True)

    for i in range(len(prompts)):
        prompt_dict = line_to_prompt_dict(prompts[i])
        prompt_dict["enum"] = i
        prompts[i] = prompt_dict

    # save random state to restore later
    rng_state = torch.get_rng_state()

    if distributed_state.num_processes <= 1:
        with torch.no_grad():
            for prompt_dict in prompts:
                sample_image_inference(
                    accelerator, args, pipeline, save_dir, prompt_dict, epoch, steps
                )
    else:
        # Creating list with N elements, where each element is a list of prompt_dicts, and N is the number of processes available (number of devices available)
        # prompt_dicts are assigned to lists based on order of processes, to attempt to time the image creation time to match enum order. Probably only works when steps and sampler are identical.
        per_process_prompts = []  # list of lists
        for i in range(distributed_state.num_processes):
            per_process_prompts.append(prompts[i :: distributed_state.num_processes])

        with (
            torch.no_grad(),
            distributed_state.split_between_processes(per_process_prompts) as prompt_dict_lists,
        ):
            for prompt_dict in prompt_dict_lists[0]:
                sample_image_inference(
                    accelerator, args, pipeline, save_dir, prompt_dict, epoch, steps
                )

    del pipeline
    torch.set_rng_state(rng_state)


def sample_image_inference(accelerator, args, pipeline, save_dir, prompt_dict, epoch, steps):
    negative_prompt = prompt_dict.get("negative_prompt")
    sample_steps = prompt_dict.get("sample_steps", 30)
    width = prompt_dict.get("width", 512)
    height = prompt_dict.get("height", 512)
    scale = prompt_dict.get("scale", 7.5)
    seed = prompt_dict.get("seed")
    prompt: str = prompt_dict.get("prompt", "")
    sampler_name: str = prompt_dict.get("sample_sampler", args.sample_sampler)

    if seed is not None:
        torch.manual_seed(seed)
    else:
        # True random sample image generation
        torch.seed()

    height = max(64, height - height % 8)  # round to divisible by 8
    width = max(64, width - width % 8)  # round to divisible by 8
    logger.info(f"prompt: {prompt}")
    logger.info(f"negative_prompt: {negative_prompt}")
    logger.info(f"height: {height}")
    logger.info(f"width: {width}")
    logger.info(f"sample_steps: {sample_steps}")
    logger.info(f"scale: {scale}")
    logger.info(f"sample_sampler: {sampler_name}")
    if seed is not None:
        logger.info(f"seed: {seed}")
    with accelerator.autocast(), torch.no_grad():
        latents = pipeline(
            prompt=prompt,
            height=height,
            width=width,
            num_inference_steps=sample_steps,
            guidance_scale=scale,
            negative_prompt=negative_prompt,
        )
    image = pipeline.latents_to_image(latents)[0]

    ts_str = time.strftime("%Y%m%d%H%M%S", time.localtime())
    num_suffix = f"e{epoch:06d}" if epoch is not None else f"{steps:06d}"
    seed_suffix = "" if seed is None else f"_{seed}"
    i: int = prompt_dict["enum"]
    img_filename = f"{'' if args.output_name is None else args.output_name + '_'}{num_suffix}_{i:02d}_{ts_str}{seed_suffix}.png"
    write_png(os.path.join(save_dir, img_filename), image)


# endregion

# region arguments


def add_training_arguments(parser):
    parser.add_argument("--console_log_level", type=str, default=None)
    parser.add_argument("--console_log_file", type=str, default=None)
    parser.add_argument("--console_log_simple", action="store_true")
    parser.add_argument("--pretrained_model_name_or_path", type=str, default=None)
    parser.add_argument("--dataset_config", type=str, default=None)
    parser.add_argument("--train_data_dir", type=str, default=None)
    parser.add_argument("--reg_data_dir", type=str, default=None)
    parser.add_argument("--in_json", type=str, default=None)
    parser.add_argument("--resolution", type=str, default=None)
    parser.add_argument("--enable_bucket", action="store_true")
    parser.add_argument("--min_bucket_reso", type=int, default=256)
    parser.add_argument("--max_bucket_reso", type=int, default=1024)
    parser.add_argument("--bucket_reso_steps", type=int, default=64)
    parser.add_argument("--train_batch_size", type=int, default=1)
    parser.add_argument("--caption_extension", type=str, default=".caption")
    parser.add_argument("--output_dir", type=str, default=None)
    parser.add_argument("--output_name", type=str, default=None)
    parser.add_argument("--save_model_as", type=str, default="safetensors")
    parser.add_argument(
        "--save_precision", type=str, default=None, choices=[None, "float", "fp16", "bf16"]
    )
    parser.add_argument("--save_every_n_epochs", type=int, default=None)
    parser.add_argument("--max_train_steps", type=int, default=1600)
    parser.add_argument("--max_train_epochs", type=int, default=None)
    parser.add_argument("--max_data_loader_n_workers", type=int, default=8)
    parser.add_argument("--persistent_data_loader_workers", action="store_true")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--gradient_checkpointing", action="store_true")
    parser.add_argument("--gradient_accumulation_steps", type=int, default=1)
    parser.add_argument("--mixed_precision", type=str, default="no", choices=["no", "fp16", "bf16"])
    parser.add_argument("--mem_eff_attn", action="store_true")
    parser.add_argument("--xformers", action="store_true")
    parser.add_argument("--sdpa", action="store_true")
    parser.add_argument("--cache_latents", action="store_true")
    parser.add_argument("--cache_latents_to_disk", action="store_true")
    parser.add_argument("--learning_rate", type=float, default=2.0e-6)
    parser.add_argument("--optimizer_type", type=str, default="")
    parser.add_argument("--max_grad_norm", type=float, default=1.0)
    parser.add_argument("--lr_scheduler", type=str, default="constant")
    parser.add_argument("--logging_dir", type=str, default=None)
    parser.add_argument("--log_with", type=str, default=None)
    parser.add_argument("--sample_every_n_steps", type=int, default=None)
    parser.add_argument("--sample_at_first", action="store_true")
    parser.add_argument("--sample_every_n_epochs", type=int, default=None)
    parser.add_argument("--sample_prompts", type=str, default=None)
    parser.add_argument("--sample_sampler", type=str, default="ddim")
    parser.add_argument("--ddp_timeout", type=int, default=None)
    parser.add_argument("--no_metadata", action="store_true")
    parser.add_argument("--training_comment", type=str, default=None)


# endregion
