"""(Re)captures the bundled logs of real runs: `python -m ddpdoctor.scenarios.capture NAME...`
or `--all`. Writes only under scenarios/captured/; needs torch. Never edits a captured log."""

from __future__ import annotations

import argparse
import logging

from ddpdoctor.scenarios import catalog, runner

log = logging.getLogger("ddpdoctor.scenarios.capture")


def capture(names: list[str]) -> int:
    """Runs each named scenario into its captured/ folder; returns how many timed out."""
    timeouts = 0
    for name in names:
        scenario = catalog.get(name)
        result = runner.run(scenario, scenario.captured_dir)
        timeouts += result.timed_out
        log.info(
            "%-28s rc=%s %5.1fs%s",
            name,
            result.exit_code,
            result.duration_s,
            " TIMED OUT" if result.timed_out else "",
        )
    return timeouts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ddpdoctor.scenarios.capture")
    parser.add_argument("names", nargs="*", help="scenario names (see catalog.py)")
    parser.add_argument("--all", action="store_true", help="capture every scenario")
    ns = parser.parse_args(argv)
    names = [s.name for s in catalog.SCENARIOS] if ns.all else ns.names
    if not names:
        parser.error("name a scenario or pass --all")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    return 1 if capture(names) else 0


if __name__ == "__main__":
    raise SystemExit(main())
