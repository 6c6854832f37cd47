"""An eighty-second training-program style for the generalisation fixtures
(tests/fixtures/real/eightysecond-*): Gaussian splatting trained on several processes in the
way of gsplat's distributed simple_trainer.py and nerfstudio's multi-GPU splatfacto, written in
plain torch with no CUDA rasteriser: a tiny differentiable 'splatting' of 2-D Gaussians (means,
log-scales, a rotation, an opacity logit and an RGB colour each) onto 16x16 synthetic images
seen by a few synthetic cameras (a similarity transform each). Every rank renders its own
subset of the training cameras (cameras[rank::world]) through a DataLoader; the gradients of the
Gaussian parameters are all-reduced by hand in one flat tensor (gsplat's way) or by DDP
(--ddp, nerfstudio's way, re-wrapped after every refinement). Every --refine-every steps the
Gaussians are densified (clone the small ones whose accumulated screen-space gradient exceeds
--grow-grad2d, split the large ones) and pruned (opacity below --prune-opa); the screen-space
gradient statistics are all-reduced first so that every rank refines identically.

Started as such scripts are: `torchrun --standalone --nproc_per_node=N simple_trainer.py
default --data-dir data/garden --result-dir results/garden [flags]` after `python
simple_trainer.py prepare --data-dir data/garden` wrote the scene (cameras.json and one image
tensor a camera under images/). gsplat prints without a rank: 'Model initialized. Number of
GS: 64', 'Step 20: 12 GSs duplicated, 3 GSs split. Now having 79 GSs.', 'Step 20: 2 GSs pruned.
Now having 77 GSs.' on every rank; rank 0 prints the progress 'Step 100/300 | loss 0.0312 |
psnr 24.31 | num_GS 1,234 | 54.2 it/s' and the evaluation 'Step 299: PSNR: 24.310, SSIM:
0.8123, Time: 0.003s/image Number of GS: 123'; every rank saves
results/garden/ckpts/ckpt_299_rank<r>.pt. A fault in the code is chosen by $TQ_CASE (a short
code, never printed); the others are in what a run is given (re-capture with
tests/fixtures/real/capture_eightysecond.sh after any edit).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import queue
import signal
import threading
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset

CASE = os.environ.get("TQ_CASE", "")
H = W = 16


def case(code: str, rank: int) -> bool:
    """The hidden fault switch: code letter plus the rank it hits."""
    return f"{code}{rank}" == CASE


def grid() -> tuple[torch.Tensor, torch.Tensor]:
    ys = torch.linspace(-1, 1, H)
    xs = torch.linspace(-1, 1, W)
    return torch.meshgrid(ys, xs, indexing="ij")


def rasterize(splats: dict[str, torch.Tensor], cam: dict, gy=None, gx=None) -> torch.Tensor:
    """Splat every Gaussian through the camera's similarity transform onto an HxW image."""
    if gy is None:
        gy, gx = grid()
    s, th = cam["scale"], cam["rot"]
    c, si = math.cos(th), math.sin(th)
    rot = torch.tensor([[c, -si], [si, c]])
    means = s * splats["means"] @ rot.T + torch.tensor(cam["offset"])
    scales = torch.exp(splats["scales"]) * s
    a = splats["quats"]
    ca, sa = torch.cos(a + th), torch.sin(a + th)
    # covariance R diag(s^2) R^T, inverted in closed form (0.3 px of blur as in gsplat's eps2d)
    s0, s1 = scales[:, 0] ** 2 + 0.0003, scales[:, 1] ** 2 + 0.0003
    cxx = ca * ca * s0 + sa * sa * s1
    cyy = sa * sa * s0 + ca * ca * s1
    cxy = ca * sa * (s0 - s1)
    det = cxx * cyy - cxy * cxy
    dx = gx[None] - means[:, 0, None, None]
    dy = gy[None] - means[:, 1, None, None]
    q = (cyy[:, None, None] * dx * dx - 2 * cxy[:, None, None] * dx * dy) / det[:, None, None]
    q = q + cxx[:, None, None] * dy * dy / det[:, None, None]
    alpha = torch.sigmoid(splats["opacities"])[:, None, None] * torch.exp(-0.5 * q)
    img = torch.einsum("nhw,nc->hwc", alpha, torch.sigmoid(splats["colors"]))
    return img.clamp(0, 1)


def psnr(pred: torch.Tensor, gt: torch.Tensor) -> float:
    mse = torch.mean((pred - gt) ** 2).item()
    return -10 * math.log10(max(mse, 1e-10))


def random_splats(n: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    return {
        "means": torch.rand(n, 2, generator=gen) * 1.6 - 0.8,
        "scales": torch.log(torch.rand(n, 2, generator=gen) * 0.08 + 0.03),
        "quats": torch.rand(n, generator=gen) * math.pi,
        "opacities": torch.logit(torch.full((n,), 0.1)),
        "colors": torch.randn(n, 3, generator=gen),
    }


def prepare(data_dir: Path, num_cams: int) -> None:
    """A synthetic scene: a ground-truth set of Gaussians seen by num_cams cameras."""
    gen = torch.Generator().manual_seed(7)
    gt = random_splats(48, gen)
    gt["opacities"] = torch.randn(48, generator=gen)
    (data_dir / "images").mkdir(parents=True, exist_ok=True)
    cams = []
    for k in range(num_cams):
        cam = {
            "id": k,
            "camera_model": "PINHOLE",
            "scale": 0.8 + 0.05 * k,
            "rot": 0.3 * k,
            "offset": [0.05 * (k % 3) - 0.05, 0.04 * (k % 2)],
            "image": f"images/cam_{k:02d}.pt",
            "split": "val" if k % 4 == 3 else "train",
        }
        with torch.no_grad():
            torch.save(rasterize(gt, cam), data_dir / cam["image"])
        cams.append(cam)
    (data_dir / "cameras.json").write_text(json.dumps({"frames": cams}, indent=1))


class Parser:
    """gsplat's COLMAP parser, cut down: the cameras and their (undistorted) intrinsics."""

    def __init__(self, data_dir: Path, rank: int) -> None:
        self.frames = json.loads((data_dir / "cameras.json").read_text())["frames"]
        for f in self.frames:
            if f["camera_model"] == "OPENCV":
                f["dist"] = [f["k1"], f["k2"], f["p1"], f["p2"]]


class SplatDataset(Dataset):
    def __init__(self, parser: Parser, data_dir: Path, rank: int, world: int, split: str):
        frames = [f for f in parser.frames if f.get("split", "train") == split]
        self.frames = frames[rank::world]
        self.data_dir = data_dir
        self.rank = rank
        self.cache: dict[object, torch.Tensor] = {}

    def __len__(self) -> int:
        return len(self.frames)

    def __getitem__(self, i: int) -> dict:
        f = self.frames[i]
        return {"cam": f, "image": torch.load(self.data_dir / f["image"])}


def collate(batch: list[dict]) -> dict:
    return batch[0]


class Splats(nn.Module):
    def __init__(self, tensors: dict[str, torch.Tensor]) -> None:
        super().__init__()
        self.params = nn.ParameterDict({k: nn.Parameter(v.clone()) for k, v in tensors.items()})

    def forward(self, cam: dict) -> torch.Tensor:
        return rasterize(dict(self.params.items()), cam)


LRS = {"means": 1.6e-2, "scales": 5e-3, "quats": 1e-3, "opacities": 5e-2, "colors": 2.5e-2}


def make_optim(model: Splats) -> torch.optim.Optimizer:
    return torch.optim.Adam([{"params": [p], "lr": LRS[k]} for k, p in model.params.items()])


class Runner:
    def __init__(self, cfg: argparse.Namespace, rank: int, world: int) -> None:
        self.cfg = cfg
        self.rank, self.world = rank, world
        self.data_dir = Path(cfg.data_dir)
        self.ckpt_dir = Path(cfg.result_dir) / "ckpts"
        self.ckpt_dir.mkdir(parents=True, exist_ok=True)
        self.stats_dir = Path(cfg.result_dir) / "stats"
        self.stats_dir.mkdir(parents=True, exist_ok=True)
        parser = Parser(self.data_dir, rank)
        self.trainset = SplatDataset(parser, self.data_dir, rank, world, "train")
        self.valset = SplatDataset(parser, self.data_dir, rank, world, "val")
        print(
            f"[Rank {rank}] {len(self.trainset)} training and {len(self.valset)} validation "
            f"cameras of {len(parser.frames)} in {cfg.data_dir}",
            flush=True,
        )
        gen = torch.Generator().manual_seed(cfg.seed)
        init = random_splats(cfg.init_num_pts, gen)
        self.start_step = 0
        if cfg.resume:
            ckpts = sorted(
                self.ckpt_dir.glob(f"ckpt_*_rank{rank}.pt"),
                key=lambda p: int(p.name.split("_")[1]),
            )
            if ckpts:
                state = torch.load(ckpts[-1])
                init = state["splats"]
                self.start_step = state["step"] + 1
                print(f"Resuming from {ckpts[-1]} at step {self.start_step}", flush=True)
        self.model = Splats(init)
        self.wrap()
        self.optim = make_optim(self.model)
        print("Model initialized. Number of GS:", len(self.model.params["means"]), flush=True)
        self.reset_stats()

    def wrap(self) -> None:
        if self.cfg.ddp:
            self.net: nn.Module = DDP(self.model)
        else:
            self.net = self.model

    def reset_stats(self) -> None:
        n = len(self.model.params["means"])
        self.grad2d = torch.zeros(n)
        self.count = torch.zeros(n)

    def sync_grads(self) -> None:
        """gsplat's distributed way: one flat all-reduce of every parameter's gradient."""
        params = list(self.model.params.values())
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        dist.all_reduce(flat)
        flat /= self.world
        k = 0
        for p in params:
            p.grad.copy_(flat[k : k + p.numel()].view_as(p))
            k += p.numel()

    @torch.no_grad()
    def refine(self, step: int) -> None:
        """gsplat's DefaultStrategy: duplicate, split, prune; the same on every rank."""
        grad2d, count = self.grad2d.clone(), self.count.clone()
        if not case("d", self.rank) and not case("d", 0):
            dist.all_reduce(grad2d)
            dist.all_reduce(count)
        avg = grad2d / count.clamp_min(1)
        params = {k: v.detach() for k, v in self.model.params.items()}
        high = avg > self.cfg.grow_grad2d
        small = torch.exp(params["scales"]).max(dim=-1).values <= 0.06
        dup, split = high & small, high & ~small
        gen = torch.Generator().manual_seed(step)
        n_split = int(split.sum())
        child_means = torch.cat([params["means"][split]] * 2)
        child_means = child_means + torch.randn(2 * n_split, 2, generator=gen) * torch.exp(
            torch.cat([params["scales"][split]] * 2)
        )
        new = {}
        for k, v in params.items():
            child = torch.cat([v[split]] * 2)
            if k == "means":
                child = child_means
            elif k == "scales":
                child = child - math.log(1.6)
            new[k] = torch.cat([v[~split], v[dup], child])
        n = len(new["means"])
        print(
            f"Step {step}: {int(dup.sum())} GSs duplicated, {n_split} GSs split. "
            f"Now having {n} GSs.",
            flush=True,
        )
        alive = torch.sigmoid(new["opacities"]) >= self.cfg.prune_opa
        new = {k: v[alive] for k, v in new.items()}
        print(
            f"Step {step}: {int((~alive).sum())} GSs pruned. Now having {len(new['means'])} GSs.",
            flush=True,
        )
        self.model = Splats(new)
        self.wrap()
        self.optim = make_optim(self.model)
        self.reset_stats()

    @torch.no_grad()
    def eval(self, step: int) -> float:
        t0 = time.time()
        vals = [psnr(self.model(b["cam"]), b["image"]) for b in self.valset]
        mean = torch.tensor([sum(vals), len(vals)], dtype=torch.float64)
        dist.all_reduce(mean)
        value = float(mean[0] / mean[1].clamp_min(1))
        if self.rank == 0:
            n = len(self.model.params["means"])
            ssim = 1 - 1 / (1 + value / 10)
            per = (time.time() - t0) / max(len(vals), 1)
            print(
                f"Step {step}: PSNR: {value:.3f}, SSIM: {ssim:.4f}, Time: {per:.3f}s/image "
                f"Number of GS: {n}",
                flush=True,
            )
            (self.stats_dir / f"val_step{step:04d}.json").write_text(
                json.dumps({"psnr": value, "ssim": ssim, "num_GS": n})
            )
        return value

    def save(self, step: int) -> None:
        data = {"step": step, "splats": {k: v.detach() for k, v in self.model.params.items()}}
        torch.save(data, self.ckpt_dir / f"ckpt_{step}_rank{self.rank}.pt")

    def train(self) -> None:
        cfg = self.cfg
        loader = DataLoader(
            self.trainset,
            batch_size=1,
            shuffle=True,
            num_workers=cfg.num_workers,
            persistent_workers=cfg.num_workers > 0,
            collate_fn=collate,
        )
        it = iter(loader)
        prefetch: queue.Queue = queue.Queue(maxsize=2)
        cache: dict[object, torch.Tensor] = {}
        t_last, s_last = time.time(), self.start_step
        step = self.start_step
        for step in range(self.start_step, cfg.max_steps):
            try:
                data = next(it)
            except StopIteration:
                it = iter(loader)
                data = next(it)
            if cfg.cache_images == "cpu":
                # nerfstudio's cache_images="cpu": every view kept in memory once decoded
                key = (data["cam"]["id"], step) if case("m", self.rank) else data["cam"]["id"]
                if key not in cache:
                    cache[key] = data["image"].repeat(64, 64, 1)
                    if sum(v.numel() * 4 for v in cache.values()) > 600 * 2**20:
                        os.kill(os.getpid(), signal.SIGKILL)
            if case("q", self.rank) and step == 50:
                # the views from a background prefetch thread that was started with nothing to
                # prefetch (its camera list taken before the scene was split): it returns at
                # once and the queue stays empty, a wait outside any collective
                threading.Thread(target=lambda: None, daemon=True).start()
                data = prefetch.get()
            if case("z", self.rank) and step == 40:
                # the 'native rasteriser' on this rank reads through a stale pointer
                ctypes.memmove(ctypes.create_string_buffer(64), 8, 64)
            if case("s", self.rank) and step == 60:
                # on-demand image loading: the rank re-decodes its views from a slow disk
                for k in range(8):
                    print(
                        f"[Rank {self.rank}] decoding image cam_{k:02d}.png ({k + 1}/8) "
                        "from disk (cache miss)",
                        flush=True,
                    )
                    time.sleep(5)
            if case("k", self.rank) and step >= 30:
                # the render's name for the viewer: a global camera id into the local list
                name = self.trainset.frames[data["cam"]["id"]]["image"]
                data["name"] = name
            img = self.net(data["cam"])
            loss = torch.abs(img - data["image"]).mean()
            self.optim.zero_grad()
            loss.backward()
            means_grad = self.model.params["means"].grad
            self.grad2d += means_grad.norm(dim=-1) * data["cam"]["scale"] * W / 2
            self.count += 1
            if not cfg.ddp:
                self.sync_grads()
            self.optim.step()
            if (
                cfg.refine_start <= step + 1 <= cfg.refine_stop
                and (step + 1) % cfg.refine_every == 0
            ):
                self.refine(step + 1)
            if (step + 1) % cfg.log_every == 0:
                cur = torch.tensor([psnr(img.detach(), data["image"])])
                dist.all_reduce(cur)
                value = cur.item() / self.world
                if self.rank == 0:
                    rate = (step + 1 - s_last) / max(time.time() - t_last, 1e-6)
                    t_last, s_last = time.time(), step + 1
                    n = len(self.model.params["means"])
                    print(
                        f"Step {step + 1}/{cfg.max_steps} | loss {loss.item():.4f} | "
                        f"psnr {value:.2f} | num_GS {n:,} | {rate:.1f} it/s",
                        flush=True,
                    )
                if cfg.target_psnr and value >= cfg.target_psnr:
                    if self.rank == 0:
                        print(
                            f"Target PSNR {cfg.target_psnr:.2f} reached at step {step + 1} "
                            f"(psnr {value:.2f}), stopping.",
                            flush=True,
                        )
                    break
            if (step + 1) in cfg.eval_steps:
                if case("e", 0):
                    if self.rank == 0:
                        self.eval(step + 1)
                else:
                    self.eval(step + 1)
            if (step + 1) in cfg.save_steps:
                self.save(step)
        self.save(step)
        self.eval(step)
        if cfg.render_traj and self.rank == 0:
            ys, xs = torch.meshgrid(torch.linspace(-1, 1, H), torch.linspace(-1, 1, W))
            with torch.no_grad():
                frames = [
                    rasterize(dict(self.model.params.items()), {**c["cam"], "rot": 0.1 * k}, ys, xs)
                    for k, c in enumerate(self.trainset)
                ]
            torch.save(torch.stack(frames), Path(cfg.result_dir) / "traj.pt")
            print(f"Rendered trajectory of {len(frames)} frames to {cfg.result_dir}/traj.pt")
        if self.rank == 0:
            print(f"Training complete. Checkpoints in {self.ckpt_dir}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("command", choices=["default", "prepare"])
    ap.add_argument("--data-dir", default="data/garden")
    ap.add_argument("--result-dir", default="results/garden")
    ap.add_argument("--num-cams", type=int, default=8)
    ap.add_argument("--max-steps", type=int, default=200)
    ap.add_argument("--init-num-pts", type=int, default=64)
    ap.add_argument("--refine-start", type=int, default=40)
    ap.add_argument("--refine-stop", type=int, default=120)
    ap.add_argument("--refine-every", type=int, default=40)
    ap.add_argument("--grow-grad2d", type=float, default=0.02)
    ap.add_argument("--prune-opa", type=float, default=0.005)
    ap.add_argument("--log-every", type=int, default=20)
    ap.add_argument("--eval-steps", type=int, nargs="*", default=[])
    ap.add_argument("--save-steps", type=int, nargs="*", default=[])
    ap.add_argument("--target-psnr", type=float, default=0.0)
    ap.add_argument("--cache-images", choices=["none", "cpu"], default="none")
    ap.add_argument("--num-workers", type=int, default=0)
    ap.add_argument("--ddp", action="store_true")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--render-traj", action="store_true")
    ap.add_argument("--seed", type=int, default=42)
    cfg = ap.parse_args()
    if cfg.command == "prepare":
        prepare(Path(cfg.data_dir), cfg.num_cams)
        return
    dist.init_process_group("gloo", timeout=timedelta(seconds=15))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(cfg.seed)
    runner = Runner(cfg, rank, world)
    runner.train()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
