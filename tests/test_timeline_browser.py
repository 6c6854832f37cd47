"""The HTML timeline in a real headless browser (Debian's chromium through chromedriver's
WebDriver protocol, spoken with urllib): the page renders with nothing fetched and no script,
the culprit's lane holds the root marker (in the DOM and inside the lane's box on screen), the
other lanes hold none, arrows leave from the root, and the screenshot shows the marker painted
red. Skipped, with the reason, where chromium is not installed (`make browser` installs it)."""

from __future__ import annotations

import base64
import json
import shutil
import socket
import struct
import subprocess
import time
import urllib.error
import urllib.request
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, run_cli
from tests.test_timeline import write_world

TIMED = REPO / "tests" / "fixtures" / "real" / "timed-data-error" / "console.log"
ROOT_RED = (0xB4, 0x23, 0x18)
BROWSERS = ("chromium", "chromium-browser", "google-chrome")


def _binaries() -> tuple[str, str]:
    browser = next((p for b in BROWSERS if (p := shutil.which(b))), None)
    driver = shutil.which("chromedriver")
    if browser is None or driver is None:
        pytest.skip(
            "chromium and chromedriver are not installed here: `make browser` installs them "
            "(apt-get install chromium chromium-driver, Debian, as root)"
        )
    return browser, driver


class WebDriver:
    """The few W3C WebDriver commands the test needs."""

    def __init__(self, url: str, browser: str) -> None:
        self.url = url
        caps = {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": browser,
                "args": [
                    "--headless=new",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--disable-dev-shm-usage",
                    "--window-size=1280,1400",
                    "--force-device-scale-factor=1",
                ],
            },
        }
        self.session = self.call("POST", "/session", {"capabilities": {"alwaysMatch": caps}})[
            "sessionId"
        ]

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            self.url + path, data=data, method=method, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                return json.loads(resp.read())["value"]
        except urllib.error.HTTPError as exc:
            raise AssertionError(f"{method} {path}: {exc.read()[:500]!r}") from exc

    def s(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        return self.call(method, f"/session/{self.session}{path}", body)

    def open(self, page: Path) -> None:
        self.s("POST", "/url", {"url": page.as_uri()})

    def js(self, script: str, *args: Any) -> Any:
        return self.s("POST", "/execute/sync", {"script": script, "args": list(args)})

    def element(self, css: str) -> str:
        found = self.s("POST", "/element", {"using": "css selector", "value": css})
        return str(next(iter(found.values())))

    def screenshot(self, element: str | None = None) -> bytes:
        path = f"/element/{element}/screenshot" if element else "/screenshot"
        return base64.b64decode(self.s("GET", path))

    def quit(self) -> None:
        self.s("DELETE", "")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    chromium, chromedriver = _binaries()
    port = _free_port()
    proc = subprocess.Popen(
        [chromedriver, f"--port={port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(url + "/status", timeout=2) as resp:
                if json.loads(resp.read())["value"]["ready"]:
                    break
        except OSError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("chromedriver did not start within 30 s")
        time.sleep(0.2)
    driver = WebDriver(url, chromium)
    try:
        yield driver
    finally:
        driver.quit()
        proc.terminate()
        proc.wait(timeout=10)


def png_pixels(png: bytes) -> tuple[int, int, list[tuple[int, int, int]]]:
    """(width, height, RGB pixels) of an 8-bit RGB or RGBA, non-interlaced PNG."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat = 8, b""
    width = height = colour = 0
    while pos < len(png):
        (length,) = struct.unpack(">I", png[pos : pos + 4])
        kind, data = png[pos + 4 : pos + 8], png[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", data)
            assert depth == 8 and colour in (2, 6) and interlace == 0
        elif kind == b"IDAT":
            idat += data
        pos += 12 + length
    bpp = 4 if colour == 6 else 3
    raw, stride = zlib.decompress(idat), width * bpp
    rows: list[bytearray] = []
    prev = bytearray(stride)
    for y in range(height):
        f, line = (
            raw[y * (stride + 1)],
            bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)]),
        )
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 0xFF
            elif f == 2:
                line[i] = (line[i] + b) & 0xFF
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 0xFF
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                line[i] = (line[i] + pred) & 0xFF
        rows.append(line)
        prev = line
    pixels = [(r[i], r[i + 1], r[i + 2]) for r in rows for i in range(0, stride, bpp)]
    return width, height, pixels


LANES = """
const lanes = [...document.querySelectorAll('svg.timeline g.lane')];
return lanes.map(g => {
  const box = g.querySelector('rect.lane-bg').getBoundingClientRect();
  const roots = [...g.querySelectorAll('.root-marker')].map(m => {
    const r = m.getBoundingClientRect();
    return {top: r.top, bottom: r.bottom, left: r.left, width: r.width, height: r.height};
  });
  return {id: g.id, ranks: g.dataset.ranks, culprit: g.classList.contains('culprit'),
          top: box.top, bottom: box.bottom, roots: roots,
          marks: g.querySelectorAll('g.mark').length};
});
"""


def _page(tmp_path: Path, name: str, *inputs: Path) -> Path:
    out = tmp_path / name
    proc = run_cli("diagnose", *map(str, inputs), "-o", str(out))
    assert proc.returncode == 1, proc.stderr
    return out


def _check_culprit_lane(driver: WebDriver, culprit: int) -> list[dict[str, Any]]:
    lanes = driver.js(LANES)
    assert lanes, "no lane rendered"
    holders = [lane for lane in lanes if lane["roots"]]
    assert len(holders) == 1, lanes
    lane = holders[0]
    assert lane["culprit"] and lane["ranks"].split(",") == [str(culprit)]
    (root,) = lane["roots"]
    assert root["width"] > 10 and root["height"] > 10  # drawn, not collapsed
    assert lane["top"] - 1 <= root["top"] and root["bottom"] <= lane["bottom"] + 1  # on its lane
    return lanes


def test_culprit_lane_holds_the_root_marker_in_a_real_browser(
    browser: WebDriver, tmp_path: Path
) -> None:
    page = _page(tmp_path, "report.html", TIMED)
    html = page.read_text()
    assert "<script" not in html and "http://" not in html.replace("http://www.w3.org", "")
    browser.open(page)
    assert browser.js("return document.readyState") == "complete"
    assert browser.js("return performance.getEntriesByType('resource').length") == 0
    lanes = _check_culprit_lane(browser, culprit=1)
    assert [lane["ranks"] for lane in lanes][:2] == ["1", "0"]
    arrows = browser.js(
        "return [...document.querySelectorAll('svg.timeline path.arrow')]"
        ".map(p => [p.dataset.from, p.dataset.to, p.getTotalLength()])"
    )
    root_id = browser.js("return document.querySelector('.root-marker').parentNode.id")
    assert arrows and all(a[0] == root_id and a[2] > 20 for a in arrows)
    tips = browser.js(
        "return document.querySelector('#' + arguments[0] + ' > title').textContent", root_id
    )
    assert "console.log:16" in tips and "FileNotFoundError" in tips  # hover text, no script

    shot = tmp_path / "report.png"
    shot.write_bytes(browser.screenshot())
    width, height, _ = png_pixels(shot.read_bytes())
    assert width >= 1000 and height >= 600
    marker = browser.element(".root-marker")
    _, _, pixels = png_pixels(browser.screenshot(marker))
    red = [p for p in pixels if all(abs(p[i] - ROOT_RED[i]) < 40 for i in range(3))]
    assert len(red) >= 20, "the root marker is not painted in the root's red"


def test_thousands_of_ranks_render_as_two_lanes(browser: WebDriver, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    write_world(logs, 1024, culprit=700)
    page = _page(tmp_path, "big.html", logs)
    browser.open(page)
    lanes = _check_culprit_lane(browser, culprit=700)
    assert len(lanes) == 2
    # the 1,023 ranks that waited share a lane: their last progress and their timeout
    assert lanes[1]["ranks"].count(",") == 1022 and lanes[1]["marks"] == 2
    (tmp_path / "big.png").write_bytes(browser.screenshot())
