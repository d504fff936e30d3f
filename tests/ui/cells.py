"""Reading a dashboard page's HTML in the HTTP-level tests: a table row's cells as text."""

import html
import re


def cells(page: str, row: str) -> list[str]:
    """The text of each cell of the first table row whose HTML contains `row`."""
    found = next((r for r in re.findall(r"<tr[ >].*?</tr>", page, re.S) if row in r), None)
    assert found, f"no row {row!r} on the page"
    return [
        html.unescape(re.sub(r"<[^>]+>", "", cell)).strip()
        for cell in re.findall(r"<td[^>]*>(.*?)</td>", found, re.S)
    ]
