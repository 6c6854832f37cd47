"""Builds and runs the notebooks of the hundred-and-sixtieth style (a Kaggle / Colab notebook
that trains on two GPUs: ../hundredsixtieth_style_train.py, the notebook's source in percent
format) for tests/fixtures/real/capture_hundredsixtieth.sh. Run it with a Python that has
ipykernel, nbclient, nbformat, tqdm and torch 2.13.0 (CPU), a virtual environment outside the
repository (the capture script makes it).

    notebook.py build                 fork.ipynb, spawn.ipynb, torchrun.ipynb beside this file
    notebook.py generate DIR          the synthetic data set, DIR/leaf-tiles-32
    notebook.py run NB WORKDIR OUT [--cell SRC]... [--stop-after S] [--again] [--raw]
                                      [--fsize BYTES]

`run` executes notebook NB on a real kernel whose working folder is WORKDIR, every cell in
order; --cell replaces the notebook's last cell (its launch cell) with the cells given, the last
of them the launch cell. --stop-after presses the notebook's stop button (interrupts the kernel)
S seconds into the launch cell; --again runs the launch cell once more after that, as a user
re-running it; --fsize sets the kernel's RLIMIT_FSIZE (a container's small /dev/shm: torch's
shared-memory segments are files). OUT gets what the user copies from the launch cell's output:
with the browser (the stream text as the page shows it, carriage returns applied, and the error's
traceback, ANSI colours removed) or, with --raw, the raw cell output (a Kaggle run's log or a
terminal copy: carriage returns and ANSI colour codes kept).
"""

from __future__ import annotations

import json
import re
import resource
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE.parent / "hundredsixtieth_style_train.py"
CODE = ("imports", "config", "accelerate", "data", "model", "training")
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def source_cells() -> list[tuple[str, str]]:
    """(name, source) of each `# %% name` cell of the percent-format source; the markdown cell
    as ("markdown", text)."""
    cells: list[tuple[str, list[str]]] = []
    for line in SOURCE.read_text().splitlines():
        if line.startswith("# %%"):
            head = line[4:].strip()
            cells.append(("markdown" if head == "[markdown]" else head, []))
        elif cells:
            cells[-1][1].append(line)
    out = []
    for name, lines in cells:
        text = "\n".join(lines).strip("\n")
        if name == "markdown":
            text = "\n".join(line.removeprefix("#").removeprefix(" ") for line in lines).strip()
        out.append((name, text))
    return out


def notebooks() -> dict[str, dict[str, object]]:
    import nbformat

    cells = dict(source_cells())

    def module(name: str, entry: str) -> str:
        return f"%%writefile {name}\n" + "\n\n\n".join(cells[c] for c in (*CODE, entry)) + "\n"

    books = {
        "fork": [cells[c] for c in (*CODE[:4], "cache", *CODE[4:], "launch")],
        "spawn": [
            module("ddp_train.py", "spawn_entry"),
            "import os\n\nimport torch.multiprocessing as mp\n\nimport ddp_train\n\n"
            "cfg = ddp_train.Config()",
            'os.environ["MASTER_ADDR"] = "localhost"\nos.environ["MASTER_PORT"] = "29500"\n'
            "mp.spawn(ddp_train.main, args=(2, cfg), nprocs=2)",
        ],
        "torchrun": [
            module("train.py", "script_entry"),
            "!torchrun --nproc_per_node 2 train.py",
        ],
    }
    out = {}
    for flavour, code in books.items():
        nb = nbformat.v4.new_notebook()
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3"}
        nb.cells = [nbformat.v4.new_markdown_cell(cells["markdown"])]
        nb.cells += [nbformat.v4.new_code_cell(c) for c in code]
        for i, cell in enumerate(nb.cells):
            cell["id"] = f"{flavour}-{i}"
        out[flavour] = nb
    return out


def build() -> None:
    import nbformat

    for flavour, nb in notebooks().items():
        nbformat.write(nb, HERE / f"{flavour}.ipynb")


LESIONS = ((0.6, -0.2, -0.1), (0.5, 0.4, -0.1), (-0.3, -0.4, -0.3), (0.5, 0.3, 0.5))
"""The colour shift of each class's lesion (rust, blight, rot, mildew)."""


def generate(folder: Path) -> None:
    """Leaf tiles: 3x32x32 float32 .npy images of four classes (the colour of a lesion), a
    train.csv with image_id, label and fold (five folds), a test.csv without labels."""
    import numpy as np

    root = folder / "leaf-tiles-32"
    rng = np.random.default_rng(7)
    for split, n in (("train", 320), ("test", 48)):
        (root / f"{split}_images").mkdir(parents=True, exist_ok=True)
        rows = []
        for i in range(n):
            label = int(rng.integers(0, 4))
            tile = rng.uniform(0.0, 0.4, size=(3, 32, 32)).astype(np.float32)
            tile[1] += 0.3  # green leaf
            cy, cx = rng.integers(6, 26, size=2)
            yy, xx = np.ogrid[:32, :32]
            spot = (yy - cy) ** 2 + (xx - cx) ** 2 <= rng.integers(16, 36)
            for channel, shift in enumerate(LESIONS[label]):
                tile[channel][spot] += shift
            image_id = f"{split}_{i:04d}"
            np.save(root / f"{split}_images" / f"{image_id}.npy", tile)
            rows.append((image_id, label, int(rng.integers(0, 5))))
        with open(root / f"{split}.csv", "w") as f:
            if split == "train":
                f.write("image_id,label,fold\n")
                f.writelines(f"{a},{b},{c}\n" for a, b, c in rows)
            else:
                f.write("image_id\n")
                f.writelines(f"{a}\n" for a, _, _ in rows)


def overwrite(text: str) -> str:
    """A line's carriage returns as the notebook's page applies them (JupyterLab's
    fixCarriageReturn: each part written over the line from its start)."""
    text = re.sub(r"\r+\n", "\n", text)
    lines = []
    for line in text.split("\n"):
        parts = re.split(r"\r+", line)
        shown = parts[0]
        for part in parts[1:]:
            shown = part + shown[len(part) :]
        lines.append(shown)
    return "\n".join(lines)


def cell_text(outputs: list[dict[str, object]], raw: bool) -> str:
    blocks: list[list[str]] = []
    for o in outputs:
        kind = o["output_type"]
        if kind == "stream":
            if not raw and blocks and blocks[-1][0] == o["name"]:
                blocks[-1][1] += str(o["text"])  # the page merges a stream's outputs
            else:
                blocks.append([str(o["name"]), str(o["text"])])
        elif kind == "error":
            blocks.append(["error", "\n".join(o["traceback"])])  # type: ignore[arg-type]
        elif kind in ("execute_result", "display_data"):
            blocks.append(["data", str(o["data"].get("text/plain", ""))])  # type: ignore[attr-defined]
    out = ""
    for name, text in blocks:
        if raw and name != "error":  # a log has the streams' text as it was written
            out += text
            continue
        if not raw:
            text = overwrite(ANSI.sub("", text))
        if out and not out.endswith("\n"):
            out += "\n"  # each output area (a traceback) starts on a line of its own
        out += text if text.endswith("\n") else text + "\n"
    return out


def run(argv: list[str]) -> None:
    import nbformat
    from nbclient import NotebookClient

    book, workdir, out = Path(argv[0]), Path(argv[1]), Path(argv[2])
    opts = argv[3:]
    cells: list[str] = []
    stop_after = again = raw = fsize = None
    while opts:
        opt = opts.pop(0)
        if opt == "--cell":
            cells.append(opts.pop(0))
        elif opt == "--stop-after":
            stop_after = float(opts.pop(0))
        elif opt == "--fsize":
            fsize = int(opts.pop(0))
        elif opt == "--again":
            again = True
        elif opt == "--raw":
            raw = True
        else:
            raise SystemExit(f"unknown option {opt}")
    nb = nbformat.read(book, as_version=4)
    if cells:
        nb.cells[-1:] = [nbformat.v4.new_code_cell(c) for c in cells]
    launch = nb.cells[-1]
    pressed = []

    def timeout_func(cell: object) -> float:
        if cell is launch and stop_after and not pressed:
            pressed.append(True)
            return stop_after
        return 300

    client = NotebookClient(
        nb,
        kernel_name="python3",
        allow_errors=True,
        interrupt_on_timeout=True,
        timeout_func=timeout_func,
        resources={"metadata": {"path": str(workdir)}},
    )
    with client.setup_kernel():
        if fsize:
            pid = client.km.provisioner.process.pid  # type: ignore[union-attr]
            resource.prlimit(pid, resource.RLIMIT_FSIZE, (fsize, fsize))
        for index, cell in enumerate(nb.cells):
            client.execute_cell(cell, index)
        if again:
            client.execute_cell(launch, len(nb.cells) - 1)
    out.write_text(cell_text(launch.outputs, bool(raw)))
    (workdir / "executed.ipynb").write_text(json.dumps(nb, indent=1))


def main() -> None:
    what, rest = sys.argv[1], sys.argv[2:]
    if what == "build":
        build()
    elif what == "generate":
        generate(Path(rest[0]))
    elif what == "run":
        run(rest)
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main()
