"""Debian's chromium driven by Playwright for Python (never `playwright install`: it downloads a
browser), and where the dashboard tests save their screenshots."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from playwright.sync_api import Browser, ConsoleMessage, Dialog, Page, sync_playwright

from tests.conftest import CHROMIUM, need_chromium

FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SHOTS = Path(__file__).parents[2] / "build" / "ui-screenshots"
SCREENSHOTS = Path(os.environ.get("KAIROS_UI_SCREENSHOTS", SHOTS))


@contextmanager
def chromium() -> Iterator[Browser]:
    need_chromium()
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=FLAGS)
        try:
            yield browser
        finally:
            browser.close()


@dataclass
class Watch:
    """What a page did that it must not: dialogs opened, scripts run, CSP violations."""

    dialogs: list[str] = field(default_factory=list)
    console: list[str] = field(default_factory=list)

    def attach(self, page: Page) -> None:
        def dialog(d: Dialog) -> None:
            self.dialogs.append(d.message)
            d.dismiss()

        def console(message: ConsoleMessage) -> None:
            self.console.append(f"{message.type}: {message.text}")

        page.on("dialog", dialog)
        page.on("console", console)
        page.on("pageerror", lambda error: self.console.append(f"pageerror: {error}"))

    @property
    def csp_violations(self) -> list[str]:
        return [line for line in self.console if re.search("Content Security Policy", line)]


def shoot(page: Page, name: str) -> Path:
    """A full-page screenshot under SCREENSHOTS (build/ui-screenshots by default)."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path
