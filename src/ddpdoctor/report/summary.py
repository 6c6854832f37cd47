"""The verdict's summary as the reports print it: right under the title, so the sentence that
repeats the title (and the culprit, printed on its own line) is left out."""

from __future__ import annotations

import re

from ddpdoctor.model.findings import Verdict

_WHERE = re.compile(r"\s*(\([^()]*\))?\.\s*")


def summary_body(v: Verdict) -> str:
    """`v.summary` without its opening "<title> (<where>)." sentence."""
    text = v.summary
    if not v.title or not text.startswith(v.title):
        return text
    m = _WHERE.match(text, len(v.title))
    if m is None:
        return text
    rest = text[m.end() :]
    return rest or text
