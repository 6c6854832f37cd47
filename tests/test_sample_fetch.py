"""DATA105: an exception raised in the dataset's __getitem__ / __iter__ below the DataLoader's
fetch is a data error; one raised in the collate function is not (real captures)."""

from __future__ import annotations

from ddpdoctor.analysis.diagnose import diagnose_paths
from ddpdoctor.rules.data import SAMPLE_FETCH
from tests.conftest import REPO

REAL = REPO / "tests" / "fixtures" / "real"
FETCH = '  File "/venv/lib/python3.11/site-packages/torch/utils/data/_utils/fetch.py", line 52, in fetch'
DATALOADER = '  File "/venv/lib/python3.11/site-packages/torch/utils/data/dataloader.py", line 7, in __next__'


def test_an_error_in_the_datasets_getitem_below_the_fetch_is_a_data_error() -> None:
    below = [DATALOADER, FETCH, '  File "/repo/data.py", line 9, in __getitem__', "    x.view(3)"]
    assert SAMPLE_FETCH.context_ok("\n".join(below))
    iterable = [FETCH, '  File "/repo/data.py", line 9, in __iter__', "    yield f(d)"]
    assert SAMPLE_FETCH.context_ok("\n".join(iterable))


def test_the_dataloaders_own_frames_or_the_collate_are_not() -> None:
    collate = [DATALOADER, FETCH, '  File "/repo/data.py", line 121, in collate', "    stack(x)"]
    assert not SAMPLE_FETCH.context_ok("\n".join(collate))
    no_fetch = ['  File "/repo/data.py", line 9, in __getitem__', "    x.view(3)"]
    assert not SAMPLE_FETCH.context_ok("\n".join(no_fetch))


def test_real_runs() -> None:
    decoded = diagnose_paths([str(REAL / "nineteenth-prefetch-stall")]).verdict
    assert (decoded.rule, decoded.kind, decoded.culprit.ranks) == ("DATA105", "data-error", [1])
    collated = diagnose_paths([str(REAL / "fifth-collate-record")]).verdict
    assert (collated.kind, collated.culprit.ranks) == ("python-exception", [1])
