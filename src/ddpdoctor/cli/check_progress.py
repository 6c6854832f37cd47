"""What `ddpdoctor check` is doing, one line at a time on stderr while it works: collecting the
node's facts, each launch of the collective test (the baseline, then every bisection variation)
and how it ended. Wraps the session's launch function; changes nothing it does."""

from __future__ import annotations

import time
from collections.abc import Callable

import click

from ddpdoctor.preflight.collective import Attempt, LaunchConfig, run_attempt
from ddpdoctor.preflight.facts import Facts, collect_facts

Launch = Callable[[LaunchConfig, dict[str, str]], Attempt]


def say(text: str) -> None:
    click.echo(f"ddpdoctor check: {text}", err=True)


def facts_with_progress(workdir: str) -> Facts:
    t0 = time.monotonic()
    say("collecting the facts of this node (versions, GPUs, env, /dev/shm, interfaces)...")
    facts = collect_facts(workdir=workdir)
    say(f"facts collected in {time.monotonic() - t0:.1f} s")
    return facts


def launch_with_progress(backend: str, launch: Launch = run_attempt) -> Launch:
    """`launch`, announcing each attempt: the first is the test, later ones the bisection."""
    attempts = 0

    def announced(cfg: LaunchConfig, env: dict[str, str]) -> Attempt:
        nonlocal attempts
        attempts += 1
        what = (
            f"collective test: {cfg.nproc_per_node} rank(s), backend {backend}"
            if attempts == 1
            else "bisection: rerunning the test with "
            + (" ".join(f"{k}={v}" for k, v in sorted(env.items())) or "no change")
        )
        say(f"{what}, up to {cfg.attempt_timeout_s:.0f} s...")
        attempt = launch(cfg, env)
        say(f"  {attempt.status} after {attempt.duration_s:.1f} s")
        return attempt

    return announced
