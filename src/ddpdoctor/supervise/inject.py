"""The no-ptrace path: a `sitecustomize.py` put first on the job's PYTHONPATH that arms
faulthandler on SIGUSR1 in each rank (dump to `<stacks>/rank<RANK>.txt`), arms the Flight
Recorder hook (see supervise/flight.py) and chains to any existing sitecustomize. It must never
break the user's interpreter.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

SITECUSTOMIZE = r'''
"""Written by `ddpdoctor run`; arms faulthandler on SIGUSR1 and the Flight Recorder hook, then
chains to the real one."""
def _ddpdoctor_slurm_task():
    """SLURM_PROCID of a task that srun started; a batch script has SLURM_PROCID=0 too, without
    a step id, and is no rank."""
    import os
    if os.environ.get("SLURM_STEP_ID") is None and os.environ.get("SLURM_STEPID") is None:
        return None
    return os.environ.get("SLURM_PROCID")


def _ddpdoctor_arm():
    import os
    stacks = os.environ.get("DDPDOCTOR_STACKS_DIR")
    armed = os.environ.get("DDPDOCTOR_ARMED_DIR")
    rank = os.environ.get("RANK") or _ddpdoctor_slurm_task()
    if not stacks or not armed:
        return
    if rank is None and str(os.getppid()) != os.environ.get("DDPDOCTOR_SUPERVISOR_PID"):
        return  # neither a rank nor the job's own interpreter (a launcher's helper)
    try:
        import faulthandler, signal
        import signal as _s
        if _s.getsignal(_s.SIGUSR1) not in (_s.SIG_DFL, None):
            return  # the program owns SIGUSR1 already
        name = "rank%s.txt" % rank if rank is not None else "pid%d.txt" % os.getpid()
        fh = open(os.path.join(stacks, name), "a")
        faulthandler.register(signal.SIGUSR1, file=fh, all_threads=True, chain=False)
        globals()["_ddpdoctor_file"] = fh
        open(os.path.join(armed, str(os.getpid())), "w").close()
    except Exception:
        pass


def _ddpdoctor_flight():
    """Write this rank's Flight Recorder dump (torch's `_dump_fr_trace_json()`, then
    `_dump_fr_trace()` with frames) to DDPDOCTOR_FR_DIR/rank<RANK>.json and .pkl when asked
    (a file in the request folder; a thread polls, since the main thread may be blocked in a
    collective): by the supervisor on a hang, and by any rank that is about to die of an
    uncaught exception, which dumps itself and asks the others first, before the launcher
    kills them. Never imports torch: a process that has not imported it has nothing recorded."""
    import os, sys, threading
    out = os.environ.get("DDPDOCTOR_FR_DIR")
    requests = os.environ.get("DDPDOCTOR_FR_REQUESTS")
    answers = os.environ.get("DDPDOCTOR_FR_ANSWERS")
    rank = os.environ.get("RANK") or _ddpdoctor_slurm_task()
    if not out or not requests or not answers or rank is None:
        return
    lock = threading.Lock()
    seen = set()

    def write(name, data):
        path = os.path.join(out, name)
        tmp = "%s.%d.tmp" % (path, os.getpid())
        with open(tmp, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)

    def dump():
        # JSON first: instant, no frames; then the pickle with frames, whose first call in a
        # process takes seconds (torch imports its symbolizer's modules)
        try:
            dist = sys.modules.get("torch.distributed")
            c10d = sys.modules.get("torch._C._distributed_c10d")
            if dist is None or c10d is None or not dist.is_available():
                return "torch.distributed not in use"
            if not dist.is_initialized():
                return "no process group"
            with lock:
                write("rank%s.json" % rank, c10d._dump_fr_trace_json())
                write("rank%s.pkl" % rank, c10d._dump_fr_trace())
            return "ok"
        except Exception as exc:
            return "error: %s: %s" % (type(exc).__name__, exc)

    def answer(name, text):
        tmp = os.path.join(answers, ".%s.%d" % (name, os.getpid()))
        with open(tmp, "w") as fh:
            fh.write(text)
        os.replace(tmp, os.path.join(answers, "%s.%d" % (name, os.getpid())))

    def watch():
        import time
        try:
            seen.update(os.listdir(requests))
        except OSError:
            return
        while True:
            time.sleep(0.2)
            try:
                names = set(os.listdir(requests))
            except OSError:
                return  # the supervisor removed its folder: the run is over
            for name in sorted(names - seen):
                seen.add(name)
                try:
                    answer(name, dump())
                except OSError:
                    pass

    try:
        threading.Thread(target=watch, name="ddpdoctor-flight-recorder", daemon=True).start()
        previous = sys.excepthook

        def hook(*args):
            if args and isinstance(args[0], type) and issubclass(args[0], KeyboardInterrupt):
                return previous(*args)  # Ctrl-C: a stop, not a failure to record (and quick)
            name = "exception-rank%s-%d" % (rank, os.getpid())
            seen.add(name)
            try:
                open(os.path.join(requests, name), "w").close()
            except OSError:
                pass
            dump()
            previous(*args)

        sys.excepthook = hook
    except Exception:
        pass


def _ddpdoctor_chain():
    import importlib.machinery, importlib.util, os, sys
    here = os.path.dirname(os.path.abspath(__file__))
    saved = sys.modules.pop("sitecustomize", None)
    try:
        path = [p for p in sys.path if os.path.abspath(p or ".") != here]
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
        if spec is not None and spec.loader is not None:
            module = importlib.util.module_from_spec(spec)
            sys.modules["sitecustomize"] = module
            spec.loader.exec_module(module)
            return
    except Exception:
        import traceback
        traceback.print_exc()
    if saved is not None:
        sys.modules["sitecustomize"] = saved


_ddpdoctor_arm()
_ddpdoctor_flight()
_ddpdoctor_chain()
'''


def prepare(base: Path | None = None) -> Path:
    """A private temp folder holding `site/sitecustomize.py`, `armed/` and `heartbeats/` (and,
    made by supervise/flight.py, the Flight Recorder request and answer folders)."""
    root = Path(tempfile.mkdtemp(prefix="ddpdoctor-", dir=base))
    (root / "site").mkdir()
    (root / "armed").mkdir()
    (root / "heartbeats").mkdir()
    (root / "site" / "sitecustomize.py").write_text(SITECUSTOMIZE, encoding="utf-8")
    return root


def job_env(
    env: dict[str, str], inject_root: Path, stacks_dir: Path, inject: bool
) -> dict[str, str]:
    """The child's environment: heartbeat dir always; sitecustomize first on PYTHONPATH if asked."""
    out = dict(env)
    out["DDPDOCTOR_HEARTBEAT_DIR"] = str(inject_root / "heartbeats")
    if inject:
        site = str(inject_root / "site")
        old = out.get("PYTHONPATH")
        out["PYTHONPATH"] = site + (os.pathsep + old if old else "")
        out["DDPDOCTOR_STACKS_DIR"] = str(stacks_dir.resolve())
        out["DDPDOCTOR_ARMED_DIR"] = str((inject_root / "armed").resolve())
        out["DDPDOCTOR_SUPERVISOR_PID"] = str(os.getpid())
    return out
