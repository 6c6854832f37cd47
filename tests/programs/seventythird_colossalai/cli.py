"""colossalai.cli: `colossalai run`, which builds a torchrun command for each host and runs it
there through a runner process a host (on the local host: a local shell), then prints each
host's status; exits 1 when any host's command failed."""

from __future__ import annotations

import os
import subprocess
import sys
from multiprocessing import Pipe, Process

import click
import torch
from packaging import version


class UnexpectedExit(Exception):
    def __init__(self, command: str, exited: int) -> None:
        self.command = command
        self.exited = exited

    def __str__(self) -> str:
        return (
            "Encountered a bad command exit code!\n\n"
            f"Command: {self.command!r}\n\n"
            f"Exit code: {self.exited}\n\n"
            "Stdout: already printed\n\n"
            "Stderr: already printed\n\n"
        )


def get_launch_command(
    master_addr, master_port, nproc_per_node, user_script, user_args, node_rank, num_nodes
) -> str:
    torch_version = version.parse(torch.__version__)
    assert torch_version.major >= 1
    cmd = [
        "torchrun",
        f"--nproc_per_node={nproc_per_node}",
        f"--nnodes={num_nodes}",
        f"--node_rank={node_rank}",
    ]
    cmd += [f"--master_addr={master_addr}", f"--master_port={master_port}"]
    cmd += [user_script, *user_args]
    return " ".join(cmd)


def run_on_host(hostname: str, workdir: str, recv_conn, send_conn, env: dict) -> None:
    env_msg = " ".join([f'{k}="{v}"' for k, v in env.items()])
    while True:
        cmds = recv_conn.recv()
        if cmds == "exit":
            break
        try:
            command = f"cd {workdir} && export {env_msg} && {cmds}"
            rc = subprocess.run(command, shell=True, executable="/bin/bash").returncode
            if rc != 0:
                raise UnexpectedExit(command, rc)
            send_conn.send("success")
        except Exception as e:
            click.echo(
                f"Error: failed to run {cmds} on {hostname}, is localhost: True, exception: {e}"
            )
            send_conn.send("failure")
    send_conn.send("finish")


@click.group()
def cli():
    pass


@cli.command(context_settings=dict(ignore_unknown_options=True))
@click.option("--nproc_per_node", type=int, default=None)
@click.option("--master_port", type=int, default=29500)
@click.option("--master_addr", type=str, default="127.0.0.1")
@click.argument("user_script", type=str)
@click.argument("user_args", nargs=-1)
def run(nproc_per_node, master_port, master_addr, user_script, user_args):
    """Launch distributed training on the local node (the hostfile options are not re-created)."""
    if nproc_per_node is None:
        click.echo("--nproc_per_node did not receive any value")
        exit()
    hostname = "127.0.0.1"
    env = {k: v for k, v in os.environ.items() if v and "\n" not in v}
    master_send, worker_recv = Pipe()
    master_recv, worker_send = Pipe()
    p = Process(
        target=run_on_host, args=(hostname, os.path.abspath("."), worker_recv, worker_send, env)
    )
    p.start()
    cmd = get_launch_command(master_addr, master_port, nproc_per_node, user_script, user_args, 0, 1)
    master_send.send(cmd)
    msg = master_recv.recv()
    click.echo("\n====== Training on All Nodes =====")
    click.echo(f"{hostname}: {msg}")
    master_send.send("exit")
    stop = master_recv.recv()
    click.echo("\n====== Stopping All Nodes =====")
    click.echo(f"{hostname}: {stop}")
    p.join()
    sys.exit(1 if msg == "failure" else 0)
