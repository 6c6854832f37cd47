"""A ninety-fifth training-program style for the generalisation fixtures
(tests/fixtures/real/ninetyfifth-*): 3-D point-cloud object detection in the way of OpenPCDet's
tools/train.py, re-implemented in plain torch in one file (pcdet, spconv, SharedArray,
tensorboardX and easydict are not installed). Run from the repo's tools/ folder as OpenPCDet
is: `torchrun --nproc_per_node N train.py --launcher pytorch --cfg_file
cfgs/kitti_models/tiny_pointpillar.yaml --tcp_port P --batch_size 4 --epochs 3` (or the repo's
scripts/dist_train.sh). A yaml config with a _BASE_CONFIG_ (cfgs/dataset_configs/
kitti_dataset.yaml) read into an EasyDict and dumped line by line into the log
('cfg.DATA_CONFIG.POINT_CLOUD_RANGE: [0, -40, -3, 70.4, 40, 1]'); OpenPCDet's logger
('%(asctime)s  %(levelname)5s  %(message)s', INFO on rank 0, ERROR on the others, to the
console and rank 0's output/.../log_train_*.txt); init_dist_pytorch (env://, gloo on CPU, 15 s
collective timeout; --tcp_port is no longer used by it); a KITTI-layout data set
(../data/kitti/training/velodyne/000123.bin float32 N x 4, label_2/000123.txt, calib/,
ImageSets/) with the infos (kitti_infos_train.pkl, kitti_infos_val.pkl) and the GT database
(kitti_dbinfos_train.pkl, gt_database/000123_Car_0.bin) that create_kitti_infos makes, all
written by `train.py --prepare` (synthetic scenes: a ground plane and a few cars); gt sampling,
flip, rotation and scaling augmentation, range cropping and voxelisation into pillars in the
DataLoader workers; a tiny PointPillars (PillarVFE, PointPillarScatter to a BEV grid,
BaseBEVBackbone, AnchorHeadSingle with an axis-aligned target assigner) in
DistributedDataParallel; adam_onecycle; train_one_epoch's three average_reduce_value
all_gathers per iteration, rank 0's tqdm 'epochs' bar (every rank draws one) and its logger
records every --logger_iter_interval iterations (or the tqdm 'train' bar with
--use_tqdm_to_record); rank 0 saves ckpt/checkpoint_epoch_N.pth, an existing checkpoint is
resumed; after training every checkpoint is evaluated (repeat_eval_ckpt, eval_one_epoch,
merge_results_dist, a KITTI-like BEV/3-D AP on rank 0). A fault in the code is chosen by the
TQ_CASE environment variable (a letter and a rank) and never printed (re-capture with
tests/fixtures/real/capture_ninetyfifth.sh after any edit).
"""

from __future__ import annotations

import argparse
import copy
import ctypes
import datetime
import glob
import logging
import os
import pickle
import shutil
import signal
import sys
import threading
import time
from ast import literal_eval
from functools import partial
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import tqdm
import yaml
from torch import nn
from torch.nn import functional as F
from torch.nn.utils import clip_grad_norm_
from torch.utils.data import DataLoader, Dataset
from torch.utils.data import DistributedSampler as _DistributedSampler


def fault() -> tuple[str, int]:
    """(letter, rank) of the fault in the code, from TQ_CASE ("", -1 where none)."""
    case = os.environ.get("TQ_CASE", "")
    if not case:
        return "", -1
    return case[0], int(case[1:] or 0)


# ----------------------------------------------------------------------------- config
class EasyDict(dict):
    """easydict.EasyDict: a dict whose keys are attributes, nested dicts converted."""

    def __init__(self, d=None, **kwargs):
        super().__init__()
        for k, v in dict(d or {}, **kwargs).items():
            self[k] = v

    def __setitem__(self, key, value):
        if isinstance(value, dict) and not isinstance(value, EasyDict):
            value = EasyDict(value)
        elif isinstance(value, list | tuple):
            value = type(value)(
                EasyDict(x) if isinstance(x, dict) and not isinstance(x, EasyDict) else x
                for x in value
            )
        super().__setitem__(key, value)

    __setattr__ = __setitem__

    def __getattr__(self, key):
        try:
            return self[key]
        except KeyError:
            raise AttributeError(key) from None

    def update(self, other=None, **kwargs):
        for k, v in dict(other or {}, **kwargs).items():
            self[k] = v


ROOT_DIR = Path(os.path.abspath(__file__)).parent.parent
cfg = EasyDict()
cfg.ROOT_DIR = ROOT_DIR
cfg.LOCAL_RANK = 0


def merge_new_config(config, new_config):
    if "_BASE_CONFIG_" in new_config:
        with open(new_config["_BASE_CONFIG_"]) as f:
            config.update(EasyDict(yaml.safe_load(f)))
    for key, val in new_config.items():
        if not isinstance(val, dict):
            config[key] = val
            continue
        if key not in config:
            config[key] = EasyDict()
        merge_new_config(config[key], val)
    return config


def cfg_from_yaml_file(cfg_file, config):
    with open(cfg_file) as f:
        merge_new_config(config=config, new_config=yaml.safe_load(f))
    return config


def cfg_from_list(cfg_list, config):
    assert len(cfg_list) % 2 == 0
    for k, v in zip(cfg_list[0::2], cfg_list[1::2], strict=True):
        key_list = k.split(".")
        d = config
        for subkey in key_list[:-1]:
            assert subkey in d, f"NotFoundKey: {subkey}"
            d = d[subkey]
        try:
            value = literal_eval(v)
        except (ValueError, SyntaxError):
            value = v
        d[key_list[-1]] = value


def log_config_to_file(config, pre="cfg", logger=None):
    for key, val in config.items():
        if isinstance(config[key], EasyDict):
            logger.info(f"----------- {key} -----------")
            log_config_to_file(config[key], pre=pre + "." + key, logger=logger)
            continue
        logger.info(f"{pre}.{key}: {val}")


# ----------------------------------------------------------------------------- common utils
def create_logger(log_file=None, rank=0, log_level=logging.INFO):
    logger = logging.getLogger(__name__)
    logger.setLevel(log_level if rank == 0 else "ERROR")
    formatter = logging.Formatter("%(asctime)s  %(levelname)5s  %(message)s")
    console = logging.StreamHandler()
    console.setLevel(log_level if rank == 0 else "ERROR")
    console.setFormatter(formatter)
    logger.addHandler(console)
    if log_file is not None:
        file_handler = logging.FileHandler(filename=log_file)
        file_handler.setLevel(log_level if rank == 0 else "ERROR")
        file_handler.setFormatter(formatter)
        logger.addHandler(file_handler)
    return logger


def init_dist_pytorch(tcp_port, local_rank, backend="gloo"):
    # num_gpus is torch.cuda.device_count() on a GPU node: the processes of this node
    num_gpus = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    dist.init_process_group(backend=backend, timeout=datetime.timedelta(seconds=15))
    return num_gpus, dist.get_rank()


def get_dist_info():
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def set_random_seed(seed):
    np.random.seed(seed)
    torch.manual_seed(seed)


def worker_init_fn(worker_id, seed=666):
    if seed is not None:
        np.random.seed(seed + worker_id)
        torch.manual_seed(seed + worker_id)


def all_gather(data):
    """pcdet.utils.commu_utils.all_gather: any picklable object, through byte tensors."""
    _, world_size = get_dist_info()
    if world_size == 1:
        return [data]
    buffer = pickle.dumps(data)
    tensor = torch.ByteTensor(torch.ByteStorage.from_buffer(buffer))
    local_size = torch.LongTensor([tensor.numel()])
    size_list = [torch.LongTensor([0]) for _ in range(world_size)]
    dist.all_gather(size_list, local_size)
    size_list = [int(size.item()) for size in size_list]
    max_size = max(size_list)
    tensor_list = [torch.ByteTensor(size=(max_size,)) for _ in size_list]
    if local_size != max_size:
        tensor = torch.cat((tensor, torch.ByteTensor(size=(max_size - local_size,))), dim=0)
    dist.all_gather(tensor_list, tensor)
    return [
        pickle.loads(t.numpy().tobytes()[:size])
        for size, t in zip(size_list, tensor_list, strict=True)
    ]


def average_reduce_value(data):
    data_list = all_gather(data)
    return sum(data_list) / len(data_list)


def merge_results_dist(result_part, size, tmpdir):
    rank, world_size = get_dist_info()
    os.makedirs(tmpdir, exist_ok=True)
    dist.barrier()
    with open(os.path.join(tmpdir, f"result_part_{rank}.pkl"), "wb") as f:
        pickle.dump(result_part, f)
    dist.barrier()
    if rank != 0:
        return None
    part_list = []
    for i in range(world_size):
        with open(os.path.join(tmpdir, f"result_part_{i}.pkl"), "rb") as f:
            part_list.append(pickle.load(f))
    ordered_results = []
    for res in zip(*part_list, strict=False):
        ordered_results.extend(list(res))
    ordered_results = ordered_results[:size]
    shutil.rmtree(tmpdir)
    return ordered_results


def sa_create(name, var):
    """SharedArray.create: an array in /dev/shm under NAME."""
    x = np.lib.format.open_memmap(
        "/dev/shm/" + name.replace("shm://", ""), mode="w+", dtype=var.dtype, shape=var.shape
    )
    x[...] = var[...]
    x.flush()
    return x


def sa_attach(name):
    return np.load("/dev/shm/" + name.replace("shm://", ""), mmap_mode="r")


def limit_period(val, offset=0.5, period=np.pi):
    return val - torch.floor(val / period + offset) * period


class AverageMeter:
    def __init__(self):
        self.val = self.avg = self.sum = 0.0
        self.count = 0

    def update(self, val, n=1):
        self.val = val
        self.sum += val * n
        self.count += n
        self.avg = self.sum / self.count


class SummaryWriter:
    """tensorboardX.SummaryWriter's add_scalar, kept as JSON lines (no tensorboardX here)."""

    def __init__(self, log_dir):
        os.makedirs(log_dir, exist_ok=True)
        self.path = os.path.join(log_dir, "scalars.jsonl")

    def add_scalar(self, tag, value, step):
        with open(self.path, "a") as f:
            f.write(f'{{"tag": "{tag}", "value": {float(value)}, "step": {int(step)}}}\n')


# ----------------------------------------------------------------------------- boxes
def rotate_points_along_z(points, angle):
    """points (N, 3+C) numpy, angle a float."""
    c, s = np.cos(angle), np.sin(angle)
    rot = np.array([[c, s, 0], [-s, c, 0], [0, 0, 1]], dtype=points.dtype)
    out = points.copy()
    out[:, :3] = points[:, :3] @ rot
    return out


def nearest_bev(boxes):
    """Axis-aligned BEV boxes (x1, y1, x2, y2) of (N, 7) boxes turned to the nearest axis."""
    rot = limit_period(boxes[:, 6], offset=0.5, period=np.pi).abs()
    choose = rot > np.pi / 4
    dims = torch.where(choose[:, None], boxes[:, [4, 3]], boxes[:, [3, 4]])
    return torch.cat([boxes[:, :2] - dims / 2, boxes[:, :2] + dims / 2], dim=1)


def boxes_iou_normal(a, b):
    x1 = torch.max(a[:, None, 0], b[None, :, 0])
    y1 = torch.max(a[:, None, 1], b[None, :, 1])
    x2 = torch.min(a[:, None, 2], b[None, :, 2])
    y2 = torch.min(a[:, None, 3], b[None, :, 3])
    inter = (x2 - x1).clamp(min=0) * (y2 - y1).clamp(min=0)
    area_a = (a[:, 2] - a[:, 0]) * (a[:, 3] - a[:, 1])
    area_b = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    return inter / (area_a[:, None] + area_b[None, :] - inter).clamp(min=1e-6)


def boxes3d_nearest_bev_iou(boxes_a, boxes_b):
    return boxes_iou_normal(nearest_bev(boxes_a), nearest_bev(boxes_b))


def boxes_bev_iou_cpu(boxes_a, boxes_b):
    """iou3d_nms_utils.boxes_bev_iou_cpu (numpy in, numpy out)."""
    if len(boxes_a) == 0 or len(boxes_b) == 0:
        return np.zeros((len(boxes_a), len(boxes_b)), dtype=np.float32)
    return boxes3d_nearest_bev_iou(torch.from_numpy(boxes_a), torch.from_numpy(boxes_b)).numpy()


def boxes_iou3d_nearest(boxes_a, boxes_b):
    bev = boxes_iou_normal(nearest_bev(boxes_a), nearest_bev(boxes_b))
    za1, za2 = boxes_a[:, 2] - boxes_a[:, 5] / 2, boxes_a[:, 2] + boxes_a[:, 5] / 2
    zb1, zb2 = boxes_b[:, 2] - boxes_b[:, 5] / 2, boxes_b[:, 2] + boxes_b[:, 5] / 2
    zi = (torch.min(za2[:, None], zb2[None]) - torch.max(za1[:, None], zb1[None])).clamp(min=0)
    zu = torch.max(za2[:, None], zb2[None]) - torch.min(za1[:, None], zb1[None])
    return bev * zi / zu.clamp(min=1e-6)


def points_in_boxes_mask(points, boxes):
    """(M, N) mask of the points inside each (rotated) box."""
    if len(boxes) == 0:
        return np.zeros((0, len(points)), dtype=bool)
    local = points[None, :, :3] - boxes[:, None, :3]
    c, s = np.cos(-boxes[:, 6])[:, None], np.sin(-boxes[:, 6])[:, None]
    lx = local[..., 0] * c - local[..., 1] * s
    ly = local[..., 0] * s + local[..., 1] * c
    return (
        (np.abs(lx) <= boxes[:, 3:4] / 2)
        & (np.abs(ly) <= boxes[:, 4:5] / 2)
        & (np.abs(local[..., 2]) <= boxes[:, 5:6] / 2)
    )


class ResidualCoder:
    code_size = 7

    def encode_torch(self, boxes, anchors):
        xa, ya, za, dxa, dya, dza, ra = torch.split(anchors, 1, dim=-1)
        xg, yg, zg, dxg, dyg, dzg, rg = torch.split(boxes, 1, dim=-1)
        diagonal = torch.sqrt(dxa**2 + dya**2)
        return torch.cat(
            [
                (xg - xa) / diagonal,
                (yg - ya) / diagonal,
                (zg - za) / dza,
                torch.log(dxg.clamp(min=1e-5) / dxa),
                torch.log(dyg.clamp(min=1e-5) / dya),
                torch.log(dzg.clamp(min=1e-5) / dza),
                rg - ra,
            ],
            dim=-1,
        )

    def decode_torch(self, box_encodings, anchors):
        xa, ya, za, dxa, dya, dza, ra = torch.split(anchors, 1, dim=-1)
        xt, yt, zt, dxt, dyt, dzt, rt = torch.split(box_encodings, 1, dim=-1)
        diagonal = torch.sqrt(dxa**2 + dya**2)
        return torch.cat(
            [
                xt * diagonal + xa,
                yt * diagonal + ya,
                zt * dza + za,
                torch.exp(dxt) * dxa,
                torch.exp(dyt) * dya,
                torch.exp(dzt) * dza,
                rt + ra,
            ],
            dim=-1,
        )


# ----------------------------------------------------------------------------- the repo's configs
DATASET_YAML = """\
DATASET: 'KittiDataset'
DATA_PATH: '../data/kitti'

POINT_CLOUD_RANGE: [0, -40, -3, 70.4, 40, 1]

DATA_SPLIT: {
    'train': train,
    'test': val
}

INFO_PATH: {
    'train': [kitti_infos_train.pkl],
    'test': [kitti_infos_val.pkl],
}

GET_ITEM_LIST: ["points"]
FOV_POINTS_ONLY: True

DATA_AUGMENTOR:
    DISABLE_AUG_LIST: ['placeholder']
    AUG_CONFIG_LIST:
        - NAME: gt_sampling
          USE_ROAD_PLANE: False
          DB_INFO_PATH:
              - kitti_dbinfos_train.pkl
          PREPARE: {
             filter_by_min_points: ['Car:5'],
             filter_by_difficulty: [-1],
          }

          SAMPLE_GROUPS: ['Car:6']
          NUM_POINT_FEATURES: 4
          DATABASE_WITH_FAKELIDAR: False
          REMOVE_EXTRA_WIDTH: [0.0, 0.0, 0.0]
          LIMIT_WHOLE_SCENE: True
          USE_SHARED_MEMORY: False

        - NAME: random_world_flip
          ALONG_AXIS_LIST: ['x']

        - NAME: random_world_rotation
          WORLD_ROT_ANGLE: [-0.78539816, 0.78539816]

        - NAME: random_world_scaling
          WORLD_SCALE_RANGE: [0.95, 1.05]


POINT_FEATURE_ENCODING: {
    encoding_type: absolute_coordinates_encoding,
    used_feature_list: ['x', 'y', 'z', 'intensity'],
    src_feature_list: ['x', 'y', 'z', 'intensity'],
}


DATA_PROCESSOR:
    - NAME: mask_points_and_boxes_outside_range
      REMOVE_OUTSIDE_BOXES: True

    - NAME: shuffle_points
      SHUFFLE_ENABLED: {
        'train': True,
        'test': False
      }

    - NAME: transform_points_to_voxels
      VOXEL_SIZE: [0.05, 0.05, 0.1]
      MAX_POINTS_PER_VOXEL: 5
      MAX_NUMBER_OF_VOXELS: {
        'train': 16000,
        'test': 40000
      }
"""

MODEL_YAML = """\
CLASS_NAMES: ['Car']

DATA_CONFIG:
    _BASE_CONFIG_: cfgs/dataset_configs/kitti_dataset.yaml
    POINT_CLOUD_RANGE: [0, -40, -3, 70.4, 40, 1]
    DATA_PROCESSOR:
        - NAME: mask_points_and_boxes_outside_range
          REMOVE_OUTSIDE_BOXES: True

        - NAME: shuffle_points
          SHUFFLE_ENABLED: {
            'train': True,
            'test': False
          }

        - NAME: transform_points_to_voxels
          VOXEL_SIZE: [1.6, 1.6, 4]
          MAX_POINTS_PER_VOXEL: 32
          MAX_NUMBER_OF_VOXELS: {
            'train': 4000,
            'test': 4000
          }

MODEL:
    NAME: PointPillar

    VFE:
        NAME: PillarVFE
        WITH_DISTANCE: False
        USE_ABSLOTE_XYZ: True
        USE_NORM: True
        NUM_FILTERS: [{vfe}]

    MAP_TO_BEV:
        NAME: PointPillarScatter
        NUM_BEV_FEATURES: {vfe}

    BACKBONE_2D:
        NAME: BaseBEVBackbone
        LAYER_NUMS: [1, 1]
        LAYER_STRIDES: [1, 2]
        NUM_FILTERS: [{f1}, {f2}]
        UPSAMPLE_STRIDES: [1, 2]
        NUM_UPSAMPLE_FILTERS: [{up}, {up}]

    DENSE_HEAD:
        NAME: AnchorHeadSingle
        CLASS_AGNOSTIC: False

        USE_DIRECTION_CLASSIFIER: True
        DIR_OFFSET: 0.78539
        DIR_LIMIT_OFFSET: 0.0
        NUM_DIR_BINS: 2

        ANCHOR_GENERATOR_CONFIG: [
            {
                'class_name': 'Car',
                'anchor_sizes': [[3.9, 1.6, 1.56]],
                'anchor_rotations': [0, 1.57],
                'anchor_bottom_heights': [-1.78],
                'align_center': False,
                'feature_map_stride': 1,
                'matched_threshold': 0.6,
                'unmatched_threshold': 0.45
            }
        ]

        TARGET_ASSIGNER_CONFIG:
            NAME: AxisAlignedTargetAssigner
            POS_FRACTION: -1.0
            SAMPLE_SIZE: 512
            NORM_BY_NUM_EXAMPLES: False
            MATCH_HEIGHT: False
            BOX_CODER: ResidualCoder

        LOSS_CONFIG:
            LOSS_WEIGHTS: {
                'cls_weight': 1.0,
                'loc_weight': 2.0,
                'dir_weight': 0.2,
                'code_weights': [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
            }

    POST_PROCESSING:
        RECALL_THRESH_LIST: [0.3, 0.5, 0.7]
        SCORE_THRESH: 0.1
        OUTPUT_RAW_SCORE: False

        EVAL_METRIC: kitti

        NMS_CONFIG:
            MULTI_CLASSES_NMS: False
            NMS_TYPE: nms_gpu
            NMS_THRESH: 0.01
            NMS_PRE_MAXSIZE: 4096
            NMS_POST_MAXSIZE: 500


OPTIMIZATION:
    BATCH_SIZE_PER_GPU: 4
    NUM_EPOCHS: 80

    OPTIMIZER: adam_onecycle
    LR: 0.003
    WEIGHT_DECAY: 0.01
    MOMENTUM: 0.9

    MOMS: [0.95, 0.85]
    PCT_START: 0.4
    DIV_FACTOR: 10
    DECAY_STEP_LIST: [35, 45]
    LR_DECAY: 0.1
    LR_CLIP: 0.0000001

    LR_WARMUP: False
    WARMUP_EPOCH: 1

    GRAD_NORM_CLIP: 10
"""


# ----------------------------------------------------------------------------- prepare
# The fixed calibration of the synthetic rig: camera x = -lidar y, camera y = -lidar z,
# camera z = lidar x (R0_rect the identity)
TR_VELO_TO_CAM = np.array([[0, -1, 0, 0], [0, 0, -1, -0.08], [1, 0, 0, -0.27]], dtype=np.float64)


def lidar_to_rect(pts):
    return np.concatenate([pts, np.ones((len(pts), 1))], axis=1) @ TR_VELO_TO_CAM.T


def rect_to_lidar(pts):
    rot, trans = TR_VELO_TO_CAM[:, :3], TR_VELO_TO_CAM[:, 3]
    return (pts - trans) @ rot


def synth_scene(rs):
    """A ground plane with clutter and 1-4 cars; points (N, 4) and boxes (M, 7) in lidar."""
    n_ground = rs.randint(900, 1300)
    r = np.sqrt(rs.uniform(4, 75**2, n_ground))
    a = rs.uniform(-np.pi, np.pi, n_ground)
    ground = np.stack([r * np.cos(a), r * np.sin(a), -1.73 + rs.normal(0, 0.04, n_ground)], axis=1)
    clutter = np.stack(
        [rs.uniform(-20, 70, 150), rs.uniform(-40, 40, 150), rs.uniform(-1.7, 1.5, 150)], axis=1
    )
    boxes, parts = [], [ground, clutter]
    for _ in range(rs.randint(1, 5)):
        for _try in range(20):
            x, y = rs.uniform(5, 65), rs.uniform(-30, 30)
            if abs(y) < x - 2 and all(np.hypot(x - b[0], y - b[1]) > 6 for b in boxes):
                break
        dx, dy, dz = rs.normal(3.9, 0.2), rs.normal(1.6, 0.08), rs.normal(1.56, 0.08)
        yaw = rs.uniform(-np.pi, np.pi)
        box = np.array([x, y, -1.73 + dz / 2, dx, dy, dz, yaw])
        n = int(np.clip(2600 / np.hypot(x, y) ** 1.15 + rs.normal(0, 4), 0, 400))
        if rs.uniform() < 0.15:  # hidden behind another object: a handful of points
            n = rs.randint(0, 5)
        local = rs.uniform(-0.5, 0.5, (n, 3)) * np.array([dx, dy, dz])
        side = rs.randint(0, 2, n)
        local[side == 0, 0] = np.sign(local[side == 0, 0]) * dx / 2 * 0.98
        local[side == 1, 1] = np.sign(local[side == 1, 1]) * dy / 2 * 0.98
        c, s = np.cos(yaw), np.sin(yaw)
        obj = local @ np.array([[c, s, 0], [-s, c, 0], [0, 0, 1]]) + box[:3]
        boxes.append(box)
        parts.append(obj)
    pts = np.concatenate(parts)
    intensity = rs.uniform(0, 1, (len(pts), 1))
    return np.concatenate([pts, intensity], axis=1).astype(np.float32), np.array(boxes)


def write_label(path, boxes, rs):
    lines = []
    for b in boxes:
        x, y, z, dx, dy, dz, yaw = b
        loc = lidar_to_rect(np.array([[x, y, z - dz / 2]]))[0]
        ry = -yaw - np.pi / 2
        ry = (ry + np.pi) % (2 * np.pi) - np.pi
        alpha = ry - np.arctan2(loc[0], loc[2])
        u, v = rs.uniform(100, 1100), rs.uniform(150, 200)
        height = 700 / max(loc[2], 1)
        lines.append(
            f"Car 0.00 0 {alpha:.2f} {u:.2f} {v:.2f} {u + 1.6 * height:.2f} {v + height:.2f} "
            f"{dz:.2f} {dy:.2f} {dx:.2f} {loc[0]:.2f} {loc[1]:.2f} {loc[2]:.2f} {ry:.2f}"
        )
    lines.append("DontCare -1 -1 -10 503.89 169.71 590.61 190.13 -1 -1 -1 -1000 -1000 -1000 -10")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def read_label(path):
    names, dims, locs, rots = [], [], [], []
    with open(path) as f:
        for line in f:
            v = line.split()
            names.append(v[0])
            dims.append([float(v[10]), float(v[8]), float(v[9])])  # l, h, w
            locs.append([float(v[11]), float(v[12]), float(v[13])])
            rots.append(float(v[14]))
    return np.array(names), np.array(dims), np.array(locs), np.array(rots)


def prepare(num_train, num_val):
    tools = Path(os.path.abspath(__file__)).parent
    (tools / "cfgs" / "dataset_configs").mkdir(parents=True, exist_ok=True)
    (tools / "cfgs" / "kitti_models").mkdir(parents=True, exist_ok=True)
    (tools / "cfgs" / "dataset_configs" / "kitti_dataset.yaml").write_text(DATASET_YAML)
    (tools / "cfgs" / "kitti_models" / "tiny_pointpillar.yaml").write_text(
        MODEL_YAML.replace("{vfe}", "16")
        .replace("{f1}", "16")
        .replace("{f2}", "32")
        .replace("{up}", "16")
    )
    (tools / "cfgs" / "kitti_models" / "tiny_pointpillar_wide.yaml").write_text(
        MODEL_YAML.replace("{vfe}", "32")
        .replace("{f1}", "32")
        .replace("{f2}", "64")
        .replace("{up}", "32")
    )
    root = ROOT_DIR / "data" / "kitti"
    for sub in ("velodyne", "label_2", "calib"):
        (root / "training" / sub).mkdir(parents=True, exist_ok=True)
    (root / "ImageSets").mkdir(parents=True, exist_ok=True)
    rs = np.random.RandomState(95)
    ids = [f"{i:06d}" for i in rs.choice(7481, num_train + num_val, replace=False)]
    calib = (
        "P2: 7.07e+02 0 6.04e+02 4.57e+01 0 7.07e+02 1.80e+02 -3.41e-01 0 0 1 4.98e-03\n"
        "R0_rect: 1 0 0 0 1 0 0 0 1\n"
        "Tr_velo_to_cam: " + " ".join(f"{v:g}" for v in TR_VELO_TO_CAM.ravel()) + "\n"
    )
    for sample_idx in ids:
        points, boxes = synth_scene(rs)
        points.tofile(root / "training" / "velodyne" / f"{sample_idx}.bin")
        write_label(root / "training" / "label_2" / f"{sample_idx}.txt", boxes, rs)
        (root / "training" / "calib" / f"{sample_idx}.txt").write_text(calib)
    train_ids, val_ids = sorted(ids[:num_train]), sorted(ids[num_train:])
    (root / "ImageSets" / "train.txt").write_text("\n".join(train_ids) + "\n")
    (root / "ImageSets" / "val.txt").write_text("\n".join(val_ids) + "\n")
    create_kitti_infos(root, train_ids, val_ids)


def get_infos(root, ids):
    infos = []
    for sample_idx in ids:
        names, dims, locs, rots = read_label(root / "training" / "label_2" / f"{sample_idx}.txt")
        keep = names != "DontCare"
        loc_lidar = rect_to_lidar(locs[keep])
        dl, dh, dw = dims[keep, 0:1], dims[keep, 1:2], dims[keep, 2:3]
        loc_lidar[:, 2] += dh[:, 0] / 2
        gt_boxes_lidar = np.concatenate(
            [loc_lidar, dl, dw, dh, -(np.pi / 2 + rots[keep][:, None])], axis=1
        )
        points = np.fromfile(
            root / "training" / "velodyne" / f"{sample_idx}.bin", dtype=np.float32
        ).reshape(-1, 4)
        num_points = points_in_boxes_mask(points, gt_boxes_lidar).sum(1)
        infos.append(
            {
                "point_cloud": {"num_features": 4, "lidar_idx": sample_idx},
                "annos": {
                    "name": names[keep],
                    "difficulty": np.zeros(keep.sum(), dtype=np.int32),
                    "gt_boxes_lidar": gt_boxes_lidar.astype(np.float32),
                    "num_points_in_gt": num_points.astype(np.int32),
                },
            }
        )
    return infos


def create_kitti_infos(root, train_ids, val_ids):
    print("---------------Start to generate data infos---------------")
    for split, ids in (("train", train_ids), ("val", val_ids)):
        infos = get_infos(root, ids)
        with open(root / f"kitti_infos_{split}.pkl", "wb") as f:
            pickle.dump(infos, f)
        print(f"Kitti info {split} file is saved to {root / f'kitti_infos_{split}.pkl'}")
        if split == "train":
            train_infos = infos
    print("---------------Start create groundtruth database for data augmentation---------------")
    (root / "gt_database").mkdir(exist_ok=True)
    all_db_infos = {"Car": []}
    for info in train_infos:
        sample_idx = info["point_cloud"]["lidar_idx"]
        points = np.fromfile(
            root / "training" / "velodyne" / f"{sample_idx}.bin", dtype=np.float32
        ).reshape(-1, 4)
        boxes = info["annos"]["gt_boxes_lidar"]
        masks = points_in_boxes_mask(points, boxes)
        for i, name in enumerate(info["annos"]["name"]):
            gt_points = points[masks[i]].copy()
            gt_points[:, :3] -= boxes[i, :3]
            rel = f"gt_database/{sample_idx}_{name}_{i}.bin"
            gt_points.tofile(root / rel)
            all_db_infos[name].append(
                {
                    "name": name,
                    "path": rel,
                    "image_idx": sample_idx,
                    "gt_idx": i,
                    "box3d_lidar": boxes[i],
                    "num_points_in_gt": len(gt_points),
                    "difficulty": 0,
                }
            )
    for k, v in all_db_infos.items():
        print(f"Database {k}: {len(v)}")
    with open(root / "kitti_dbinfos_train.pkl", "wb") as f:
        pickle.dump(all_db_infos, f)
    print("---------------Data preparation Done---------------")


# ----------------------------------------------------------------------------- data
class DataBaseSampler:
    def __init__(self, root_path, sampler_cfg, class_names, logger=None):
        self.root_path = root_path
        self.class_names = class_names
        self.sampler_cfg = sampler_cfg
        self.logger = logger
        self.db_infos = {name: [] for name in class_names}
        for db_info_path in sampler_cfg.DB_INFO_PATH:
            db_info_path = self.root_path.resolve() / db_info_path
            with open(str(db_info_path), "rb") as f:
                infos = pickle.load(f)
                for cur_class in class_names:
                    self.db_infos[cur_class].extend(infos[cur_class])
        for func_name, val in sampler_cfg.PREPARE.items():
            self.db_infos = getattr(self, func_name)(self.db_infos, val)
        self.use_shared_memory = sampler_cfg.get("USE_SHARED_MEMORY", False)
        if self.use_shared_memory:
            self.load_db_to_shared_memory()
        self.sample_groups = {}
        self.sample_class_num = {}
        self.limit_whole_scene = sampler_cfg.get("LIMIT_WHOLE_SCENE", False)
        for x in sampler_cfg.SAMPLE_GROUPS:
            class_name, sample_num = x.split(":")
            if class_name not in class_names:
                continue
            self.sample_class_num[class_name] = sample_num
            self.sample_groups[class_name] = {
                "sample_num": sample_num,
                "pointer": len(self.db_infos[class_name]),
                "indices": np.arange(len(self.db_infos[class_name])),
            }

    def __getstate__(self):
        d = dict(self.__dict__)
        del d["logger"]
        return d

    def load_db_to_shared_memory(self):
        self.logger.info("Loading GT database to shared memory")
        cur_rank, num_gpus = get_dist_info()
        letter, who = fault()
        for cur_class in self.class_names:
            for info in self.db_infos[cur_class][cur_rank::num_gpus]:
                sa_key = info["path"].replace("/", "___")
                if os.path.exists(f"/dev/shm/{sa_key}"):
                    continue
                if letter == "s" and cur_rank == who:
                    time.sleep(0.5)  # this rank's share read from a slow network mount
                obj_points = np.fromfile(
                    str(self.root_path / info["path"]), dtype=np.float32
                ).reshape([-1, self.sampler_cfg.NUM_POINT_FEATURES])
                sa_create(f"shm://{sa_key}", obj_points)
        dist.barrier()
        self.logger.info("GT database has been saved to shared memory")

    def filter_by_difficulty(self, db_infos, removed_difficulty):
        new_db_infos = {}
        for key, dinfos in db_infos.items():
            pre_len = len(dinfos)
            new_db_infos[key] = [
                info for info in dinfos if info["difficulty"] not in removed_difficulty
            ]
            if self.logger is not None:
                self.logger.info(
                    f"Database filter by difficulty {key}: {pre_len} => {len(new_db_infos[key])}"
                )
        return new_db_infos

    def filter_by_min_points(self, db_infos, min_gt_points_list):
        for name_num in min_gt_points_list:
            name, min_num = name_num.split(":")
            min_num = int(min_num)
            if min_num > 0 and name in db_infos:
                filtered_infos = [
                    info for info in db_infos[name] if info["num_points_in_gt"] >= min_num
                ]
                if self.logger is not None:
                    self.logger.info(
                        f"Database filter by min points {name}: "
                        f"{len(db_infos[name])} => {len(filtered_infos)}"
                    )
                db_infos[name] = filtered_infos
        return db_infos

    def sample_with_fixed_number(self, class_name, sample_group):
        sample_num = int(sample_group["sample_num"])
        pointer, indices = sample_group["pointer"], sample_group["indices"]
        if pointer >= len(self.db_infos[class_name]):
            indices = np.random.permutation(len(self.db_infos[class_name]))
            pointer = 0
        sampled_dict = [
            self.db_infos[class_name][idx] for idx in indices[pointer : pointer + sample_num]
        ]
        sample_group["pointer"] = pointer + sample_num
        sample_group["indices"] = indices
        return sampled_dict

    def add_sampled_boxes_to_scene(self, data_dict, sampled_gt_boxes, total_valid_sampled_dict):
        gt_boxes_mask = data_dict["gt_boxes_mask"]
        gt_boxes = data_dict["gt_boxes"][gt_boxes_mask]
        gt_names = data_dict["gt_names"][gt_boxes_mask]
        points = data_dict["points"]
        obj_points_list = []
        for info in total_valid_sampled_dict:
            if self.use_shared_memory:
                obj_points = np.array(sa_attach(f"shm://{info['path'].replace('/', '___')}"))
            else:
                obj_points = np.fromfile(
                    str(self.root_path / info["path"]), dtype=np.float32
                ).reshape([-1, self.sampler_cfg.NUM_POINT_FEATURES])
            obj_points[:, :3] += info["box3d_lidar"][:3]
            obj_points_list.append(obj_points)
        obj_points = np.concatenate(obj_points_list, axis=0)
        sampled_gt_names = np.array([x["name"] for x in total_valid_sampled_dict])
        inside = points_in_boxes_mask(points, sampled_gt_boxes[:, 0:7]).any(0)
        points = np.concatenate([obj_points, points[~inside]], axis=0)
        data_dict["gt_names"] = np.concatenate([gt_names, sampled_gt_names], axis=0)
        data_dict["gt_boxes"] = np.concatenate([gt_boxes, sampled_gt_boxes], axis=0)
        data_dict["points"] = points
        return data_dict

    def __call__(self, data_dict):
        gt_boxes = data_dict["gt_boxes"]
        gt_names = data_dict["gt_names"].astype(str)
        existed_boxes = gt_boxes
        total_valid_sampled_dict = []
        for class_name, sample_group in self.sample_groups.items():
            if self.limit_whole_scene:
                num_gt = np.sum(class_name == gt_names)
                sample_group["sample_num"] = str(int(self.sample_class_num[class_name]) - num_gt)
            if int(sample_group["sample_num"]) > 0:
                sampled_dict = self.sample_with_fixed_number(class_name, sample_group)
                sampled_boxes = np.stack([x["box3d_lidar"] for x in sampled_dict], axis=0).astype(
                    np.float32
                )
                iou1 = boxes_bev_iou_cpu(sampled_boxes[:, 0:7], existed_boxes[:, 0:7])
                iou2 = boxes_bev_iou_cpu(sampled_boxes[:, 0:7], sampled_boxes[:, 0:7])
                iou2[range(sampled_boxes.shape[0]), range(sampled_boxes.shape[0])] = 0
                iou1 = iou1 if iou1.shape[1] > 0 else iou2
                valid_mask = ((iou1.max(axis=1) + iou2.max(axis=1)) == 0).nonzero()[0]
                total_valid_sampled_dict.extend([sampled_dict[x] for x in valid_mask])
                existed_boxes = np.concatenate(
                    (existed_boxes, sampled_boxes[valid_mask]), axis=0
                ).astype(np.float32)
        sampled_gt_boxes = existed_boxes[gt_boxes.shape[0] :, :]
        if len(total_valid_sampled_dict) > 0:
            data_dict = self.add_sampled_boxes_to_scene(
                data_dict, sampled_gt_boxes, total_valid_sampled_dict
            )
        data_dict.pop("gt_boxes_mask")
        return data_dict


class DataAugmentor:
    def __init__(self, root_path, augmentor_configs, class_names, logger=None):
        self.data_augmentor_queue = []
        for cur_cfg in augmentor_configs.AUG_CONFIG_LIST:
            if cur_cfg.NAME in augmentor_configs.DISABLE_AUG_LIST:
                continue
            if cur_cfg.NAME == "gt_sampling":
                self.data_augmentor_queue.append(
                    DataBaseSampler(root_path, cur_cfg, class_names, logger=logger)
                )
            else:
                self.data_augmentor_queue.append(partial(getattr(self, cur_cfg.NAME), cur_cfg))

    @staticmethod
    def random_world_flip(config, data_dict):
        if np.random.choice([False, True]):
            data_dict["gt_boxes"][:, 1] = -data_dict["gt_boxes"][:, 1]
            data_dict["gt_boxes"][:, 6] = -data_dict["gt_boxes"][:, 6]
            data_dict["points"][:, 1] = -data_dict["points"][:, 1]
        return data_dict

    @staticmethod
    def random_world_rotation(config, data_dict):
        angle = np.random.uniform(*config.WORLD_ROT_ANGLE)
        data_dict["points"] = rotate_points_along_z(data_dict["points"], angle)
        boxes = data_dict["gt_boxes"]
        boxes[:, 0:3] = rotate_points_along_z(boxes[:, 0:3].astype(np.float32), angle)
        boxes[:, 6] += angle
        return data_dict

    @staticmethod
    def random_world_scaling(config, data_dict):
        scale = np.random.uniform(*config.WORLD_SCALE_RANGE)
        data_dict["points"][:, :3] *= scale
        data_dict["gt_boxes"][:, :6] *= scale
        return data_dict

    def forward(self, data_dict):
        for cur_augmentor in self.data_augmentor_queue:
            data_dict = cur_augmentor(data_dict=data_dict)
        data_dict["gt_boxes"][:, 6] = limit_period(
            torch.from_numpy(data_dict["gt_boxes"][:, 6]), offset=0.5, period=2 * np.pi
        ).numpy()
        return data_dict


class DataProcessor:
    def __init__(self, processor_configs, point_cloud_range, training):
        self.point_cloud_range = np.array(point_cloud_range, dtype=np.float32)
        self.training = training
        self.mode = "train" if training else "test"
        self.steps = [(c.NAME, c) for c in processor_configs]
        vox = next(c for c in processor_configs if c.NAME == "transform_points_to_voxels")
        self.voxel_size = np.array(vox.VOXEL_SIZE, dtype=np.float32)
        grid = (self.point_cloud_range[3:6] - self.point_cloud_range[0:3]) / self.voxel_size
        self.grid_size = np.round(grid).astype(np.int64)

    def mask_points_and_boxes_outside_range(self, data_dict, config):
        r = self.point_cloud_range
        pts = data_dict["points"]
        mask = (pts[:, 0] >= r[0]) & (pts[:, 0] <= r[3]) & (pts[:, 1] >= r[1]) & (pts[:, 1] <= r[4])
        data_dict["points"] = pts[mask]
        if data_dict.get("gt_boxes") is not None and config.REMOVE_OUTSIDE_BOXES and self.training:
            b = data_dict["gt_boxes"]
            inside = (b[:, 0] >= r[0]) & (b[:, 0] <= r[3]) & (b[:, 1] >= r[1]) & (b[:, 1] <= r[4])
            data_dict["gt_boxes"] = b[inside]
        return data_dict

    def shuffle_points(self, data_dict, config):
        if config.SHUFFLE_ENABLED[self.mode]:
            pts = data_dict["points"]
            data_dict["points"] = pts[np.random.permutation(pts.shape[0])]
        return data_dict

    def transform_points_to_voxels(self, data_dict, config):
        """spconv's VoxelGenerator: up to MAX_POINTS_PER_VOXEL points a voxel, coords z, y, x."""
        pts = data_dict["points"]
        r, vs, gs = self.point_cloud_range, self.voxel_size, self.grid_size
        idx = np.floor((pts[:, :3] - r[:3]) / vs).astype(np.int64)
        ok = np.all((idx >= 0) & (idx < gs), axis=1)
        pts, idx = pts[ok], idx[ok]
        key = (idx[:, 2] * gs[1] + idx[:, 1]) * gs[0] + idx[:, 0]
        uniq, first, inverse, counts = np.unique(
            key, return_index=True, return_inverse=True, return_counts=True
        )
        order = np.argsort(first, kind="stable")[: config.MAX_NUMBER_OF_VOXELS[self.mode]]
        rank_of = np.full(len(uniq), -1)
        rank_of[order] = np.arange(len(order))
        vox_id = rank_of[inverse]
        keep = vox_id >= 0
        pts, vox_id = pts[keep], vox_id[keep]
        sort = np.argsort(vox_id, kind="stable")
        pts, vox_id = pts[sort], vox_id[sort]
        starts = np.searchsorted(vox_id, np.arange(len(order)))
        pos = np.arange(len(vox_id)) - starts[vox_id]
        keep = pos < config.MAX_POINTS_PER_VOXEL
        voxels = np.zeros((len(order), config.MAX_POINTS_PER_VOXEL, pts.shape[1]), np.float32)
        voxels[vox_id[keep], pos[keep]] = pts[keep]
        zyx = np.stack([uniq // (gs[0] * gs[1]), (uniq // gs[0]) % gs[1], uniq % gs[0]], axis=1)[
            order
        ]
        data_dict["voxels"] = voxels
        data_dict["voxel_coords"] = zyx.astype(np.int32)
        data_dict["voxel_num_points"] = np.minimum(counts[order], config.MAX_POINTS_PER_VOXEL)
        return data_dict

    def forward(self, data_dict):
        for name, config in self.steps:
            data_dict = getattr(self, name)(data_dict, config)
        return data_dict


class KittiDataset(Dataset):
    def __init__(self, dataset_cfg, class_names, training=True, root_path=None, logger=None):
        self.dataset_cfg = dataset_cfg
        self.training = training
        self.class_names = class_names
        self.logger = logger
        self.root_path = root_path if root_path is not None else Path(dataset_cfg.DATA_PATH)
        self.point_cloud_range = np.array(dataset_cfg.POINT_CLOUD_RANGE, dtype=np.float32)
        self.mode = "train" if training else "test"
        self.data_augmentor = (
            DataAugmentor(self.root_path, dataset_cfg.DATA_AUGMENTOR, class_names, logger=logger)
            if training
            else None
        )
        self.data_processor = DataProcessor(
            dataset_cfg.DATA_PROCESSOR, dataset_cfg.POINT_CLOUD_RANGE, training
        )
        self.grid_size = self.data_processor.grid_size
        self.voxel_size = self.data_processor.voxel_size
        self.split = dataset_cfg.DATA_SPLIT[self.mode]
        self.root_split_path = self.root_path / "training"
        split_dir = self.root_path / "ImageSets" / (self.split + ".txt")
        self.sample_id_list = split_dir.read_text().split()
        self.kitti_infos = []
        self.include_kitti_data(self.mode)
        self.rank = get_dist_info()[0]
        self.gets = 0

    def include_kitti_data(self, mode):
        if self.logger is not None:
            self.logger.info("Loading KITTI dataset")
        for info_path in self.dataset_cfg.INFO_PATH[mode]:
            info_path = self.root_path / info_path
            if not info_path.exists():
                continue
            with open(info_path, "rb") as f:
                self.kitti_infos.extend(pickle.load(f))
        if self.logger is not None:
            self.logger.info(f"Total samples for KITTI dataset: {len(self.kitti_infos)}")

    def get_lidar(self, idx):
        lidar_file = self.root_split_path / "velodyne" / f"{idx}.bin"
        assert lidar_file.exists()
        return np.fromfile(str(lidar_file), dtype=np.float32).reshape(-1, 4)

    @staticmethod
    def fov_flag(points):
        """The points the camera sees (its 90 degree field of view), as get_fov_flag."""
        return (points[:, 0] > 0) & (np.abs(points[:, 1]) < points[:, 0])

    def __len__(self):
        return len(self.kitti_infos)

    def __getitem__(self, index):
        letter, who = fault()
        self.gets += 1
        if letter == "w" and self.rank == who and self.training and self.gets == 18:
            # a lock another thread held when the DataLoader forked this worker: never released
            held = threading.Lock()
            held.acquire()
            held.acquire()
        info = copy.deepcopy(self.kitti_infos[index])
        sample_idx = info["point_cloud"]["lidar_idx"]
        points = self.get_lidar(sample_idx)
        if self.dataset_cfg.FOV_POINTS_ONLY:
            points = points[self.fov_flag(points)]
        input_dict = {"points": points, "frame_id": sample_idx}
        annos = info["annos"]
        input_dict["gt_names"] = annos["name"]
        input_dict["gt_boxes"] = annos["gt_boxes_lidar"].astype(np.float32)
        data_dict = self.prepare_data(data_dict=input_dict)
        return data_dict

    def prepare_data(self, data_dict):
        if self.training:
            gt_boxes_mask = np.array([n in self.class_names for n in data_dict["gt_names"]])
            data_dict = self.data_augmentor.forward(
                data_dict={**data_dict, "gt_boxes_mask": gt_boxes_mask}
            )
        if data_dict.get("gt_boxes") is not None:
            selected = np.array(
                [i for i, x in enumerate(data_dict["gt_names"]) if x in self.class_names],
                dtype=np.int64,
            )
            data_dict["gt_names"] = data_dict["gt_names"][selected]
            gt_classes = np.array(
                [self.class_names.index(n) + 1 for n in data_dict["gt_names"]], dtype=np.int32
            )
            data_dict["gt_boxes"] = np.concatenate(
                (data_dict["gt_boxes"][selected], gt_classes.reshape(-1, 1).astype(np.float32)),
                axis=1,
            )
        data_dict = self.data_processor.forward(data_dict=data_dict)
        if self.training and len(data_dict["gt_boxes"]) == 0:
            new_index = np.random.randint(self.__len__())
            return self.__getitem__(new_index)
        data_dict.pop("gt_names", None)
        return data_dict

    @staticmethod
    def collate_batch(batch_list, _unused=False):
        data_dict = {}
        for cur_sample in batch_list:
            for key, val in cur_sample.items():
                data_dict.setdefault(key, []).append(val)
        batch_size = len(batch_list)
        ret = {}
        for key, val in data_dict.items():
            if key in ["voxels", "voxel_num_points"]:
                ret[key] = np.concatenate(val, axis=0)
            elif key in ["points", "voxel_coords"]:
                ret[key] = np.concatenate(
                    [np.pad(c, ((0, 0), (1, 0)), constant_values=i) for i, c in enumerate(val)],
                    axis=0,
                )
            elif key == "gt_boxes":
                max_gt = max(len(x) for x in val)
                boxes = np.zeros((batch_size, max_gt, val[0].shape[-1]), dtype=np.float32)
                for k in range(batch_size):
                    boxes[k, : val[k].__len__()] = val[k]
                ret[key] = boxes
            else:
                ret[key] = np.stack(val, axis=0)
        ret["batch_size"] = batch_size
        return ret

    def generate_prediction_dicts(self, batch_dict, pred_dicts, class_names):
        annos = []
        for index, box_dict in enumerate(pred_dicts):
            labels = box_dict["pred_labels"].numpy()
            annos.append(
                {
                    "name": np.array(class_names)[labels - 1],
                    "score": box_dict["pred_scores"].numpy(),
                    "boxes_lidar": box_dict["pred_boxes"].numpy(),
                    "frame_id": batch_dict["frame_id"][index],
                }
            )
        return annos

    def evaluation(self, det_annos, class_names):
        """A KITTI-like AP of the BEV and 3-D boxes at IoU 0.7 (11 and 40 recall positions)."""
        gt = {i["point_cloud"]["lidar_idx"]: i["annos"] for i in self.kitti_infos}
        scores, tps, num_gt = [], [], 0
        for anno in det_annos:
            g = gt[anno["frame_id"]]
            gboxes = torch.from_numpy(g["gt_boxes_lidar"][g["name"] == "Car"]).float()
            num_gt += len(gboxes)
            order = np.argsort(-anno["score"])
            dboxes = torch.from_numpy(anno["boxes_lidar"][order]).float()
            if len(dboxes) == 0:
                continue
            iou = {
                "bev": boxes3d_nearest_bev_iou(dboxes, gboxes) if len(gboxes) else None,
                "3d": boxes_iou3d_nearest(dboxes, gboxes) if len(gboxes) else None,
            }
            for k in range(len(dboxes)):
                scores.append(anno["score"][order][k])
                tp = {}
                for kind, m in iou.items():
                    tp[kind] = bool(m is not None and m[k].max() >= 0.7)
                    if tp[kind]:
                        m[:, m[k].argmax()] = 0
                tps.append(tp)
        order = np.argsort(-np.array(scores)) if scores else np.array([], dtype=np.int64)
        result = {}
        lines = []
        for name, points in (("AP", np.linspace(0, 1, 11)), ("AP_R40", np.linspace(1 / 40, 1, 40))):
            lines.append(f"Car {name}@0.70, 0.70, 0.70:")
            for kind in ("bev", "3d"):
                hits = np.array([tps[i][kind] for i in order], dtype=np.float64)
                tp_cum = np.cumsum(hits)
                recall = tp_cum / max(num_gt, 1)
                precision = tp_cum / np.arange(1, len(hits) + 1)
                ap = 0.0
                for r in points:
                    p = precision[recall >= r]
                    ap += (p.max() if len(p) else 0.0) / len(points)
                result[f"Car_{kind}/{name}"] = ap * 100
                lines.append(f"{kind:<4} AP:{ap * 100:.4f}, {ap * 100:.4f}, {ap * 100:.4f}")
        return "\n" + "\n".join(lines) + "\n", result


class DistributedSampler(_DistributedSampler):
    """pcdet.datasets.DistributedSampler: padded, in order unless shuffled."""

    def __init__(self, dataset, num_replicas=None, rank=None, shuffle=True):
        super().__init__(dataset, num_replicas=num_replicas, rank=rank)
        self.shuffle = shuffle

    def __iter__(self):
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.epoch)
            indices = torch.randperm(len(self.dataset), generator=g).tolist()
        else:
            indices = torch.arange(len(self.dataset)).tolist()
        indices += indices[: (self.total_size - len(indices))]
        indices = indices[self.rank : self.total_size : self.num_replicas]
        return iter(indices)


def build_dataloader(
    dataset_cfg,
    class_names,
    batch_size,
    dist_train,
    workers=4,
    seed=None,
    logger=None,
    training=True,
):
    dataset = KittiDataset(dataset_cfg, class_names, training=training, logger=logger)
    if dist_train:
        if training:
            sampler = torch.utils.data.distributed.DistributedSampler(dataset)
        else:
            rank, world_size = get_dist_info()
            sampler = DistributedSampler(dataset, world_size, rank, shuffle=False)
    else:
        sampler = None
    dataloader = DataLoader(
        dataset,
        batch_size=batch_size,
        pin_memory=False,
        num_workers=workers,
        shuffle=(sampler is None) and training,
        collate_fn=dataset.collate_batch,
        drop_last=False,
        sampler=sampler,
        timeout=0,
        worker_init_fn=partial(worker_init_fn, seed=seed),
    )
    return dataset, dataloader, sampler


# ----------------------------------------------------------------------------- model
class PFNLayer(nn.Module):
    def __init__(self, in_channels, out_channels, use_norm=True):
        super().__init__()
        self.linear = nn.Linear(in_channels, out_channels, bias=False)
        self.norm = nn.BatchNorm1d(out_channels, eps=1e-3, momentum=0.01)

    def forward(self, inputs):
        x = self.linear(inputs)
        x = self.norm(x.permute(0, 2, 1)).permute(0, 2, 1)
        x = F.relu(x)
        return torch.max(x, dim=1, keepdim=True)[0]


class PillarVFE(nn.Module):
    def __init__(self, model_cfg, voxel_size, point_cloud_range):
        super().__init__()
        self.model_cfg = model_cfg
        num_filters = [10, *model_cfg.NUM_FILTERS]
        self.pfn_layers = nn.ModuleList(
            [PFNLayer(num_filters[i], num_filters[i + 1]) for i in range(len(num_filters) - 1)]
        )
        self.voxel_x, self.voxel_y, self.voxel_z = (float(v) for v in voxel_size)
        self.x_offset = self.voxel_x / 2 + float(point_cloud_range[0])
        self.y_offset = self.voxel_y / 2 + float(point_cloud_range[1])
        self.z_offset = self.voxel_z / 2 + float(point_cloud_range[2])

    def forward(self, batch_dict):
        voxel_features = batch_dict["voxels"]
        voxel_num_points, coords = batch_dict["voxel_num_points"], batch_dict["voxel_coords"]
        points_mean = voxel_features[:, :, :3].sum(dim=1, keepdim=True) / voxel_num_points.type_as(
            voxel_features
        ).clamp(min=1).view(-1, 1, 1)
        f_cluster = voxel_features[:, :, :3] - points_mean
        f_center = torch.zeros_like(voxel_features[:, :, :3])
        f_center[:, :, 0] = voxel_features[:, :, 0] - (
            coords[:, 3].to(voxel_features.dtype).unsqueeze(1) * self.voxel_x + self.x_offset
        )
        f_center[:, :, 1] = voxel_features[:, :, 1] - (
            coords[:, 2].to(voxel_features.dtype).unsqueeze(1) * self.voxel_y + self.y_offset
        )
        f_center[:, :, 2] = voxel_features[:, :, 2] - (
            coords[:, 1].to(voxel_features.dtype).unsqueeze(1) * self.voxel_z + self.z_offset
        )
        features = torch.cat([voxel_features, f_cluster, f_center], dim=-1)
        count = features.shape[1]
        mask = torch.arange(count).view(1, -1) < voxel_num_points.view(-1, 1)
        features *= mask.unsqueeze(-1).type_as(voxel_features)
        for pfn in self.pfn_layers:
            features = pfn(features)
        batch_dict["pillar_features"] = features.squeeze(1)
        return batch_dict


class PointPillarScatter(nn.Module):
    def __init__(self, model_cfg, grid_size):
        super().__init__()
        self.num_bev_features = model_cfg.NUM_BEV_FEATURES
        self.nx, self.ny, self.nz = (int(g) for g in grid_size)

    def forward(self, batch_dict):
        pillar_features, coords = batch_dict["pillar_features"], batch_dict["voxel_coords"]
        batch_spatial_features = []
        batch_size = coords[:, 0].max().int().item() + 1
        for batch_idx in range(batch_size):
            spatial_feature = torch.zeros(
                self.num_bev_features, self.nz * self.nx * self.ny, dtype=pillar_features.dtype
            )
            batch_mask = coords[:, 0] == batch_idx
            this_coords = coords[batch_mask, :]
            indices = this_coords[:, 1] + this_coords[:, 2] * self.nx + this_coords[:, 3]
            spatial_feature[:, indices.long()] = pillar_features[batch_mask, :].t()
            batch_spatial_features.append(spatial_feature)
        batch_spatial_features = torch.stack(batch_spatial_features, 0).view(
            batch_size, self.num_bev_features * self.nz, self.ny, self.nx
        )
        batch_dict["spatial_features"] = batch_spatial_features
        return batch_dict


class BaseBEVBackbone(nn.Module):
    def __init__(self, model_cfg, input_channels):
        super().__init__()
        c_in_list = [input_channels, *model_cfg.NUM_FILTERS[:-1]]
        self.blocks = nn.ModuleList()
        self.deblocks = nn.ModuleList()
        for idx in range(len(model_cfg.LAYER_NUMS)):
            f = model_cfg.NUM_FILTERS[idx]
            layers = [
                nn.ZeroPad2d(1),
                nn.Conv2d(c_in_list[idx], f, 3, stride=model_cfg.LAYER_STRIDES[idx], bias=False),
                nn.BatchNorm2d(f, eps=1e-3, momentum=0.01),
                nn.ReLU(),
            ]
            for _ in range(model_cfg.LAYER_NUMS[idx]):
                layers += [
                    nn.Conv2d(f, f, 3, padding=1, bias=False),
                    nn.BatchNorm2d(f, eps=1e-3, momentum=0.01),
                    nn.ReLU(),
                ]
            self.blocks.append(nn.Sequential(*layers))
            stride = model_cfg.UPSAMPLE_STRIDES[idx]
            up = model_cfg.NUM_UPSAMPLE_FILTERS[idx]
            self.deblocks.append(
                nn.Sequential(
                    nn.ConvTranspose2d(f, up, stride, stride=stride, bias=False),
                    nn.BatchNorm2d(up, eps=1e-3, momentum=0.01),
                    nn.ReLU(),
                )
            )
        self.num_bev_features = sum(model_cfg.NUM_UPSAMPLE_FILTERS)

    def forward(self, data_dict):
        x = data_dict["spatial_features"]
        ups = []
        for block, deblock in zip(self.blocks, self.deblocks, strict=True):
            x = block(x)
            ups.append(deblock(x))
        data_dict["spatial_features_2d"] = torch.cat(ups, dim=1)
        return data_dict


def generate_anchors(config, grid_size, point_cloud_range):
    """AnchorGenerator for one class: (ny, nx, rotations, 7) flattened to (N, 7)."""
    r = point_cloud_range
    nx, ny = int(grid_size[0]), int(grid_size[1])
    xs = torch.linspace(r[0], r[3], nx)
    ys = torch.linspace(r[1], r[4], ny)
    size = torch.tensor(config["anchor_sizes"][0])
    rots = torch.tensor(config["anchor_rotations"])
    z = config["anchor_bottom_heights"][0] + float(size[2]) / 2
    yy, xx, rr = torch.meshgrid(ys, xs, rots, indexing="ij")
    anchors = torch.stack(
        [xx, yy, torch.full_like(xx, z), *(torch.full_like(xx, float(s)) for s in size), rr],
        dim=-1,
    )
    return anchors.view(-1, 7), len(rots)


class AnchorHeadSingle(nn.Module):
    def __init__(self, model_cfg, input_channels, num_class, grid_size, point_cloud_range):
        super().__init__()
        self.model_cfg = model_cfg
        self.num_class = num_class
        gen = model_cfg.ANCHOR_GENERATOR_CONFIG[0]
        anchors, self.num_anchors_per_location = generate_anchors(gen, grid_size, point_cloud_range)
        self.anchors = anchors
        self.matched_threshold = gen["matched_threshold"]
        self.unmatched_threshold = gen["unmatched_threshold"]
        self.box_coder = ResidualCoder()
        a = self.num_anchors_per_location
        self.conv_cls = nn.Conv2d(input_channels, a * num_class, kernel_size=1)
        self.conv_box = nn.Conv2d(input_channels, a * self.box_coder.code_size, kernel_size=1)
        self.conv_dir_cls = nn.Conv2d(input_channels, a * model_cfg.NUM_DIR_BINS, kernel_size=1)
        nn.init.constant_(self.conv_cls.bias, -np.log((1 - 0.01) / 0.01))
        nn.init.normal_(self.conv_box.weight, mean=0, std=0.001)

    def assign_targets(self, gt_boxes):
        """AxisAlignedTargetAssigner (MATCH_HEIGHT False: the nearest BEV IoU)."""
        letter, who = fault()
        labels_list, targets_list = [], []
        for k in range(gt_boxes.shape[0]):
            cur_gt = gt_boxes[k]
            cur_gt = cur_gt[cur_gt[:, :7].abs().sum(1) > 0]
            labels = torch.zeros(len(self.anchors), dtype=torch.int64)
            targets = torch.zeros(len(self.anchors), 7)
            if len(cur_gt) > 0:
                if letter == "n" and self.rank == who and self.epoch == 1 and self.it == 4:
                    # the compiled IoU kernel of iou3d_nms writes through a bad pointer
                    ctypes.memmove(ctypes.c_void_p(8), ctypes.c_char_p(b"iou3d"), 5)
                overlap = boxes3d_nearest_bev_iou(self.anchors, cur_gt[:, :7])
                anchor_max, anchor_argmax = overlap.max(dim=1)
                gt_max = overlap.max(dim=0).values
                labels[anchor_max < self.unmatched_threshold] = 0
                labels[
                    (anchor_max >= self.unmatched_threshold) & (anchor_max < self.matched_threshold)
                ] = -1
                forced = ((overlap == gt_max[None]) & (gt_max[None] > 0)).any(dim=1)
                pos = (anchor_max >= self.matched_threshold) | forced
                labels[pos] = cur_gt[anchor_argmax[pos], 7].long()
                targets[pos] = self.box_coder.encode_torch(
                    cur_gt[anchor_argmax[pos], :7], self.anchors[pos]
                )
            labels_list.append(labels)
            targets_list.append(targets)
        return torch.stack(labels_list), torch.stack(targets_list)

    def forward(self, data_dict):
        x = data_dict["spatial_features_2d"]
        b = x.shape[0]
        cls_preds = self.conv_cls(x).permute(0, 2, 3, 1).contiguous().view(b, -1, self.num_class)
        box_preds = self.conv_box(x).permute(0, 2, 3, 1).contiguous().view(b, -1, 7)
        dir_preds = (
            self.conv_dir_cls(x)
            .permute(0, 2, 3, 1)
            .contiguous()
            .view(b, -1, self.model_cfg.NUM_DIR_BINS)
        )
        self.forward_ret_dict = {"cls_preds": cls_preds, "box_preds": box_preds, "dir": dir_preds}
        if self.training:
            labels, targets = self.assign_targets(data_dict["gt_boxes"])
            self.forward_ret_dict.update(box_cls_labels=labels, box_reg_targets=targets)
        else:
            batch_size = data_dict["batch_size"]
            box = self.box_coder.decode_torch(
                box_preds.view(batch_size, -1, 7), self.anchors[None].expand(batch_size, -1, -1)
            )
            dir_labels = torch.max(dir_preds.view(batch_size, -1, 2), dim=-1)[1]
            period = 2 * np.pi / self.model_cfg.NUM_DIR_BINS
            dir_rot = limit_period(
                box[..., 6] - self.model_cfg.DIR_OFFSET, self.model_cfg.DIR_LIMIT_OFFSET, period
            )
            box[..., 6] = dir_rot + self.model_cfg.DIR_OFFSET + period * dir_labels.to(box.dtype)
            data_dict["batch_cls_preds"] = cls_preds.view(batch_size, -1, self.num_class)
            data_dict["batch_box_preds"] = box
        return data_dict

    def get_loss(self):
        d = self.forward_ret_dict
        w = self.model_cfg.LOSS_CONFIG.LOSS_WEIGHTS
        labels, batch_size = d["box_cls_labels"], d["cls_preds"].shape[0]
        positives, negatives = labels > 0, labels == 0
        pos_normalizer = positives.sum(1, keepdim=True).float().clamp(min=1.0)
        cls_weights = (negatives.float() + positives.float()) / pos_normalizer
        reg_weights = positives.float() / pos_normalizer
        target = (labels.clamp(min=0) > 0).float().unsqueeze(-1)
        pred = d["cls_preds"]
        p = torch.sigmoid(pred)
        alpha = target * 0.25 + (1 - target) * 0.75
        pt = target * (1 - p) + (1 - target) * p
        bce = F.binary_cross_entropy_with_logits(pred, target, reduction="none")
        cls_loss = (alpha * pt.pow(2) * bce * cls_weights.unsqueeze(-1)).sum() / batch_size
        box_preds, reg_targets = d["box_preds"], d["box_reg_targets"]
        rad_pred = torch.sin(box_preds[..., 6:7]) * torch.cos(reg_targets[..., 6:7])
        rad_tg = torch.cos(box_preds[..., 6:7]) * torch.sin(reg_targets[..., 6:7])
        box_preds = torch.cat([box_preds[..., :6], rad_pred], dim=-1)
        reg_targets = torch.cat([reg_targets[..., :6], rad_tg], dim=-1)
        diff = (box_preds - reg_targets).abs()
        beta = 1.0 / 9.0
        sl1 = torch.where(diff < beta, 0.5 * diff**2 / beta, diff - 0.5 * beta)
        loc_loss = (sl1 * reg_weights.unsqueeze(-1)).sum() / batch_size
        rot_gt = d["box_reg_targets"][..., 6] + self.anchors[None, :, 6]
        offset_rot = limit_period(rot_gt - self.model_cfg.DIR_OFFSET, 0, 2 * np.pi)
        dir_targets = torch.floor(offset_rot / (2 * np.pi / 2)).long().clamp(0, 1)
        dir_loss = F.cross_entropy(d["dir"].view(-1, 2), dir_targets.view(-1), reduction="none")
        dir_loss = (dir_loss.view(batch_size, -1) * reg_weights).sum() / batch_size
        cls_loss = cls_loss * w["cls_weight"]
        loc_loss = loc_loss * w["loc_weight"]
        dir_loss = dir_loss * w["dir_weight"]
        rpn_loss = cls_loss + loc_loss + dir_loss
        tb_dict = {
            "rpn_loss_cls": cls_loss.item(),
            "rpn_loss_loc": loc_loss.item(),
            "rpn_loss_dir": dir_loss.item(),
            "rpn_loss": rpn_loss.item(),
        }
        return rpn_loss, tb_dict


class PointPillar(nn.Module):
    def __init__(self, model_cfg, num_class, dataset):
        super().__init__()
        self.model_cfg = model_cfg
        self.num_class = num_class
        self.class_names = dataset.class_names
        self.register_buffer("global_step", torch.LongTensor(1).zero_())
        self.vfe = PillarVFE(model_cfg.VFE, dataset.voxel_size, dataset.point_cloud_range)
        self.map_to_bev_module = PointPillarScatter(model_cfg.MAP_TO_BEV, dataset.grid_size)
        self.backbone_2d = BaseBEVBackbone(
            model_cfg.BACKBONE_2D, model_cfg.MAP_TO_BEV.NUM_BEV_FEATURES
        )
        self.dense_head = AnchorHeadSingle(
            model_cfg.DENSE_HEAD,
            self.backbone_2d.num_bev_features,
            num_class,
            dataset.grid_size,
            dataset.point_cloud_range,
        )
        self.dense_head.rank = get_dist_info()[0]
        self.dense_head.epoch = self.dense_head.it = 0

    def update_global_step(self):
        self.global_step += 1

    def forward(self, batch_dict):
        batch_dict = self.vfe(batch_dict)
        batch_dict = self.map_to_bev_module(batch_dict)
        batch_dict = self.backbone_2d(batch_dict)
        batch_dict = self.dense_head(batch_dict)
        if self.training:
            loss, tb_dict = self.dense_head.get_loss()
            return {"loss": loss}, tb_dict, {}
        return self.post_processing(batch_dict)

    def post_processing(self, batch_dict):
        post = self.model_cfg.POST_PROCESSING
        batch_size = batch_dict["batch_size"]
        recall_dict, pred_dicts = {}, []
        for index in range(batch_size):
            box_preds = batch_dict["batch_box_preds"][index]
            cls_preds = torch.sigmoid(batch_dict["batch_cls_preds"][index])
            scores, labels = torch.max(cls_preds, dim=-1)
            keep = scores >= post.SCORE_THRESH
            scores, labels, boxes = scores[keep], labels[keep] + 1, box_preds[keep]
            order = torch.argsort(scores, descending=True)[: post.NMS_CONFIG.NMS_PRE_MAXSIZE]
            scores, labels, boxes = scores[order], labels[order], boxes[order]
            iou = boxes3d_nearest_bev_iou(boxes, boxes)
            suppressed = torch.zeros(len(boxes), dtype=torch.bool)
            selected = []
            for i in range(len(boxes)):
                if suppressed[i]:
                    continue
                selected.append(i)
                suppressed |= iou[i] > post.NMS_CONFIG.NMS_THRESH
            selected = selected[: post.NMS_CONFIG.NMS_POST_MAXSIZE]
            final_boxes = boxes[selected]
            recall_dict = self.generate_recall_record(
                final_boxes, recall_dict, batch_dict, index, post.RECALL_THRESH_LIST
            )
            pred_dicts.append(
                {
                    "pred_boxes": final_boxes,
                    "pred_scores": scores[selected],
                    "pred_labels": labels[selected],
                }
            )
        return pred_dicts, recall_dict

    @staticmethod
    def generate_recall_record(box_preds, recall_dict, batch_dict, index, thresh_list):
        if "gt_boxes" not in batch_dict:
            return recall_dict
        cur_gt = batch_dict["gt_boxes"][index]
        cur_gt = cur_gt[cur_gt[:, :7].abs().sum(1) > 0]
        if recall_dict.__len__() == 0:
            recall_dict = {"gt": 0}
            for t in thresh_list:
                recall_dict[f"roi_{t}"] = 0
                recall_dict[f"rcnn_{t}"] = 0
        if len(cur_gt) > 0:
            iou = (
                boxes_iou3d_nearest(box_preds[:, :7], cur_gt[:, :7])
                if len(box_preds)
                else torch.zeros(1, len(cur_gt))
            )
            for t in thresh_list:
                recall_dict[f"rcnn_{t}"] += (iou.max(dim=0)[0] > t).sum().item()
            recall_dict["gt"] += len(cur_gt)
        return recall_dict

    def load_params_from_file(self, filename, logger, to_cpu=False):
        if not os.path.isfile(filename):
            raise FileNotFoundError
        logger.info(
            "==> Loading parameters from checkpoint {} to {}".format(
                filename, "CPU" if to_cpu else "GPU"
            )
        )
        checkpoint = torch.load(filename, map_location=torch.device("cpu"))
        model_state_disk = checkpoint["model_state"]
        version = checkpoint.get("version", None)
        if version is not None:
            logger.info(f"==> Checkpoint trained from version: {version}")
        state_dict, update_model_state = self._load_state_dict(model_state_disk, strict=False)
        for key in state_dict:
            if key not in update_model_state:
                logger.info(f"Not updated weight {key}: {state_dict[key].shape}")
        logger.info(f"==> Done (loaded {len(update_model_state)}/{len(state_dict)})")

    def _load_state_dict(self, model_state_disk, *, strict=True):
        state_dict = self.state_dict()
        update_model_state = {}
        for key, val in model_state_disk.items():
            if key in state_dict and state_dict[key].shape == val.shape:
                update_model_state[key] = val
        if strict:
            self.load_state_dict(update_model_state)
        else:
            state_dict.update(update_model_state)
            self.load_state_dict(state_dict)
        return state_dict, update_model_state

    def load_params_with_optimizer(self, filename, to_cpu=False, optimizer=None, logger=None):
        if not os.path.isfile(filename):
            raise FileNotFoundError
        logger.info(
            "==> Loading parameters from checkpoint {} to {}".format(
                filename, "CPU" if to_cpu else "GPU"
            )
        )
        checkpoint = torch.load(filename, map_location=torch.device("cpu"))
        epoch = checkpoint.get("epoch", -1)
        it = checkpoint.get("it", 0.0)
        self._load_state_dict(checkpoint["model_state"], strict=True)
        if optimizer is not None and checkpoint.get("optimizer_state") is not None:
            logger.info(
                "==> Loading optimizer parameters from checkpoint {} to {}".format(
                    filename, "CPU" if to_cpu else "GPU"
                )
            )
            optimizer.load_state_dict(checkpoint["optimizer_state"])
        if "version" in checkpoint:
            print("==> Checkpoint trained from version: {}".format(checkpoint["version"]))
        logger.info("==> Done")
        return it, epoch


def load_data_to_gpu(batch_dict):
    for key, val in batch_dict.items():
        if not isinstance(val, np.ndarray) or key == "frame_id":
            continue
        if key in ["voxel_coords", "voxel_num_points"]:
            batch_dict[key] = torch.from_numpy(val).int()
        else:
            batch_dict[key] = torch.from_numpy(val).float()


def model_fn_decorator():
    def model_func(model, batch_dict):
        load_data_to_gpu(batch_dict)
        ret_dict, tb_dict, disp_dict = model(batch_dict)
        loss = ret_dict["loss"].mean()
        if hasattr(model, "update_global_step"):
            model.update_global_step()
        else:
            model.module.global_step += 1
        return loss, tb_dict, disp_dict

    return model_func


# ----------------------------------------------------------------------------- optimization
def build_optimizer(model, optim_cfg):
    return torch.optim.Adam(
        model.parameters(), lr=optim_cfg.LR, betas=(0.9, 0.99), weight_decay=optim_cfg.WEIGHT_DECAY
    )


class OneCycle:
    """adam_onecycle's schedule: cosine up to LR over PCT_START, then down; moms the other way."""

    def __init__(self, optimizer, total_step, lr_max, moms, div_factor, pct_start):
        self.optimizer, self.total_step = optimizer, max(total_step, 1)
        self.lr_max, self.moms, self.div, self.pct = lr_max, moms, div_factor, pct_start

    @staticmethod
    def _cos(start, end, pct):
        return end + (start - end) / 2 * (np.cos(np.pi * pct) + 1)

    def step(self, it):
        pct = it / self.total_step
        low = self.lr_max / self.div
        if pct < self.pct:
            lr = self._cos(low, self.lr_max, pct / self.pct)
            mom = self._cos(self.moms[0], self.moms[1], pct / self.pct)
        else:
            p = min((pct - self.pct) / (1 - self.pct), 1.0)
            lr = self._cos(self.lr_max, low / 1e4, p)
            mom = self._cos(self.moms[1], self.moms[0], p)
        for group in self.optimizer.param_groups:
            group["lr"] = float(lr)
            group["betas"] = (float(mom), group["betas"][1])


def build_scheduler(optimizer, total_iters_each_epoch, total_epochs, last_epoch, optim_cfg):
    total_steps = total_iters_each_epoch * total_epochs
    scheduler = OneCycle(
        optimizer,
        total_steps,
        optim_cfg.LR,
        list(optim_cfg.MOMS),
        optim_cfg.DIV_FACTOR,
        optim_cfg.PCT_START,
    )
    return scheduler, None


# ----------------------------------------------------------------------------- train utils
HOARD: list[torch.Tensor] = []


def train_one_epoch(
    model,
    optimizer,
    train_loader,
    model_func,
    lr_scheduler,
    accumulated_iter,
    optim_cfg,
    rank,
    tbar,
    total_it_each_epoch,
    dataloader_iter,
    tb_log=None,
    leave_pbar=False,
    use_logger_to_record=False,
    logger=None,
    logger_iter_interval=50,
    cur_epoch=None,
    total_epochs=None,
    ckpt_save_dir=None,
    ckpt_save_time_interval=300,
    show_gpu_stat=False,
    use_amp=False,
):
    letter, who = fault()
    if total_it_each_epoch == len(train_loader):
        dataloader_iter = iter(train_loader)
    ckpt_save_cnt = 1
    start_it = accumulated_iter % total_it_each_epoch
    scaler = torch.amp.GradScaler(
        "cuda", enabled=use_amp, init_scale=optim_cfg.get("LOSS_SCALE_FP16", 2.0**16)
    )
    if rank == 0:
        pbar = tqdm.tqdm(
            total=total_it_each_epoch, leave=leave_pbar, desc="train", dynamic_ncols=True
        )
        data_time, batch_time, forward_time = AverageMeter(), AverageMeter(), AverageMeter()
    end = time.time()
    for cur_it in range(start_it, total_it_each_epoch):
        try:
            batch = next(dataloader_iter)
        except StopIteration:
            dataloader_iter = iter(train_loader)
            batch = next(dataloader_iter)
            print("new iters")
        data_timer = time.time()
        cur_data_time = data_timer - end
        lr_scheduler.step(accumulated_iter)
        cur_lr = optimizer.param_groups[0]["lr"]
        if tb_log is not None:
            tb_log.add_scalar("meta_data/learning_rate", cur_lr, accumulated_iter)
        if letter == "m" and rank == who and cur_epoch == 1:
            # every batch's BEV features kept for a visualisation dump at the epoch's end
            HOARD.append(torch.ones(16 << 20))
            if len(HOARD) >= 6:
                os.kill(os.getpid(), signal.SIGKILL)  # what the kernel's OOM killer does
        inner = model.module if hasattr(model, "module") else model
        inner.dense_head.epoch, inner.dense_head.it = cur_epoch, cur_it
        model.train()
        optimizer.zero_grad()
        with torch.amp.autocast("cuda", enabled=use_amp):
            loss, tb_dict, disp_dict = model_func(model, batch)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        clip_grad_norm_(model.parameters(), optim_cfg.GRAD_NORM_CLIP)
        scaler.step(optimizer)
        scaler.update()
        accumulated_iter += 1
        cur_forward_time = time.time() - data_timer
        cur_batch_time = time.time() - end
        end = time.time()
        # average reduce
        if letter != "c":
            avg_data_time = average_reduce_value(cur_data_time)
            avg_forward_time = average_reduce_value(cur_forward_time)
            avg_batch_time = average_reduce_value(cur_batch_time)
        # log to console and tensorboard
        if rank == 0:
            if letter == "c":  # only rank 0 shows the times: reduce them here
                avg_data_time = average_reduce_value(cur_data_time)
                avg_forward_time = average_reduce_value(cur_forward_time)
                avg_batch_time = average_reduce_value(cur_batch_time)
            data_time.update(avg_data_time)
            forward_time.update(avg_forward_time)
            batch_time.update(avg_batch_time)
            disp_dict.update(
                {
                    "loss": loss.item(),
                    "lr": cur_lr,
                    "d_time": f"{data_time.val:.2f}({data_time.avg:.2f})",
                    "f_time": f"{forward_time.val:.2f}({forward_time.avg:.2f})",
                    "b_time": f"{batch_time.val:.2f}({batch_time.avg:.2f})",
                }
            )
            if use_logger_to_record:
                if (
                    accumulated_iter % logger_iter_interval == 0
                    or cur_it == start_it
                    or cur_it + 1 == total_it_each_epoch
                ):
                    trained_time_past_all = tbar.format_dict["elapsed"]
                    second_each_iter = pbar.format_dict["elapsed"] / max(cur_it - start_it + 1, 1.0)
                    trained_time_each_epoch = pbar.format_dict["elapsed"]
                    remaining_second_each_epoch = second_each_iter * (total_it_each_epoch - cur_it)
                    remaining_second_all = second_each_iter * (
                        (total_epochs - cur_epoch) * total_it_each_epoch - cur_it
                    )
                    disp_str = ", ".join(
                        [f"{key}={val}" for key, val in disp_dict.items() if key != "lr"]
                    )
                    disp_str += f", lr={disp_dict['lr']}"
                    batch_size = batch.get("batch_size", None)
                    logger.info(
                        f"epoch: {cur_epoch}/{total_epochs}, acc_iter={accumulated_iter}, "
                        f"cur_iter={cur_it}/{total_it_each_epoch}, batch_size={batch_size}, "
                        f"time_cost(epoch): {tbar.format_interval(trained_time_each_epoch)}/"
                        f"{tbar.format_interval(remaining_second_each_epoch)}, "
                        f"time_cost(all): {tbar.format_interval(trained_time_past_all)}/"
                        f"{tbar.format_interval(remaining_second_all)}, {disp_str}"
                    )
                    if show_gpu_stat and accumulated_iter % (3 * logger_iter_interval) == 0:
                        # To show the GPU utilization, please install gpustat through
                        # "pip install gpustat"
                        gpu_info = os.popen("gpustat").read()
                        logger.info(gpu_info)
            else:
                pbar.update()
                pbar.set_postfix({"total_it": accumulated_iter})
                tbar.set_postfix(disp_dict)
            if tb_log is not None:
                tb_log.add_scalar("train/loss", loss.item(), accumulated_iter)
                for key, val in tb_dict.items():
                    tb_log.add_scalar("train/" + key, val, accumulated_iter)
            time_past_this_epoch = pbar.format_dict["elapsed"]
            if time_past_this_epoch // ckpt_save_time_interval >= ckpt_save_cnt:
                ckpt_name = ckpt_save_dir / "latest_model"
                save_checkpoint(
                    checkpoint_state(model, optimizer, cur_epoch, accumulated_iter),
                    filename=ckpt_name,
                )
                logger.info(f"Save latest model to {ckpt_name}")
                ckpt_save_cnt += 1
    if rank == 0:
        pbar.close()
    return accumulated_iter


def train_model(
    model,
    optimizer,
    train_loader,
    model_func,
    lr_scheduler,
    optim_cfg,
    start_epoch,
    total_epochs,
    start_iter,
    rank,
    tb_log,
    ckpt_save_dir,
    train_sampler=None,
    lr_warmup_scheduler=None,
    ckpt_save_interval=1,
    max_ckpt_save_num=50,
    use_amp=False,
    use_logger_to_record=False,
    logger=None,
    logger_iter_interval=None,
    ckpt_save_time_interval=None,
    show_gpu_stat=False,
):
    accumulated_iter = start_iter
    with tqdm.trange(
        start_epoch, total_epochs, desc="epochs", dynamic_ncols=True, leave=(rank == 0)
    ) as tbar:
        total_it_each_epoch = len(train_loader)
        dataloader_iter = iter(train_loader)
        for cur_epoch in tbar:
            if train_sampler is not None:
                train_sampler.set_epoch(cur_epoch)
            accumulated_iter = train_one_epoch(
                model,
                optimizer,
                train_loader,
                model_func,
                lr_scheduler=lr_scheduler,
                accumulated_iter=accumulated_iter,
                optim_cfg=optim_cfg,
                rank=rank,
                tbar=tbar,
                tb_log=tb_log,
                leave_pbar=(cur_epoch + 1 == total_epochs),
                total_it_each_epoch=total_it_each_epoch,
                dataloader_iter=dataloader_iter,
                cur_epoch=cur_epoch,
                total_epochs=total_epochs,
                use_logger_to_record=use_logger_to_record,
                logger=logger,
                logger_iter_interval=logger_iter_interval,
                ckpt_save_dir=ckpt_save_dir,
                ckpt_save_time_interval=ckpt_save_time_interval,
                show_gpu_stat=show_gpu_stat,
                use_amp=use_amp,
            )
            # save trained model
            trained_epoch = cur_epoch + 1
            if trained_epoch % ckpt_save_interval == 0 and rank == 0:
                ckpt_list = glob.glob(str(ckpt_save_dir / "checkpoint_epoch_*.pth"))
                ckpt_list.sort(key=os.path.getmtime)
                if ckpt_list.__len__() >= max_ckpt_save_num:
                    for cur_file_idx in range(0, len(ckpt_list) - max_ckpt_save_num + 1):
                        os.remove(ckpt_list[cur_file_idx])
                ckpt_name = ckpt_save_dir / (f"checkpoint_epoch_{trained_epoch}")
                save_checkpoint(
                    checkpoint_state(model, optimizer, trained_epoch, accumulated_iter),
                    filename=ckpt_name,
                )


def checkpoint_state(model=None, optimizer=None, epoch=None, it=None):
    optim_state = optimizer.state_dict() if optimizer is not None else None
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        model_state = {k: v.cpu() for k, v in model.module.state_dict().items()}
    else:
        model_state = model.state_dict()
    try:
        import pcdet  # type: ignore[import-not-found]

        version = "pcdet+" + pcdet.__version__
    except ImportError:
        version = "none"
    return {
        "epoch": epoch,
        "it": it,
        "model_state": model_state,
        "optimizer_state": optim_state,
        "version": version,
    }


def save_checkpoint(state, filename="checkpoint"):
    torch.save(state, f"{filename}.pth", _use_new_zipfile_serialization=False)


# ----------------------------------------------------------------------------- eval utils
def statistics_info(config, ret_dict, metric, disp_dict):
    for cur_thresh in config.MODEL.POST_PROCESSING.RECALL_THRESH_LIST:
        metric[f"recall_roi_{cur_thresh}"] += ret_dict.get(f"roi_{cur_thresh}", 0)
        metric[f"recall_rcnn_{cur_thresh}"] += ret_dict.get(f"rcnn_{cur_thresh}", 0)
    metric["gt_num"] += ret_dict.get("gt", 0)
    min_thresh = config.MODEL.POST_PROCESSING.RECALL_THRESH_LIST[0]
    disp_dict[f"recall_{min_thresh}"] = "({}, {}) / {}".format(
        metric[f"recall_roi_{min_thresh}"], metric[f"recall_rcnn_{min_thresh}"], metric["gt_num"]
    )


def eval_one_epoch(
    config, args, model, dataloader, epoch_id, logger, dist_test=False, result_dir=None
):
    result_dir.mkdir(parents=True, exist_ok=True)
    metric = {"gt_num": 0}
    for cur_thresh in config.MODEL.POST_PROCESSING.RECALL_THRESH_LIST:
        metric[f"recall_roi_{cur_thresh}"] = 0
        metric[f"recall_rcnn_{cur_thresh}"] = 0
    dataset = dataloader.dataset
    class_names = dataset.class_names
    det_annos = []
    logger.info(f"*************** EPOCH {epoch_id} EVALUATION *****************")
    if dist_test:
        model = torch.nn.parallel.DistributedDataParallel(model, broadcast_buffers=False)
    model.eval()
    if config.LOCAL_RANK == 0:
        progress_bar = tqdm.tqdm(total=len(dataloader), leave=True, desc="eval", dynamic_ncols=True)
    start_time = time.time()
    for batch_dict in dataloader:
        load_data_to_gpu(batch_dict)
        with torch.no_grad():
            pred_dicts, ret_dict = model(batch_dict)
        disp_dict = {}
        statistics_info(config, ret_dict, metric, disp_dict)
        det_annos += dataset.generate_prediction_dicts(batch_dict, pred_dicts, class_names)
        if config.LOCAL_RANK == 0:
            progress_bar.set_postfix(disp_dict)
            progress_bar.update()
    if config.LOCAL_RANK == 0:
        progress_bar.close()
    if dist_test:
        _, world_size = get_dist_info()
        det_annos = merge_results_dist(det_annos, len(dataset), tmpdir=result_dir / "tmpdir")
        metric = merge_results_dist([metric], world_size, tmpdir=result_dir / "tmpdir")
    logger.info(f"*************** Performance of EPOCH {epoch_id} *****************")
    sec_per_example = (time.time() - start_time) / len(dataloader.dataset)
    logger.info(f"Generate label finished(sec_per_example: {sec_per_example:.4f} second).")
    if config.LOCAL_RANK != 0:
        return {}
    ret_dict = {}
    if dist_test:
        for key in metric[0]:
            for k in range(1, world_size):
                metric[0][key] += metric[k][key]
        metric = metric[0]
    gt_num_cnt = metric["gt_num"]
    for cur_thresh in config.MODEL.POST_PROCESSING.RECALL_THRESH_LIST:
        cur_roi_recall = metric[f"recall_roi_{cur_thresh}"] / max(gt_num_cnt, 1)
        cur_rcnn_recall = metric[f"recall_rcnn_{cur_thresh}"] / max(gt_num_cnt, 1)
        logger.info(f"recall_roi_{cur_thresh}: {cur_roi_recall:f}")
        logger.info(f"recall_rcnn_{cur_thresh}: {cur_rcnn_recall:f}")
        ret_dict[f"recall/roi_{cur_thresh}"] = cur_roi_recall
        ret_dict[f"recall/rcnn_{cur_thresh}"] = cur_rcnn_recall
    total_pred_objects = sum(anno["name"].__len__() for anno in det_annos)
    logger.info(
        f"Average predicted number of objects({len(det_annos)} samples): "
        f"{total_pred_objects / max(1, len(det_annos)):.3f}"
    )
    with open(result_dir / "result.pkl", "wb") as f:
        pickle.dump(det_annos, f)
    result_str, result_dict = dataset.evaluation(det_annos, class_names)
    logger.info(result_str)
    ret_dict.update(result_dict)
    logger.info(f"Result is saved to {result_dir}")
    logger.info("****************Evaluation done.*****************")
    return ret_dict


def get_no_evaluated_ckpt(ckpt_dir, ckpt_record_file, args):
    ckpt_list = glob.glob(os.path.join(ckpt_dir, "*checkpoint_epoch_*.pth"))
    ckpt_list.sort(key=os.path.getmtime)
    evaluated_ckpt_list = [float(x) for x in Path(ckpt_record_file).read_text().split()]
    for cur_ckpt in ckpt_list:
        num_list = cur_ckpt.split("epoch_")[-1].replace(".pth", "")
        epoch_id = num_list
        if float(epoch_id) not in evaluated_ckpt_list and int(float(epoch_id)) >= args.start_epoch:
            return epoch_id, cur_ckpt
    return -1, None


def repeat_eval_ckpt(model, test_loader, args, eval_output_dir, logger, ckpt_dir, dist_test=False):
    ckpt_record_file = eval_output_dir / (
        "eval_list_{}.txt".format(cfg.DATA_CONFIG.DATA_SPLIT["test"])
    )
    with open(ckpt_record_file, "a"):
        pass
    if cfg.LOCAL_RANK == 0:
        tb_log = SummaryWriter(
            log_dir=str(
                eval_output_dir / ("tensorboard_{}".format(cfg.DATA_CONFIG.DATA_SPLIT["test"]))
            )
        )
    total_time = 0
    first_eval = True
    while True:
        cur_epoch_id, cur_ckpt = get_no_evaluated_ckpt(ckpt_dir, ckpt_record_file, args)
        if cur_epoch_id == -1 or int(float(cur_epoch_id)) < args.start_epoch:
            wait_second = 30
            if cfg.LOCAL_RANK == 0:
                print(
                    f"Wait {wait_second} seconds for next check (progress: "
                    f"{total_time * 1.0 / 60:.1f} / {args.max_waiting_mins} minutes): {ckpt_dir} \r",
                    end="",
                    flush=True,
                )
            time.sleep(wait_second)
            total_time += 30
            if total_time > args.max_waiting_mins * 60 and (first_eval is False):
                break
            continue
        total_time = 0
        first_eval = False
        model.load_params_from_file(filename=cur_ckpt, logger=logger, to_cpu=dist_test)
        cur_result_dir = (
            eval_output_dir / f"epoch_{cur_epoch_id}" / cfg.DATA_CONFIG.DATA_SPLIT["test"]
        )
        tb_dict = eval_one_epoch(
            cfg,
            args,
            model,
            test_loader,
            cur_epoch_id,
            logger,
            dist_test=dist_test,
            result_dir=cur_result_dir,
        )
        if cfg.LOCAL_RANK == 0:
            for key, val in tb_dict.items():
                tb_log.add_scalar(key, val, cur_epoch_id)
        with open(ckpt_record_file, "a") as f:
            print(f"{cur_epoch_id}", file=f)
        logger.info(f"Epoch {cur_epoch_id} has been evaluated")


# ----------------------------------------------------------------------------- train.py
def parse_config():
    parser = argparse.ArgumentParser(description="arg parser")
    parser.add_argument(
        "--cfg_file", type=str, default=None, help="specify the config for training"
    )
    parser.add_argument(
        "--batch_size", type=int, default=None, required=False, help="batch size for training"
    )
    parser.add_argument(
        "--epochs", type=int, default=None, required=False, help="number of epochs to train for"
    )
    parser.add_argument("--workers", type=int, default=4, help="number of workers for dataloader")
    parser.add_argument(
        "--extra_tag", type=str, default="default", help="extra tag for this experiment"
    )
    parser.add_argument("--ckpt", type=str, default=None, help="checkpoint to start from")
    parser.add_argument("--pretrained_model", type=str, default=None, help="pretrained_model")
    parser.add_argument("--launcher", choices=["none", "pytorch", "slurm"], default="none")
    parser.add_argument(
        "--tcp_port", type=int, default=18888, help="tcp port for distrbuted training"
    )
    parser.add_argument(
        "--sync_bn", action="store_true", default=False, help="whether to use sync bn"
    )
    parser.add_argument("--fix_random_seed", action="store_true", default=False, help="")
    parser.add_argument(
        "--ckpt_save_interval", type=int, default=1, help="number of training epochs"
    )
    parser.add_argument(
        "--local_rank", type=int, default=None, help="local rank for distributed training"
    )
    parser.add_argument(
        "--max_ckpt_save_num", type=int, default=30, help="max number of saved checkpoint"
    )
    parser.add_argument(
        "--merge_all_iters_to_one_epoch", action="store_true", default=False, help=""
    )
    parser.add_argument(
        "--set",
        dest="set_cfgs",
        default=None,
        nargs=argparse.REMAINDER,
        help="set extra config keys if needed",
    )
    parser.add_argument("--max_waiting_mins", type=int, default=0, help="max waiting minutes")
    parser.add_argument("--start_epoch", type=int, default=0, help="")
    parser.add_argument(
        "--num_epochs_to_eval", type=int, default=0, help="number of checkpoints to be evaluated"
    )
    parser.add_argument("--save_to_file", action="store_true", default=False, help="")
    parser.add_argument(
        "--use_tqdm_to_record",
        action="store_true",
        default=False,
        help="if True, the intermediate losses will not be logged to file, only tqdm will be used",
    )
    parser.add_argument("--logger_iter_interval", type=int, default=50, help="")
    parser.add_argument(
        "--ckpt_save_time_interval", type=int, default=300, help="in terms of seconds"
    )
    parser.add_argument("--wo_gpu_stat", action="store_true", help="")
    parser.add_argument("--use_amp", action="store_true", help="use mix precision training")
    args = parser.parse_args()
    cfg_from_yaml_file(args.cfg_file, cfg)
    cfg.TAG = Path(args.cfg_file).stem
    cfg.EXP_GROUP_PATH = "/".join(args.cfg_file.split("/")[1:-1])  # remove 'cfgs' and 'xxxx.yaml'
    args.use_amp = args.use_amp or cfg.OPTIMIZATION.get("USE_AMP", False)
    if args.set_cfgs is not None:
        cfg_from_list(args.set_cfgs, cfg)
    return args, cfg


def main():
    if "--prepare" in sys.argv:  # the repo's configs and the data (create_kitti_infos)
        p = argparse.ArgumentParser(description="write the configs and the synthetic KITTI data")
        p.add_argument("--prepare", action="store_true")
        p.add_argument("--num_train", type=int, default=160)
        p.add_argument("--num_val", type=int, default=40)
        a = p.parse_args()
        prepare(a.num_train, a.num_val)
        return
    args, cfg = parse_config()
    if args.local_rank is None:
        args.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if args.launcher == "none":
        dist_train = False
        total_gpus = 1
    else:
        total_gpus, cfg.LOCAL_RANK = init_dist_pytorch(args.tcp_port, args.local_rank)
        dist_train = True

    if args.batch_size is None:
        args.batch_size = cfg.OPTIMIZATION.BATCH_SIZE_PER_GPU
    else:
        assert args.batch_size % total_gpus == 0, "Batch size should match the number of gpus"
        args.batch_size = args.batch_size // total_gpus

    args.epochs = cfg.OPTIMIZATION.NUM_EPOCHS if args.epochs is None else args.epochs

    if args.fix_random_seed:
        set_random_seed(666 + cfg.LOCAL_RANK)

    output_dir = cfg.ROOT_DIR / "output" / cfg.EXP_GROUP_PATH / cfg.TAG / args.extra_tag
    ckpt_dir = output_dir / "ckpt"
    output_dir.mkdir(parents=True, exist_ok=True)
    ckpt_dir.mkdir(parents=True, exist_ok=True)

    log_file = output_dir / (
        "log_train_{}.txt".format(datetime.datetime.now().strftime("%Y%m%d-%H%M%S"))
    )
    logger = create_logger(log_file, rank=cfg.LOCAL_RANK)

    # log to file
    logger.info("**********************Start logging**********************")
    gpu_list = os.environ.get("CUDA_VISIBLE_DEVICES", "ALL")
    logger.info(f"CUDA_VISIBLE_DEVICES={gpu_list}")

    if dist_train:
        logger.info(f"total_batch_size: {total_gpus * args.batch_size}")
    for key, val in vars(args).items():
        logger.info(f"{key:16} {val}")
    log_config_to_file(cfg, logger=logger)
    if cfg.LOCAL_RANK == 0:
        shutil.copy(args.cfg_file, output_dir)

    tb_log = SummaryWriter(log_dir=str(output_dir / "tensorboard")) if cfg.LOCAL_RANK == 0 else None

    # -----------------------create dataloader & network & optimizer---------------------------
    train_set, train_loader, train_sampler = build_dataloader(
        dataset_cfg=cfg.DATA_CONFIG,
        class_names=cfg.CLASS_NAMES,
        batch_size=args.batch_size,
        dist_train=dist_train,
        workers=args.workers,
        logger=logger,
        training=True,
        seed=666 if args.fix_random_seed else None,
    )

    model = PointPillar(model_cfg=cfg.MODEL, num_class=len(cfg.CLASS_NAMES), dataset=train_set)
    if args.sync_bn:
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)

    optimizer = build_optimizer(model, cfg.OPTIMIZATION)

    # load checkpoint if it is possible
    start_epoch = it = 0
    last_epoch = -1
    if args.pretrained_model is not None:
        model.load_params_from_file(
            filename=args.pretrained_model, to_cpu=dist_train, logger=logger
        )

    if args.ckpt is not None:
        it, start_epoch = model.load_params_with_optimizer(
            args.ckpt, to_cpu=dist_train, optimizer=optimizer, logger=logger
        )
        last_epoch = start_epoch + 1
    else:
        ckpt_list = glob.glob(str(ckpt_dir / "*.pth"))
        if len(ckpt_list) > 0:
            ckpt_list.sort(key=os.path.getmtime)
            while len(ckpt_list) > 0:
                try:
                    it, start_epoch = model.load_params_with_optimizer(
                        ckpt_list[-1], to_cpu=dist_train, optimizer=optimizer, logger=logger
                    )
                    last_epoch = start_epoch + 1
                    break
                except Exception:
                    ckpt_list = ckpt_list[:-1]

    model.train()  # before wrap to DistributedDataParallel to support fixed some parameters
    if dist_train:
        model = nn.parallel.DistributedDataParallel(model)
    logger.info(model)

    lr_scheduler, lr_warmup_scheduler = build_scheduler(
        optimizer,
        total_iters_each_epoch=len(train_loader),
        total_epochs=args.epochs,
        last_epoch=last_epoch,
        optim_cfg=cfg.OPTIMIZATION,
    )

    # -----------------------start training---------------------------
    logger.info(
        f"**********************Start training {cfg.EXP_GROUP_PATH}/{cfg.TAG}({args.extra_tag})**********************"
    )

    train_model(
        model,
        optimizer,
        train_loader,
        model_func=model_fn_decorator(),
        lr_scheduler=lr_scheduler,
        optim_cfg=cfg.OPTIMIZATION,
        start_epoch=start_epoch,
        total_epochs=args.epochs,
        start_iter=it,
        rank=cfg.LOCAL_RANK,
        tb_log=tb_log,
        ckpt_save_dir=ckpt_dir,
        train_sampler=train_sampler,
        lr_warmup_scheduler=lr_warmup_scheduler,
        ckpt_save_interval=args.ckpt_save_interval,
        max_ckpt_save_num=args.max_ckpt_save_num,
        logger=logger,
        logger_iter_interval=args.logger_iter_interval,
        ckpt_save_time_interval=args.ckpt_save_time_interval,
        use_logger_to_record=not args.use_tqdm_to_record,
        show_gpu_stat=not args.wo_gpu_stat,
        use_amp=args.use_amp,
    )
    if dist_train:
        dist.barrier()  # the evaluation below looks for rank 0's last checkpoint

    logger.info(
        f"**********************End training {cfg.EXP_GROUP_PATH}/{cfg.TAG}({args.extra_tag})**********************\n\n\n"
    )

    logger.info(
        f"**********************Start evaluation {cfg.EXP_GROUP_PATH}/{cfg.TAG}({args.extra_tag})**********************"
    )
    _, test_loader, _ = build_dataloader(
        dataset_cfg=cfg.DATA_CONFIG,
        class_names=cfg.CLASS_NAMES,
        batch_size=args.batch_size,
        dist_train=dist_train,
        workers=args.workers,
        logger=logger,
        training=False,
    )
    eval_output_dir = output_dir / "eval" / "eval_with_train"
    eval_output_dir.mkdir(parents=True, exist_ok=True)
    # Only evaluate the last args.num_epochs_to_eval epochs
    args.start_epoch = max(args.epochs - args.num_epochs_to_eval, 0)

    repeat_eval_ckpt(
        model.module if dist_train else model,
        test_loader,
        args,
        eval_output_dir,
        logger,
        ckpt_dir,
        dist_test=dist_train,
    )
    logger.info(
        f"**********************End evaluation {cfg.EXP_GROUP_PATH}/{cfg.TAG}({args.extra_tag})**********************"
    )


if __name__ == "__main__":
    main()
