"""The report in a real browser: headless Chromium opens report.html from file://, draws a page
that is not blank, holds every expected figure, and logs nothing to its console."""
from __future__ import annotations

import base64
import io
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest
from matplotlib import image as mpimg
from testkit import needs_service

from infersight.dashboards.report import write_report

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
pytestmark = needs_service("Chromium", Path(CHROMIUM).exists(), "no /usr/bin/chromium (`make services` installs it)")
#: Flags for a quiet, offline, throwaway browser: no sandbox (we may be root in a container), no
#: GPU, no network side-traffic, no first-run UI, and a fresh profile per run.
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--enable-logging=stderr", "--v=0", "--hide-scrollbars")
EXPECTED_FIGURES = {
    "fig-ttft-decomposition": "Per-request latency decomposition", "fig-latency-cdf": "Latency distributions",
    "fig-expert-load": "MoE expert load", "fig-expert-imbalance": "MoE imbalance over time",
    "fig-kv-transitions": "KV block lifecycle", "fig-kv-lifetimes": "KV block ages",
    "fig-prefix-groups": "Shared-prefix groups", "fig-acceptance-position": "Speculative acceptance by task",
    "fig-spec-speedup": "Predicted speculation speedup"}
EXPECTED_NOTES = ("note-gpu-activity", "note-kernel-categories", "note-roofline")  # CPU run: skipped, said why


def _chromium(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    profile = tempfile.mkdtemp(prefix="chromium-profile-", dir=tmp)
    proc = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _console_lines(stderr: str) -> list[str]:
    """What the page logged: Chromium writes console messages as ...:CONSOLE(line)] "text" or
    ...:CONSOLE:line] "text"; uncaught exceptions come through the same channel."""
    return [ln for ln in stderr.splitlines() if ":CONSOLE" in ln or "Uncaught" in ln]


def _packed(rgb: np.ndarray) -> np.ndarray:
    """One int per pixel (0xRRGGBB) from float RGB in 0..1: np.unique over ints is fast, over rows slow."""
    c = (rgb.reshape(-1, 3) * 255).round().astype(np.uint32)
    return (c[:, 0] << 16) | (c[:, 1] << 8) | c[:, 2]


@pytest.fixture(scope="module")
def report_url(run_dir: Path) -> str:
    return write_report(run_dir).resolve().as_uri()


def test_the_page_renders_and_is_not_blank(report_url: str, tmp_path: Path) -> None:
    shot = tmp_path / "report.png"
    proc = _chromium(tmp_path, "--window-size=1280,3000", f"--screenshot={shot}", report_url)
    assert not _console_lines(proc.stderr), _console_lines(proc.stderr)
    pixels = mpimg.imread(str(shot))[..., :3]
    assert pixels.shape[0] >= 2000 and pixels.shape[1] >= 1200
    packed = _packed(pixels)
    colours, counts = np.unique(packed, return_counts=True)
    drawn = float((packed != colours[counts.argmax()]).mean())  # share of pixels unlike the background
    assert len(colours) > 50, f"only {len(colours)} distinct colours: a blank or broken page"
    assert drawn > 0.10, f"only {drawn:.1%} of the screenshot differs from the background"


def test_every_figure_is_in_the_dom_without_console_errors(report_url: str, tmp_path: Path) -> None:
    proc = _chromium(tmp_path, "--dump-dom", report_url)
    dom = proc.stdout
    assert not _console_lines(proc.stderr), _console_lines(proc.stderr)
    images = {m.group(1): (m.group(2), m.group(3)) for m in
              re.finditer(r'<img id="([^"]+)" alt="([^"]*)" src="data:image/png;base64,([^"]+)"', dom)}
    assert set(images) == set(EXPECTED_FIGURES)
    for fig_id, (alt, data) in images.items():
        assert alt.startswith(EXPECTED_FIGURES[fig_id]), (fig_id, alt)
        png = mpimg.imread(io.BytesIO(base64.b64decode(data)), format="png")  # a real, decodable PNG
        assert png.shape[0] > 100 and png.shape[1] > 300, (fig_id, png.shape)
        assert len(np.unique(_packed(png[..., :3]))) > 5, f"{fig_id} is blank"
    notes = set(re.findall(r'<p class="note" id="([^"]+)">Skipped: [^<]+</p>', dom))
    assert notes == set(EXPECTED_NOTES)
    assert '<table class="summary" id="summary">' in dom
    assert "src=\"http" not in dom and "href=\"http" not in dom  # nothing the page would fetch


def test_console_errors_would_be_caught(tmp_path: Path) -> None:
    """The console check above is not vacuous: a page that throws is reported."""
    page = tmp_path / "bad.html"
    page.write_text("<html><body><script>console.error('boom'); missingFunction();</script></body></html>")
    lines = _console_lines(_chromium(tmp_path, "--dump-dom", page.resolve().as_uri()).stderr)
    assert any("boom" in ln for ln in lines) and any("Uncaught" in ln for ln in lines)
