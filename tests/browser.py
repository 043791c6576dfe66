"""Chromium for the browser tests (test_site.py, test_lab.py) through Playwright, which cannot download a browser
here: Debian's (``CHROMIUM``, default /usr/bin/chromium; ``make test`` installs it as root), else they skip."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

CHROMIUM = Path(os.environ.get("CHROMIUM", "/usr/bin/chromium"))
NO_CHROMIUM = (
    f"no Chromium at {CHROMIUM}: the browser tests need it (`make test` installs it as root; "
    "else `sudo apt-get install chromium`, or set CHROMIUM to a Chromium binary)"
)
needs_chromium = pytest.mark.skipif(not CHROMIUM.exists(), reason=NO_CHROMIUM)

# A quiet, self-contained browser: no sandbox (root in a container), no GPU, nothing fetched in the background.
ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync",
]  # fmt: skip


@contextlib.contextmanager
def chromium(profile_dir: Path, **context_options) -> Iterator[object]:
    """A headless Chromium context with a fresh profile in ``profile_dir`` (Playwright's BrowserContext)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(profile_dir), executable_path=str(CHROMIUM), headless=True, args=ARGS, **context_options
        )
        try:
            yield context
        finally:
            context.close()
