"""Is an install profile already in this Python? ``python -m course.installed PROFILE`` exits 0
when this checkout's ``llmcore`` is installed (``pip install -e``) with every requirement of the
profile's extra (``learner``, ``instructor``, ``dev``...; extras that name other extras followed)
installed at a version its pin allows, and 1, naming the first thing missing, otherwise.

The Makefile asks it before installing a profile, so that an environment installed by hand (the
README's ``pip install`` lines, which write no stamp) is stamped instead of installed again.
Standard library and ``packaging`` only (pip brings it; without it the answer is "no").
"""

from __future__ import annotations

import sys
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROJECT = "llmcore"


def missing(profile: str) -> str | None:
    """What keeps ``profile`` from being installed here, or None when nothing does."""
    try:
        from packaging.requirements import Requirement
    except ImportError:
        return "packaging is not installed"
    try:
        project = metadata.distribution(PROJECT)
    except metadata.PackageNotFoundError:
        return f"{PROJECT} is not installed"
    import json                                    # the checkout's, not another copy
    from urllib.parse import unquote, urlparse
    url = json.loads(project.read_text("direct_url.json") or "{}").get("url", "")
    if Path(unquote(urlparse(url).path)).resolve() != ROOT:
        return f"{PROJECT} is installed from {url or 'an index'}, not from {ROOT}"
    extras, base = _requirements(project)
    if profile not in extras:
        return f"no install profile {profile!r}"
    wanted, seen, lines = [profile], set(), list(base)
    while wanted:
        extra = wanted.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for line in extras.get(extra, []):
            requirement = Requirement(line)
            if requirement.name == PROJECT:
                wanted.extend(requirement.extras)
            else:
                lines.append(line)
    for line in lines:
        requirement = Requirement(line)
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue                       # another platform's
        try:
            version = metadata.version(requirement.name)
        except metadata.PackageNotFoundError:
            return f"{requirement.name} is not installed"
        if not requirement.specifier.contains(version, prereleases=True):
            return f"{requirement.name} {version} does not satisfy {requirement}"
    return None


def _requirements(project) -> tuple[dict[str, list[str]], list[str]]:
    """(extra -> its requirement lines, the base requirements), from the checkout's
    pyproject.toml (which may be newer than the install), else from the installed metadata."""
    try:
        import tomllib                                  # Python 3.11+
        table = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
        return table.get("optional-dependencies", {}), table.get("dependencies", [])
    except (ImportError, OSError, KeyError):
        from packaging.requirements import Requirement
        extras: dict[str, list[str]] = {}
        base = []
        for line in project.requires or []:
            requirement = Requirement(line)
            marker = str(requirement.marker or "")
            names = [e for e in (project.metadata.get_all("Provides-Extra") or [])
                     if f'extra == "{e}"' in marker]
            for extra in names:
                extras.setdefault(extra, []).append(line.split(";")[0])
            if not names:
                base.append(line)
        for extra in project.metadata.get_all("Provides-Extra") or []:
            extras.setdefault(extra, [])
        return extras, base


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m course.installed PROFILE", file=sys.stderr)
        return 2
    reason = missing(args[0])
    if reason:
        print(f"the {args[0]} profile is not installed: {reason}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
