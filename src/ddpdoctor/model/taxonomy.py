"""The failure kinds and categories of ../shared/taxonomy.md (v1). Slugs are a public contract:
never rename or reuse one. Owns the default category of each kind; nothing else."""

from __future__ import annotations

from enum import StrEnum


class Category(StrEnum):
    USER_CODE = "user-code"
    CONFIGURATION = "configuration"
    ENVIRONMENT = "environment"
    RESOURCE = "resource"
    INFRASTRUCTURE = "infrastructure"
    INTENDED_EXIT = "intended-exit"
    PERFORMANCE = "performance"
    UNKNOWN = "unknown"


class Status(StrEnum):
    FAILED = "failed"
    HUNG = "hung"
    SLOW = "slow"
    OK = "ok"
    UNKNOWN = "unknown"


class Role(StrEnum):
    ROOT = "root"
    CASCADE = "cascade"
    CONTEXT = "context"


C = Category
KIND_DEFAULT_CATEGORY: dict[str, Category] = {
    "ddp-unused-parameters": C.USER_CODE,
    "ddp-mark-ready-twice": C.USER_CODE,
    "ddp-grad-strides": C.PERFORMANCE,
    "ddp-model-mismatch": C.USER_CODE,
    "collective-mismatch": C.USER_CODE,
    "uneven-inputs": C.USER_CODE,
    "slow-rank-timeout": C.CONFIGURATION,
    "nccl-timeout": C.UNKNOWN,
    "cuda-oom": C.RESOURCE,
    "checkpoint-load-device": C.USER_CODE,
    "host-oom": C.RESOURCE,
    "device-side-assert": C.USER_CODE,
    "dataloader-worker-killed": C.ENVIRONMENT,
    "dataloader-cuda-fork": C.USER_CODE,
    "cuda-library-mismatch": C.ENVIRONMENT,
    "local-rank-argument": C.CONFIGURATION,
    "launcher-env-missing": C.CONFIGURATION,
    "entrypoint-not-found": C.CONFIGURATION,
    "device-assignment": C.CONFIGURATION,
    "nccl-network": C.INFRASTRUCTURE,
    "nccl-p2p": C.INFRASTRUCTURE,
    "nccl-socket-interface": C.CONFIGURATION,
    "rendezvous-failure": C.CONFIGURATION,
    "gpu-hardware": C.INFRASTRUCTURE,
    "process-group-not-initialized": C.USER_CODE,
    "uncoordinated-exit": C.USER_CODE,
    "early-stop": C.INTENDED_EXIT,
    "exit-teardown-crash": C.INTENDED_EXIT,
    "preempted": C.INTENDED_EXIT,
    "data-error": C.USER_CODE,
    "disk-full": C.RESOURCE,
    "missing-module": C.ENVIRONMENT,
    "weights-only-load": C.USER_CODE,
    "native-crash": C.UNKNOWN,
    "zero3-multinode-slow": C.PERFORMANCE,
    "python-exception": C.USER_CODE,
    "hang": C.UNKNOWN,
}

KINDS: frozenset[str] = frozenset(KIND_DEFAULT_CATEGORY)


def default_category(kind: str) -> Category:
    """The taxonomy's category for a kind; unknown kinds fall back to `unknown`."""
    return KIND_DEFAULT_CATEGORY.get(kind, Category.UNKNOWN)
