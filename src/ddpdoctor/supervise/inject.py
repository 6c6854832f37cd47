"""The no-ptrace path: a `sitecustomize.py` put first on the job's PYTHONPATH that arms
faulthandler on SIGUSR1 in each rank (dump to `<stacks>/rank<RANK>.txt`) and chains to any
existing sitecustomize. It must never break the user's interpreter.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

SITECUSTOMIZE = r'''
"""Written by `ddpdoctor run`; arms faulthandler on SIGUSR1, then chains to the real one."""
def _ddpdoctor_arm():
    import os
    stacks = os.environ.get("DDPDOCTOR_STACKS_DIR")
    armed = os.environ.get("DDPDOCTOR_ARMED_DIR")
    rank = os.environ.get("RANK") or os.environ.get("SLURM_PROCID")
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
_ddpdoctor_chain()
'''


def prepare(base: Path | None = None) -> Path:
    """A private temp folder holding `site/sitecustomize.py`, `armed/` and `heartbeats/`."""
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
