"""Figures from data, and the rules of a lesson page's text (SYLLABUS section 2, "How a lesson page reads").

Figures. A measured number in a sentence is never typed: the page writes

    {{fig SOURCE | SELECTOR | FIELD | FORMAT}}

and the build puts the value there, with the file's GPU, command and date as its hover title.
  SOURCE    a JSON file under site/data/ without .json: bench/06-fused-elementwise, profile/08-flash-attention,
            plots/08-flash-attention-seqlen, evidence/06-fused-elementwise/gelu_erf
  SELECTOR  `-`: the file's top level. Otherwise one entry of the file's list ("cases", "kernels" or "rows"):
            `key=value` pairs joined by ` & `, or a bare string, the entry whose "name" (else "case", else
            "kernel") equals it. It must match exactly one entry.
  FIELD     a key of that entry, dotted for nesting (shared_bank_conflicts.ld.pct_of_wavefronts)
  FORMAT    a Python format spec (.2f, ,.0f, .1%); optional

Evidence files (site/data/evidence/NN-slug/NAME.json) hold the measurements that are not a bench, profile or
plot file: {"gpu", "torch", "date", "command", "source", "rows": [...], "table": {"columns": [[field, label,
format], ...]}}. `<!-- evidence: NN-slug/NAME -->` on a line of its own renders the rows as a table, with one
provenance line under it. The probe that wrote a file sits beside it.

Rules, each a warning (so `mkdocs build --strict` fails), for every page under lessons/ but the instructors' and
troubleshooting pages: no issue numbers, work dates or paths of internal notes; no stale "not measured" phrases
(the data says what ran); and for lesson pages (NN-slug.md) a main text of at most WORD_BUDGET words, where code
included from files (`--8<--` lines), HTML comments and collapsed blocks (`??? ...` with its indented body,
`<details>...</details>`) do not count.

Run as a script on page files to print their word counts and problems:
    ./course run site/hooks/spine.py lessons/06-fused-elementwise.md
"""
from __future__ import annotations

import html
import json
import logging
import re
import sys
from pathlib import Path

if __name__ == "__main__":  # as a script, this folder leads sys.path: its math.py would shadow the stdlib's
    _HOOKS = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HOOKS]
from coursekit import trees  # noqa: E402

log = logging.getLogger("mkdocs.hooks.spine")
DATA = trees.SITE_SOURCES / "data"
WORD_BUDGET = 5000
LESSON_PAGE = re.compile(r"^\d\d-[a-z0-9-]+\.md$")
RULES_EXEMPT = {"instructors.md", "troubleshooting.md"}  # pages about the tooling, not lessons
FIGURE = re.compile(r"\{\{fig\s+([^{}]*?)\s*\}\}")
EVIDENCE_TABLE = re.compile(r"^<!--\s*evidence:\s*([0-9]{2}-[a-z0-9-]+/[A-Za-z0-9_.-]+)\s*-->[ \t]*$", re.MULTILINE)
ENTRY_LISTS = ("cases", "kernels", "rows")
NAME_KEYS = ("name", "case", "kernel")
# What a page must not say: internal references, and measurements said to be missing (the data says what ran).
FORBIDDEN = [
    (re.compile(r"\bissues?\s+#?\d+\b|(?<![\w&/(\"])#\d{1,4}\b", re.IGNORECASE), "an issue number"),
    (re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b"), "a work date (the data's provenance line gives dates)"),
    (re.compile(r"NOTES\.md|tools/gpu/"), "a path of the internal notes or probes (cite the evidence file)"),
    (re.compile(r"\bthis session\b", re.IGNORECASE), "an internal note"),
    (re.compile(r"not (?:yet )?(?:been )?(?:run|timed|measured|profiled)(?: yet)? on (?:a|the|any) GPU"
                r"|ha(?:s|ve) not (?:yet )?(?:been )?(?:run|timed|measured|profiled)"
                r"|to be measured|not (?:yet )?measured yet|not yet measured", re.IGNORECASE),
     "a stale 'not measured' phrase (render what the data has, or say what would measure it)"),
]


# ------------------------------------------------------------------ the text
def _drop_collapsed(lines: list[str]) -> list[str]:
    """Lines outside `??? ...` blocks (the header and its indented or blank body) and <details> blocks."""
    kept: list[str] = []
    in_block, in_details = False, 0
    for line in lines:
        if in_details:
            in_details += line.count("<details") - line.count("</details>")
            continue
        if "<details" in line:
            in_details = line.count("<details") - line.count("</details>")
            continue
        if in_block:
            if not line.strip() or line.startswith(("    ", "\t")):
                continue
            in_block = False
        if re.match(r"^\?\?\?\+?\s", line):
            in_block = True
            continue
        kept.append(line)
    return kept


def main_text(markdown: str) -> str:
    """The text the word budget counts: no front matter, HTML comments, --8<-- includes or collapsed blocks; each
    {{fig}} counts as the one word it renders."""
    markdown = re.sub(r"\A---\n.*?\n---\n", "", markdown, flags=re.DOTALL)
    markdown = re.sub(r"<!--.*?-->", "", markdown, flags=re.DOTALL)
    markdown = FIGURE.sub("0", markdown)  # a figure reads as one word, however long its marker
    lines = [line for line in markdown.splitlines() if not line.lstrip().startswith("--8<--")]
    return "\n".join(_drop_collapsed(lines))


def word_count(markdown: str) -> int:
    return len(main_text(markdown).split())


def text_problems(name: str, markdown: str) -> list[str]:
    """What breaks the page rules, for the page lessons/`name` (e.g. "06-fused-elementwise.md", "notes/06-...")."""
    if name in RULES_EXEMPT:
        return []
    problems = []
    for number, line in enumerate(markdown.splitlines(), 1):
        for pattern, what in FORBIDDEN:
            found = pattern.search(line)
            if found:
                problems.append(f"line {number}: {what}: {found.group(0)!r}")
    if LESSON_PAGE.match(name):
        words = word_count(markdown)
        if words > WORD_BUDGET:
            problems.append(f"its main text is {words} words, over the budget of {WORD_BUDGET} (move "
                            "investigations into collapsed `??? note` blocks or the lesson's notes page)")
    return problems


# ------------------------------------------------------------------ the data
def load(source: str) -> dict:
    path = DATA / f"{source}.json"
    if not re.fullmatch(r"[a-z]+/[A-Za-z0-9_./-]+", source) or ".." in source or not path.is_file():
        raise LookupError(f"no data file site/data/{source}.json")
    return json.loads(path.read_text())


def provenance(data: dict) -> str:
    torch = f"torch {data['torch']}" if data.get("torch") else None
    parts = [data.get("gpu") or data.get("device"), torch, data.get("date")]  # plots name the GPU "device"
    where = ", ".join(p for p in parts if p)
    return f"{where}, by `{data['command']}`" if data.get("command") else where


def select(data: dict, selector: str) -> dict:
    if selector == "-":
        return data
    entries = next((data[key] for key in ENTRY_LISTS if isinstance(data.get(key), list)), None)
    if entries is None:
        raise LookupError(f"it has no list of entries ({', '.join(ENTRY_LISTS)}) to select {selector!r} from")
    if "=" in selector:
        wanted = dict(part.split("=", 1) for part in selector.split(" & "))
        wanted = {key.strip(): value.strip() for key, value in wanted.items()}
        found = [e for e in entries if all(str(e.get(key)) == value for key, value in wanted.items())]
    else:
        key = next((k for k in NAME_KEYS if any(k in e for e in entries)), "name")
        found = [e for e in entries if str(e.get(key)) == selector]
    if len(found) != 1:
        names = sorted({str(e.get(k)) for e in entries for k in NAME_KEYS[:1] + NAME_KEYS[1:2] if k in e})[:12]
        raise LookupError(f"selector {selector!r} matches {len(found)} entries, not 1 (some entries: {names})")
    return found[0]


def field(entry: dict, path: str):
    """entry[a][b][c] for "a.b.c"; where the rest of the path is itself a key, that key (Nsight Compute's metric
    names hold dots: "metrics.dram__bytes_read.sum" is entry["metrics"]["dram__bytes_read.sum"])."""
    value, keys = entry, path.split(".")
    while keys:
        rest = ".".join(keys)
        if isinstance(value, dict) and rest in value:
            return value[rest]
        if not isinstance(value, dict) or keys[0] not in value:
            raise LookupError(f"no field {path!r} (the entry has {sorted(entry)[:20]})")
        value = value[keys.pop(0)]
    return value


def figure(spec: str) -> tuple[str, dict]:
    """The text of one {{fig ...}} marker, and the data file it came from."""
    parts = [p.strip() for p in spec.split("|")]
    if len(parts) not in (3, 4):
        raise LookupError(f"{{{{fig {spec}}}}}: write {{{{fig SOURCE | SELECTOR | FIELD | FORMAT}}}}")
    data = load(parts[0])
    value = field(select(data, parts[1]), parts[2])
    if value is None:
        raise LookupError(f"field {parts[2]!r} is null")
    try:
        return (format(value, parts[3]) if len(parts) == 4 and parts[3] else str(value)), data
    except (ValueError, TypeError) as error:
        raise LookupError(f"format {parts[3]!r} does not apply to {value!r}: {error}") from None


def render_figures(markdown: str) -> tuple[str, list[str]]:
    problems: list[str] = []

    def replace(match: re.Match) -> str:
        try:
            text, data = figure(match.group(1))
        except LookupError as error:
            problems.append(f"figure {match.group(0)}: {error}")
            return "**(missing figure)**"
        title = html.escape(provenance(data).replace("`", "")).replace("|", "&#124;")  # a | would split a table row
        return f'<span class="figure" title="{title}">{html.escape(text)}</span>'

    return FIGURE.sub(replace, markdown), problems


def evidence_table(data: dict, name: str) -> str:
    columns = (data.get("table") or {}).get("columns")
    if not columns:
        raise LookupError(f"evidence/{name}.json has no table.columns to render")
    rows = ["| " + " | ".join(label for _, label, _ in columns) + " |",
            "|" + "|".join("---" if i == 0 else "---:" for i in range(len(columns))) + "|"]
    for row in data["rows"]:
        cells = []
        for key, _, spec in columns:
            value = row.get(key)
            cells.append("" if value is None else format(value, spec) if spec and not isinstance(value, str)
                         else str(value))
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows) + f"\n\n*Measured on {provenance(data)}.*\n"


def render_evidence(markdown: str) -> tuple[str, list[str]]:
    problems: list[str] = []

    def replace(match: re.Match) -> str:
        try:
            return evidence_table(load(f"evidence/{match.group(1)}"), match.group(1))
        except (LookupError, KeyError, ValueError, TypeError) as error:
            problems.append(f"evidence table {match.group(1)}: {error}")
            return "**(missing evidence table)**"

    return EVIDENCE_TABLE.sub(replace, markdown), problems


# ------------------------------------------------------------------ mkdocs
def on_page_markdown(markdown: str, page, config, files) -> str:
    src = page.file.src_uri
    problems = text_problems(src, page.file.content_string)  # the page as written, before any hook's markers
    markdown, found = render_evidence(markdown)
    problems += found
    markdown, found = render_figures(markdown)
    problems += found
    for problem in problems:
        log.warning(f"{src}: {problem}")
    return markdown


def main(paths: list[str]) -> int:
    bad = 0
    for path in map(Path, paths):
        name = path.resolve().relative_to(trees.LESSONS).as_posix() if path.resolve().is_relative_to(
            trees.LESSONS) else path.name
        text = path.read_text()
        problems = text_problems(name, text) + render_evidence(text)[1] + render_figures(text)[1]
        budget = f" (budget {WORD_BUDGET})" if LESSON_PAGE.match(name) else ""
        print(f"{name}: {word_count(text)} words of main text{budget}, {len(problems)} problem(s)")
        for problem in problems:
            print(f"  {problem}")
        bad += bool(problems)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or [str(p) for p in sorted(trees.LESSONS.glob("*.md"))]))
