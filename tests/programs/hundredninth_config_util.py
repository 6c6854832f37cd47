"""library/config_util.py of the hundred-and-ninth style (kohya-ss/sd-scripts re-created in plain
torch for the fixtures tests/fixtures/real/hundredninth-*; linked into each run's folder as
library/config_util.py): the dataset config (a TOML file with [general], [[datasets]] and
[[datasets.subsets]], or the DreamBooth folders '<repeats>_<class tokens>' under --train_data_dir,
with kohya's 'ignore directory without repeats'), the '[Dataset 0]' description block, and the
dataset group whose buckets are made before training.
"""

from __future__ import annotations

import logging
import random
import tomllib
from pathlib import Path
from textwrap import dedent, indent

from library import train_util

logger = logging.getLogger(__name__)


def load_user_config(file: str) -> dict:
    with open(file, "rb") as f:
        return tomllib.load(f)


def generate_dreambooth_subsets_config_by_subdirs(train_data_dir=None, reg_data_dir=None):
    def extract_dreambooth_params(name: str) -> tuple[int, str]:
        tokens = name.split("_")
        try:
            n_repeats = int(tokens[0])
        except ValueError:
            logger.warning(
                f"ignore directory without repeats / 繰り返し回数のないディレクトリを無視します: {name}"
            )
            return 0, ""
        caption_by_folder = "_".join(tokens[1:])
        return n_repeats, caption_by_folder

    def generate(base_dir, is_reg: bool):
        if base_dir is None:
            return []
        base_dir = Path(base_dir)
        if not base_dir.is_dir():
            return []
        subsets_config = []
        for subdir in sorted(base_dir.iterdir()):
            if not subdir.is_dir():
                continue
            num_repeats, class_tokens = extract_dreambooth_params(subdir.name)
            if num_repeats < 1:
                continue
            subsets_config.append(
                {
                    "image_dir": str(subdir),
                    "num_repeats": num_repeats,
                    "is_reg": is_reg,
                    "class_tokens": class_tokens,
                }
            )
        return subsets_config

    return generate(train_data_dir, False) + generate(reg_data_dir, True)


def _resolution(value) -> tuple[int, int]:
    if isinstance(value, int):
        return value, value
    if isinstance(value, str):
        parts = [int(v) for v in value.split(",")]
        return (parts[0], parts[-1])
    return tuple(value)


def generate_dataset_group(user_config: dict, args, tokenizer, current_epoch, accelerator_state):
    general = user_config.get("general", {})
    datasets = []
    for ds in user_config.get("datasets", []):
        params = {**general, **{k: v for k, v in ds.items() if k != "subsets"}}
        subsets = []
        for sub in ds.get("subsets", []):
            merged = {**params, **sub}
            subsets.append(
                train_util.DreamBoothSubset(
                    image_dir=merged["image_dir"],
                    num_repeats=merged.get("num_repeats", 1),
                    class_tokens=merged.get("class_tokens"),
                    caption_extension=merged.get("caption_extension", args.caption_extension),
                    is_reg=merged.get("is_reg", False),
                    shuffle_caption=merged.get("shuffle_caption", False),
                    keep_tokens=merged.get("keep_tokens", 0),
                    flip_aug=merged.get("flip_aug", False),
                )
            )
        datasets.append(
            train_util.DreamBoothDataset(
                subsets,
                batch_size=params.get("batch_size", args.train_batch_size),
                resolution=_resolution(params.get("resolution", args.resolution or 512)),
                enable_bucket=params.get("enable_bucket", args.enable_bucket),
                min_bucket_reso=params.get("min_bucket_reso", args.min_bucket_reso),
                max_bucket_reso=params.get("max_bucket_reso", args.max_bucket_reso),
                bucket_reso_steps=params.get("bucket_reso_steps", args.bucket_reso_steps),
                tokenizer=tokenizer,
                current_epoch=current_epoch,
            )
        )

    info = ""
    for i, dataset in enumerate(datasets):
        info += dedent(f"""\
            [Dataset {i}]
              batch_size: {dataset.batch_size}
              resolution: {(dataset.width, dataset.height)}
              enable_bucket: {dataset.enable_bucket}
        """)
        if dataset.enable_bucket:
            info += indent(
                dedent(f"""\
              min_bucket_reso: {dataset.min_bucket_reso}
              max_bucket_reso: {dataset.max_bucket_reso}
              bucket_reso_steps: {dataset.bucket_reso_steps}
              bucket_no_upscale: {dataset.bucket_no_upscale}
            \n"""),
                "  ",
            )
        else:
            info += "\n"
        for j, subset in enumerate(dataset.subsets):
            info += indent(
                dedent(f"""\
              [Subset {j} of Dataset {i}]
                image_dir: "{subset.image_dir}"
                image_count: {subset.img_count}
                num_repeats: {subset.num_repeats}
                shuffle_caption: {subset.shuffle_caption}
                keep_tokens: {subset.keep_tokens}
                flip_aug: {subset.flip_aug}
                is_reg: {subset.is_reg}
                class_tokens: {subset.class_tokens}
                caption_extension: {subset.caption_extension}
            \n"""),
                "  ",
            )
    logger.info(info)

    # make buckets first because it determines the length of dataset
    # and set the same seed for all datasets
    seed = random.randint(0, 2**31)  # actual seed is seed + epoch_no
    for i, dataset in enumerate(datasets):
        logger.info(f"[Prepare dataset {i}]")
        dataset.set_seed(seed)
        dataset.make_buckets(accelerator_state.num_processes, accelerator_state.process_index)
    return train_util.DatasetGroup(datasets)
