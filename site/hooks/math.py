"""Render TeX math to MathML when the site is built.

pymdownx.arithmatex (generic mode) wraps math in `<span class="arithmatex">\\(...\\)</span>`
and `<div class="arithmatex">\\[...\\]</div>`. This hook replaces each with MathML,
which browsers render natively: no MathJax, no CDN, and a page that works offline.
"""
from __future__ import annotations

import html
import re

from latex2mathml.converter import convert

_INLINE = re.compile(r'<span class="arithmatex">\\\((.+?)\\\)</span>', re.DOTALL)
_BLOCK = re.compile(r'<div class="arithmatex">\\\[(.+?)\\\]</div>', re.DOTALL)


def _render(tex: str, display: str) -> str:
    return convert(html.unescape(tex).strip(), display=display)


def on_page_content(content: str, page, config, files) -> str:
    content = _BLOCK.sub(lambda m: f'<div class="math-block">{_render(m.group(1), "block")}</div>', content)
    return _INLINE.sub(lambda m: _render(m.group(1), "inline"), content)
