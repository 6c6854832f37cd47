"""Fallback and lifecycle rules: any uncaught Python exception, announced early stops, and the
teardown warnings of a job that had finished. Specific rules always win over these."""

from __future__ import annotations

from ddpdoctor.rules.base import Explanation, Rule, Signature

PYTHON_EXCEPTION = Rule(
    code="PY101",
    kind="python-exception",
    title="Uncaught Python exception in the training script",
    sources="CPython traceback printing",
    specificity=1,
    signatures=(
        Signature(r"^\**(?P<exc>[A-Za-z_][\w.]*Error)(?::|$)", "Error"),
        Signature(r"^\**(?P<exc>[A-Za-z_][\w.]*Exception)(?::|$)", "Exception"),
        Signature(r"^\**(?P<exc>KeyboardInterrupt|SystemExit)(?::|$)", "Exit"),
    ),
    context_all=(r"Traceback \(most recent call last\)|^\s+File \"|\n\s+File \"",),
    explanation=Explanation(
        what="A Python exception ended a rank, and no more specific rule explains it.",
        why="A bug or a wrong assumption in the training code or a library it calls.",
        fix="Read the last frames of the traceback in the evidence: the deepest frame in your "
        "own code is where to start.",
        false_positives="An exception that was caught and logged (with its traceback) by the "
        "program is reported too.",
    ),
    fix=("Fix the error at the deepest frame of your own code in the traceback.",),
    positive=("AttributeError: 'DistributedDataParallel' object has no attribute 'model'",),
    negative=("INFO: loss=0.31 RuntimeError count=0",),
)

EARLY_STOP = Rule(
    code="EXIT101",
    kind="early-stop",
    title="Training announced an early stop",
    sources="Lightning EarlyStopping, HF EarlyStoppingCallback, user code",
    severity="info",
    specificity=10,
    signatures=(
        Signature(r"(?i:early[ _-]?stop)\w*", "arly"),
    ),
    explanation=Explanation(
        what="A line announcing an early stop.",
        why="Stopping early is fine when every rank stops at the same step; when one rank stops "
        "alone, the others wait for it until the timeout (uncoordinated exit).",
        fix="Decide the stop on one rank and broadcast it, then let every rank leave the loop "
        "together and call destroy_process_group().",
        false_positives="Configuration dumps that mention early stopping parameters.",
    ),
    fix=(
        "Broadcast the stop decision: flag = torch.tensor([stop]); dist.broadcast(flag, 0); "
        "all ranks break together, then dist.destroy_process_group() and exit 0.",
    ),
    positive=("Early stopping at epoch 3: val_loss did not improve",),
    negative=("Epoch 3: val_loss improved to 0.21",),
)

RULES = (PYTHON_EXCEPTION, EARLY_STOP)
