"""INF225: the output ends while ranks still retry to connect to the rendezvous store. A rank
that cannot reach MASTER_ADDR:MASTER_PORT logs each failed attempt and tries again until the
rendezvous timeout; a healthy job prints a few such lines while the master starts, then trains.
When the retries are the last thing a writer says, the job never got past the rendezvous."""

from __future__ import annotations

import re

from ddpdoctor.model.evidence import JobEvidence
from ddpdoctor.model.taxonomy import Status
from ddpdoctor.rules.base import Explanation, Rule
from ddpdoctor.rules.hypotheses.base import Assessment

RULE = Rule(
    code="INF225",
    kind="rendezvous-failure",
    title="The output ends while ranks still retry to connect to the rendezvous store",
    signatures=(),
    explanation=Explanation(
        what="The last lines of a writer are c10d's failed connection attempts to the store "
        "(MASTER_ADDR:MASTER_PORT), and nothing after them: no training, no error, no exit.",
        why="A rank retries the store until the rendezvous timeout. Retries that never end "
        "mean the address does not lead to the master: a wrong or unresolvable MASTER_ADDR "
        "(a host name that resolves elsewhere), a port that is closed or taken, a firewall, "
        "or a master that never started.",
        fix="Check from the failing node that MASTER_ADDR resolves to the master and that the "
        "port is open (`getent hosts ADDR`, `nc -zv ADDR PORT`); use the master's IP address "
        "when the name resolves wrongly.",
        false_positives="A log copied while the master was still starting (the job then "
        "trains), or cut right after a few harmless retries.",
    ),
    fix=(
        "From the node that retries: `getent hosts $MASTER_ADDR` and `nc -zv $MASTER_ADDR "
        "$MASTER_PORT`; set MASTER_ADDR to the master's IP (127.0.0.1 on one node) if the name "
        "resolves to another address.",
    ),
)

STORE_RETRY = re.compile(
    r"client socket has (?:failed to connect to|timed out after)|"
    r"No socket on \([^()]{1,300}\) is listening yet, will retry|"
    r"Connection (?:refused|timed out)\b.*\b(?:retry|retrying|store|rendezvous)",
    re.IGNORECASE,
)
"""c10d's socket.cpp warnings for one failed attempt ("The client socket has failed to connect
to [host]:port (errno: 111 - Connection refused).", "No socket on (host, port) is listening
yet, will retry."), and older torch's wording."""

OTHER_FAMILY = re.compile(r"(?:errno|system error): (?:22|97|99|10047|10049) - ")
"""EINVAL / EAFNOSUPPORT / EADDRNOTAVAIL (Linux's 22, 97, 99; Windows' WSAEAFNOSUPPORT 10047
and WSAEADDRNOTAVAIL 10049, "system error: 10049"): one address of the host (its IPv6 one, a
Windows machine name) refused at once; c10d goes on to the next, and healthy jobs print it on
every start (census: socket-client-failed-connect). A wrong address ends in 'failed to connect
to any network address', or retries of a refused connection (111)."""

ENDPOINT = re.compile(
    r"(?:failed to connect to (?:any network address of )?|No socket on )"
    r"(?:\((?P<host>[^,()\s]{1,255}), (?P<port>\d{1,5})\)"
    r"|(?P<endpoint>\[[^\]\s]{1,255}\]:\d{1,5}|[^\s\[\]]{1,255}:\d{1,5}))"
)


def assess(job: JobEvidence) -> Assessment | None:
    if job.ended or job.started_training or job.echoes or job.failing_exits:
        return None
    retrying = [
        w for w in job.last_words if STORE_RETRY.search(w.text) and not OTHER_FAMILY.search(w.text)
    ]
    if not retrying:
        return None
    endpoints = sorted({_endpoint(m) for w in retrying if (m := ENDPOINT.search(w.text))})
    where = f" ({', '.join(endpoints[:3])})" if endpoints else ""
    why = [
        f"the output ends with failed attempts to connect to the rendezvous store{where}: "
        "no training step, no error, no exit after them. The ranks were still retrying "
        "when the log ends, so the job never got past the rendezvous."
    ]
    if any(e.endswith(":0") for e in endpoints):
        why.append(
            "Port 0 is no port a store listens on: the address the ranks were given lacks "
            "its port (MASTER_PORT unset or 0, a rendezvous endpoint without ':PORT')."
        )
    return Assessment(
        RULE,
        0.45,
        [],  # the ranks that retry are not at fault: the address they were given is
        why,
        evidence=retrying[:4],
        status=Status.HUNG,
        explains_echoes=False,
    )


def _endpoint(m: re.Match[str]) -> str:
    return m["endpoint"] or f"{m['host']}:{m['port']}"
