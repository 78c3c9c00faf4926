#!/usr/bin/env python3
"""Print a wheel's ``Requires-Dist`` lines that are not behind an ``extra ==`` marker.

Used by gym-server.Dockerfile: nemo-gym's wheel declares a Python floor that most 3.13
builds do not meet, so its dependencies are installed from this list (still checked
against the running Python) and the wheel itself without its Python check.

Usage: ``wheel-requirements WHEEL > requirements.txt``. Standard library only.
"""

from __future__ import annotations

import re
import sys
import zipfile
from email.parser import Parser

_EXTRA = re.compile(r";.*\bextra\s*==")


def requirements(wheel: str) -> list[str]:
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = Parser().parsestr(zf.read(name).decode())
    return [r for r in metadata.get_all("Requires-Dist", []) if not _EXTRA.search(r)]


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: wheel-requirements WHEEL")
    print("\n".join(requirements(sys.argv[1])))
