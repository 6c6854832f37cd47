"""No secret leaves through `ddpdoctor diagnose`, `check` or `explain`: each secret format is
planted in a real log where a script prints it (the exception message of a traceback, a
command line quoted by CalledProcessError), diagnosed through the real command in text, JSON
and HTML. The same runs with --no-redact must show the secret: that proves the line is quoted,
so a missing secret means it was masked, not dropped."""

from __future__ import annotations

import html
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from ddpdoctor.cli.main import cli
from tests.conftest import REPO, run_cli

DATA_ERROR = REPO / "src" / "ddpdoctor" / "scenarios" / "captured" / "data-error" / "console.log"
MULTINODE = REPO / "tests" / "fixtures" / "real" / "multinode-data-error"
# The exception lines the reports quote as the root cause in those two real runs.
DATA_ERROR_LINE = "[rank1]: FileNotFoundError: [Errno 2] No such file or directory: '/tmp/ddpdoctor-data-error-b2s8dfnd/shards/rank1/shard-00001-step003.bin'"
MULTINODE_LINE = (
    "FileNotFoundError: [Errno 2] No such file or directory: '/data/shards/rank3/step2.bin'"
)

PEM_BODY = "Ns0Gc4LtWa4pmDP4iXJ44MG508LOvndABLZCPvmDXqQYAMWHS5FwMezMv3q4W/hN"
AWS_SECRET = "GXnBd7EA2qBI/rPUYyttsqheJMwrITq6vxgxt0/d"
WANDB_KEY = "8a06e8b26034a7e6592d4308d157faabaf8fa81f"

# (format, the line a job prints, the secret that must not appear). Made-up secrets of the
# real shape; none is taken from the module's own table.
CASES: list[tuple[str, str, str]] = [
    (
        "aws-access-key-id",
        "botocore.exceptions.ClientError: An error occurred (InvalidAccessKeyId) when calling the GetObject operation: key AKIAIB4XQ3MXR6ZTND0E does not exist",
        "IB4XQ3MXR6ZTND0E",
    ),
    (
        "aws-sts-key-id",
        "botocore.exceptions.ClientError: An error occurred (ExpiredToken) for ASIA68T4F67U5UVXLE9L",
        "68T4F67U5UVXLE9L",
    ),
    (
        "aws-secret-env",
        f"RuntimeError: S3 upload failed with AWS_SECRET_ACCESS_KEY={AWS_SECRET}",
        AWS_SECRET,
    ),
    (
        "aws-secret-credentials-file",
        f"configparser.ParsingError: bad entry in ~/.aws/credentials: aws_secret_access_key = {AWS_SECRET}",
        AWS_SECRET,
    ),
    (
        "gcp-service-account-key",
        'google.auth.exceptions.DefaultCredentialsError: {"type": "service_account", "private_key": "-----BEGIN PRIVATE KEY-----\\nMIIEvQIBADANBg\\n'
        + PEM_BODY
        + '\\n-----END PRIVATE KEY-----\\n"} is not valid',
        PEM_BODY,
    ),
    (
        "pem-rsa-private-key",
        "ValueError: Could not deserialize key data: b'-----BEGIN RSA PRIVATE KEY-----\\n"
        + PEM_BODY
        + "\\n-----END RSA PRIVATE KEY-----\\n'",
        PEM_BODY,
    ),
    (
        "pem-openssh-private-key",
        "paramiko.ssh_exception.SSHException: not a valid key: '-----BEGIN OPENSSH PRIVATE KEY-----\\nb3BlbnNzaC1rZXktdjEAAAAA"
        + PEM_BODY,
        PEM_BODY,
    ),
    (
        "azure-storage-connection-string",
        "ValueError: Connection string is either blank or malformed: DefaultEndpointsProtocol=https;AccountName=ckpts;AccountKey=o8W9c/BXe7rLEOI3dTvpVBjv6Zon1ZaFzgHvIVkGveBo5eT7ey9gLlviJAaKf8HjvE/gTDY7lFeb0Xl4wvEvzR==;EndpointSuffix=core.windows.net",
        "o8W9c/BXe7rLEOI3dTvpVBjv6Zon1ZaFzgHvIVkGveBo5eT7ey9gLlviJAaKf8HjvE/gTDY7lFeb0Xl4wvEvzR==",
    ),
    (
        "azure-sas-url",
        "azure.core.exceptions.ClientAuthenticationError: Server failed to authenticate https://ckpts.blob.core.windows.net/run/model.pt?sv=2022-11-02&sr=b&sp=r&sig=Dyexz9e2axKQfrJomvqftIJh0IeSoDJwYY3ikjmJqRh%3D",
        "Dyexz9e2axKQfrJomvqftIJh0IeSoDJwYY3ikjmJqRh%3D",
    ),
    (
        "s3-presigned-url",
        "urllib.error.HTTPError: HTTP Error 403: Forbidden: https://b.s3.amazonaws.com/x.pt?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Signature=c8fb665bf2491b78f1948ec36938d2fa994129d26600a60a38fda71bffd1ab68",
        "c8fb665bf2491b78f1948ec36938d2fa994129d26600a60a38fda71bffd1ab68",
    ),
    (
        "hf-token",
        "huggingface_hub.errors.HfHubHTTPError: 401 Client Error: Unauthorized for url: https://huggingface.co/api/models/acme/private (token hf_huG8GP38g4o5MNJAYKJ1UXXFWXLCpaNfhs)",
        "huG8GP38g4o5MNJAYKJ1UXXFWXLCpaNfhs",
    ),
    (
        "hf-token-env",
        "RuntimeError: login failed with HF_TOKEN=hf_0gCa05RFRunzqw7wZyVGOeUvfJIssDj4PT",
        "0gCa05RFRunzqw7wZyVGOeUvfJIssDj4PT",
    ),
    (
        "hub-token-flag",
        "subprocess.CalledProcessError: Command 'python run_clm.py --model_name_or_path gpt2 --push_to_hub --hub_token hf_huG8GP38g4o5MNJAYKJ1UXXFWXLCpaNfhs' returned non-zero exit status 1.",
        "huG8GP38g4o5MNJAYKJ1UXXFWXLCpaNfhs",
    ),
    (
        "argparse-namespace",
        "ValueError: unsupported arguments Namespace(model='gpt2', hub_token='hx7Qm2LpW9zR4tK8vN3cB6yD1fG5', lr=0.0001)",
        "hx7Qm2LpW9zR4tK8vN3cB6yD1fG5",
    ),
    (
        "wandb-api-key-env",
        f"wandb.errors.AuthenticationError: API key rejected: WANDB_API_KEY={WANDB_KEY}",
        WANDB_KEY,
    ),
    (
        "wandb-login",
        f"subprocess.CalledProcessError: Command 'wandb login --relogin {WANDB_KEY}' returned non-zero exit status 1.",
        WANDB_KEY,
    ),
    (
        "github-ghp-in-url",
        "git.exc.GitCommandError: Cmd('git') failed due to: exit code(128) cmdline: git clone https://ci-bot:ghp_TKtb2TxxDBfz5LJF3hBGZW3M4Fz6Hq2AK7EG@github.com/acme/data.git",
        "TKtb2TxxDBfz5LJF3hBGZW3M4Fz6Hq2AK7EG",
    ),
    (
        "github-gho-as-user",
        "OSError: could not fetch https://gho_HZbKoXi0d9TH4QgTNBEjE4o24hOSDRET79Iq@github.com/acme/ckpt.git",
        "HZbKoXi0d9TH4QgTNBEjE4o24hOSDRET79Iq",
    ),
    (
        "github-ghs",
        "RuntimeError: GitHub API returned 401 Bad credentials for ghs_JzQtJZPGSEZ4zBms1racjP4M9DZH7Fx6mqSF",
        "JzQtJZPGSEZ4zBms1racjP4M9DZH7Fx6mqSF",
    ),
    (
        "github-fine-grained-pat",
        "subprocess.CalledProcessError: Command '['git', 'push', 'https://x-access-token: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@github.com/a/b.git']' returned non-zero exit status 128.",
        "DGX0FZBJQ6c1suD6ZgCSTY_9GqC79l9B1UE8ePr5FxgmV2AjC6afaCLI71fNYmphNcWI9rQWOwjauQLKX7",
    ),
    (
        "gitlab-pat",
        "gitlab.exceptions.GitlabAuthenticationError: 401: 401 Unauthorized for glpat-_rC8qLk1urN0XtzWbnXj",
        "_rC8qLk1urN0XtzWbnXj",
    ),
    (
        "slack-bot-token",
        "slack_sdk.errors.SlackApiError: The request to the Slack API failed. (url: https://www.slack.com/api/chat.postMessage, token: xoxb-055008754751-7799229836957-MoRTeJzcmP6lcPI71dC3WPmE)",
        "MoRTeJzcmP6lcPI71dC3WPmE",
    ),
    (
        "slack-user-token",
        "slack_sdk.errors.SlackApiError: invalid_auth with xoxp-02838222646-86164252477-6472587718841-6702ead50b5b6386984383d531b53a82",
        "6702ead50b5b6386984383d531b53a82",
    ),
    (
        "slack-webhook-url",
        "requests.exceptions.HTTPError: 404 Client Error: Not Found for url: https://hooks.slack.com/services/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",
        "uXDMOPTNc7zuMnMDBR4hRx3G",
    ),
    (
        "openai-key",
        "openai.AuthenticationError: Error code: 401 - Incorrect API key provided: sk-R7qys80wdVTB4bsSvsU9XZ6htXAuL5bI9vmJdUhkNhhciHwM",
        "R7qys80wdVTB4bsSvsU9XZ6htXAuL5bI9vmJdUhkNhhciHwM",
    ),
    (
        "openai-project-key",
        "openai.AuthenticationError: Incorrect API key provided: sk-proj-Md2qT1XWE1CqxdYGsDccJ91HOrlweHROhbF8hCtZUDJRzVT6T3BlbkFJ68Nyu0t_aT0ewkMVHrmcBNfYWunksXQHNfyuLLKTrXyb92Tv",
        "Md2qT1XWE1CqxdYGsDccJ91HOrlweHROhbF8hCtZUDJRzVT6T3BlbkFJ68Nyu0t_aT0ewkMVHrmcBNfYWunksXQHNfyuLLKTrXyb92Tv",
    ),
    (
        "anthropic-key",
        "anthropic.AuthenticationError: Error code: 401 - invalid x-api-key sk-ant-api03-dwOsudoaViVMBtFqnP_njWHMpS8-pFT6Skil-NHCvP3QP-ZOwz7CSS0WBt4q3IQpOI4HsIDQspIL6ZZcQ0Rm-A2TQhZwbAA",
        "dwOsudoaViVMBtFqnP_njWHMpS8-pFT6Skil-NHCvP3QP-ZOwz7CSS0WBt4q3IQpOI4HsIDQspIL6ZZcQ0Rm-A2TQhZwbAA",
    ),
    (
        "stripe-live-key",
        "stripe._error.AuthenticationError: Invalid API Key provided: sk_live_rJSqivLPNA1XZE24EvacWoOh",
        "rJSqivLPNA1XZE24EvacWoOh",
    ),
    (
        "jwt",
        "jwt.exceptions.InvalidSignatureError: Signature verification failed for eyJhbGciOiAiUlMyNTYiLCAidHlwIjogIkpXVCJ9.eyJzdWIiOiAic3ZjLXRyYWluIiwgImV4cCI6IDE3NjcyMjU2MDB9.jqIIYbwYlVZaaihcfOqcc_gcn4gzt-zCeV5ezeN95m1ZjnNZETkkaxdFEegN",
        "jqIIYbwYlVZaaihcfOqcc_gcn4gzt-zCeV5ezeN95m1ZjnNZETkkaxdFEegN",
    ),
    (
        "postgres-url-password",
        "sqlalchemy.exc.OperationalError: (psycopg2.OperationalError) connection to server failed: postgresql://mlflow:AN49lBzokTuowA@db.internal:5432/mlflow",
        "AN49lBzokTuowA",
    ),
    (
        "mysql-url-password",
        'sqlalchemy.exc.OperationalError: (pymysql.err.OperationalError) (2003, "Can\'t connect to mysql+pymysql://optuna:PBm589BbJjP56OYr@mysql.internal/optuna")',
        "PBm589BbJjP56OYr",
    ),
    (
        "mongodb-url-password",
        "pymongo.errors.ServerSelectionTimeoutError: mongodb+srv://trainer:KUYb96IT_rns@cluster0.abcde.mongodb.net/?retryWrites=true timed out",
        "KUYb96IT_rns",
    ),
    (
        "redis-url-password",
        "redis.exceptions.ConnectionError: Error 111 connecting to redis://:JowDyMOLd7SQJuWq9RfD@redis.internal:6379/0. Connection refused.",
        "JowDyMOLd7SQJuWq9RfD",
    ),
    (
        "amqp-url-password",
        "kombu.exceptions.OperationalError: [Errno 111] Connection refused: amqp://celery:DwI0YH0H8g0rscfLce@rabbitmq.internal:5672//",
        "DwI0YH0H8g0rscfLce",
    ),
    (
        "http-url-password",
        "requests.exceptions.ConnectionError: HTTPConnectionPool(host='minio.internal', port=9000): Max retries exceeded with url http://admin:H7CKgyZPZK9DNEI@minio.internal:9000/ckpt",
        "H7CKgyZPZK9DNEI",
    ),
    (
        "https-url-password",
        "pip._vendor.urllib3.exceptions.MaxRetryError: https://deploy:bj5uibgzfkI3qbcVeWMHhU@artifactory.acme.io/api/pypi/simple failed",
        "bj5uibgzfkI3qbcVeWMHhU",
    ),
    (
        "authorization-bearer",
        "requests.exceptions.HTTPError: 403 Client Error; request headers: {'User-Agent': 'python-requests/2.32.3', 'Authorization': 'Bearer 8tPw.oraWl.1R~TkcGEoWFMwNbdRw6mF8u_9oiqa'}",
        "8tPw.oraWl.1R~TkcGEoWFMwNbdRw6mF8u_9oiqa",
    ),
    (
        "authorization-basic",
        "urllib.error.HTTPError: HTTP Error 407: Proxy Authentication Required (Proxy-Authorization: Basic Y2k6enJQUGtEZmJ3ZVZXaThLM0hYcDA=)",
        "Y2k6enJQUGtEZmJ3ZVZXaThLM0hYcDA=",
    ),
    (
        "password-flag",
        "subprocess.CalledProcessError: Command 'mlflow server --backend-store-uri postgresql://mlflow@db/mlflow --password 925vTjt9EpuT5DSpz' returned non-zero exit status 2.",
        "925vTjt9EpuT5DSpz",
    ),
    (
        "token-env",
        "RuntimeError: neptune init failed: NEPTUNE_API_TOKEN=JOHwZzI3WfOP4WYbBD7RdPMcEj3QEzhT rejected",
        "JOHwZzI3WfOP4WYbBD7RdPMcEj3QEzhT",
    ),
    (
        "api-key-env",
        "RuntimeError: cohere client: COHERE_API_KEY=pG32uAcFpMlCm8Qw2Zr5Tn7Vb is not valid",
        "pG32uAcFpMlCm8Qw2Zr5Tn7Vb",
    ),
    (
        "secret-env",
        "ValueError: OIDC misconfigured: OIDC_CLIENT_SECRET=Qf8Lm2Zx7Wc4Nv9Rt1Yb6Kp3Hd5Js0 expired",
        "Qf8Lm2Zx7Wc4Nv9Rt1Yb6Kp3Hd5Js0",
    ),
    (
        "password-env",
        "RuntimeError: database refused DB_PASSWORD_PROD=Wk3Rt8Zq1Lm6Xv9Nb2 for user trainer",
        "Wk3Rt8Zq1Lm6Xv9Nb2",
    ),
    (
        "kaggle-key-env",
        "OSError: Could not find kaggle.json. KAGGLE_USERNAME=alice KAGGLE_KEY=b3837d7686e031fb5c46959d9ddd62cc",
        "b3837d7686e031fb5c46959d9ddd62cc",
    ),
    (
        "json-api-key",
        'json.decoder.JSONDecodeError: Extra data: line 1 column 49 (char 48) in {"api_key": "Zt7Qm1Xw4Rb9Lk2Vn8Pc", "model": "gpt2"} x',
        "Zt7Qm1Xw4Rb9Lk2Vn8Pc",
    ),
    (
        "dict-password",
        "KeyError: \"missing 'host' in {'user': 'trainer', 'password': 'Lq5Vz8Rm2Xk7Wb1N'}\"",
        "Lq5Vz8Rm2Xk7Wb1N",
    ),
    (
        "yaml-secret-key",
        "yaml.scanner.ScannerError: mapping values are not allowed here, in 'secret_key: Hn4Tq9Wz2Lx7Rb5Mk1Vc'",
        "Hn4Tq9Wz2Lx7Rb5Mk1Vc",
    ),
    (
        "google-api-key",
        "google.api_core.exceptions.GoogleAPICallError: 403 API key not valid: AIzaMCUl70tPsf8ahmTGQduyl23zvEC-BVu226U",
        "MCUl70tPsf8ahmTGQduyl23zvEC-BVu226U",
    ),
    (
        "google-oauth-token",
        "google.auth.exceptions.RefreshError: ('invalid_grant: Token has been expired or revoked.', ya29.FazROpRZ27WnV35PWTbTXSG9bU07fcLgoQ3HXMGaABhjDwgU6ngLqn1DoinjXer4dK0V4yg1NtIvYgi6094saKmq3yI7tAPuLdny)",
        "FazROpRZ27WnV35PWTbTXSG9bU07fcLgoQ3HXMGaABhjDwgU6ngLqn1DoinjXer4dK0V4yg1NtIvYgi6094saKmq3yI7tAPuLdny",
    ),
    (
        "npm-token",
        "subprocess.CalledProcessError: Command 'npm publish --//registry.npmjs.org/:_authToken=npm_VcZMGvJt1AoSO4I4188GsZQ19NGw1wWyHoaA' returned non-zero exit status 1.",
        "VcZMGvJt1AoSO4I4188GsZQ19NGw1wWyHoaA",
    ),
    (
        "pypi-token",
        "subprocess.CalledProcessError: Command 'twine upload -u __token__ -p pypi-AgEIcHlwaS5vcmc2XUFWTdnEBw_Y8u3yVdkmoBYp6Sm1EPNamiRt60mny_RxplSEt47m2qlc72i dist/*' returned non-zero exit status 1.",
        "2XUFWTdnEBw_Y8u3yVdkmoBYp6Sm1EPNamiRt60mny_RxplSEt47m2qlc72i",
    ),
    (
        "docker-hub-pat",
        'docker.errors.APIError: 401 Client Error: Unauthorized ("login with dckr_pat_4-h58Smg0x2iGF2nSvbsNH3nCUj failed")',
        "4-h58Smg0x2iGF2nSvbsNH3nCUj",
    ),
    (
        "groq-key",
        "groq.AuthenticationError: Error code: 401 - Invalid API Key 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",
        "A4OfKXNquB2N3LtoV0MHlHAqcJNqHDsAV23qnT7XULCkw0Ht8qth",
    ),
    (
        "age-secret-key",
        "RuntimeError: sops: no identity matched: AGE-SECRET-KEY-1XN85QUPV9FMRLF3LOOT033CRSFCR3VEY761U0FHRHD7IPUUOQRASKR4R37",
        "XN85QUPV9FMRLF3LOOT033CRSFCR3VEY761U0FHRHD7IPUUOQRASKR4R37",
    ),
]


def plant(case_line: str, index: int, folder: Path) -> Path:
    """A real log with the root-cause exception line replaced by `case_line`: even cases in the
    single-node torchrun log (under its [rank1]: prefix), odd ones in the second node's log of
    the two-node run (an unprefixed traceback.print_exc())."""
    folder.mkdir(parents=True, exist_ok=True)
    if index % 2 == 0:
        text = DATA_ERROR.read_text()
        assert DATA_ERROR_LINE in text
        (folder / "console.log").write_text(text.replace(DATA_ERROR_LINE, "[rank1]: " + case_line))
        return folder
    for node in ("node0", "node1"):
        (folder / node).mkdir()
        text = (MULTINODE / node / "console.log").read_text()
        if node == "node1":
            assert MULTINODE_LINE in text
            text = text.replace(MULTINODE_LINE, case_line)
        (folder / node / "console.log").write_text(text)
    return folder


def diagnose(folder: Path, fmt: str, *extra: str) -> str:
    """The real `diagnose` command, run in this process (click's runner): the same parsing,
    diagnosis and rendering as a user's shell gets, without paying an interpreter per call
    (the matrix below makes about 330 calls; the tests after it go through a subprocess)."""
    result = CliRunner().invoke(
        cli, ["diagnose", "--format", fmt, "--width", "1000", *extra, str(folder)]
    )
    assert result.exit_code == 1, result.output
    return result.output


def test_at_least_40_formats() -> None:
    assert len({name for name, _, _ in CASES}) == len(CASES) >= 40


FULL = os.environ.get("DDPDOCTOR_FUZZ") == "full"
MATRIX = list(enumerate(CASES)) if FULL else list(enumerate(CASES))[::3]
"""Every format of secret through every report format in `make fuzz` (which CI runs); every
third one in `make test` (cloud keys, tokens, passwords in URLs, environment values and dicts
among them): the whole matrix took 111 s of a whole-suite run on this machine."""


@pytest.mark.parametrize(("index", "case"), MATRIX, ids=[c[0] for _, c in MATRIX])
def test_no_secret_in_any_report_format(
    tmp_path: Path, index: int, case: tuple[str, str, str]
) -> None:
    _, line, secret = case
    assert secret in line
    folder = plant(line, index, tmp_path)
    for fmt in ("text", "json", "html"):
        shown = diagnose(folder, fmt, "--no-redact")
        assert secret in shown, f"{fmt}: the planted line is not quoted, the test proves nothing"
        out = diagnose(folder, fmt)
        assert secret not in out, fmt
        # nor a long piece of it (a mask that stopped short, a wrapped line)
        pieces = {secret[i : i + 12] for i in range(0, max(1, len(secret) - 11), 4)}
        assert not [p for p in pieces if p in out], fmt
        assert "****" in out, fmt


def test_source_paths_and_skip_reasons_are_redacted(tmp_path: Path) -> None:
    """A command line pasted as a path ends up in `sources` (skipped, not found) and on stderr.
    Through a subprocess: stdout and stderr as a shell sees them."""
    folder = plant(CASES[0][1], 0, tmp_path / "logs")
    pasted = "HF_TOKEN=hf_huG8GP38g4o5MNJAYKJ1UXXFWXLCpaNfhs"
    for fmt in ("text", "json", "html"):
        raw = run_cli("diagnose", "--format", fmt, "--no-redact", str(folder), pasted)
        assert "huG8GP38g4o5MNJAYKJ1UXXFWXLCpaNfhs" in raw.stdout and pasted in raw.stderr
        proc = run_cli("diagnose", "--format", fmt, str(folder), pasted)
        assert proc.returncode == 1, proc.stderr
        assert "huG8GP38g4o5MNJAYKJ1UXXFWXLCpaNfhs" not in proc.stdout + proc.stderr
        assert "HF_TOKEN=****" in proc.stdout and "HF_TOKEN=****" in proc.stderr


def test_control_sequences_never_reach_a_report(tmp_path: Path) -> None:
    line = (
        "FileNotFoundError: [Errno 2] No such file or directory: '\x1b[1;31m/data/shard-3.bin"
        "\x1b[0m'\x1b]0;owned\x07 \x1b]8;;http://evil.example/\x1b\\see\x1b]8;;\x1b\\ \x9b2J\x07"
    )
    folder = plant(line, 1, tmp_path)
    for fmt in ("text", "json", "html"):
        for extra in ((), ("--no-redact",)):
            out = diagnose(folder, fmt, *extra)
            assert "/data/shard-3.bin' see" in (html.unescape(out) if fmt == "html" else out)
            assert not [c for c in out if (ord(c) < 32 and c not in "\t\n") or 127 <= ord(c) < 160]
            assert "owned" not in out and "evil.example" not in out
            if fmt == "json":  # JSON would escape a control character instead of dropping it
                assert "\\u001b" not in out and "\\u0007" not in out


def test_explain_does_not_echo_a_pasted_secret() -> None:
    proc = run_cli("explain", "HF_TOKEN=hf_huG8GP38g4o5MNJAYKJ1UXXFWXLCpaNfhs zzz no such rule")
    assert proc.returncode == 2
    assert "huG8GP38g4o5MNJAYKJ1UXXFWXLCpaNfhs" not in proc.stdout + proc.stderr
    assert "HF_TOKEN=****" in proc.stderr


CHECK_ENV = {
    # allow-listed prefixes (TORCH_, NCCL_, TORCHELASTIC_) that hold secrets
    "TORCH_HUB_TOKEN": "ghp_TKtb2TxxDBfz5LJF3hBGZW3M4Fz6Hq2AK7EG",
    "TORCHELASTIC_ETCD_PASSWORD": "Wk3Rt8Zq1Lm6Xv9Nb2",
    "NCCL_NET_PLUGIN_SECRET": "Qf8Lm2Zx7Wc4Nv9Rt1Yb6Kp3Hd5Js0",
    # a secret under a harmless name, in a URL
    "TORCH_HOME": "https://reader:AN49lBzokTuowA@models.internal/torch",
    # near misses that must stay
    "NCCL_SOCKET_IFNAME": "lo",
    "TORCH_DISTRIBUTED_DEBUG": "DETAIL",
}
CHECK_SECRETS = [
    "TKtb2TxxDBfz5LJF3hBGZW3M4Fz6Hq2AK7EG",
    "Wk3Rt8Zq1Lm6Xv9Nb2",
    "Qf8Lm2Zx7Wc4Nv9Rt1Yb6Kp3Hd5Js0",
    "AN49lBzokTuowA",
]


def _check(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ddpdoctor", "check", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={**os.environ, **CHECK_ENV},
    )


def test_check_masks_secret_environment_values() -> None:
    raw = _check("--format", "json", "--no-redact")
    assert raw.returncode in (0, 1), raw.stderr
    env = json.loads(raw.stdout)["facts"]["env"]
    assert all(env[k] == v for k, v in CHECK_ENV.items())  # --no-redact shows them as they are

    out = _check("--format", "json")
    assert out.returncode in (0, 1), out.stderr
    assert not [s for s in CHECK_SECRETS if s in out.stdout + out.stderr]
    env = json.loads(out.stdout)["facts"]["env"]
    assert env["TORCH_HUB_TOKEN"] == env["TORCHELASTIC_ETCD_PASSWORD"] == "****"
    assert env["NCCL_NET_PLUGIN_SECRET"] == "****"
    assert env["TORCH_HOME"] == "https://reader:****@models.internal/torch"
    assert env["NCCL_SOCKET_IFNAME"] == "lo" and env["TORCH_DISTRIBUTED_DEBUG"] == "DETAIL"

    # the text report in this process (torch imported once): it shows the NCCL_ variables
    from ddpdoctor.cli.check_cmd import check

    raw_text = CliRunner().invoke(check, ["--no-redact"], env=CHECK_ENV)
    assert "Qf8Lm2Zx7Wc4Nv9Rt1Yb6Kp3Hd5Js0" in raw_text.output
    text = CliRunner().invoke(check, [], env=CHECK_ENV)
    assert text.exit_code in (0, 1), text.output
    assert not [s for s in CHECK_SECRETS if s in text.output]
    assert "NCCL_NET_PLUGIN_SECRET=****" in text.output


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_demo_does_not_echo_secrets_or_control_sequences(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt: str
) -> None:
    """`demo --replay` shows the job's lines and its diagnosis: bundled logs with a secret and
    a colour code planted in the failing rank's exception line."""
    from ddpdoctor.cli.demo_cmd import demo
    from ddpdoctor.scenarios import catalog

    bundled = DATA_ERROR.parent
    planted = tmp_path / "captured" / bundled.name
    planted.mkdir(parents=True)
    (planted / "meta.json").write_text((bundled / "meta.json").read_text())
    line = "OSError: could not clone https://ci-bot:ghp_TKtb2TxxDBfz5LJF3hBGZW3M4Fz6Hq2AK7EG@github.com/acme/data.git \x1b[31mfatal\x1b[0m"
    (planted / "console.log").write_text(
        DATA_ERROR.read_text().replace(DATA_ERROR_LINE, "[rank1]: " + line)
    )
    monkeypatch.setattr(catalog, "CAPTURED_DIR", tmp_path / "captured")
    result = CliRunner().invoke(demo, ["--replay", "--format", fmt, "--width", "300", "data-error"])
    assert result.exit_code == 0, result.output
    assert "TKtb2TxxDBfz5LJF3hBGZW3M4Fz6Hq2AK7EG" not in result.output
    assert "https://ci-bot:****@github.com" in result.output  # the line was shown, masked
    assert "\x1b" not in result.output and "\\u001b" not in result.output


def test_real_reports_are_unchanged_by_redaction() -> None:
    """False positives at report level: every real run kept in the repo (and the corpus when
    present; a stable third of them in `make test`, all in `make fuzz`) gives the same report
    with and without redaction, and no rule's documentation (summaries, fixes) is touched."""
    from ddpdoctor.analysis.diagnose import diagnose_paths
    from ddpdoctor.redaction import redact
    from ddpdoctor.report.to_json import to_json
    from ddpdoctor.report.view import shown
    from ddpdoctor.rules.docs import rule_markdown
    from ddpdoctor.rules.registry import all_rules
    from tests.conftest import CORPUS, tier_sample

    assert [r.code for r in all_rules() if redact(rule_markdown(r)) != rule_markdown(r)] == []
    roots = [MULTINODE.parent, DATA_ERROR.parent.parent, CORPUS]
    runs = [d for root in roots if root.is_dir() for d in sorted(root.iterdir()) if d.is_dir()]
    assert len(runs) >= 40
    changed = []
    for run in tier_sample(runs):  # every run in `make fuzz`, a stable third in `make test`
        report = diagnose_paths([str(run)])
        if to_json(shown(report, redact=True)) != to_json(shown(report, redact=False)):
            changed.append(run.name)
    assert changed == []


def test_a_shown_copy_is_shown_again_as_it_is_but_never_unmasked(tmp_path: Path) -> None:
    """The CLI shows the report (to check it), then renders it, which shows it again: the
    second time returns the same copy instead of copying every rank's data over again. A copy
    made without redaction is still masked when shown with it."""
    from ddpdoctor.analysis.diagnose import diagnose_paths
    from ddpdoctor.report.to_json import to_json
    from ddpdoctor.report.view import shown

    secret = "ghp_TKtb2TxxDBfz5LJF3hBGZW3M4Fz6Hq2AK7EG"
    log = tmp_path / "console.log"
    line = f"OSError: could not clone https://ci-bot:{secret}@github.com/acme/data.git"
    log.write_text(DATA_ERROR.read_text().replace(DATA_ERROR_LINE, "[rank1]: " + line))
    report = diagnose_paths([str(log)])
    raw = shown(report, redact=False)
    assert secret in to_json(raw)
    assert shown(raw, redact=False) is raw
    masked = shown(raw, redact=True)
    assert masked is not raw and secret not in to_json(masked)
    assert shown(masked, redact=True) is masked
    assert shown(masked, redact=False) is masked  # already masked: nothing to give back
