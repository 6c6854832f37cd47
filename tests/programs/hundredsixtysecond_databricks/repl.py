"""A Databricks driver's Python REPL, as far as the hundred-and-sixty-second style needs one, for
tests/fixtures/real/capture_hundredsixtysecond.sh: runs the cells of a notebook exported as
source (../hundredsixtysecond_style_train.py: `# Databricks notebook source`, cells between
`# COMMAND ----------`, `# MAGIC` text cells skipped) one after another on a real IPython shell,
each compiled as `<command-N>` (the names Databricks gives cells, shown in tracebacks as 'File
<command-N>, line L'), with what a Databricks notebook finds predefined: `spark` (a local
SparkSession on the driver, 'Databricks Shell'), `sc` and `dbutils.widgets` (the job's
parameters). As on Databricks, the notebook's folder (a Repo) is the working folder and is on
the driver's sys.path, stdout and stderr go to the console unbuffered, and the first cell that
fails stops the run (IPython's traceback, without colours, on stdout; exit status 1). Run it with
a Python that has pyspark 3.5, IPython 8, numpy and torch 2.13.0 (CPU), a virtual environment
outside the repository (the capture script makes it).

    repl.py NOTEBOOK [--ui-port P] [name=value ...]     widgets name=value
"""

from __future__ import annotations

import random
import sys
from pathlib import Path


class Widgets:
    """dbutils.widgets: text() declares a widget with its default, get() reads the value the
    job passed (or the default)."""

    def __init__(self, values: dict[str, str]) -> None:
        self._values = dict(values)

    def text(self, name: str, default_value: str, label: str | None = None) -> None:
        self._values.setdefault(name, default_value)

    def get(self, name: str) -> str:
        if name not in self._values:
            raise ValueError(f"InputWidgetNotDefined: No input widget named {name} is defined")
        return self._values[name]


class DBUtils:
    def __init__(self, values: dict[str, str]) -> None:
        self.widgets = Widgets(values)


def cells(source: str) -> list[str]:
    """The notebook's code cells, in order (the header line and the MAGIC text cells left out)."""
    body = source.split("\n", 1)[1] if source.startswith("# Databricks notebook source") else source
    out = []
    for cell in body.split("\n# COMMAND ----------\n"):
        lines = [ln for ln in cell.strip("\n").splitlines() if ln.strip()]
        if lines and not all(ln.startswith("# MAGIC") for ln in lines):
            out.append(cell.strip("\n") + "\n")
    return out


def main() -> None:
    notebook = Path(sys.argv[1]).absolute()
    rest = sys.argv[2:]
    ui_port = "4040"
    if rest[:1] == ["--ui-port"]:
        ui_port, rest = rest[1], rest[2:]
    widgets = dict(arg.split("=", 1) for arg in rest)
    sys.path.insert(0, str(notebook.parent))
    sys.argv = [sys.argv[0]]

    from IPython.core.interactiveshell import InteractiveShell
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("Databricks Shell")
        .config("spark.ui.port", ui_port)
        .getOrCreate()
    )
    shell = InteractiveShell.instance(colors="NoColor")
    names = random.Random(notebook.name)
    shell.user_ns.update(spark=spark, sc=spark.sparkContext, dbutils=DBUtils(widgets))
    compiler = shell.compile
    compiler.format_code_name = lambda name: (  # type: ignore[method-assign]
        ("File", name) if name.startswith("<command-") else None
    )
    for code in cells(notebook.read_text()):
        name = f"<command-{names.randrange(10**15, 10**16)}>"
        compiler.get_code_name = lambda raw, transformed, number, name=name: name  # type: ignore[method-assign]
        result = shell.run_cell(code, store_history=True)
        sys.stdout.flush()
        if not result.success:
            sys.exit(1)


if __name__ == "__main__":
    main()
