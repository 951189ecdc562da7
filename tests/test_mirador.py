"""A generated manifest loads in Mirador (from the npm registry, pinned in deploy/iipsrv/install-mirador) in
headless Chromium (Debian's chromium), with the viewer, the manifest (MinIO) and the images (iipsrv) all
served from loopback. The screenshot must show the image: the validator's test image is a grid of 100
distinct colours that no viewer chrome or error dialog has."""
from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import time
from pathlib import Path
from urllib.parse import quote

import numpy as np
import pytest
from PIL import Image

from gcis_etl.iipsrv import DEPLOY
from tests.consumer import VALIDATOR_IMAGE, wait_logged
from tests.servers import terminate

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def mirador(consumer) -> Path:
    """Mirador installed where the consumer serves it from (/viewer/mirador.min.js)."""
    target = consumer.server.mirador_dir.expanduser()
    done = subprocess.run([str(DEPLOY / "install-mirador"), str(target)], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, f"install-mirador failed (npm and the npm registry are needed): {done.stderr}"
    return target


class ProtocolError(Exception):
    """Chromium answered a DevTools command with an error."""


class Chromium:
    """Headless Chromium driven over the DevTools protocol on a pipe (--remote-debugging-pipe: JSON messages
    ending in NUL, read on fd 3, written on fd 4), so a test waits for what it needs on the wall clock
    instead of guessing a load time."""

    SCREENSHOT_ATTEMPTS = 5

    def __init__(self, profile: Path, width: int = 1200, height: int = 900):
        binary = shutil.which("chromium")
        assert binary, "Chromium is needed: apt-get install chromium (the Makefile's system packages)"
        to_chrome, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome = os.pipe()

        def child_fds() -> None:
            read, write = os.dup(to_chrome), os.dup(from_chrome)  # out of the way of 3 and 4 first
            os.dup2(read, 3)
            os.dup2(write, 4)

        self.proc = subprocess.Popen(
            [binary, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
             "--disable-extensions", "--remote-debugging-pipe", f"--user-data-dir={profile}",
             f"--window-size={width},{height}", "about:blank"],
            pass_fds=(3, 4), preexec_fn=child_fds, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_chrome)
        os.close(from_chrome)
        self._buffer = b""
        self._id = 0
        self.size = (width, height)
        self.target: str | None = None
        self.session: str | None = None

    def call(self, method: str, timeout: float = 30, browser: bool = False, **params) -> dict:
        """Send a command to the page's session (to the browser itself when `browser`), wait for its answer."""
        self._id += 1
        message = {"id": self._id, "method": method, "params": params}
        if self.session and not browser:
            message["sessionId"] = self.session
        os.write(self._to_chrome, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            while b"\0" in self._buffer:
                raw, self._buffer = self._buffer.split(b"\0", 1)
                reply = json.loads(raw)
                if reply.get("id") == self._id:
                    if "error" in reply:
                        raise ProtocolError(f"{method}: {reply['error'].get('message')} ({reply['error']})")
                    return reply["result"]
            left = deadline - time.monotonic()
            assert left > 0 and select.select([self._from_chrome], [], [], left)[0], f"{method}: no answer"
            chunk = os.read(self._from_chrome, 1 << 20)
            assert chunk, "chromium exited"
            self._buffer += chunk

    def open(self, url: str) -> None:
        self.target = self.call("Target.createTarget", browser=True, url="about:blank")["targetId"]
        self._attach()
        self.call("Page.navigate", url=url)

    def _attach(self) -> None:
        """A new session on the page target, with the window size (an emulation lasts as long as its session);
        the previous session, if any, is let go."""
        previous = self.session
        self.session = self.call("Target.attachToTarget", browser=True, targetId=self.target,
                                 flatten=True)["sessionId"]
        width, height = self.size
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1,
                  mobile=False)
        if previous:
            try:
                self.call("Target.detachFromTarget", browser=True, sessionId=previous)
            except ProtocolError:  # Chromium had already let it go
                pass

    def evaluate(self, expression: str):
        return self.call("Runtime.evaluate", expression=expression, returnByValue=True)["result"].get("value")

    def screenshot(self, out: Path) -> Path:
        """Page.captureScreenshot answers "Not attached to an active page" while a navigation commits in a new
        renderer (most captures made just after Page.navigate do; one made 0.2 s later works). Try again a
        bounded number of times, each on a new session to the page target in case the old one went too."""
        errors = []
        for attempt in range(1, self.SCREENSHOT_ATTEMPTS + 1):
            if attempt > 1:
                time.sleep(0.2 * attempt)
                self._attach()
            try:
                data = self.call("Page.captureScreenshot", format="png")["data"]
            except ProtocolError as exc:
                errors.append(str(exc))
                continue
            out.write_bytes(base64.b64decode(data))
            return out
        raise AssertionError(f"no screenshot in {self.SCREENSHOT_ATTEMPTS} attempts: " + "; ".join(errors))

    def close(self) -> None:
        terminate(self.proc)
        os.close(self._to_chrome)
        os.close(self._from_chrome)


@pytest.fixture
def browser(tmp_path):
    chromium = Chromium(tmp_path / "profile")
    yield chromium
    chromium.close()


def grid_colours() -> list[tuple[int, int, int]]:
    """The colour at the centre of each of the 10x10 squares of the validator's test image."""
    image = np.asarray(Image.open(VALIDATOR_IMAGE).convert("RGB"))
    step = image.shape[0] // 10
    return [tuple(int(v) for v in image[step * r + step // 2, step * c + step // 2])
            for r in range(10) for c in range(10)]


def colours_shown(shot: Path, colours: list[tuple[int, int, int]], tolerance: int = 12,
                  min_pixels: int = 50) -> int:
    """How many of `colours` cover at least `min_pixels` pixels of the screenshot. Compared with its distinct
    colours, each weighed by its pixels: a screenshot has a million pixels but a few thousand colours (each of the
    100 colours compared with every pixel took seconds a screenshot)."""
    pixels = np.asarray(Image.open(shot).convert("RGB")).reshape(-1, 3).astype(np.int32)
    packed, counts = np.unique(pixels[:, 0] << 16 | pixels[:, 1] << 8 | pixels[:, 2], return_counts=True)
    distinct = np.stack([packed >> 16, packed >> 8 & 255, packed & 255], axis=1)
    return sum(int(counts[np.abs(distinct - np.array(c)).max(axis=1) <= tolerance].sum()) >= min_pixels
               for c in colours)


@pytest.mark.parametrize("version", ["3", "2"])
def test_a_generated_manifest_shows_its_image_in_mirador(deposited, consumer, mirador, browser, tmp_path, version):
    image = deposited.image("validator")
    manifest = f"{image.pipeline}/{image.object_id}/manifest-v{version}.json"
    assert manifest in deposited.manifest_keys
    browser.open(f"{consumer.url}/viewer/?manifest={quote(deposited.manifest_url(manifest), safe='')}")
    colours = grid_colours()
    deadline = time.monotonic() + 60
    while True:  # until the image is drawn, or the deadline: the last screenshot is what is judged
        shot = browser.screenshot(tmp_path / "mirador.png")
        shown = colours_shown(shot, colours)
        if shown >= 90 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert shown >= 90, f"only {shown} of the image's 100 colours on screen: see {shot}"
    assert browser.evaluate("document.title") == "gcis-etl viewer"
    wait_logged(consumer.server.access_log, f"{consumer.server.prefix}/{image.key}/")  # pixels came from our iipsrv


def test_the_colour_check_finds_nothing_in_an_empty_viewer(consumer, mirador, browser, tmp_path):
    """The viewer without a manifest, once Mirador has drawn its workspace: none of the image's colours."""
    browser.open(f"{consumer.url}/viewer/")
    deadline = time.monotonic() + 60
    while not browser.evaluate("document.querySelectorAll('#viewer *').length > 20"):
        assert time.monotonic() < deadline, "Mirador did not render"
        time.sleep(0.2)
    assert colours_shown(browser.screenshot(tmp_path / "empty.png"), grid_colours()) <= 5
