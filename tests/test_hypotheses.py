"""Each inferred cause (rules/hypotheses) with its own positive and near-miss examples, all real:
captures of scenario runs, real fixtures, and training-split corpus cases (never validation).
A positive concludes that hypothesis with the culprit given; a near miss concludes another."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ddpdoctor.analysis.diagnose import diagnose_paths
from ddpdoctor.rules.registry import HYPOTHESES, HYPOTHESIS_ONLY_RULES
from ddpdoctor.scenarios import catalog, runner
from tests.conftest import CORPUS, REPO

REAL = REPO / "tests" / "fixtures" / "real"
CASES = REPO / "corpus" / "cases"


def scenario(name: str) -> list[str]:
    return runner.log_paths(catalog.get(name).captured_dir)


def real(name: str) -> list[str]:
    return [str(REAL / name)]


def case(prefix: str) -> list[str]:
    found = [p for base in (CASES, CORPUS) for p in base.glob(f"{prefix}-*")]
    if not found:
        pytest.skip(f"corpus case {prefix} not present")
    from corpus.scoreboard import load_cases

    splits = {c.path: c.split for c in load_cases()}
    assert splits[found[0]] == "train", "hypothesis examples come from the training split only"
    return [str(found[0] / "logs")]


def ran(code: str, tmp: Path) -> list[str]:
    """The console of a real Python program run here (stdout and stderr together)."""
    script = tmp / "train.py"
    script.write_text(code)
    proc = subprocess.run(
        [sys.executable, str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=60,
    )
    out = tmp / "console.log"
    out.write_text(proc.stdout)
    return [str(out)]


def launcher_only(name: str, tmp: Path) -> list[str]:
    """Only torchrun's own lines of a real console, as when the workers' stderr went elsewhere."""
    console = Path(scenario(name)[0])
    kept = [
        ln for ln in console.read_text().splitlines(keepends=True) if not ln.startswith("[rank")
    ]
    out = tmp / "launcher.log"
    out.write_text("".join(kept))
    return [str(out)]


def case_cut_before(prefix: str, marker: str, tmp: Path) -> list[str]:
    """A training corpus case's single log cut just before the first line holding `marker`:
    the same report as a paste that stopped one line earlier."""
    (log,) = [p for p in Path(case(prefix)[0]).rglob("*") if p.is_file()]
    lines = log.read_text().splitlines(keepends=True)
    end = next(i for i, ln in enumerate(lines) if marker in ln)
    out = tmp / "cut.log"
    out.write_text("".join(lines[:end]))
    return [str(out)]


def case_edited(prefix: str, old: str, new: str, tmp: Path) -> list[str]:
    """A training corpus case's single log with one phrase put otherwise (a paste of the same
    failure from a version that words a line differently)."""
    (log,) = [p for p in Path(case(prefix)[0]).rglob("*") if p.is_file()]
    text = log.read_text()
    assert old in text
    out = tmp / "edited.log"
    out.write_text(text.replace(old, new))
    return [str(out)]


def twice(folder: str, tmp: Path) -> list[str]:
    """A folder's one log given as two files: the same lines in two outputs."""
    (log,) = [p for p in Path(folder).rglob("*") if p.is_file()]
    for name in ("console.log", "copy.log"):
        (tmp / name).write_bytes(log.read_bytes())
    return [str(tmp / "console.log"), str(tmp / "copy.log")]


def cut_before(name: str, marker: str, tmp: Path) -> list[str]:
    """A real console cut just before the first line holding `marker`, as a paste that stops
    early or a log truncated when its disk filled up."""
    lines = Path(scenario(name)[0]).read_text().splitlines(keepends=True)
    end = next(i for i, ln in enumerate(lines) if marker in ln)
    out = tmp / "cut.log"
    out.write_text("".join(lines[:end]))
    return [str(out)]


# code -> [(inputs, culprit ranks or None for "not checked")]
POSITIVE = {
    "INF201": [
        (lambda t: scenario("slow-rank-timeout"), [0]),
        (lambda t: real("monitored-barrier"), [1]),
        (lambda t: case("019"), [0]),
        (lambda t: case("145"), None),
        # one line: rank 3 gave up waiting for rank 0's NCCL id, and rank 0 printed nothing
        (lambda t: case("615"), [0]),
        # a 15 s timeout: rank 2's own 'class weights' bar (no rank on it) moved for 15 s while
        # the others timed out, below the 30 s a bar needs when no timeout is known
        (lambda t: real("thirtyeighth-r2-drag"), [2]),
        # Lightning's SIGTERM handler broadcast on top of rank 0's time.sleep in a callback:
        # the stop found it outside any collective while the others waited at the barrier
        (lambda t: real("sixth-slow-ckpt"), [0]),
        # two ranks terminated by the agent; rank 1 alone announced "re-tokenizing the shard"
        (lambda t: real("seventh-busy-retok"), [1]),
        # its timed lines ('... rebuilding 3/8', 're-indexing data (4/8)') went on inside the
        # others' 15 s wait, under its node's prefix only: the node's one rank that neither
        # waited nor failed was at work of its own
        (lambda t: real("fiftyfifth-cache-crawl"), [2]),
        (lambda t: real("fiftyninth-reindex-crawl"), [2]),
        # the same with a time of day and no date ('[06:56:30 - darcy_fno - WARNING] ...
        # refining grid (3/8)', Modulus's PythonLogger), read on the day of the launcher's stop
        (lambda t: real("sixtyfourth-solver-crawl"), [1]),
        # no rank on any line: Megatron's '... building the indices on rank 0 ...', then the
        # store's 'RuntimeError: Socket Timeout' of the processes that waited for it: the line
        # says which rank does the work
        (lambda t: case("1235"), [0]),
        # the same with the rank left out of that line: which rank worked is not known
        (
            lambda t: case_edited(
                "1235", "building the indices on rank 0", "building the indices", t
            ),
            [],
        ),
    ],
    # without `run`: Lightning's SIGTERM handler stood on rank 1's `with self.lock:` (a lock
    # it already held) while ranks 0 and 2 timed out: stuck, not busy
    "INF211": [
        # StyleGAN's 'Setting up PyTorch plugin "bias_act_plugin"... ' never closed by 'Done.'
        # (a lock file left by a killed build): rank 0, the one mp.spawn had to stop, waits on
        # the build lock while rank 1 times out
        (lambda t: real("ninetyseventh-stale-lock"), [0]),
        (lambda t: real("sixth-lock-twice"), [1]),
        # "... will be overwritten. Continue? [y/N] " and rank 0, still running when the agent
        # stopped the job, never reached DDP's first collective: waiting for an answer
        (lambda t: real("eighth-ask-overwrite"), [0]),
        # rank 1 (not the main process) blocked on a lock file rank 0 never released: alive
        # (the agent had to SIGTERM it), silent, no work of its own announced, while rank 0
        # timed out waiting for it
        (lambda t: real("fourteenth-cache-lock"), [1]),
        (lambda t: real("twentyfourth-stuck-r1"), [1]),
    ],
    "INF202": [
        (lambda t: scenario("uncoordinated-exit"), [1]),
        # mp.spawn: "gpu 1 | training finished" while ranks 0 and 2 were still in their
        # backward pass, which then lost its peer: rank 1 left, it did not finish the job
        (lambda t: real("spawn-leave"), [1]),
        # rank 1 exits 1 with no traceback (its "Loss is nan, stopping training" silenced by
        # setup_for_distributed) in the console that holds rank 0's lost-peer traceback: an
        # exception would have printed one there; it called sys.exit(1)
        (lambda t: real("nineteenth-nan-quiet"), [1]),
        # ranks 0 and 1 exit 0, left out of torchrun's summary, as in fiftieth-odd-shards, but a
        # line of no rank says 'Loss below 1.2, stopping at iter 36': a stop decided on purpose
        (lambda t: real("sixtieth-early-out"), [0, 1]),
        # one 'Early stopping' line of no rank; rank 0 then times out in the barrier after the
        # epoch loop, rank 1 in its backward: rank 0 left the loop on its own patience
        (lambda t: real("ninetyninth-lone-ett"), [0]),
    ],
    "INF203": [
        (lambda t: scenario("collective-mismatch-op-nodebug"), [0]),
        (lambda t: real("timeout-echo-printed-first"), [0]),
        (lambda t: case("057"), None),
        (lambda t: case("132"), None),
        # after the Trainer's end of training, trainer.evaluate() on rank 0 only
        (lambda t: scenario("hf-trainer-evaluate-main-only"), [0]),
        # only process 0 timed out, in a barrier its calc_metric reached; processes 1 and 2
        # printed nothing (mp.spawn stopped them): metrics on the main process only
        (lambda t: real("fiftysixth-lone-tally"), [0]),
        # both ranks time out on the same line; rank 1 had said "skipping degenerate batch 5"
        (lambda t: real("sixth-skipped-backward"), [1]),
        # only process 1's barrier timeout is shown (mp.spawn stopped the rest); rank 2's last
        # words are rank 1's, rank 0's are another phase (it broadcast in an `if rank == 0`)
        (lambda t: real("spawn-rank0-collective"), [0]),
    ],
    "INF204": [(lambda t: case("141"), None), (lambda t: case("146"), None)],
    # rank 0 hosts the store and timed out waiting for its clients ("3/4 clients joined"),
    # the pod of rank 3 never started: the others lost the store's host when it gave up
    "INF230": [
        (lambda t: real("sixteenth-pod-pending"), [3]),
        # init_process_group's store-based barrier timed out on rank 0 with 'worker_count=1' of
        # 'world_size=4': it alone had arrived, ranks 1-3 never came (busy loading a cache)
        (lambda t: case("1658"), [1, 2, 3]),
    ],
    # NCCL connected the 4 GPUs of one node "via P2P/IPC", Init COMPLETE, then nothing
    "INF205": [(lambda t: case("467"), [])],
    # torchrun saw rank 0 exit 1 first and SIGTERMed rank 1 (the real culprit) while it was
    # going down: from the launcher alone the culprit cannot be told, so it is not checked
    "INF208": [
        (lambda t: launcher_only("data-error", t), None),
        # mpirun names rank 0 as the first process to exit 1; rank 1 only lost its peer
        # (Horovod shut down): rank 0's own error (an OOM, per the thread) is not pasted
        (lambda t: case("410"), [0]),
    ],
    # rank 1's traceback without its FileNotFoundError line; a paste cut inside one
    "INF215": [
        (lambda t: cut_before("data-error", "[rank1]: FileNotFoundError", t), [1]),
        (lambda t: case("259"), []),
    ],
    # c10::Error frames that end the paste: the heartbeat monitor's
    "INF216": [(lambda t: case("136"), None)],
    # the NCCL watchdog's (the timeout's message above them cut away)
    "INF222": [(lambda t: case("153"), [])],
    # cut tracebacks whose last frame names what the process was doing
    "INF218": [(lambda t: case("369"), [])],
    "INF219": [
        (lambda t: cut_before("missing-module", "ModuleNotFoundError", t), [0]),
        (lambda t: case("246"), []),
    ],
    "INF220": [(lambda t: cut_before("launcher-env-missing", "KeyError", t), None)],
    "INF221": [(lambda t: case("230"), [])],
    # torch.distributed.launch's own traceback, cut in process.wait() -> os.waitpid after the
    # last epoch: the launcher still waited for its workers when it was stopped
    "INF236": [(lambda t: case("454"), [])],
    # a DeepSpeed ZeRO checkpoint save, the paste cut inside torch.save
    "INF223": [
        (lambda t: case("235"), []),
        # rank 24 cut inside datasets' Arrow writer (map() writing its cache), in pyarrow's
        # compiled frame
        (lambda t: case("605"), [24]),
    ],
    # the paste ends in c10d's retries to reach the store: no rank is blamed, the address is
    "INF225": [
        (lambda t: case("462"), []),
        # torch 2.x's other retry ('No socket on (localhost, 0) is listening yet'), alone
        (lambda t: case("1072"), []),
    ],
    # Lightning's ranks announce they join a world of 8, and the paste stops there
    "INF226": [
        (lambda t: case("474"), []),
        # c10d's store barrier: ranks 0-3 and 5-7 of 8 wait, each naming itself; rank 4 never
        # printed a line
        (lambda t: case("613"), [4]),
    ],
    # srun --label: Lightning's 'GLOBAL_RANK: 1, MEMBER: 2/8' printed by two tasks each for
    # ranks 1-3, ranks 4-7 never: both nodes took the first node's ranks
    "INF235": [(lambda t: case("660"), []), (lambda t: case("1324"), [])],
    # one exception line pasted alone, naming init_process_group (not a start-up stall)
    "INF227": [(lambda t: case("500"), [])],
    # the ranks' barrier in main_process_first while the main process tokenised, cut
    "INF228": [(lambda t: case("426"), [])],
    # torch.load restoring every rank's optimizer state onto cuda:0 (two reports): the pastes
    # cut before their CUDA out of memory
    "INF232": [
        (lambda t: case_cut_before("052", "RuntimeError: CUDA out of memory", t), None),
        (lambda t: case_cut_before("488", "RuntimeError: CUDA out of memory", t), None),
    ],
    # two nodes whose output stops after NCCL set up its channels: a hang, not peer-to-peer
    "INF206": [
        (lambda t: case("449"), []),
        # one node, but no NCCL line at all: nothing shows peer-to-peer (an infrastructure
        # kind is not said without evidence; its bisection is the next step)
        (lambda t: case("070"), []),
        # one node's paste only, but its rank 8 connects its ring "via NET/Socket": two nodes
        (lambda t: case("507"), []),
    ],
    "INF209": [
        # only rank 0 logs; it lost its peer on the loopback and torchrun's summary lists it
        # alone (<NO_OTHER_FAILURES>): another process existed, printed nothing and exited 0
        # while rank 0 still had steps (a world of two where nothing says more)
        (lambda t: real("ninetysixth-pack-uneven"), [1]),
        # rank 2 printed nothing and torchrun's failure summary lists ranks 0 and 1 only (it
        # lists every worker that did not exit 0): rank 2's loop had ended, it exited 0 while
        # they lost it, and no rank announced a stop (it had fewer shards)
        (lambda t: real("fiftieth-odd-shards"), [2]),
        (lambda t: scenario("uneven-inputs"), [1]),
        # rank 1 logged 'Filtered 4 prompts longer than prompt_max_len=16' (its own log file),
        # then finished its loop and exited 0 while rank 0 still had prompts
        (lambda t: real("fortysixth-long-prompts"), [1]),
        # CosyVoice's join barrier before every batch (WeNet's): '[Rank 0]: Rank 2 failed to
        # pass monitoredBarrier', logged as an uneven workload; rank 2 printed nothing else
        (lambda t: case("416"), [2]),
        # one bar per node console: machine 1's 'Steps: 100%| 5/5', machine 0's 'Steps: 62%|
        # 5/8'; the ranks are each console's (its agent's summary)
        (lambda t: real("twentysecond-node1-fewer"), [2, 3]),
        (lambda t: real("abort-after-timeout"), [1]),
        # no counters: the ranks said how much data they had ("7 batches of 8 per epoch" on
        # rank 2, 10 on the others) before gloo's size check aborted a rank
        (lambda t: real("third-uneven"), [2]),
        (lambda t: real("spawn-uneven"), [1]),
        # no counters, no sizes: rank 2 timed out in the evaluation's all_gather (Lightning's
        # validation_step, Accelerate's gather_for_metrics in evaluate) while the others still
        # waited inside a training step: it had left the training loop first
        (lambda t: real("sixth-uneven-shard"), [2]),
        (lambda t: real("fifth-short-shard"), [2]),
        # "[Rank 2] 28 documents, 7 micro-batches per epoch" against 8 on the others: the
        # announcement outweighs the ranks' different collectives, which leaving the loop gives
        (lambda t: real("seventh-short-shard"), [2]),
        # the DDP tutorial's '[GPU3] Epoch 0 | Batchsize: 16 | Steps: 3' against 'Steps: 5':
        # rank 3 finished its epochs and exited 0 while the others still trained
        (lambda t: real("thirtyeighth-lean-r3"), [3]),
        # no error, no timeout, the log stops: each rank's own count of its batches, rank 2's
        # twice the others' (the odd one out has more: it goes on alone)
        (lambda t: case("1166"), [2]),
        # no counters, sizes or phases: rank 2 timed out in a barrier (the program's, at its
        # loop's end) while ranks 0 and 1 waited inside a training step (DDP's backward)
        (lambda t: real("nineteenth-shard-uneven"), [2]),
        (lambda t: real("twentieth-own-shards"), [2]),
        # no counters, sizes or phase of its own: gloo aborted rank 1 in a collective of 4
        # bytes ('132 vs 4': the evaluation's metric) when a peer sent it a gradient bucket,
        # while ranks 0 and 2 lost it inside loss.backward(): it had left the training loop
        (lambda t: real("fortyfirst-short-ann"), [1]),
        (lambda t: real("twentyseventh-thin-r2"), [2]),
        # the same abort ('2436 vs 4', '452 vs 8') after training steps, and torchrun's (or
        # spawn's) SIGTERM ended the others before they printed where they waited: the abort
        # alone, on a rank that is not the main process
        (lambda t: real("fortyfifth-lopsided-split"), [1]),
        (lambda t: real("twentyfourth-short-r1"), [1]),
        # the same under `ddpdoctor run`, with the Flight Recorder dumps of ranks 0 and 2 only:
        # rank 1 died before writing one, so the dumps do not show its call
        (lambda t: real("run-uneven-partial-dumps"), [1]),
    ],
}
POSITIVE["INF231"] = [
    # two pods OOMKilled at once (a real memory limit): their JSON logs end on step 12, no
    # exit code anywhere (each pod's launcher died with it); the other pods lost them
    (lambda t: real("sixteenth-pod-oomkill"), [2, 3]),
    # Fabric's launcher: rank 1 (SIGKILLed after its memory grew) printed no steps of its own
    # and fell silent while the main process's steps went on; rank 0 lost the connection and
    # no launcher reported an exit code: killed, not left
    (lambda t: real("sixtythird-rss-swell"), [1]),
    # Lightning's spawn: the same with rank 1's last record from epoch 0
    (lambda t: real("hundredfirst-fbank-hoard"), [1]),
]
POSITIVE["INF234"] = [
    # nvidia-smi after a resume: four processes on GPU 0, one of them also GPU 1's (the paste
    # stops in GPU 1's row)
    (lambda t: case("203"), []),
]
POSITIVE["INF233"] = [
    # one line of Megatron's start-up that no rule knows, and nothing after it
    (lambda t: case("938"), None),
    # Horovod's trace lines ('[1]: Performing broadcast...'), then nothing: no error, no step
    (lambda t: case("716"), None),
    # a Kubeflow master's MNIST download, then nothing
    (lambda t: case("802"), None),
]
POSITIVE["INF240"] = [
    # a program's own ERROR record that no rule knows (an option it refuses), then it returns
    # 0: nothing after it. (kohya's 'No data found. Please verify' was one until its words
    # were read as missing input data: DATA108)
    (
        lambda t: ran(
            "import logging\nlogging.basicConfig(level=logging.INFO)\n"
            "log = logging.getLogger('train')\nlog.info('parsing the run configuration')\n"
            "log.error(\"unsupported optimizer 'adamw8bit' with backend 'gloo', nothing to do\")\n",
            t,
        ),
        [],
    ),
]
POSITIVE["INF237"] = [
    # '[rank 0] calling destroy_process_group ...' and nothing after it
    (lambda t: case("452"), []),
    # the last mini-epoch saved, then NCCL's 'Abort COMPLETE' of ranks 1 and 2 (destroying
    # their communicators), rank 3's line cut, and no exit
    (lambda t: case("501"), []),
    # wandb's end-of-run history table, cut inside it
    (lambda t: case("172"), []),
]
POSITIVE["INF239"] = [
    # two Ray Train nodes: NCCL's bootstrap and socket transport list a veth with a link-local
    # IPv6 address beside ens5, and the output stops during start-up
    (lambda t: case("1599"), []),
]
POSITIVE["INF238"] = [
    # torchrun starts four processes told a world of eight: every one waits for rank 4's
    # address (gloo's '/default_pg/0//cpu//0/4') and times out, no [rankN] prefix on any
    (lambda t: real("seventysecond-wide-ring"), []),
    # a script that hard-codes four for a launch of three: all three wait for rank 3
    (lambda t: real("thirtysixth-four-of-three"), []),
    # one pod's edited config says four where the others say three: only rank 2 waits
    (lambda t: real("sixteenth-size-edit"), [2]),
]
NEAR_MISS = {
    # the rank waited for was launched and failed or never came up (a pod still pending, a
    # node whose ranks died of a missing module before the group formed)
    # a link-local USB NIC in NCCL's bootstrap list, but one host: nothing crosses nodes
    "INF239": [lambda t: case("1602")],
    "INF238": [
        lambda t: real("sixteenth-pod-pending"),
        lambda t: real("sixth-profiler-node"),
    ],
    # the same log one line earlier: the ranks' last words are the save of the last epoch
    # and its announcement, not the way out
    "INF237": [
        lambda t: case_cut_before("501", "[Service thread]", t),
    ],
    # rank 2's last line is a step that says it stops ('loss is nan at iter 8, stopping'); rank
    # 1 says it leaves the loop: both left on their own
    "INF231": [
        lambda t: real("eighth-nan-break"),
        lambda t: real("style-leave"),
        # silent and lost mid-training too, but torchrun reported exits (its failure summary):
        # a launcher that saw the rank leave would have said how (here: left, INF202)
        lambda t: real("third-leave"),
        # rank 0 left at its epoch's end under Lightning's spawn, whose parent reported how
        # the processes ended ('Process 1 terminated with the following error')
        lambda t: real("sixtyfifth-solo-budget"),
    ],
    # the handler stood on a sleep (sixth-slow-ckpt) or a busy loop's line (sixth-busy-prep):
    # the rank was slow, not blocked on a lock
    "INF211": [
        lambda t: real("sixth-slow-ckpt"),
        lambda t: real("sixth-busy-prep"),
        # the main process, silent while it evaluates alone past the timeout: busy (work only
        # one rank does is the main process's)
        lambda t: real("twentyfourth-slow-zero"),
        # rank 2 (not the main process) but announcing its own work, part by part ('building
        # feature cache: part 3/5'): busy
        lambda t: real("twentythird-cache-drag"),
    ],
    # a 15 s timeout and a training loop's bar that stopped at about 15 s when its rank began
    # to wait ('train: 13%| 4/30 [00:15<01:43'; 'r0 ep1: 0%| 0/12 [00:10'): no busy rank
    "INF201": [
        # no rank either: 'Building fields with vocab in counts...', then the store's wait for
        # its clients at the rendezvous ('1/2 clients joined'): no work was waited for
        lambda t: real("seventyfirst-half-ring"),
        lambda t: scenario("uncoordinated-exit"),
        lambda t: real("healthy-plain"),
        lambda t: real("fifth-abba"),
        lambda t: real("thirtyfirst-never-woken"),
        # rank 1's lines of the attempt before torchrun's restart fall in a wait counted from
        # that attempt's end; the last attempt's wait saw nothing of it: stuck, not busy
        lambda t: real("twentyseventh-wedge-r1"),
        # the stuck rank's node console holds, inside the others' wait, only its torchrun's
        # own lines (its agent's glog, its summary's 'time : ...' fields): no work of a worker
        lambda t: real("fiftyninth-event-park"),
        lambda t: real("fiftyfifth-event-stall"),
    ],
    "INF202": [
        # a rank with no lines that the summary does list (SIGKILL, -9): killed, not left
        lambda t: real("eighth-sigkill-step"),
        lambda t: scenario("slow-rank-timeout"),
        lambda t: scenario("early-stop"),
        # rank 1 left after training announced its end: it finished, it did not leave early
        lambda t: scenario("hf-trainer-evaluate-main-only"),
        # ranks 1 and 2's NCCL proxies report their own connections closed ("[2] ...
        # Connection closed by localRank 2") as their communicators are aborted after the last
        # save: no rank lost a peer, so ranks 0 and 3 did not leave anyone waiting
        lambda t: case("501"),
        # the paste stops on rank 6's own watchdog line, cut after its header: it printed after
        # ranks 2 and 3 had timed out, so it had not left (corpus 878). Case 513 was a positive
        # example until session 15: it named rank 2, whose cut traceback comes after rank 3's
        # Horovod shutdown (so rank 2 had not left either; the rank that did is not in the paste)
        lambda t: case("878"),
    ],
    "INF203": [
        # the same picture (process 0 alone timed out in its evaluation's collective, rank 1
        # silent), but spawn stopped rank 1 alive outside it: busy or stuck, which weighs more
        # than a guess of the main process alone in its evaluation
        lambda t: real("fortythird-heavy-case"),
        # ranks 0 and 3 in the epoch's broadcast, rank 2 already in backward, and rank 1 stopped
        # alive by its launcher in no collective: the broadcast it never joined holds the peers
        # that need it while rank 2, served, went on; a stuck rank, not a mismatch
        lambda t: real("fiftyeighth-event-wait"),
        lambda t: scenario("uneven-inputs"),
        lambda t: scenario("data-error"),
        # rank 1 skipped a loss spike's micro-step; DDP paired the all-reduce up again and
        # nothing timed out: a skip is no mismatch by itself
        lambda t: real("fourth-spike-skip"),
    ],
    "INF204": [lambda t: real("multinode-silent-rank")],
    # a worker could not resolve the master's name: its own error is the root, not the
    # store's wait for it (no rank of the world is missing)
    "INF230": [lambda t: real("sixteenth-addr-typo"), lambda t: real("multinode-silent-rank")],
    "INF205": [lambda t: real("healthy-noisy")],
    "INF208": [
        lambda t: scenario("data-error"),
        # the exit-1 rank printed no traceback in the console where rank 0's is: it ended
        # itself (INF202), not an error whose output went elsewhere
        lambda t: real("nineteenth-nan-quiet"),
    ],
    "INF209": [
        # gloo aborted rank 1 in an 8-byte collective while rank 0 was in DDP's backward, but a
        # line said a batch was skipped ('attempting to recover from OOM in forward/backward
        # pass', of no rank): a collective skipped inside the loop, not data that ran out
        lambda t: real("fifteenth-oom-forward"),
        # the main process aborted in a 4-byte collective while the others trained: a metric
        # it alone reduces ('if rank == 0'), not a rank out of data
        lambda t: real("thirtyseventh-solo-reduce"),
        # rank 1 aborted in a 16-byte all_reduce while rank 0 waited in the program's own
        # all_reduce of 4096 floats (not DDP's gradient collective): a shape mismatch
        lambda t: real("flight-recorder/shape"),
        # the same program's run where rank 0's traceback names its own all_reduce (a
        # collective the program calls by name, not DDP's): a shape mismatch
        lambda t: scenario("collective-mismatch-shape"),
        # machine 1's ranks removed all 64 images and spun in an empty sampler: silent but
        # alive (ranks 0 and 1 timed out, nobody lost a peer), a hang, not ranks that left
        lambda t: real("thirteenth-all-crowd"),
        # WeNet's join barrier names rank 2, which announced a long task of its own ('rebuilding
        # speed perturb cache: part N/8'): a busy rank (INF201), not one out of data
        lambda t: real("fiftythird-cache-drag"),
        # rank 0 alone in a barrier while the others wait in a training step: work for the
        # main process only (a save behind a barrier), not ranks out of data; and rank 1 in a
        # barrier of its own while the others wait in an all_reduce the program calls itself
        lambda t: real("twentieth-barrier-in-zero"),
        lambda t: real("seventh-extra-barrier"),
        lambda t: scenario("collective-mismatch-op-nodebug"),
        # every rank announced the same data (10 batches), then a rank's own code failed
        lambda t: real("third-value-error"),
        # the main process among the ranks in the evaluation's collectives, one rank still in
        # its training step: a rank-dependent exchange, not ranks out of data
        lambda t: real("sixth-object-gossip"),
        # every rank inside its training step, in different collectives: no phase apart
        lambda t: real("sixth-order-swap"),
    ],
    "INF215": [
        lambda t: scenario("data-error"),  # every traceback whole
        # rank 0's timeout traceback is cut, rank 1's error is whole: rank 1's line decides
        lambda t: cut_before("data-error", "[rank0]: RuntimeError", t),
        lambda t: real("healthy-plain"),
    ],
    # a cut traceback elsewhere (a dataset's open()), or a whole one that names its error
    "INF218": [lambda t: cut_before("data-error", "[rank1]: FileNotFoundError", t)],
    "INF219": [lambda t: scenario("missing-module")],
    "INF220": [lambda t: scenario("launcher-env-missing")],
    "INF221": [lambda t: scenario("dataloader-worker-killed")],
    # a cut wait in a worker's own frames (the DataLoader's queue), not a launcher's (INF221)
    "INF236": [lambda t: case("230")],
    # frames of another native thread (the heartbeat monitor): not the watchdog
    "INF222": [lambda t: case("136")],
    # a whole traceback through torch.save names its error (an I/O error: DATA103)
    "INF223": [lambda t: case("232")],
    # retries of the IPv6 address family only (EINVAL): c10d moves on to IPv4, a healthy start;
    # Windows' WSAEADDRNOTAVAIL on the machine's name ("system error: 10049"), likewise
    "INF225": [lambda t: case("465"), lambda t: case("764")],
    # start-up that got as far as NCCL connecting the GPUs: past the rendezvous (INF205)
    "INF226": [lambda t: case("070")],
    # only the first node's four ranks announced themselves, once each: the other node never
    # came (INF226), no rank was taken twice; a detectron2-style run whose every rank
    # announced itself once and trained
    "INF235": [
        lambda t: case("474"),
        lambda t: real("thirteenth-voted-halt"),
        # case 474's console given twice (a console and its copy, as torchrun --tee keeps a
        # rank's lines in two files): each announcement twice, but one process's line
        lambda t: twice(case("474")[0], t),
    ],
    # the exception under its whole traceback: read by the rule for its line
    "INF227": [lambda t: case("232"), lambda t: real("healthy-plain")],
    # a cut traceback in another place (torch.save inside a checkpoint engine)
    "INF228": [lambda t: case("235")],
    # cut inside torch.save's frames of the same file: writing, not restoring
    "INF232": [lambda t: case("235")],
    # the same stop on one node after NCCL connected its GPUs peer-to-peer (INF205)
    "INF206": [
        lambda t: case("467"),
        # rank 0's barrier advice alone (torch 2.8's 'No device id is provided via
        # `init_process_group`'): a Python warning, printed before the first step of healthy
        # runs as of hung ones, is no start-up the log stops in (OK: a message of normal
        # operation)
        lambda t: case("839"),
    ],
    # only the end of training (fairseq's 'done training in'), or only a warning of normal
    # operation and nothing after: not a log in which nothing was recognised
    # (c10d's warnings for each address of a host without IPv6, errno 97: it goes on with IPv4)
    "INF233": [
        lambda t: case("750"),
        lambda t: case("334"),
        lambda t: real("healthy-plain"),
        lambda t: case("568"),
        # OpenMMLab's MKL_NUM_THREADS note alone
        lambda t: case("755"),
    ],
    # a log that stops with no error-level line at all (INF233's own), and a healthy run
    "INF240": [
        lambda t: case("938"),
        lambda t: real("hundredninth-calm-lora"),
    ],
    # nvidia-smi's device table (utilisation, memory) without its process rows
    "INF234": [lambda t: case("523"), lambda t: real("healthy-plain")],
    # rank 1's watchdog timeout, then frames no rank owns: the timeout's own trace
    "INF216": [lambda t: case("403"), lambda t: real("rendezvous-no-master")],
}


def test_every_hypothesis_has_examples() -> None:
    codes = {h.rule.code for h in HYPOTHESES} | {r.code for r in HYPOTHESIS_ONLY_RULES}
    # INF211 (a stall caught live), INF212 (a log that ends) and INF214 (a rank behind in the
    # Flight Recorder dumps) have their own tests: tests/test_run_hang_verdict.py,
    # tests/test_nothing_diagnosable.py and tests/test_flight_verdicts.py
    assert codes - {"INF211", "INF212", "INF214"} <= set(POSITIVE) & set(NEAR_MISS)


@pytest.mark.parametrize(
    ("code", "index"), [(c, i) for c, xs in POSITIVE.items() for i in range(len(xs))]
)
def test_positive(code: str, index: int, tmp_path: Path) -> None:
    make, culprits = POSITIVE[code][index]
    verdict = diagnose_paths(make(tmp_path)).verdict
    assert verdict.rule == code, (verdict.rule, verdict.summary)
    if culprits is not None:
        assert verdict.culprit.ranks == culprits
    assert verdict.confidence > 0 and verdict.basis


@pytest.mark.parametrize(
    ("code", "index"), [(c, i) for c, xs in NEAR_MISS.items() for i in range(len(xs))]
)
def test_near_miss(code: str, index: int, tmp_path: Path) -> None:
    verdict = diagnose_paths(NEAR_MISS[code][index](tmp_path)).verdict
    assert verdict.rule != code, verdict.summary


@pytest.mark.parametrize(
    ("row", "gpu", "pid"),
    [
        # nvidia-smi's process rows: older drivers, drivers with MIG's GI/CI columns, a row a
        # paste cut after the process name (corpus 203)
        ("|    0     31408      C   /usr/bin/python3.6                  731MiB |", "0", "31408"),
        ("|    1   N/A  N/A     31408      C   python                    731MiB |", "1", "31408"),
        ("|    1     31408      C   /usr/bin/python3.6", "1", "31408"),
    ],
)
def test_nvidia_smi_process_rows_are_read(row: str, gpu: str, pid: str) -> None:
    from ddpdoctor.analysis.facts import FACT_PATTERNS

    (fact,) = [f for f in FACT_PATTERNS if f.name == "gpu_process"]
    m = fact.compiled.search(row)
    assert m and (m["gpu"], m["pid"]) == (gpu, pid)
    # the device table's rows above it are no process rows
    assert not fact.compiled.search("| N/A   46C    P0    70W / 300W |   9388MiB / 16152MiB |")


@pytest.mark.parametrize(
    ("line", "n"),
    [
        # PyTorch's DDP tutorial series prints each rank's batches per epoch (INF209's sizes)
        ("[GPU3] Epoch 0 | Batchsize: 16 | Steps: 3", "3"),
        ("rank 1 | batches: 12", "12"),
        # a tqdm bar labelled "Steps" at its total, a counter of where a rank is, a key
        ("Steps: 100%|██████████| 5/5 [00:01<00:00,  3.21it/s]", None),
        ("Step: 5 | loss 0.3127", None),
        ("global_steps: 40", None),
    ],
)
def test_labelled_batch_counts_are_data_sizes(line: str, n: str | None) -> None:
    from ddpdoctor.analysis.facts import FACT_PATTERNS

    found = [
        m["n"] for f in FACT_PATTERNS if f.name == "data_size" if (m := f.compiled.search(line))
    ]
    assert found == ([n] if n else [])


@pytest.mark.parametrize(
    ("line", "found"),
    [
        # Slurm's srun names the task (the rank, one task per rank) that exited non-zero
        ("srun: error: node12: task 3: Exited with exit code 1", ("3", "1")),
        # a range of tasks names no one rank; a task killed by a signal is LCH101's / LCH104's
        ("srun: error: node12: tasks 0-3: Exited with exit code 1", None),
        ("srun: error: node12: task 3: Killed", None),
    ],
)
def test_srun_task_exits_are_launcher_exits(line: str, found: tuple[str, str] | None) -> None:
    from ddpdoctor.analysis.facts import FACT_PATTERNS

    hits = [
        (m["rank"], m["code"])
        for f in FACT_PATTERNS
        if f.name == "launcher_exit" and "srun" in f.regex
        if (m := f.compiled.search(line))
    ]
    assert hits == ([found] if found else [])


@pytest.mark.parametrize(
    ("line", "winding"),
    [
        ("[rank 0] calling destroy_process_group ...", True),
        ("Destroying process group", True),
        (
            "gcn17:2408115:2596340 [2] NCCL INFO comm 0xe83c2a0 rank 2 nranks 4 cudaDev 2 "
            "busId ca000 - Abort COMPLETE",
            True,
        ),
        ("NCCL INFO [Service thread] Connection closed by localRank 2", True),
        ("wandb:         train/box_loss ██▇▆▆▅▄▄", True),
        ("wandb: Run summary:", True),
        ("wandb: Tracking run with wandb version 0.16.0", False),
        ("NCCL INFO comm 0x55d5 rank 0 nranks 2 cudaDev 0 busId 1000 - Init COMPLETE", False),
        ("destroy the old checkpoint", False),
        ("Epoch 3/10 step 40", False),
    ],
)
def test_words_of_the_way_out(line: str, winding: bool) -> None:
    from ddpdoctor.rules.hypotheses.teardown_stop import WINDING_DOWN

    assert bool(WINDING_DOWN.search(line)) is winding


@pytest.mark.parametrize(
    ("line", "fact"),
    [
        ('Setting up PyTorch plugin "bias_act_plugin"... ', "extension_root"),
        (
            'Setting up PyTorch plugin "upfirdn2d_plugin"... W1206 05:19:22.480000 14799 '
            "torch/multiprocessing/spawn.py:165] Terminating process 14801 via signal SIGTERM",
            "extension_root",
        ),
        ('Setting up PyTorch plugin "bias_act_plugin"... Done.', "extension_built"),
        ('Setting up PyTorch plugin "bias_act_plugin"... Failed!', None),
    ],
)
def test_stylegans_plugin_line_open_or_done(line: str, fact: str | None) -> None:
    """NVlabs' custom_ops prints 'Done.' or 'Failed!' on the same line once the build or load
    is over: the line left open is a process in the build or its lock."""
    from ddpdoctor.analysis.facts import FACT_PATTERNS

    found = [
        f.name for f in FACT_PATTERNS if f.name.startswith("extension_") and f.compiled.search(line)
    ]
    assert found == ([fact] if fact else [])


def test_an_extensions_root_line_is_a_lock_wait_only_without_progress_after_it() -> None:
    """torch's 'Using ... as PyTorch extensions root...' is a wait on the build lock (INF211)
    only where its writer made no progress and nothing was built or loaded after it: a rank
    that went on to train, or whose extension was built, got past the lock."""
    from ddpdoctor.analysis.job import _extension_waits
    from ddpdoctor.analysis.scanner import StreamSummary
    from ddpdoctor.model.records import Origin, Record

    def root(line: int) -> tuple[int | None, Record]:
        text = "Using /tmp/ext as PyTorch extensions root..."
        return None, Record("console.log", line, text, stream_key="console.log|")

    def writer(last_progress: int) -> StreamSummary:
        return StreamSummary("", Origin(), "console.log", last_progress_line=last_progress)

    assert _extension_waits([root(5)], {}, [writer(3)]) == [root(5)]
    assert _extension_waits([root(5)], {}, [writer(9)]) == []  # it trained after the line
    assert _extension_waits([root(5)], {"console.log": 6}, [writer(3)]) == []  # built: got past
    assert _extension_waits([root(5)], {"other.log": 6}, [writer(3)]) == [root(5)]
