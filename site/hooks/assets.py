"""Serve the site's own CSS from site/css, so lessons/ holds only lesson pages."""
from __future__ import annotations

from mkdocs.structure.files import File

from coursekit import trees

CSS = trees.SITE_SOURCES / "css"


def on_files(files, config):
    for path in sorted(CSS.glob("*.css")):
        files.append(File.generated(config, f"assets/{path.name}", abs_src_path=str(path)))
    return files
