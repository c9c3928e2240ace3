"""docs/ builds as a site (MkDocs, `mkdocs.yml`) with --strict, as CI builds it: a link to a page or a heading
that does not exist fails the build. Built into temporary folders, never into the checkout."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def build(project: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                          cwd=project, capture_output=True, text=True, timeout=300)


def test_the_docs_site_builds_strictly(tmp_path):
    built = build(REPO, tmp_path / "site")
    assert built.returncode == 0, built.stderr
    for page in ("index", "running", "configuration", "memory", "scopes", "measuring", "layout", "playbook"):
        assert (tmp_path / "site" / f"{page}.html").is_file(), page


def test_a_broken_link_or_anchor_fails_the_strict_build(tmp_path):
    for broken in ("[gone](no-such-page.md)", "[gone](playbook.md#no-such-heading)"):
        project = tmp_path / broken[7:14].strip("#.")
        shutil.copytree(REPO / "docs", project / "docs")
        shutil.copy(REPO / "mkdocs.yml", project / "mkdocs.yml")
        with (project / "docs" / "running.md").open("a") as page:
            page.write(f"\nSee {broken}.\n")
        failed = build(project, project / "site")
        assert failed.returncode != 0, broken
        assert "running.md" in failed.stderr, failed.stderr
