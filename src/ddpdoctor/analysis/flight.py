"""Cross-rank reading of Flight Recorder dumps: per process group, walk the sequence ids the
ranks issued and find where they part (a rank behind, a different op/size/dtype, an op only some
ranks issued, ranks waiting in different groups), plus ranks without a dump. Plain functions over
parsed dumps; it decides no verdict (the causality engine does) and imports no torch."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from ddpdoctor.model.flight import (
    FlightAnalysis,
    FlightCall,
    FlightDivergence,
    FlightDump,
    FlightEntry,
    FlightGroupStatus,
    FlightRankView,
    FlightRow,
)

TABLE_ROWS = 6
TABLE_GAPS = 64
"""Columns kept for members without a dump: enough to show who is missing, never a million."""
MAX_WORLD = 1 << 16
"""The most ranks the comparison follows: a dump that names rank 16,000,000 would otherwise
make every per-rank structure that large (make fuzz: 14 GB)."""
"""Sequence ids per group in the cross-rank table: enough to see the pattern before the fault."""
SIZED_OPS = frozenset(
    {
        "all_reduce",
        "allreduce",
        "broadcast",
        "reduce",
        "all_gather",
        "allgather",
        "_allgather_base",
        "allgather_into_tensor_coalesced",
        "reduce_scatter",
        "_reduce_scatter_base",
        "reduce_scatter_tensor_coalesced",
        "allreduce_coalesced",
    }
)
"""Ops whose input sizes must agree on every rank (a rooted gather or scatter, or an
all_to_all with uneven splits, legitimately differs from rank to rank)."""
DEFAULT_GROUP = "0"


@dataclass(slots=True)
class _Rank:
    """One rank's entries, merged over its dumps (pickle and JSON of one moment, or several
    moments): per (group, seq) the latest entry, with frames from any dump of the same entry."""

    rank: int
    sources: list[str] = field(default_factory=list)
    by_group: dict[str, dict[int, FlightEntry]] = field(default_factory=dict)
    status: dict[str, FlightGroupStatus] = field(default_factory=dict)
    latest_ns: int = -1

    def last_entry(self) -> FlightEntry | None:
        """The op this rank issued last, over all groups: where it waits when it hangs."""
        best: FlightEntry | None = None
        for entries in self.by_group.values():
            for e in entries.values():
                if best is None or (e.time_created_ns or 0, e.record_id) > (
                    best.time_created_ns or 0,
                    best.record_id,
                ):
                    best = e
        return best


def _merge(dumps: Iterable[FlightDump]) -> tuple[dict[int, _Rank], list[str]]:
    ranks: dict[int, _Rank] = {}
    notes: list[str] = []
    for dump in dumps:
        if dump.rank is None:
            notes.append(f"{dump.source}: no rank in the file name; not compared")
            continue
        r = ranks.setdefault(dump.rank, _Rank(dump.rank))
        r.sources.append(dump.source)
        newest = max((e.time_created_ns or 0 for e in dump.entries), default=0)
        if newest >= r.latest_ns:
            r.latest_ns = newest
            r.status = dump.status or r.status
        for e in dump.entries:
            if e.p2p:
                continue
            group = r.by_group.setdefault(e.pg, {})
            old = group.get(e.seq)
            if old is None or (e.time_created_ns or 0) > (old.time_created_ns or 0):
                if old is not None and not e.frames and old.time_created_ns == e.time_created_ns:
                    e.frames = old.frames
                group[e.seq] = e
            elif not old.frames and e.frames and old.time_created_ns == e.time_created_ns:
                old.frames = e.frames
        if dump.dropped_entries:
            notes.append(f"{dump.source}: {dump.dropped_entries} entries past the cap not read")
    if any(d.p2p for dump in dumps for d in dump.entries):
        notes.append("point-to-point ops (send/recv) are listed but not matched across ranks")
    return ranks, notes


def call_of(rank: int, e: FlightEntry, source: str) -> FlightCall:
    user = e.user_frame
    return FlightCall(
        rank=rank,
        pg=e.pg,
        pg_desc=e.pg_desc,
        seq=e.seq,
        op=e.op,
        input_sizes=e.input_sizes,
        input_dtypes=e.input_dtypes,
        site=user.site if user else None,
        file=user.file if user else None,
        line=user.line if user else None,
        func=user.name if user else None,
        source=source,
    )


def _signature(e: FlightEntry) -> tuple[object, ...]:
    sizes = tuple(map(tuple, e.input_sizes)) if e.op in SIZED_OPS else ()
    return (e.op, sizes, tuple(e.input_dtypes))


def _differing(entries: list[FlightEntry]) -> list[str]:
    fields = []
    if len({e.op for e in entries}) > 1:
        fields.append("op")
    else:
        if len({_signature(e)[1] for e in entries}) > 1:
            fields.append("sizes")
        if len({tuple(e.input_dtypes) for e in entries}) > 1:
            fields.append("dtypes")
    return fields


def _fmt_ranks(ranks: Iterable[int]) -> str:
    rs = sorted(ranks)
    return ("rank " if len(rs) == 1 else "ranks ") + ",".join(map(str, rs))


def _group_name(pg: str, desc: str) -> str:
    return desc if desc and desc != "undefined" else f"group {pg}"


def _shape(call: FlightCall) -> str:
    if not call.input_sizes:
        return ""
    dims = "; ".join("x".join(map(str, s)) or "scalar" for s in call.input_sizes[:3])
    dtype = call.input_dtypes[0] if call.input_dtypes else ""
    return f" of [{dims}]{' ' + dtype if dtype else ''}"


class _Analyzer:
    def __init__(self, dumps: list[FlightDump], world_size: int | None) -> None:
        self.dumps = dumps
        self.ranks, self.notes = _merge(dumps)
        self.world_size = world_size
        self.divergences: list[tuple[tuple[int, int], FlightDivergence]] = []
        self.rows: list[FlightRow] = []
        self.unnamed: list[int] = []
        self.desc: dict[str, str] = {}
        for r in self.ranks.values():
            for pg, entries in r.by_group.items():
                for e in entries.values():
                    if e.pg_desc:
                        self.desc.setdefault(pg, e.pg_desc)

    def source(self, rank: int) -> str:
        return ", ".join(self.ranks[rank].sources)

    def call(self, rank: int, e: FlightEntry) -> FlightCall:
        return call_of(rank, e, self.source(rank))

    # ------------------------------------------------------------------ membership
    def recorded_members(self) -> dict[str, list[int]]:
        """Members by pg_config, and a group-config divergence where ranks disagree."""
        seen: dict[str, dict[tuple[int, ...], list[int]]] = {}
        for dump in self.dumps:
            if dump.rank is None:
                continue
            for pg, members in dump.members.items():
                seen.setdefault(pg, {}).setdefault(tuple(sorted(members)), []).append(dump.rank)
        out: dict[str, list[int]] = {}
        for pg, variants in seen.items():
            if not pg:  # gloo's unnamed entry: a bound on the world size, not a group
                self.unnamed = sorted({r for m in variants for r in m})
                continue
            if len(variants) > 1:
                parts = [f"{_fmt_ranks(who)} say {list(m)}" for m, who in sorted(variants.items())]
                self.add(
                    (-1, 0),
                    FlightDivergence(
                        kind="group-config",
                        pg=pg,
                        pg_desc=self.desc.get(pg),
                        seq=None,
                        ranks=sorted({r for who in variants.values() for r in who}),
                        others=[],
                        calls=[],
                        ambiguous=True,
                        summary=f"the ranks disagree on the members of "
                        f"{_group_name(pg, self.desc.get(pg, ''))}: " + "; ".join(parts),
                    ),
                )
            out[pg] = sorted({r for m in variants for r in m})
        return out

    def world(self, recorded: dict[str, list[int]]) -> list[int]:
        size = self.world_size or 0
        size = max(size, max(self.ranks, default=-1) + 1)
        for known in (recorded.get(DEFAULT_GROUP), self.unnamed):
            if known:
                size = max(size, max(known) + 1)
        if size > MAX_WORLD:  # a damaged dump's rank, not a job: every rank costs memory below
            self.notes.append(
                f"the dumps name a world of {size:,} ranks; ranks from {MAX_WORLD:,} on are not "
                "followed (a damaged dump, or more ranks than ddpdoctor compares)"
            )
            size = MAX_WORLD
        return list(range(size))

    def members(self, pg: str, recorded: dict[str, list[int]], world: list[int]) -> list[int]:
        """Who must issue the group's collectives: pg_config's list where recorded; every rank
        for the default group; otherwise (gloo records none) the ranks that issued any op in it,
        so that a subgroup is never mistaken for ranks that fell behind."""
        if pg in recorded:
            return recorded[pg]
        if pg == DEFAULT_GROUP or self.desc.get(pg) == "default_pg":
            return world
        return sorted(r for r, data in self.ranks.items() if pg in data.by_group)

    # ------------------------------------------------------------------ walking one group
    def add(self, key: tuple[int, int], d: FlightDivergence) -> None:
        self.divergences.append((key, d))

    def walk(self, pg: str, members: list[int]) -> FlightDivergence | None:
        """The first sequence id of pg where the ranks with dumps part, as a divergence."""
        have = [r for r in members if r in self.ranks]
        if len(have) < 2:
            return None
        seqs = {r: self.ranks[r].by_group.get(pg, {}) for r in have}
        last = {r: max(s) if s else 0 for r, s in seqs.items()}
        starts = [min(s) for s in seqs.values() if s]
        lo = max(starts, default=1)
        # the ids some rank recorded, not every number up to the highest: a dump's id can be
        # anything (10**19 in a damaged one), and an id nobody recorded shows no divergence
        for seq in sorted({q for s in seqs.values() for q in s if q >= lo}):
            present = {r: s[seq] for r, s in seqs.items() if seq in s}
            absent = [r for r in have if r not in present and last[r] < seq]
            if len({_signature(e) for e in present.values()}) > 1:
                return self.mismatch(pg, seq, present, seqs)
            if absent:
                return self.behind(pg, seq, present, absent, last)
        return None

    def behind(
        self,
        pg: str,
        seq: int,
        present: dict[int, FlightEntry],
        absent: list[int],
        last: dict[int, int],
    ) -> FlightDivergence:
        calls = [self.call(r, e) for r, e in sorted(present.items())]
        waits: list[FlightCall] = []
        for r in absent:
            entry = self.ranks[r].last_entry()
            if entry is not None:
                waits.append(self.call(r, entry))
        sample = calls[0]
        head = f"{_fmt_ranks(present)} called {sample.describe()}"
        if len(calls) > 1 and len({c.site for c in calls}) > 1:
            head += " (" + "; ".join(f"rank {c.rank} at {c.site}" for c in calls) + ")"
        tails = []
        for r in absent:
            w = next((c for c in waits if c.rank == r), None)
            if w is None:
                tails.append(f"rank {r} never issued an op")
            elif w.pg == pg:
                tails.append(f"rank {r} never did (its last was #{w.seq}, {w.op}{_at(w)})")
            else:
                tails.append(
                    f"rank {r} never did (its last was {w.op} #{w.seq} of "
                    f"{_group_name(w.pg, w.pg_desc)}{_at(w)})"
                )
        minority_present = len(present) < len(absent)
        kind = "only-some" if minority_present else "behind"
        group = _group_name(pg, self.desc.get(pg, ""))
        summary = f"{head} in {group}; " + "; ".join(tails)
        return FlightDivergence(
            kind=kind,
            pg=pg,
            pg_desc=self.desc.get(pg),
            seq=seq,
            ranks=sorted(present) if minority_present else sorted(absent),
            others=sorted(absent) if minority_present else sorted(present),
            calls=calls + waits,
            summary=summary,
        )

    def mismatch(
        self,
        pg: str,
        seq: int,
        present: dict[int, FlightEntry],
        seqs: dict[int, dict[int, FlightEntry]],
    ) -> FlightDivergence:
        sides: dict[tuple[object, ...], list[int]] = {}
        for r, e in sorted(present.items()):
            sides.setdefault(_signature(e), []).append(r)
        ordered = sorted(sides.values(), key=lambda rs: (-len(rs), rs))
        calls = [self.call(r, e) for r, e in sorted(present.items())]
        fields = _differing(list(present.values()))
        kind, culprits, ambiguous, why = "mismatch", [], False, ""
        if len(ordered[0]) > len(ordered[1]):
            culprits = sorted(r for rs in ordered[1:] for r in rs)
            why = f" ({_fmt_ranks(culprits)} differ from the majority)"
        else:
            culprits = self.departed(seq, present, seqs, sides)
            if culprits:
                kept = next(present[r] for r in present if r not in culprits)
                why = (
                    f" ({_fmt_ranks(culprits)} stopped issuing {kept.op}"
                    f"{_at(call_of(-1, kept, ''))} where the others went on)"
                )
            if not culprits:
                extra = self.extra_side(seq, present, seqs, sides)
                if extra:
                    kind, culprits = "only-some", extra
            if not culprits:
                culprits, ambiguous = sorted(present), True
        parts = []
        for rs in ordered:
            c = next(c for c in calls if c.rank == rs[0])
            sites = sorted({x.site for x in calls if x.rank in rs and x.site})
            where = f" at {', '.join(sites)}" if sites else ""
            parts.append(f"{_fmt_ranks(rs)} called {c.op} #{seq}{_shape(c)}{where}")
        group = _group_name(pg, self.desc.get(pg, ""))
        what = {"op": "different collectives", "sizes": "different sizes"}.get(
            fields[0] if fields else "", "different dtypes"
        )
        summary = f"{what} at #{seq} of {group}: " + "; ".join(parts) + why
        if kind == "only-some":
            summary += f" ({_fmt_ranks(culprits)} issued one collective the others did not)"
        return FlightDivergence(
            kind=kind,
            pg=pg,
            pg_desc=self.desc.get(pg),
            seq=seq,
            ranks=culprits,
            others=sorted(set(present) - set(culprits)),
            calls=calls,
            fields=fields,
            ambiguous=ambiguous,
            summary=summary,
        )

    @staticmethod
    def departed(
        seq: int,
        present: dict[int, FlightEntry],
        seqs: dict[int, dict[int, FlightEntry]],
        sides: dict[tuple[object, ...], list[int]],
    ) -> list[int]:
        """With no majority: if every rank issued the same call at seq-1 and exactly one side
        repeats it at seq (same op, sizes, code line), the other sides left the pattern (a rank
        that skipped a step or ran out of data calls what comes after the loop)."""
        before = [s.get(seq - 1) for s in seqs.values()]
        if any(b is None for b in before) or len({_key(b) for b in before if b}) != 1:
            return []
        pattern = _key(before[0]) if before[0] else None
        keeping = [rs for rs in sides.values() if all(_key(present[r]) == pattern for r in rs)]
        if len(keeping) != 1:
            return []
        return sorted(r for rs in sides.values() if rs is not keeping[0] for r in rs)

    @staticmethod
    def extra_side(
        seq: int,
        present: dict[int, FlightEntry],
        seqs: dict[int, dict[int, FlightEntry]],
        sides: dict[tuple[object, ...], list[int]],
    ) -> list[int]:
        """A side whose seq+1 is what the others issued at seq issued one extra collective."""
        for sig, rs in sides.items():
            others = [r for r in present if r not in rs]
            nxt = [seqs[r].get(seq + 1) for r in rs]
            if nxt and all(n is not None and _signature(n) != sig for n in nxt):
                theirs = {_signature(present[o]) for o in others}
                if len(theirs) == 1 and all(n and _signature(n) in theirs for n in nxt):
                    return sorted(rs)
        return []

    # ------------------------------------------------------------------ the job
    def group_order(self, recorded: dict[str, list[int]]) -> None:
        """A rank behind in one group because it waits in another group's collective, which
        the ranks ahead never issued there: each side waits for the other, the groups are
        called in a different order. Replaces the `behind` divergences it explains."""
        for key, d in list(self.divergences):
            if d.kind != "behind" or d.pg is None:
                continue
            stuck: set[int] = set()
            elsewhere: set[str] = set()
            for r in d.ranks:
                w = self.ranks[r].last_entry() if r in self.ranks else None
                if w is None or w.pg == d.pg:
                    continue
                members = recorded.get(w.pg)
                for p in d.others:
                    if w.seq not in self.ranks[p].by_group.get(w.pg, {}) and (
                        members is None or p in members
                    ):
                        stuck.update((r, p))
                        elsewhere.add(w.pg)
            if not stuck:
                continue
            explained = [
                x
                for _, x in self.divergences
                if x is d or (x.kind == "behind" and x.pg in elsewhere)
            ]
            self.divergences = [(k, x) for k, x in self.divergences if x not in explained]
            self.add(key, self.crossed(sorted(stuck)))
            return

    def crossed(self, ranks: list[int]) -> FlightDivergence:
        waits = []
        for r in ranks:
            entry = self.ranks[r].last_entry() if r in self.ranks else None
            if entry is not None:
                waits.append(self.call(r, entry))
        parts = []
        for w in waits:
            lacking = [
                o
                for o in ranks
                if o != w.rank
                and o in self.ranks
                and w.seq not in self.ranks[o].by_group.get(w.pg, {})
            ]
            who = f", which {_fmt_ranks(lacking)} never issued" if lacking else ""
            parts.append(
                f"rank {w.rank} waits in {w.op} #{w.seq} of {_group_name(w.pg, w.pg_desc)}"
                f"{_at(w)}{who}"
            )
        return FlightDivergence(
            kind="group-order",
            pg=None,
            pg_desc=None,
            seq=None,
            ranks=ranks,
            others=[],
            calls=waits,
            ambiguous=True,
            summary="; ".join(parts) + ": the ranks call the process groups in a different order",
        )

    def table(self, pg: str, members: list[int], at: int | None) -> None:
        have = [r for r in members if r in self.ranks]
        # a column per rank with a dump, and the first of those without one (the table is read)
        shown = sorted(set(have) | set([r for r in members if r not in self.ranks][:TABLE_GAPS]))
        seqs = {r: self.ranks[r].by_group.get(pg, {}) for r in have}
        hi = max((max(s) for s in seqs.values() if s), default=0)
        if not hi:
            return
        end = hi if at is None else max(at, min(hi, at + 1))
        for seq in range(max(1, end - TABLE_ROWS + 1), end + 1):
            cells: dict[int, FlightCall | None] = {r: None for r in shown}
            for r in have:
                if seq in seqs[r]:
                    cells[r] = self.call(r, seqs[r][seq])
            if not any(cells.values()):
                continue
            self.rows.append(FlightRow(pg, self.desc.get(pg, ""), seq, cells, diverges=seq == at))

    def run(self) -> FlightAnalysis:
        recorded = self.recorded_members()
        world = self.world(recorded)
        groups = sorted({pg for r in self.ranks.values() for pg in r.by_group}, key=_pg_order)
        for pg in groups:
            d = self.walk(pg, self.members(pg, recorded, world))
            if d is not None:
                self.add(self.when(d), d)
        self.group_order(recorded)
        missing = [r for r in world if r not in self.ranks]
        if missing:
            self.add((1 << 62, 0), self.no_dump(missing))
        marks: dict[str, int | None] = {}
        for _, d in sorted(self.divergences, key=lambda kd: kd[0]):
            if d.pg is not None:
                marks.setdefault(d.pg, d.seq)
            for c in d.calls if d.kind in ("group-order", "no-dump") else []:
                marks.setdefault(c.pg, c.seq)
        if not marks and groups:
            marks[groups[0]] = None
        for pg in sorted(marks, key=_pg_order):
            involved = {
                r
                for _, d in self.divergences
                if d.pg == pg or any(c.pg == pg for c in d.calls)
                for r in d.ranks + d.others
            }
            members = sorted(set(self.members(pg, recorded, world)) | involved)
            self.table(pg, members, marks[pg])
        views = [
            FlightRankView(
                rank=r,
                pg=pg,
                pg_desc=self.desc.get(pg, ""),
                last_issued=max(entries) if entries else None,
                status=data.status.get(pg, FlightGroupStatus()),
                last_call=self.call(r, entries[max(entries)]) if entries else None,
                source=self.source(r),
            )
            for r, data in sorted(self.ranks.items())
            for pg, entries in sorted(data.by_group.items(), key=lambda kv: _pg_order(kv[0]))
        ]
        if not any(recorded.values()) and self.ranks:
            self.notes.append(
                "the dumps record no group membership (gloo leaves pg_config empty): the default "
                "group is taken to hold every rank, other groups the ranks that used them"
            )
        self.divergences.sort(key=lambda kd: kd[0])
        return FlightAnalysis(
            world_size=len(world) or None,
            ranks_with_dump=sorted(self.ranks),
            ranks_without_dump=missing,
            views=views,
            divergences=[d for _, d in self.divergences],
            table=self.rows,
            sources=[d.source for d in self.dumps],
            notes=self.notes,
        )

    def when(self, d: FlightDivergence) -> tuple[int, int]:
        """Order of divergences: the creation time of the earliest call at the point where the
        ranks parted, so that the first one is where the job left the rails."""
        times = []
        for c in d.calls:
            if c.seq == d.seq and c.pg == d.pg and c.rank in self.ranks:
                e = self.ranks[c.rank].by_group.get(c.pg, {}).get(c.seq)
                if e is not None and e.time_created_ns:
                    times.append(e.time_created_ns)
        return (min(times) if times else 1 << 61, d.seq or 0)

    def no_dump(self, missing: list[int]) -> FlightDivergence:
        waits = []
        for r, data in sorted(self.ranks.items()):
            entry = data.last_entry()
            if entry is not None:
                waits.append(self.call(r, entry))
        where = "; ".join(
            f"rank {w.rank}'s last was {w.op} #{w.seq}{_shape(w)}{_at(w)}" for w in waits
        )
        return FlightDivergence(
            kind="no-dump",
            pg=None,
            pg_desc=None,
            seq=None,
            ranks=missing,
            others=sorted(self.ranks),
            calls=waits,
            summary=f"{_fmt_ranks(missing)} left no Flight Recorder dump (died before writing "
            "one, or its dump is not among the inputs)" + (f"; {where}" if where else ""),
        )


def _at(call: FlightCall) -> str:
    return f" at {call.site}" if call.site else ""


def _key(e: FlightEntry) -> tuple[object, ...]:
    user = e.user_frame
    return (*_signature(e), user.site if user else None)


def _pg_order(pg: str) -> tuple[int, str]:
    return (int(pg), pg) if pg.isdigit() else (1 << 30, pg)


def analyze(dumps: list[FlightDump], world_size: int | None = None) -> FlightAnalysis:
    """The recorders of one job side by side. `world_size` (from the logs) lets ranks that left
    no dump at all be named."""
    return _Analyzer(dumps, world_size).run()
