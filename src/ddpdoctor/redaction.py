"""What ddpdoctor may repeat of what a job printed: control sequences stripped, secrets masked
(`hf_****`, `https://user:****@host`, `HF_TOKEN=****`) after a declared table of formats. Stdlib
only and imports nothing of ddpdoctor, so every layer that writes output uses it; never applied
to what the job itself wrote (console.log, ranks/*.log). Every regex runs in time linear in the
text: each repeat is bounded, and possessive where the next token cannot continue it."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

MASK = "****"

# Terminal control: CSI (colours, cursor moves, erase), OSC (window title, hyperlinks) ended by
# BEL or ST, DCS/SOS/PM/APC strings, other two-byte escapes, 8-bit C1 controls, then every C0
# control except tab and newline, DEL, and the bidirectional overrides that reorder what a
# terminal shows (Trojan Source).
CONTROL = re.compile(
    r"\x1b\[[0-?]{0,64}+[ -/]{0,16}+[@-~]"
    r"|\x1b\][^\x07\x1b\x9c]{0,8192}+(?:\x07|\x1b\\|\x9c)"
    r"|\x1b[PX^_][^\x1b\x9c]{0,8192}+(?:\x1b\\|\x9c)"
    r"|\x1b[ -/]{0,4}+[0-~]"
    r"|\x9b[0-?]{0,64}+[ -/]{0,16}+[@-~]"
    r"|[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]"
)
# A bare ESC that started a sequence CONTROL did not recognise is dropped by the last branch;
# the printable rest stays as text, which can no longer act on a terminal.

# A value after `NAME=` or `NAME: `: quoted (the quotes stay) or up to whitespace. It may not
# start with "-" so that `--hub_token --push_to_hub` does not eat the next flag.
VALUE = r"""(?:"(?P<s>[^"\r\n]{1,1024}+)"|'(?P<s2>[^'\r\n]{1,1024}+)'|(?P<s3>[^\s"'-][^\s"']{0,1023}+))"""
SEP = r"""(?P<sep>["']?[ \t]{0,8}+[=:][ \t]{0,8}+)"""
LONG_VALUE = r"""(?:"(?P<s>[^"\r\n]{16,1024}+)"|'(?P<s2>[^'\r\n]{16,1024}+)'|(?P<s3>[^\s"'-][^\s"']{15,1023}+))"""
"""A value of at least 16 characters: what tokens, keys and their encodings are."""
# Lower-case names of settings that hold secrets (config dumps, argparse Namespaces, headers,
# JSON). A bare `token` is left to its own entry: `pad_token=` and `eos_token=` are not secrets.
SECRET_WORDS = (
    r"(?:password|passwd|passphrase|secret|client[_-]secret|api[_-]?key|api[_-]?secret"
    r"|access[_-]?key|secret[_-]?key|private[_-]?key(?:[_-]id)?|account[_-]?key|signing[_-]?key"
    r"|encryption[_-]?key|license[_-]?key|wandb[_-]?key|(?:access|auth|hub|hf|api|refresh"
    r"|bearer|id|session|github|gitlab|slack|bot|wandb|oauth|personal[_-]access|security|private)"
    r"[_-]?token)"
)
LOWER_NAME = r"(?:[a-z0-9]{1,24}+[_.-])?(?:[a-z0-9]{1,24}+[_.-])?" + SECRET_WORDS
# Environment-style names: *_TOKEN, *_KEY, *_SECRET, *PASSWORD*, and a few bare ones.
ENV_NAME = (
    r"(?:[A-Z0-9_]{0,64}PASSWORD[A-Z0-9_]{0,32}"
    r"|[A-Z0-9_]{0,64}(?:_TOKEN|_KEY|_SECRET|_APIKEY|_PASSWD|_PASS|_PWD|_PAT)"
    r"|TOKEN|SECRET|APIKEY|PASSWD)"
)
# Values that say a secret is absent or elsewhere: masking them would hide a useful fact.
PLACEHOLDER = re.compile(
    r"(?:none|null|nil|true|false|\*+|x{3,}|\.{3}|<[^<>]{0,40}>|\$\{?[A-Za-z_][A-Za-z0-9_]{0,64}\}?)",
    re.IGNORECASE,
)
TRAILING = ",;)]}"


@dataclass(frozen=True)
class SecretFormat:
    """One kind of secret: groups named s, s2, s3... are masked, the rest of the match stays."""

    name: str
    regex: str
    example: str
    """A line as a job or a user prints it, with a made-up secret of the real shape."""
    secret: str
    """The part of `example` that must never appear in ddpdoctor's output."""
    flags: int = 0
    hints: tuple[str, ...] = ()
    """Case-folded substrings, one of which every match contains: a text without any of them
    is not searched (substring tests run at memory speed, the regex does not)."""
    needs: str = ""
    """Characters of which every match holds one (the `=` or `:` after a name, a flag's `-`):
    a text holding a hint but none of them is not searched either. The hints of the formats
    that name their secret are words of every log ('tokens/s' holds 'token'): 10,000 rank
    files' last progress lines ('... grad_norm 2.534 tokens/s 105883', 4,704 of them) each
    took five such searches, 40 us a line."""
    pattern: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "pattern", re.compile(self.regex, self.flags))


# Order matters: formats that name their secret by context come first and mask the whole value;
# the bare token formats after them then see `****` and leave it alone.
SECRET_FORMATS: tuple[SecretFormat, ...] = (
    SecretFormat(
        "pem-private-key",
        r"-----BEGIN [A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----(?P<s>(?:[^-]|-(?!----)){16,16384}+)",
        '{"type": "service_account", "private_key": "-----BEGIN PRIVATE KEY-----\\n'
        "MIIEvAIBADANBgkqhkiG9w0BAQEFAASCBKYwggSiAgEAAoIBAQC7VJTUt9Us8cKj\\n"
        'AILDy2gH8Yqy5V+jlzpplwIvfIGi2HwXAtHjMGAviO5Eho0Zq+YldPQ1eQG1nWIF\\n-----END PRIVATE KEY-----\\n"}',
        "AILDy2gH8Yqy5V+jlzpplwIvfIGi2HwXAtHjMGAviO5Eho0Zq+YldPQ1eQG1nWIF",
        hints=("private key",),
    ),
    SecretFormat(
        "url-password",
        r"://[^\s:/?#@\"'<>]{0,128}+:(?P<s>[^\s/?#@\"'<>]{1,256}+)@",
        "sqlalchemy.exc.OperationalError: could not connect to postgres://trainer:RndQyvgqizEdvPUe@db.internal:5432/runs",
        "RndQyvgqizEdvPUe",
        hints=("://",),
    ),
    SecretFormat(
        "url-query-secret",
        r"[?&;](?P<k>(?:access_|auth_|api_|id_|refresh_)?token|api_?key|key|sig|signature"
        r"|password|passwd|secret|client_secret|x-amz-signature|x-amz-credential"
        r"|x-amz-security-token|x-goog-signature|x-goog-credential|code)=(?P<s>[^&\s#\"'<>]{1,4096}+)",
        "urllib.error.HTTPError: HTTP Error 403: Forbidden for url https://acct.blob.core.windows.net/ckpt/model.pt?sv=2022-11-02&sp=r&sig=6UQFFjAriy2rekcJfTaFSfmlFEZasm1vfbt9a1jrS17%3D",
        "6UQFFjAriy2rekcJfTaFSfmlFEZasm1vfbt9a1jrS17%3D",
        re.IGNORECASE,
        hints=("token", "key", "sig", "pass", "secret", "x-amz-", "x-goog-", "code"),
        needs="=",
    ),
    SecretFormat(
        "authorization-header",
        r"\b(?P<k>(?:proxy-)?authorization)(?P<sep>[\"']?[ \t]{0,8}+[=:][ \t]{0,8}+[\"']?)"
        r"(?:(?:bearer|basic|token|bot|sso-key|apikey)[ \t]{1,4}+)?(?P<s>[^\s\"',;]{1,4096}+)",
        "requests.exceptions.HTTPError: 401 Client Error for headers {'Authorization': 'Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ0cmFpbiJ9.Zm9vYmFyYmF6cXV4MTIzNDU2Nzg5MA'}",
        "Zm9vYmFyYmF6cXV4MTIzNDU2Nzg5MA",
        re.IGNORECASE,
        hints=("authorization",),
        needs="=:",
    ),
    SecretFormat(
        "cookie-header",
        r"\b(?P<k>(?:set-)?cookie)(?P<sep>[\"']?[ \t]{0,8}+:[ \t]{0,8}+[\"']?)(?P<s>[^\r\n\"']{1,4096}+)",
        "Cookie: session=9f8e7d6c5b4a3f2e1d0c9b8a7f6e5d4c; csrftoken=Qm9vYmFyYmF6",
        "9f8e7d6c5b4a3f2e1d0c9b8a7f6e5d4c",
        re.IGNORECASE,
        hints=("cookie",),
        needs=":",
    ),
    SecretFormat(
        "connection-string-key",
        r"(?:\b(?:AccountKey|SharedAccessKey|SharedAccessSignature)|(?<=;)[ \t]{0,4}+(?i:password|pwd))"
        r"=(?P<s>[^;\s\"']{1,4096}+)",
        "ValueError: bad connection string DefaultEndpointsProtocol=https;AccountName=ckpts;AccountKey=+jNWnvZ1mjAJOK89Q1vDFRIdU2uBnvnAGHDasK5l7XBfKeDnWw+b6KN23TcbcqeKvZCngh+8Gn8norA9GUUXSD==;EndpointSuffix=core.windows.net",
        "+jNWnvZ1mjAJOK89Q1vDFRIdU2uBnvnAGHDasK5l7XBfKeDnWw+b6KN23TcbcqeKvZCngh+8Gn8norA9GUUXSD==",
        hints=("accountkey", "sharedaccess", "password", "pwd"),
        needs="=",
    ),
    SecretFormat(
        "secret-flag",
        r"(?<![\w-])(?P<k>--?(?:[a-z0-9]{1,24}+[_-])?(?:[a-z0-9]{1,24}+[_-])?(?:"
        + SECRET_WORDS
        + r"|token))(?P<sep>=|[ \t]{1,4}+)"
        + VALUE,
        "python train.py --model_name_or_path gpt2 --push_to_hub --hub_token hf_ErQHQwjyaxErPZDS3MoJaQNjCxkv5ndK0m",
        "hf_ErQHQwjyaxErPZDS3MoJaQNjCxkv5ndK0m",
        re.IGNORECASE,
        hints=("pass", "secret", "key", "token"),
        needs="-",
    ),
    SecretFormat(
        "env-secret-assignment",
        r"\b(?P<k>" + ENV_NAME + r")\b" + SEP + VALUE,
        "export WANDB_API_KEY=f545fad3549e310f117a095dd2a31f31fd9ffd7f",
        "f545fad3549e310f117a095dd2a31f31fd9ffd7f",
        hints=("pass", "token", "key", "secret", "pwd", "_pat"),
        needs="=:",
    ),
    SecretFormat(
        "config-secret-assignment",
        r"\b(?<![\w-])(?P<k>" + LOWER_NAME + r")(?![\w-])" + SEP + VALUE,
        "Namespace(model='gpt2', lr=0.0001, db_password='RndQyvgqizEdvPUe', seed=42)",
        "RndQyvgqizEdvPUe",
        re.IGNORECASE,
        hints=("pass", "secret", "key", "token"),
        needs="=:",
    ),
    SecretFormat(
        "token-assignment",
        # a bare `token` names a word as often as a secret (a vocabulary's error 'Token:
        # mixed', a tokenizer's 'token: [PAD]'): only a value as long as secrets are is one
        r"\b(?<![\w.-])(?P<k>token)(?![\w-])" + SEP + LONG_VALUE,
        '{"registry": "ghcr.io", "token": "QmFzZTY0RW5jb2RlZFJlZ2lzdHJ5VG9rZW4"}',
        "QmFzZTY0RW5jb2RlZFJlZ2lzdHJ5VG9rZW4",
        re.IGNORECASE,
        hints=("token",),
        needs="=:",
    ),
    SecretFormat(
        "wandb-login",
        r"\bwandb[ \t]{1,4}login[ \t]{1,4}+(?:--relogin[ \t]{1,4}+)?(?P<s>[0-9a-f]{40,86}+)\b",
        "$ wandb login --relogin f545fad3549e310f117a095dd2a31f31fd9ffd7f",
        "f545fad3549e310f117a095dd2a31f31fd9ffd7f",
        hints=("wandb",),
    ),
    SecretFormat(
        "slack-webhook",
        r"\bhooks\.slack\.com/(?:services|workflows|triggers)/(?P<s>[A-Za-z0-9/_-]{20,256}+)",
        "slack notify failed: https://hooks.slack.com/services/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",
        "hEBUv0zWuvMyW34ZFvm4NOIN",
        hints=("hooks.slack.com",),
    ),
    SecretFormat(
        "discord-webhook",
        r"\bdiscord(?:app)?\.com/api/webhooks/(?P<s>[0-9]{5,30}+/[A-Za-z0-9_-]{20,256}+)",
        "POST https://discord.com/api/webhooks/5135649928744561197/wUtJWQNVTQ6jwZAPUSsLRQYfQjmGu_lNv4DKiDyzJpBx9N6q9Y47XUIzE_RTZNrdjLXL failed",
        "wUtJWQNVTQ6jwZAPUSsLRQYfQjmGu_lNv4DKiDyzJpBx9N6q9Y47XUIzE_RTZNrdjLXL",
        hints=("discord",),
    ),
    SecretFormat(
        "anthropic-key",
        r"\bsk-ant-(?:api|admin|oat|sid)[0-9]{2}-(?P<s>[A-Za-z0-9_-]{20,256}+)",
        "anthropic.AuthenticationError: invalid x-api-key sk-ant-api03-_rul6Dt-sJFHGkYuId2f5qz3xhcbpsZMAl4lwLiuZdQbtnkbIVHMTpv4m30VJUnnPJDPG99RapkZauD4-YXilu5v5NMEgAA",
        "_rul6Dt-sJFHGkYuId2f5qz3xhcbpsZMAl4lwLiuZdQbtnkbIVHMTpv4m30VJUnnPJDPG99RapkZauD4-YXilu5v5NMEgAA",
        hints=("sk-ant-",),
    ),
    SecretFormat(
        "openai-project-key",
        r"\bsk-(?:proj|svcacct|admin)-(?P<s>[A-Za-z0-9_-]{20,512}+)",
        "openai.AuthenticationError: Incorrect API key provided: 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",
        "UyqAnEHe4n_xh3Mc-XTZkj6ZbV1sdQjJNCM0JYkfKUKSkpfositrvwTCZcsK66PvGbK33AvcTTT3BlbkFJLm_V1TPfMbMOrhOEApliw3RIf3CVORgO9ACim9-uz7XRyrv85toz0BwGjP85l3YzvwskvPvfD8",
        hints=("sk-proj-", "sk-svcacct-", "sk-admin-"),
    ),
    SecretFormat(
        "openai-key",
        r"\bsk-(?P<s>[A-Za-z0-9]{32,256}+)\b",
        "openai.AuthenticationError: Incorrect API key provided: sk-5EjS1HAKulqBA1djdChHtpknhX1JyGFtMf7mj1oy3H6q79H0",
        "5EjS1HAKulqBA1djdChHtpknhX1JyGFtMf7mj1oy3H6q79H0",
        hints=("sk-",),
    ),
    SecretFormat(
        "huggingface-token",
        r"\b(?:hf|api_org)_(?P<s>[A-Za-z0-9]{30,256}+)",
        "huggingface_hub.errors.HfHubHTTPError: 401 Unauthorized: Invalid credentials in Authorization header for token hf_ErQHQwjyaxErPZDS3MoJaQNjCxkv5ndK0m",
        "ErQHQwjyaxErPZDS3MoJaQNjCxkv5ndK0m",
        hints=("hf_", "api_org_"),
    ),
    SecretFormat(
        "github-token",
        r"\bgh[pousr]_(?P<s>[A-Za-z0-9]{36,255}+)\b",
        "fatal: could not read from https://gho_kG0fzMAQMEEMyIbPUf9mYQqw8x3SyRthqpvx@github.com/acme/data.git",
        "kG0fzMAQMEEMyIbPUf9mYQqw8x3SyRthqpvx",
        hints=("ghp_", "gho_", "ghu_", "ghs_", "ghr_"),
    ),
    SecretFormat(
        "github-fine-grained-token",
        r"\bgithub_pat_(?P<s>[A-Za-z0-9_]{22,255}+)",
        "RuntimeError: push failed with 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",
        "MOUdGDxnvsDES92Ep9kD7J_xlmXVo6Ma8r6XZvlpYaGcpNhxIGjb7u4YQ1rOhoYHGEFOwqR8C5VkCsN3cr",
        hints=("github_pat_",),
    ),
    SecretFormat(
        "gitlab-token",
        r"\bgl(?:pat|dt|rt|ptt|cbt|oas|soat|ft|imt|agent|cf)-(?P<s>[A-Za-z0-9_-]{20,255}+)",
        "OSError: git clone https://oauth2@gitlab.com/acme/data.git --config http.extraHeader=PRIVATE-TOKEN:glpat-Q4BKGdadqI1rEz38hHf1",
        "Q4BKGdadqI1rEz38hHf1",
        hints=(
            "glpat-",
            "gldt-",
            "glrt-",
            "glptt-",
            "glcbt-",
            "gloas-",
            "glsoat-",
            "glft-",
            "glimt-",
            "glagent-",
            "glcf-",
        ),
    ),
    SecretFormat(
        "slack-token",
        r"\bxox[abposre]-(?P<s>[A-Za-z0-9-]{10,255}+)",
        "slack_sdk.errors.SlackApiError: invalid_auth for xoxb-69163985569-2020016836153-tr7YSRIFNNhnIMSRzLpeAwuf",
        "tr7YSRIFNNhnIMSRzLpeAwuf",
        hints=("xox",),
    ),
    SecretFormat(
        "slack-app-token",
        r"\bxapp-[0-9]{1,2}-(?P<s>[A-Za-z0-9-]{20,255}+)",
        "slack_bolt: could not connect with xapp-1-0SYUJIQCY01-9456676622341-81b949609105656965903bf6e304cf9ebcd0804fb3dcb24b173d21070307f6ea",
        "81b949609105656965903bf6e304cf9ebcd0804fb3dcb24b173d21070307f6ea",
        hints=("xapp-",),
    ),
    SecretFormat(
        "stripe-key",
        r"\b(?:sk|rk)_(?:live|test)_(?P<s>[A-Za-z0-9]{16,255}+)\b",
        "stripe.error.AuthenticationError: Invalid API Key provided: sk_live_a3muFzJuWTl6iZeAifNvyauD",
        "a3muFzJuWTl6iZeAifNvyauD",
        hints=("k_live_", "k_test_"),
    ),
    SecretFormat(
        "stripe-webhook-secret",
        r"\bwhsec_(?P<s>[A-Za-z0-9]{24,255}+)\b",
        "stripe.error.SignatureVerificationError: No signatures found with secret whsec_2osgdYRPUTjbYxI2fxnl9BNhf2f7WJw1",
        "2osgdYRPUTjbYxI2fxnl9BNhf2f7WJw1",
        hints=("whsec_",),
    ),
    SecretFormat(
        "aws-access-key-id",
        r"\b(?:AKIA|ASIA|ABIA|ACCA)(?P<s>[A-Z0-9]{16})\b",
        "botocore.exceptions.ClientError: InvalidAccessKeyId: The AWS Access Key Id AKIAIOSFODNN7EXAMPLE you provided does not exist in our records.",
        "IOSFODNN7EXAMPLE",
        hints=("akia", "asia", "abia", "acca"),
    ),
    SecretFormat(
        "google-api-key",
        r"\bAIza(?P<s>[0-9A-Za-z_-]{35})(?![0-9A-Za-z_-])",
        "google.api_core.exceptions.PermissionDenied: 403 API key AIzaZqza7QvD9JjAsxcv-2C03uwS-Ow4wcnFG0K not valid",
        "Zqza7QvD9JjAsxcv-2C03uwS-Ow4wcnFG0K",
        hints=("aiza",),
    ),
    SecretFormat(
        "google-oauth-access-token",
        r"\bya29\.(?P<s>[0-9A-Za-z_-]{20,4096}+)",
        "google.auth.exceptions.RefreshError: token ya29.5R63iappeszhdp3X4d5XfwShzZnIJWyYAOFnuA_6yuohls3WVpX-3hCsI95pQKaAE1qleZdJNDtfb59fSmbwJ_wr_Ven6UOYC1OoCL8rYMsiDiys1pNomI39 expired",
        "5R63iappeszhdp3X4d5XfwShzZnIJWyYAOFnuA_6yuohls3WVpX-3hCsI95pQKaAE1qleZdJNDtfb59fSmbwJ_wr_Ven6UOYC1OoCL8rYMsiDiys1pNomI39",
        hints=("ya29.",),
    ),
    SecretFormat(
        "google-oauth-client-secret",
        r"\bGOCSPX-(?P<s>[A-Za-z0-9_-]{20,255}+)",
        "oauthlib.oauth2.rfc6749.errors.InvalidClientError: (invalid_client) client 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 rejected",
        "sFP1z3wxFHNL6G-qIszDzPbbp66w",
        hints=("gocspx-",),
    ),
    SecretFormat(
        "jwt",
        r"\beyJ(?P<s>[A-Za-z0-9_-]{8,4096}+\.eyJ[A-Za-z0-9_-]{8,8192}+\.[A-Za-z0-9_-]{0,4096}+)",
        "jwt.exceptions.ExpiredSignatureError: Signature has expired: eyJhbGciOiAiSFMyNTYiLCAidHlwIjogIkpXVCJ9.eyJzdWIiOiAidHJhaW4tYm90IiwgImlhdCI6IDE3NjQ1MDAwMDAsICJleHAiOiAxNzY0NTg2NDAwfQ.V8pNr2Z1_VPU7NSb7wJ5dSq1UusOl3CrMJ0alC2-GnB",
        "V8pNr2Z1_VPU7NSb7wJ5dSq1UusOl3CrMJ0alC2-GnB",
        hints=("eyj",),
    ),
    SecretFormat(
        "npm-token",
        r"\bnpm_(?P<s>[A-Za-z0-9]{36,255}+)\b",
        "npm ERR! 401 Unauthorized with token npm_1SyEr5CwNSoHgLM1QuJfkC3hBEIc4GiEF3BK",
        "1SyEr5CwNSoHgLM1QuJfkC3hBEIc4GiEF3BK",
        hints=("npm_",),
    ),
    SecretFormat(
        "pypi-token",
        r"\bpypi-AgE(?P<s>[A-Za-z0-9_-]{50,4096}+)",
        "twine: HTTPError: 403 Forbidden with password pypi-AgEIcHlwaS5vcmcXCED7M0HpZXReAkbHlvDnf9DJcIa2UybROfdS16-c63GXtd4VY0qURqbVBhH",
        "IcHlwaS5vcmcXCED7M0HpZXReAkbHlvDnf9DJcIa2UybROfdS16-c63GXtd4VY0qURqbVBhH",
        hints=("pypi-age",),
    ),
    SecretFormat(
        "sendgrid-key",
        r"\bSG\.(?P<s>[A-Za-z0-9_-]{22}\.[A-Za-z0-9_-]{43})(?![A-Za-z0-9_-])",
        "python_http_client.exceptions.UnauthorizedError: key 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",
        "2UvPXg-e3LobTmTNHgLDRM1lZJSmGk-nkaR7ei5aOyQ",
        hints=("sg.",),
    ),
    SecretFormat(
        "docker-hub-token",
        r"\bdckr_(?:pat|oat)_(?P<s>[A-Za-z0-9_-]{20,255}+)",
        "Error response from daemon: login with dckr_pat_iq8u5R8WQw3dvoDjUWglN64DoH6 denied",
        "iq8u5R8WQw3dvoDjUWglN64DoH6",
        hints=("dckr_",),
    ),
    SecretFormat(
        "databricks-token",
        r"\bdapi(?P<s>[0-9a-f]{32})(?:-[0-9])?\b",
        "databricks.sdk.errors.Unauthenticated: invalid token dapib8c159368946b77b1d3134ff8af87873",
        "b8c159368946b77b1d3134ff8af87873",
        hints=("dapi",),
    ),
    SecretFormat(
        "digitalocean-token",
        r"\bdo[por]_v1_(?P<s>[0-9a-f]{64})\b",
        "doctl: Unable to authenticate with dop_v1_265abad0c41fb6e8c44fe55a93339f3b305ab99665d934d55cec4f40a041b69c",
        "265abad0c41fb6e8c44fe55a93339f3b305ab99665d934d55cec4f40a041b69c",
        hints=("_v1_",),
    ),
    SecretFormat(
        "replicate-token",
        r"\br8_(?P<s>[A-Za-z0-9]{37})\b",
        "replicate.exceptions.ReplicateError: Unauthenticated with r8_VYCkqtGePKWsQgatkgtIKGXhXYF0ytjr3eGtr",
        "VYCkqtGePKWsQgatkgtIKGXhXYF0ytjr3eGtr",
        hints=("r8_",),
    ),
    SecretFormat(
        "groq-key",
        r"\bgsk_(?P<s>[A-Za-z0-9]{48,255}+)\b",
        "groq.AuthenticationError: Invalid API Key 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",
        "GlClavgQpP1m9X32Fixj5RWdPES38ZHMqMUh7o9yXWkZhdIZkpFi",
        hints=("gsk_",),
    ),
    SecretFormat(
        "perplexity-key",
        r"\bpplx-(?P<s>[A-Za-z0-9]{40,255}+)\b",
        "httpx.HTTPStatusError: 401 for key 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",
        "8HFvfV2g4JKYIUYsw3bu9RDhvp465UCZVo1HNGW8disSnZuJ",
        hints=("pplx-",),
    ),
    SecretFormat(
        "telegram-bot-token",
        r"(?<![0-9])[0-9]{8,10}+:AA(?P<s>[0-9A-Za-z_-]{33})(?![0-9A-Za-z_-])",
        "telegram.error.InvalidToken: https://api.telegram.org/bot0173782612:AAsSQAciwTV0GutdCD4tJlSgbP-iWqlHHS7/sendMessage",
        "sSQAciwTV0GutdCD4tJlSgbP-iWqlHHS7",
        hints=(":aa",),
    ),
    SecretFormat(
        "shopify-token",
        r"\bshp(?:at|ca|pa|ss)_(?P<s>[a-fA-F0-9]{32})\b",
        "shopify.errors: 401 with 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",
        "395399e408352ded510668c9c815019f",
        hints=("shpat_", "shpca_", "shppa_", "shpss_"),
    ),
    SecretFormat(
        "atlassian-token",
        r"\bATATT3(?P<s>[A-Za-z0-9_=-]{100,512}+)",
        "jira.exceptions.JIRAError: 401 with ATATT3xFfGF0YzGg1U2Gy2CWO_eE1ni-kuAdNHQlbAEh_mPRUI5tQqCZii6VVCvDZdFTz05WorUCtyYxxVEos_G8mhUpyKgzyAIfeuUVhi84H9Imc1u0P3i336YeKDGmnxcnmsEYVmEHZlohSE_Zbukt3Bt-0us3jzaBcGslNYzs9-W9w1uFpmDQiNG2jn5H=13A45CA9",
        "xFfGF0YzGg1U2Gy2CWO_eE1ni-kuAdNHQlbAEh_mPRUI5tQqCZii6VVCvDZdFTz05WorUCtyYxxVEos_G8mhUpyKgzyAIfeuUVhi84H9Imc1u0P3i336YeKDGmnxcnmsEYVmEHZlohSE_Zbukt3Bt-0us3jzaBcGslNYzs9-W9w1uFpmDQiNG2jn5H",
        hints=("atatt3",),
    ),
    SecretFormat(
        "azure-ad-client-secret",
        r"(?<![A-Za-z0-9_~.-])(?P<s>[A-Za-z0-9_~.-]{3})[0-9]Q~(?P<s2>[A-Za-z0-9_~.-]{31,34}+)(?![A-Za-z0-9_~.-])",
        "azure.identity.ClientAuthenticationError: AADSTS7000215: Invalid client secret provided: fj88Q~qi-QVGQJYXoKB2LREV9tYgwjqrjbea0TiS",
        "qi-QVGQJYXoKB2LREV9tYgwjqrjbea0TiS",
        hints=("q~",),
    ),
    SecretFormat(
        "age-secret-key",
        r"\bAGE-SECRET-KEY-1(?P<s>[0-9A-Z]{58})\b",
        "age: error: no identity matched: AGE-SECRET-KEY-1INTSJFVGTLQMKC2Y4NZ4SAXJTJCPVECM7WU5LPRO1QTMR6R1QVQK7D3VMR",
        "INTSJFVGTLQMKC2Y4NZ4SAXJTJCPVECM7WU5LPRO1QTMR6R1QVQK7D3VMR",
        hints=("age-secret-key-1",),
    ),
    SecretFormat(
        "url-token-user",
        r"://(?P<s>[A-Za-z0-9_-]{20,256}+)(?=(?::[^\s/?#@]{0,256}+)?@)",
        "git clone https://0f3b9c2d7e8a41f6b5c4d3e2a1908f7e6d5c4b3a:x-oauth-basic@github.com/acme/data.git",
        "0f3b9c2d7e8a41f6b5c4d3e2a1908f7e6d5c4b3a",
        hints=("://",),
    ),
)

_UNHINTED = frozenset(i for i, f in enumerate(SECRET_FORMATS) if not f.hints)
_BY_HINT: dict[str, list[int]] = {}
for _i, _fmt in enumerate(SECRET_FORMATS):
    for _hint in _fmt.hints:
        _BY_HINT.setdefault(_hint, []).append(_i)
_ANY_HINT = re.compile("|".join(re.escape(h) for h in sorted(_BY_HINT, key=len, reverse=True)))
"""Whether any hint is in a text at all, in one search: most texts (paths, progress lines) hold
none, and looking for each of the ~70 hints in turn took 12 us a text (0.25 s of the view of
10,000 rank files, 21,000 distinct texts)."""

_SECRET_NAME = re.compile(rf"(?:{ENV_NAME}|(?i:{LOWER_NAME}|token))")
# argv elements that announce a secret in the next element: `--hub_token`, `--password`.
_SECRET_FLAG = re.compile(
    rf"--?(?i:(?:[a-z0-9]{{1,24}}[_-])?(?:[a-z0-9]{{1,24}}[_-])?(?:{SECRET_WORDS}|token))"
)


def strip_controls(text: str) -> str:
    """Remove terminal control sequences and control characters, keeping tabs and newlines."""
    return CONTROL.sub("", text)


def _masker(match: re.Match[str]) -> str:
    """The match with each secret group replaced by MASK; placeholders stay as they are."""
    whole = match.group(0)
    start = match.start()
    out: list[str] = []
    at = 0
    for name, value in match.groupdict().items():
        if not name.startswith("s") or name == "sep" or value is None:
            continue
        lo, hi = match.span(name)
        kept = len(value) - len(value.rstrip(TRAILING))
        if PLACEHOLDER.fullmatch(value[: len(value) - kept] if kept else value):
            continue
        out.append(whole[at : lo - start])
        out.append(MASK)
        at = hi - start - kept
    if not out:
        return whole
    out.append(whole[at:])
    return "".join(out)


def redact(text: str) -> str:
    """Mask every secret of a known format in `text`, keeping what names it (`hf_****`)."""
    # Hints are looked up once, in the original text: a mask only inserts "*", which no hint
    # holds, so a hint absent before is absent after each substitution.
    folded = text.casefold()
    wanted = set(_UNHINTED)
    if _ANY_HINT.search(folded) is not None:
        for hint, formats in _BY_HINT.items():
            if hint in folded:
                wanted.update(formats)
    for i in sorted(wanted):
        fmt = SECRET_FORMATS[i]
        # (the text as masked so far: a mask may take a character away, never add one)
        if fmt.needs and not any(c in text for c in fmt.needs):
            continue
        text = fmt.pattern.sub(_masker, text)
    return text


def clean_text(text: str, redact_secrets: bool = True) -> str:
    """Strip control sequences first (one can split a token in two), then mask secrets."""
    text = strip_controls(text)
    return redact(text) if redact_secrets else text


def is_secret_name(name: str) -> bool:
    """True for names of settings that hold secrets: HF_TOKEN, WANDB_API_KEY, db_password."""
    return _SECRET_NAME.fullmatch(name) is not None


def clean_value(value: Any, redact_secrets: bool = True) -> Any:
    """A JSON-like value with every string cleaned; under a secret name (env, config) the whole
    value is masked whatever its format; in an argv list the element after `--password` too."""
    return _clean(value, redact_secrets, None)


def _clean(value: Any, redact_secrets: bool, key: str | None) -> Any:
    if isinstance(value, str):
        if redact_secrets and key is not None and is_secret_name(key):
            return _mask_whole(strip_controls(value))
        return clean_text(value, redact_secrets)
    if isinstance(value, dict):
        return {
            (clean_text(k, redact_secrets) if isinstance(k, str) else k): _clean(
                v, redact_secrets, k if isinstance(k, str) else None
            )
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        items = _clean_argv(list(value), redact_secrets)
        return tuple(items) if isinstance(value, tuple) else items
    return value


def _clean_argv(items: list[Any], redact_secrets: bool) -> list[Any]:
    out: list[Any] = []
    after_flag = False
    for item in items:
        if redact_secrets and after_flag and isinstance(item, str) and not item.startswith("-"):
            out.append(_mask_whole(strip_controls(item)))
        else:
            out.append(_clean(item, redact_secrets, None))
        after_flag = isinstance(item, str) and _SECRET_FLAG.fullmatch(item) is not None
    return out


def _mask_whole(value: str) -> str:
    return value if not value or PLACEHOLDER.fullmatch(value) else MASK
