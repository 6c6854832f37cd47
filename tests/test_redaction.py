"""The redaction module on its own: the declared table of secret formats, what a masked secret
still shows, near misses that must stay as they are (real logs included), terminal control
sequences, JSON-like values (env, argv) and matching time linear in the length of the text."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from ddpdoctor.redaction import (
    CONTROL,
    MASK,
    SECRET_FORMATS,
    _masker,
    clean_text,
    clean_value,
    is_secret_name,
    redact,
    strip_controls,
)
from tests.conftest import CORPUS, tier_sample

REPO = Path(__file__).resolve().parents[1]
REAL_LOG_ROOTS = [
    REPO / "tests" / "fixtures" / "real",
    REPO / "src" / "ddpdoctor" / "scenarios" / "captured",
    CORPUS,
]


def test_table_declares_at_least_40_formats_with_unique_names() -> None:
    names = [f.name for f in SECRET_FORMATS]
    assert len(names) >= 40
    assert len(set(names)) == len(names)


@pytest.mark.parametrize("fmt", SECRET_FORMATS, ids=lambda f: f.name)
def test_each_example_is_masked(fmt: object) -> None:
    from ddpdoctor.redaction import SecretFormat

    assert isinstance(fmt, SecretFormat)
    assert fmt.secret in fmt.example  # the table's own example holds what it claims
    assert fmt.pattern.search(fmt.example), "the format's own regex must find its example"
    out = redact(fmt.example)
    assert fmt.secret not in out
    assert MASK in out
    assert redact(out) == out  # masking twice changes nothing


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("token hf_ErQHQwjyaxErPZDS3MoJaQNjCxkv5ndK0m", "token hf_****"),
        (
            "clone https://ci-bot:ghp_eGR0vRzZ1fb6d06QGofB8ChQBiIu4NJkS4dJ@github.com/a/b.git",
            "clone https://ci-bot:****@github.com/a/b.git",
        ),
        ("postgres://user:RndQyvgqizEdvPUe@db:5432/x", "postgres://user:****@db:5432/x"),
        ("HF_TOKEN=hf_ErQHQwjyaxErPZDS3MoJaQNjCxkv5ndK0m", "HF_TOKEN=****"),
        (
            "export WANDB_API_KEY='f545fad3549e310f117a095dd2a31f31fd9ffd7f'",
            "export WANDB_API_KEY='****'",
        ),
        ("key AKIAIOSFODNN7EXAMPLE used", "key AKIA**** used"),
        ("Authorization: Bearer abc.def-ghi_jkl", "Authorization: Bearer ****"),
        ("Authorization: Basic dXNlcjpwYXNzd29yZA==", "Authorization: Basic ****"),
        (
            "--hub_token hf_ErQHQwjyaxErPZDS3MoJaQNjCxkv5ndK0m --push_to_hub",
            "--hub_token **** --push_to_hub",
        ),
        ("--password=hunter2hunter2", "--password=****"),
        ("Namespace(hub_token='abc123def456', lr=0.1)", "Namespace(hub_token='****', lr=0.1)"),
        ('{"api_key": "abc123def456", "model": "gpt2"}', '{"api_key": "****", "model": "gpt2"}'),
        ("DB_PASSWORD=s3cr3t-pa55, retrying", "DB_PASSWORD=****, retrying"),
        (
            "?X-Amz-Signature=c8fb665bf2491b78&X-Amz-Date=20250101",
            "?X-Amz-Signature=****&X-Amz-Date=20250101",
        ),
        ("xoxb-69163985569-2020016836153-tr7YSRIFNNhnIMSRzLpeAwuf", "xoxb-****"),
    ],
)
def test_masked_secret_still_says_what_it_was(text: str, expected: str) -> None:
    assert redact(text) == expected


NEAR_MISSES = [
    # git commit ids and digests: 40 or 64 hex chars, like a W&B key but not named as one
    "commit 38079c47cc5a79da2ac9943732b60488e0eb4269 (HEAD -> main)",
    "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
    "Downloading shards: revision=7c8b3f2e9a1d4c6b5e0f8a7d2c1b9e3f4a6d8c0b",
    # tensor shapes, NCCL addresses, pids, ports, timeouts
    "RuntimeError: shape '[32, 3, 224, 224]' is invalid for input of size 4816896",
    "NCCL INFO NET/Socket : Using [0]eth0:10.0.0.1<0>",
    "NCCL INFO Bootstrap : Using eth0:10.1.2.3<29500>",
    "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE, "
    "NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600012 milliseconds before timing out.",
    "failed (exitcode: 1) local_rank: 0 (pid: 20252) of binary: /work/main/.venv/bin/python3",
    "rendezvous: c10d://node0.cluster.local:29400 tcp://10.0.0.1:23456 env:// run_id=abc123",
    # file paths, including ones that name secrets without holding them
    "FileNotFoundError: [Errno 2] No such file or directory: '/data/shards/rank3/step2.bin'",
    "Your token has been saved to /root/.cache/huggingface/token",
    "GOOGLE_APPLICATION_CREDENTIALS=/var/secrets/google/key.json PWD=/home/alice OLDPWD=/home",
    "Saving checkpoint to /ckpt/run-sk-learn-baseline-2024/step_1000/model.safetensors",
    # ordinary key=value lines, tokenizer settings, env of a job
    "step=100 loss=0.3124 lr=1e-4 grad_norm=1.25 tokens_per_sec=48213 max_tokens=4096",
    "tokenizer: pad_token=<pad> eos_token=</s> bos_token_id=1 pad_token_id=0 sep_token=[SEP]",
    "TOKENIZERS_PARALLELISM=false NCCL_SOCKET_IFNAME=eth0 MASTER_ADDR=10.0.0.1 MASTER_PORT=29500",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING=1 TORCH_DISTRIBUTED_DEBUG=DETAIL CUDA_VISIBLE_DEVICES=0,1,2,3",
    'Missing key(s) in state_dict: "fc.weight", "fc.bias". Unexpected key(s): "head.bias"',
    "KeyError: 'input_ids'",
    "Epoch 3: 100%|##########| 625/625 [01:02<00:00, 10.01it/s, loss=0.213, v_num=7]",
    "git@github.com:acme/ddp-train.git ssh://git@github.com/acme/x.git https://github.com/acme/x",
    "uuid 123e4567-e89b-12d3-a456-426614174000 GPU-5f3b2a1c-8d9e-4f0a-b1c2-d3e4f5a6b7c8",
    "hf_hub_download(repo_id='gpt2', filename='config.json') with hf_transfer enabled",
    "mail sent to alice@example.com at 2025-01-01T10:00:00Z",
    "wandb: Currently logged in as: alice (acme). Use `wandb login --relogin` to force relogin",
    # settings that say a secret is absent or elsewhere stay readable
    "hub_token=None, hub_private_repo=False, push_to_hub_token=<PUSH_TO_HUB_TOKEN>",
    "--hub_token $HF_TOKEN --report_to wandb --push_to_hub",
    "HF_TOKEN=${HF_TOKEN} WANDB_API_KEY=",
    "export AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY",
]


@pytest.mark.parametrize("line", NEAR_MISSES)
def test_near_misses_stay_as_they_are(line: str) -> None:
    assert clean_text(line) == line


def _real_lines() -> list[str]:
    lines: list[str] = []
    for root in REAL_LOG_ROOTS:
        if not root.is_dir():
            continue
        for path in sorted(root.rglob("*")):
            if path.is_file() and path.suffix not in (".json", ".py", ".sh", ".md", ".gz"):
                lines += path.read_bytes().decode("utf-8", "replace").splitlines()
    return lines


def test_real_logs_are_left_unchanged() -> None:
    """Every line of the real logs the project keeps (fixtures, captured runs, the corpus when
    present) holds no secret: redaction must not change one of them."""
    lines = _real_lines()
    assert len(lines) > 1000
    changed = [line for line in lines if redact(line) != line]
    assert changed == []


def test_control_sequences_are_stripped_and_text_kept() -> None:
    raw = (
        "\x1b]0;owned title\x07"  # OSC window title, BEL-terminated
        "\x1b[1;31mRuntimeError\x1b[0m: "  # SGR colours
        "\x1b[2K\x1b[1A\x1b[10;5H"  # erase line, cursor up, cursor position
        "\x1b]8;;http://evil.example/\x1b\\link\x1b]8;;\x1b\\ "  # OSC 8 hyperlink, ST-terminated
        "\x1bP1$r0m\x1b\\"  # DCS string
        "\x9b31mc1\x9b0m "  # 8-bit CSI
        "\x1bc\x1b(B"  # full reset, charset
        "bell\x07 back\x08 cr\r del\x7f nul\x00 "
        "\u202eevil\u202c\t|end\n"
    )
    out = strip_controls(raw)
    assert out == "RuntimeError: link c1 bell back cr del nul evil\t|end\n"
    assert strip_controls(out) == out


def test_control_sequence_cannot_split_a_secret() -> None:
    raw = "HF token hf_ErQHQwjyaxErPZDS\x1b[0mS3MoJaQNjCxkv5ndK0m"
    assert clean_text(raw) == "HF token hf_****"
    assert (
        clean_text(raw, redact_secrets=False) == "HF token hf_ErQHQwjyaxErPZDSS3MoJaQNjCxkv5ndK0m"
    )


def test_clean_value_masks_by_name_and_by_format() -> None:
    env = {
        "HF_TOKEN": "anything-at-all",
        "TORCH_HUB_TOKEN": "ghp_eGR0vRzZ1fb6d06QGofB8ChQBiIu4NJkS4dJ",
        "TORCHELASTIC_ETCD_PASSWORD": "p",
        "NCCL_SOCKET_IFNAME": "eth0",
        "MASTER_ADDR": "10.0.0.1",
        "EMPTY_SECRET": "",
        "NCCL_DEBUG_FILE": "/tmp/nccl.%h.%p\x1b[0m",
    }
    out = clean_value({"env": env, "n": 3, "ok": True, "none": None})
    assert out["env"] == {
        "HF_TOKEN": MASK,
        "TORCH_HUB_TOKEN": MASK,
        "TORCHELASTIC_ETCD_PASSWORD": MASK,
        "NCCL_SOCKET_IFNAME": "eth0",
        "MASTER_ADDR": "10.0.0.1",
        "EMPTY_SECRET": "",
        "NCCL_DEBUG_FILE": "/tmp/nccl.%h.%p",
    }
    assert out["n"] == 3 and out["ok"] is True and out["none"] is None
    assert clean_value({"env": env}, redact_secrets=False)["env"]["HF_TOKEN"] == "anything-at-all"


def test_clean_value_masks_the_argv_element_after_a_secret_flag() -> None:
    argv = ["python", "train.py", "--password", "hunter2", "--hub-token", "abc", "--lr", "0.1"]
    assert clean_value(argv) == [
        "python",
        "train.py",
        "--password",
        MASK,
        "--hub-token",
        MASK,
        "--lr",
        "0.1",
    ]
    assert clean_value(("--token", "$TOKEN")) == ("--token", "$TOKEN")
    assert clean_value(argv, redact_secrets=False) == argv


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("HF_TOKEN", True),
        ("WANDB_API_KEY", True),
        ("AWS_SECRET_ACCESS_KEY", True),
        ("DB_PASSWORD_FILE", True),
        ("PASSWORD", True),
        ("hub_token", True),
        ("db_password", True),
        ("client_secret", True),
        ("private_key_id", True),
        ("X-Api-Key", True),
        ("NCCL_SOCKET_IFNAME", False),
        ("TOKENIZERS_PARALLELISM", False),
        ("PWD", False),
        ("OLDPWD", False),
        ("GOOGLE_APPLICATION_CREDENTIALS", False),
        ("pad_token", False),
        ("max_tokens", False),
        ("MASTER_PORT", False),
    ],
)
def test_secret_names(name: str, secret: bool) -> None:
    assert is_secret_name(name) is secret


# ------------------------------------------------------------------------ linear time
ADVERSARIAL_CHARS = " =:-_/@?&;'\".*aA0\\\n"
SMALL = 32 * 1024
BIG = 8 * SMALL
BOUND_S_PER_MB = 5.0


def _units(example: str, secret: str) -> list[str]:
    """Texts that make a backtracking matcher work: the example, its near misses cut at every
    length class, its prefix alone, and runs of the characters the regexes iterate on."""
    start = example.find(secret)
    return [
        example,
        example[:-1] + " ",
        example[: len(example) // 2],
        example[: max(1, start)],
        example[max(0, start - 12) : start + 4],
        secret,
        secret[:-1],
        *ADVERSARIAL_CHARS,
        "a=",
        "--a ",
        "://a:",
        "\x1b]",
        "\x1b[",
    ]


def _best_time(pattern: re.Pattern[str], unit: str, size: int, tries: int = 1) -> float:
    text = (unit * (size // len(unit) + 1))[:size]
    best = float("inf")
    for _ in range(tries):
        t0 = time.perf_counter()
        pattern.sub("", text)
        best = min(best, time.perf_counter() - t0)
    return best


def _growth(pattern: re.Pattern[str], unit: str, small: int, big: int) -> tuple[float, float]:
    """(seconds on `big` characters, time per character at `big` over that at `small`)."""
    small_s = _best_time(pattern, unit, small, tries=3)
    big_s = _best_time(pattern, unit, big, tries=2)
    return big_s, (big_s / big) / ((small_s + 0.002) / small)


def test_every_format_matches_in_linear_time() -> None:
    """Every format and the control-sequence pattern over adversarial texts of 32 KiB; the eight
    slowest again at 256 KiB: under a bound per MB, and the time per character does not grow
    with the length (8x the text: linear keeps it, quadratic multiplies it by 8)."""
    cases = [(f.name, f.pattern, u) for f in SECRET_FORMATS for u in _units(f.example, f.secret)]
    cases += [("control", CONTROL, u) for u in ("\x1b]", "\x1b[", "\x1b[1;", "\x1bP", "\x9b1")]
    timed = sorted(
        ((_best_time(p, u, SMALL), name, p, u) for name, p, u in cases), key=lambda t: -t[0]
    )
    for _, name, pattern, unit in timed[:8]:
        big_s, growth = _growth(pattern, unit, SMALL, BIG)
        assert big_s * (1 << 20) / BIG < BOUND_S_PER_MB, (name, unit[:40], big_s)
        assert growth < 3, (name, unit[:40], growth)


def test_the_growth_check_catches_a_quadratic_pattern() -> None:
    """The check above can fail: a pattern that rescans to the end from every position."""
    _, growth = _growth(re.compile(r"[a=]*b"), "a=", 2048, 8 * 2048)
    assert growth > 3, growth


def _redact_without_hints(text: str) -> str:
    for fmt in SECRET_FORMATS:
        text = fmt.pattern.sub(_masker, text)
    return text


def test_hints_never_skip_a_match() -> None:
    """The substring prefilter is only a shortcut: with it or without, the same output."""
    texts = tier_sample(_real_lines()) + NEAR_MISSES
    for f in SECRET_FORMATS:
        texts += [f.example, f.example.upper(), f.example.lower(), f.example.swapcase()]
        texts += [f.example.replace("_", "-"), f.example.replace(":", "="), f.secret]
    assert len(texts) > 1000
    differ = [t for t in texts if redact(t) != _redact_without_hints(t)]
    assert differ == []


def test_redaction_speed_on_real_lines() -> None:
    """Reports clean line by line: real log lines with every example planted, one call each."""
    lines = _real_lines()[:4000] + [f.example for f in SECRET_FORMATS]
    chars = sum(len(line) for line in lines)
    t0 = time.perf_counter()
    out = [redact(line) for line in lines]
    elapsed = time.perf_counter() - t0
    print(f"redact: {len(lines)} lines, {chars} chars in {elapsed:.3f} s")
    assert elapsed < 5.0, elapsed
    for f, line in zip(SECRET_FORMATS, out[-len(SECRET_FORMATS) :], strict=True):
        assert f.secret not in line, f.name
