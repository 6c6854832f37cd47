"""`trl vllm-serve` re-created for the hundredseventh-* fixtures (the trainer is
tests/programs/hundredseventh_style_train.py): the generation server TRL's GRPOTrainer talks to
in vllm_mode="server". Neither trl, vllm, fastapi nor uvicorn is installed: this file stands in
for trl/scripts/vllm_serve.py, a small vLLM engine and uvicorn. Like TRL's script it starts the
engine in a worker process (llm_worker, connected by a Pipe) and serves /health/,
/get_world_size/, /generate/, /init_communicator/, /update_named_param/, /reset_prefix_cache/ and
/close_communicator/ over HTTP; the weight-sync calls are fire-and-forget commands the worker
carries out (WeightSyncWorkerExtension): it hosts the weight-update group's store on the port
the client names, receives each parameter by broadcast and loads it with vLLM's
default_weight_loader. It writes what vLLM's logger writes ('INFO 12-06 05:31:22
[api_server.py:1024] ...', to stdout), what uvicorn writes ('INFO:     ...', its access lines
included, to stderr) and vLLM's 'Processed prompts' bar. Like vLLM's V1 front end, the server
shuts down when its engine process dies. The engine samples without a KV cache (every step runs
the whole sequence again). Started as `python hundredseventh_vllm_serve.py vllm-serve --model
M [--port P] [--dtype D]`, through a `trl` link in the captures.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import http.server
import json
import math
import multiprocessing
import os
import signal
import socket
import socketserver
import sys
import threading
import time
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist
from safetensors.torch import load_file
from torch import nn
from torch.nn import functional as F
from tqdm import tqdm

VLLM_VERSION = "0.8.5.post1"


def vllm_log(level: str, where: str, msg: str) -> None:
    """vLLM's logger: '%(levelname)s %(asctime)s [%(filename)s:%(lineno)d] %(message)s', date
    '%m-%d %H:%M:%S', to stdout."""
    stamp = datetime.datetime.now().strftime("%m-%d %H:%M:%S")
    sys.stdout.write(f"{level} {stamp} [{where}] {msg}\n")
    sys.stdout.flush()


def uvicorn_log(level: str, msg: str) -> None:
    """uvicorn's default formatter: '%(levelprefix)s %(message)s', to stderr."""
    sys.stderr.write(f"{(level + ':').ljust(9)} {msg}\n")
    sys.stderr.flush()


# ------------------------------------------------------------------- the engine's model code


def positions(t: int, d: int) -> torch.Tensor:
    pos = torch.arange(t, dtype=torch.float32)[:, None]
    freq = torch.exp(torch.arange(0, d, 2, dtype=torch.float32) * (-math.log(10000.0) / d))
    pe = torch.zeros(t, d)
    pe[:, 0::2] = torch.sin(pos * freq)
    pe[:, 1::2] = torch.cos(pos * freq)
    return pe


def default_weight_loader(param: torch.Tensor, loaded_weight: torch.Tensor) -> None:
    """vLLM's model_loader/weight_utils.py default_weight_loader."""
    if param.numel() == 1 and loaded_weight.numel() == 1:
        param.data.fill_(loaded_weight.item())
    else:
        assert param.size() == loaded_weight.size(), (
            f"Attempted to load weight ({loaded_weight.size()}) into parameter ({param.size()})"
        )
        param.data.copy_(loaded_weight)


class RMSNorm(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        out = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-6)
        return out.to(x.dtype) * self.weight


class TinyMathAttention(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv_proj = nn.Linear(d, 3 * d, bias=False)
        self.o_proj = nn.Linear(d, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (
            z.view(b, t, self.heads, d // self.heads).transpose(1, 2)
            for z in self.qkv_proj(x).split(d, dim=-1)
        )
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(b, t, d))


class TinyMathMLP(nn.Module):
    def __init__(self, d: int, inner: int) -> None:
        super().__init__()
        self.up_proj = nn.Linear(d, inner, bias=False)
        self.down_proj = nn.Linear(inner, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.gelu(self.up_proj(x)))


class TinyMathDecoderLayer(nn.Module):
    def __init__(self, d: int, heads: int, inner: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(d)
        self.self_attn = TinyMathAttention(d, heads)
        self.post_attention_layernorm = RMSNorm(d)
        self.mlp = TinyMathMLP(d, inner)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class TinyMathModel(nn.Module):
    def __init__(self, c: dict) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList(
            TinyMathDecoderLayer(c["hidden_size"], c["num_attention_heads"], c["intermediate_size"])
            for _ in range(c["num_hidden_layers"])
        )
        self.norm = RMSNorm(c["hidden_size"])


class TinyMathForCausalLM(nn.Module):
    def __init__(self, config: dict) -> None:
        super().__init__()
        self.config = config
        self.model = TinyMathModel(config)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        h = self.model.embed_tokens(input_ids)
        h = h + positions(input_ids.shape[1], h.shape[-1]).to(h.dtype)
        for layer in self.model.layers:
            h = layer(h)
        return F.linear(self.model.norm(h), self.model.embed_tokens.weight)

    def load_weights(self, weights: list[tuple[str, torch.Tensor]]) -> set[str]:
        params_dict = dict(self.named_parameters())
        loaded_params: set[str] = set()
        for name, loaded_weight in weights:
            param = params_dict[name]
            weight_loader = getattr(param, "weight_loader", default_weight_loader)
            weight_loader(param, loaded_weight)
            loaded_params.add(name)
        return loaded_params


# ---------------------------------------------------------------------------------- the engine


class StatelessProcessGroup:
    """vLLM's StatelessProcessGroup: rank 0 listens on the group port and hosts the store (the
    group keeps the listening socket); a gloo group on that store carries the tensors."""

    def __init__(self, rank: int, world_size: int, store, socket, pg) -> None:
        self.rank, self.world_size = rank, world_size
        self.store, self.socket, self.pg = store, socket, pg

    @staticmethod
    def create(host: str, port: int, rank: int, world_size: int, store_timeout: int = 300):
        listen_socket, listen_fd = None, None
        if rank == 0:
            listen_socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listen_socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listen_socket.bind((host, port))
            listen_socket.listen()
            listen_fd = listen_socket.fileno()
        store = dist.TCPStore(
            host_name=host,
            port=port,
            world_size=world_size,
            is_master=(rank == 0),
            timeout=timedelta(seconds=store_timeout),
            use_libuv=False,
            master_listen_fd=listen_fd,
        )
        pg = dist.ProcessGroupGloo(
            dist.PrefixStore("client2server", store), rank, world_size, timedelta(seconds=60)
        )
        return StatelessProcessGroup(rank, world_size, store, listen_socket, pg)

    def __del__(self) -> None:
        self.pg = None  # the group, then the store's daemon, before the listening socket
        self.store = None

    def broadcast(self, tensor: torch.Tensor, src: int) -> None:
        self.pg.broadcast(tensor, src).wait()

    def barrier(self) -> None:
        self.pg.barrier().wait()


class ModelRunner:
    def __init__(self, model: TinyMathForCausalLM) -> None:
        self.model = model


class WeightSyncWorkerExtension:
    """TRL's worker extension: the weight-update group and the parameters pushed over it."""

    communicator = None
    client_rank = None

    def __init__(self, model_runner: ModelRunner) -> None:
        self.model_runner = model_runner

    def init_communicator(
        self, host: str, port: int, world_size: int, client_device_uuid: str
    ) -> None:
        if self.communicator is not None:
            raise RuntimeError(
                "Weight update group already initialized. Call close_communicator first."
            )
        rank = 0  # get_world_group().rank of the only worker
        pg = StatelessProcessGroup.create(host=host, port=port, rank=rank, world_size=world_size)
        self.communicator = pg
        self.client_rank = world_size - 1

    def update_named_param(self, name: str, dtype: str, shape: list[int]) -> None:
        if self.communicator is None:
            raise RuntimeError("Communicator not initialized. Call `init_communicator` first.")
        dtype = getattr(torch, dtype.split(".")[-1])
        weight = torch.empty(tuple(shape), dtype=dtype)
        self.communicator.broadcast(weight, src=self.client_rank)
        self.communicator.barrier()
        self.model_runner.model.load_weights(weights=[(name, weight)])

    def close_communicator(self) -> None:
        if self.communicator is not None:
            del self.communicator
            self.communicator = None
            self.client_rank = None


class LLM:
    """The part of vllm.LLM the server uses: generate, collective_rpc, reset_prefix_cache."""

    def __init__(self, args: argparse.Namespace) -> None:
        torch.set_num_threads(1)
        with open(os.path.join(args.model, "config.json")) as f:
            config = json.load(f)
        with open(os.path.join(args.model, "tokenizer.json")) as f:
            self.vocab = json.load(f)["vocab"]
        self.ids = {t: i for i, t in enumerate(self.vocab)}
        model_dtype = config.get("torch_dtype", "float32")
        dtype = model_dtype if args.dtype == "auto" else args.dtype
        vllm_log(
            "INFO",
            "config.py:717",
            "This model supports multiple tasks: {'generate', 'reward', 'classify', 'embed', "
            "'score'}. Defaulting to 'generate'.",
        )
        if dtype != model_dtype:
            vllm_log("WARNING", "config.py:2940", f"Casting torch.{model_dtype} to torch.{dtype}.")
        max_len = args.max_model_len or 4096
        vllm_log(
            "INFO",
            "llm_engine.py:240",
            f"Initializing a V0 LLM engine (v{VLLM_VERSION}) with config: model='{args.model}', "
            f"speculative_config=None, tokenizer='{args.model}', skip_tokenizer_init=False, "
            "tokenizer_mode=auto, revision=None, trust_remote_code=False, "
            f"dtype=torch.{dtype}, max_seq_len={max_len}, download_dir=None, load_format=auto, "
            f"tensor_parallel_size={args.tensor_parallel_size}, pipeline_parallel_size=1, "
            f"quantization=None, enforce_eager={args.enforce_eager}, kv_cache_dtype=auto, "
            f"device_config=cpu, seed=0, served_model_name={args.model}, "
            f"enable_prefix_caching={args.enable_prefix_caching}, chunked_prefill_enabled=False, "
            "use_async_output_proc=False",
        )
        start = time.time()
        model = TinyMathForCausalLM(config)
        model.load_weights(list(load_file(os.path.join(args.model, "model.safetensors")).items()))
        self.dtype = getattr(torch, dtype)
        model = model.to(self.dtype).eval()
        n_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        vllm_log("INFO", "loader.py:458", f"Loading weights took {time.time() - start:.2f} seconds")
        vllm_log(
            "INFO",
            "model_runner.py:1140",
            f"Model loading took {n_bytes / 2**30:.4f} GiB and {time.time() - start:.6f} seconds",
        )
        blocks = int(args.gpu_memory_utilization * 8192)
        vllm_log("INFO", "executor_base.py:112", f"# cpu blocks: {blocks}, # CPU blocks: 0")
        vllm_log(
            "INFO",
            "executor_base.py:117",
            f"Maximum concurrency for {max_len} tokens per request: {blocks * 16 / max_len:.2f}x",
        )
        vllm_log(
            "INFO",
            "llm_engine.py:437",
            "init engine (profile, create kv cache, warmup model) took "
            f"{time.time() - start + 0.4:.2f} seconds",
        )
        self.model_runner = ModelRunner(model)
        self.worker = WeightSyncWorkerExtension(self.model_runner)
        self.generator = torch.Generator().manual_seed(0)
        self.eos = config["eos_token_id"]
        self.bos = config["bos_token_id"]

    def collective_rpc(self, method: str, args: tuple = (), kwargs: dict | None = None):
        return [getattr(self.worker, method)(*args, **(kwargs or {}))]

    def reset_prefix_cache(self) -> bool:
        return True

    @torch.no_grad()
    def _sample(self, prompt_ids: list[int], n: int, temperature: float, max_tokens: int):
        seqs = torch.tensor([prompt_ids] * n)
        done = [False] * n
        out: list[list[int]] = [[] for _ in range(n)]
        for _ in range(max_tokens):
            logits = self.model_runner.model(seqs)[:, -1].float()
            if temperature > 0:
                probs = torch.softmax(logits / temperature, dim=-1)
                tok = torch.multinomial(probs, 1, generator=self.generator)[:, 0]
            else:
                tok = logits.argmax(-1)
            for i in range(n):
                if not done[i]:
                    out[i].append(int(tok[i]))
                    done[i] = int(tok[i]) == self.eos
            if all(done):
                break
            seqs = torch.cat([seqs, tok[:, None]], dim=1)
        return out

    def generate(self, prompts: list[str], sampling_params: dict) -> list[dict]:
        n = sampling_params.get("n", 1)
        bar = tqdm(
            total=len(prompts),
            desc="Processed prompts",
            dynamic_ncols=True,
            postfix="est. speed input: 0.00 toks/s, output: 0.00 toks/s",
        )
        start = time.time()
        outputs = []
        n_in = n_out = 0
        for prompt in prompts:
            prompt_ids = [self.bos] + [self.ids[w] for w in prompt.split()]
            completions = self._sample(
                prompt_ids, n, sampling_params.get("temperature", 1.0),
                sampling_params.get("max_tokens", 16),
            )  # fmt: skip
            outputs.append({"prompt_token_ids": prompt_ids, "outputs": completions})
            n_in += len(prompt_ids)
            n_out += sum(len(c) for c in completions)
            elapsed = max(time.time() - start, 1e-6)
            bar.set_postfix_str(
                f"est. speed input: {n_in / elapsed:.2f} toks/s, output: {n_out / elapsed:.2f} toks/s",
                refresh=False,
            )
            bar.update(1)
        bar.close()
        return outputs


def llm_worker(args: argparse.Namespace, connection: multiprocessing.connection.Connection) -> None:
    llm = LLM(args)
    connection.send({"status": "ready"})
    while True:
        try:
            command = connection.recv()
        except KeyboardInterrupt:
            llm.collective_rpc(method="close_communicator")
            break
        if command["type"] in ["call", "fire_and_forget"]:
            method_name = command["method"]
            call_args, kwargs = command.get("args", ()), command.get("kwargs", {})
            method = getattr(llm, method_name)
            result = method(*call_args, **kwargs)
            if command["type"] == "call":
                connection.send(result)
        elif command["type"] == "shutdown":
            break


# ----------------------------------------------------------------------------------- the app


class App:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.lock = threading.Lock()
        self.stopping = False
        parent, child = multiprocessing.Pipe()
        self.connection = parent
        self.process = multiprocessing.Process(
            target=llm_worker, args=(args, child), name="EngineCore_DP0"
        )

    def send(self, command: dict) -> object:
        with self.lock:
            self.connection.send(command)
            if command["type"] == "call":
                return self.connection.recv()
        return None

    def handle(self, method: str, path: str, body: dict) -> tuple[int, dict]:
        a = self.args
        if method == "GET" and path == "/health/":
            return 200, {"status": "ok"}
        if method == "GET" and path == "/get_world_size/":
            return 200, {"world_size": a.tensor_parallel_size * a.data_parallel_size}
        if method == "POST" and path == "/generate/":
            keys = (
                "n",
                "repetition_penalty",
                "temperature",
                "top_p",
                "top_k",
                "min_p",
                "max_tokens",
            )
            sampling_params = {k: body[k] for k in keys if k in body}
            kwargs = {"prompts": body["prompts"], "sampling_params": sampling_params}
            outputs = self.send({"type": "call", "method": "generate", "kwargs": kwargs})
            completion_ids = [c for out in outputs for c in out["outputs"]]
            prompt_ids = [out["prompt_token_ids"] for out in outputs]
            return 200, {"prompt_ids": prompt_ids, "completion_ids": completion_ids}
        if method == "POST" and path == "/init_communicator/":
            world_size = a.tensor_parallel_size * a.data_parallel_size + 1
            kwargs = {
                "method": "init_communicator",
                "args": (body["host"], body["port"], world_size, body["client_device_uuid"]),
            }
            self.send({"type": "fire_and_forget", "method": "collective_rpc", "kwargs": kwargs})
            return 200, {"message": "Request received, initializing communicator"}
        if method == "POST" and path == "/update_named_param/":
            kwargs = {
                "method": "update_named_param",
                "args": (body["name"], body["dtype"], tuple(body["shape"])),
            }
            self.send({"type": "fire_and_forget", "method": "collective_rpc", "kwargs": kwargs})
            return 200, {"message": "Request received, updating named parameter"}
        if method == "POST" and path == "/reset_prefix_cache/":
            success = self.send({"type": "call", "method": "reset_prefix_cache"})
            return 200, {"message": f"Request received, resetting prefix cache status: {success}"}
        if method == "POST" and path == "/close_communicator/":
            kwargs = {"method": "close_communicator"}
            self.send({"type": "fire_and_forget", "method": "collective_rpc", "kwargs": kwargs})
            return 200, {"message": "Request received, closing communicator"}
        return 404, {"detail": "Not Found"}


class Handler(http.server.BaseHTTPRequestHandler):
    app: App

    def _serve(self, method: str) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}") if length else {}
        try:
            code, payload = self.app.handle(method, self.path, body)
        except Exception:
            uvicorn_log("ERROR", "Exception in ASGI application")
            sys.stderr.write(traceback.format_exc())
            sys.stderr.flush()
            code, payload = 500, None
        data = b"Internal Server Error" if payload is None else json.dumps(payload).encode()
        self.send_response(code)
        self.send_header(
            "content-type", "application/json" if payload is not None else "text/plain"
        )
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        with contextlib.suppress(OSError):
            self.wfile.write(data)

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def log_request(self, code: object = "-", size: object = "-") -> None:
        phrase = http.HTTPStatus(int(code)).phrase
        host, port = self.client_address[:2]
        line = (
            f'{host}:{port} - "{self.command} {self.path} {self.request_version}" {code} {phrase}'
        )
        uvicorn_log("INFO", line)

    def log_message(self, format: str, *args: object) -> None:
        pass


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def main(args: argparse.Namespace) -> int:
    vllm_log("INFO", "__init__.py:239", "Automatically detected platform cpu.")
    app = App(args)
    app.process.start()
    vllm_log(
        "INFO",
        "api_server.py:1024",
        f"Starting vLLM API server on http://{args.host}:{args.port}",
    )
    uvicorn_log("INFO", f"Started server process [{os.getpid()}]")
    uvicorn_log("INFO", "Waiting for application startup.")
    try:
        msg = app.connection.recv()
    except EOFError:
        uvicorn_log("ERROR", "Application startup failed. Exiting.")
        return 3
    assert msg == {"status": "ready"}, msg
    uvicorn_log("INFO", "Application startup complete.")
    Handler.app = app
    try:
        httpd = Server((args.host, args.port), Handler)
    except OSError as e:
        uvicorn_log(
            "ERROR",
            f"[Errno {e.errno}] error while attempting to bind on address "
            f"('{args.host}', {args.port}): {e.strerror.lower()}",
        )
        uvicorn_log("INFO", "Waiting for application shutdown.")
        app.send({"type": "shutdown"})
        app.process.join(10)
        uvicorn_log("INFO", "Application shutdown complete.")
        return 1
    uvicorn_log("INFO", f"Uvicorn running on http://{args.host}:{args.port} (Press CTRL+C to quit)")
    died = threading.Event()
    exited = threading.Event()

    def watch() -> None:  # the only thread that waits for the engine process
        app.process.join()
        exited.set()
        if not app.stopping and app.process.exitcode != 0:  # not a Ctrl-C in its terminal
            vllm_log(
                "ERROR",
                "core_client.py:439",
                f"Engine core proc {app.process.name} died unexpectedly, shutting down client.",
            )
            died.set()
            httpd.shutdown()

    def interrupt(signum: int, frame: object) -> None:
        app.stopping = True
        threading.Thread(target=httpd.shutdown, daemon=True).start()

    signal.signal(signal.SIGINT, interrupt)
    signal.signal(signal.SIGTERM, interrupt)
    threading.Thread(target=watch, daemon=True).start()
    httpd.serve_forever(poll_interval=0.1)
    uvicorn_log("INFO", "Shutting down")
    uvicorn_log("INFO", "Waiting for application shutdown.")
    if not died.is_set() and not exited.wait(timeout=10):
        vllm_log(
            "WARNING",
            "vllm_serve.py:483",
            f"Process {app.process} is still alive after 10 seconds, attempting to terminate...",
        )
        app.process.terminate()
        exited.wait()
    uvicorn_log("INFO", "Application shutdown complete.")
    uvicorn_log("INFO", f"Finished server process [{os.getpid()}]")
    return 1 if died.is_set() else 0


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="trl")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("vllm-serve", prog="trl vllm-serve")
    p.add_argument("--model", required=True)
    p.add_argument("--revision", default=None)
    p.add_argument("--tensor_parallel_size", type=int, default=1)
    p.add_argument("--data_parallel_size", type=int, default=1)
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--gpu_memory_utilization", type=float, default=0.9)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--max_model_len", type=int, default=None)
    p.add_argument("--enable_prefix_caching", action="store_true")
    p.add_argument("--enforce_eager", action="store_true")
    p.add_argument("--log_level", default="info")
    return parser


if __name__ == "__main__":
    sys.exit(main(make_parser().parse_args()))
