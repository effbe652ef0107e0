"""The docs say what the code does: every shown command parses, every named variable is read,
every table of numbers names the command that produced it, the engine's options table shows the
code's defaults, and the console script runs. Each page is a reference, not a run log: at most
MAX_PAGE_LINES lines, no heading that dates a run (dated records live in results/), and every
relative link, into results/ or between pages, reaches a file and a heading that exist."""

from __future__ import annotations

import argparse
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from onnxrank.cli import build_parser
from onnxrank.engine.config import EngineConfig, option_names

REPOSITORY = Path(__file__).resolve().parents[2]
DOCS = sorted([REPOSITORY / "README.md", *(REPOSITORY / "docs").glob("*.md")])
FENCE = re.compile(r"^```")
INLINE_COMMAND = re.compile(r"`(onnxrank [^`]+)`")
ENV_VARIABLE = re.compile(r"\bONNXRANK_[A-Z0-9_]+\b")
TABLE_ROW = re.compile(r"^\s*\|.*\|\s*$")
# a measured value: 3.1×, 0.98, 12 ms, 45%, 28.2 MB (not a name such as int8 or fp32)
MEASURED = re.compile(r"(^|[\s(~≈<>≤≥*\[])[-+]?\d[\d,]*(\.\d+)?\s*(×|x\b|%|ms\b|s\b|MB|GB|MiB|GiB|"
                      r"TOP/s|TFLOP/s|pairs/s|$|[\s)*\]–-])")
# a table is sourced when a command, or a pointer to the run that produced it, is close by
SOURCE = re.compile(r"(^\s*|`)(onnxrank |python |pytest |bash |curl )|\bcommand\b|"
                    r"measured (by|with)", re.IGNORECASE)
SOURCE_WINDOW = 8
ENGINE_DOC = REPOSITORY / "docs" / "engine.md"
OPTIONS_HEADER = "| option | default | what it does / costs |"
OPTION_NAME = re.compile(r"`(\w+)`")
# How the options table writes a literal default: 8192, True/False, `"truncate"`, None. Any other
# cell is a phrase for a default resolved at load time, such as "manifest (512)" for None.
QUOTED_DEFAULT = re.compile(r'`"([^"`]*)"`')
RESULTS = REPOSITORY / "results"
MAX_PAGE_LINES = 600
HEADING = re.compile(r"^#{1,6}\s+(.*)$")
# a heading that dates a run: 2026-11-27, a run id (r4g, full-r4, decoder-2, sweeps-r2), a round
# or a session, or "first runs": those belong in results/, with their date and command
RUN_LOG_HEADING = re.compile(
    r"\b\d{4}-\d{2}-\d{2}\b|\br\d+[a-z]?\b|\b(full|decoder|families|serving|sweeps)-r?\d+[a-z]?\b|"
    r"\bround \d+\b|\bsession\b|\bfirst runs?\b", re.IGNORECASE)
LINK = re.compile(r"\]\(([^)\s]+)\)")


def command_lines(text: str) -> list[tuple[int, str]]:
    """(line number, command) for each `onnxrank ...` command in code blocks and inline code."""
    commands: list[tuple[int, str]] = []
    in_block = False
    pending = ""
    start = 0
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line.strip()):
            in_block = not in_block
            continue
        if in_block:
            stripped = line.split(" #")[0].strip()
            if pending:
                pending += " " + stripped
            elif stripped == "onnxrank" or (stripped.startswith("onnxrank ")
                                            and not stripped.split()[1].endswith(":")):
                pending, start = stripped, number
            else:
                continue
            if pending.endswith("\\"):
                pending = pending[:-1].strip()
                continue
            commands.append((start, pending))
            pending = ""
            continue
        # `onnxrank export: error: ...` quotes a message, not a command
        commands.extend((number, match) for match in INLINE_COMMAND.findall(line)
                        if not match.split()[1].endswith(":"))
    return commands


def all_commands() -> list[tuple[str, int, str]]:
    return [(path.relative_to(REPOSITORY).as_posix(), number, command)
            for path in DOCS for number, command in command_lines(path.read_text("utf-8"))]


def env_twins(parser: argparse.ArgumentParser) -> set[str]:
    """Every ONNXRANK_* name the parser's help texts announce."""
    names: set[str] = set()
    stack = [parser]
    while stack:
        current = stack.pop()
        for action in current._actions:
            names.update(ENV_VARIABLE.findall(action.help or ""))
            if isinstance(action, argparse._SubParsersAction):
                stack.extend(action.choices.values())
    return names


@pytest.mark.parametrize(("doc", "line", "command"), all_commands())
def test_documented_command_parses(doc: str, line: int, command: str,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # a documented command must not depend on the reader's environment
    for name in [name for name in __import__("os").environ if name.startswith("ONNXRANK_")]:
        monkeypatch.delenv(name)
    try:
        argv = shlex.split(command)[1:]
    except ValueError as err:
        pytest.fail(f"{doc}:{line}: `{command}` is not a shell command line: {err}")
    if "|" in argv:  # a pipe into another program: only the onnxrank part is ours
        argv = argv[: argv.index("|")]
    parser = build_parser()
    try:
        parser.parse_args(argv)
    except SystemExit as exit_:
        assert exit_.code == 0, f"{doc}:{line}: `{command}` does not parse (exit {exit_.code})"


def test_docs_name_only_variables_the_code_reads() -> None:
    announced = env_twins(build_parser())
    source = "\n".join(path.read_text("utf-8") for path in (REPOSITORY / "onnxrank").rglob("*.py"))
    unknown = []
    for path in DOCS:
        for number, line in enumerate(path.read_text("utf-8").splitlines(), 1):
            for name in ENV_VARIABLE.findall(line):
                if name not in announced and name not in source:
                    unknown.append(f"{path.relative_to(REPOSITORY)}:{number}: {name}")
    assert not unknown, "docs name environment variables no code reads:\n" + "\n".join(unknown)


def numeric_tables(text: str) -> list[tuple[int, int]]:
    """(first line, last line) of each markdown table with a number in a body cell."""
    lines = text.splitlines()
    tables, start = [], None
    for index, line in enumerate([*lines, ""]):
        if TABLE_ROW.match(line):
            start = index if start is None else start
            continue
        if start is not None:
            body = lines[start + 2:index]
            if any(MEASURED.search(cell.strip()) for row in body for cell in row.split("|")[2:]):
                tables.append((start, index - 1))
            start = None
    return tables


def test_every_table_of_numbers_names_its_source() -> None:
    unsourced = []
    for path in DOCS:
        lines = path.read_text("utf-8").splitlines()
        for first, last in numeric_tables("\n".join(lines)):
            window = lines[max(0, first - SOURCE_WINDOW):first] + lines[last + 1:last + 4]
            if not any(SOURCE.search(line) for line in window):
                unsourced.append(f"{path.relative_to(REPOSITORY)}:{first + 1}")
    assert not unsourced, (
        "tables of numbers with no command or source within "
        f"{SOURCE_WINDOW} lines above or 3 below:\n" + "\n".join(unsourced))


def documented_default(cell: str) -> tuple[bool, object]:
    """(True, value) for a literal default cell of the options table, else (False, cell)."""
    if re.fullmatch(r"\d+", cell):
        return True, int(cell)
    if cell in ("True", "False", "None"):
        return True, {"True": True, "False": False, "None": None}[cell]
    quoted = QUOTED_DEFAULT.fullmatch(cell)
    return (True, quoted.group(1)) if quoted else (False, cell)


def option_default_errors(lines: list[str]) -> list[str]:
    """Rows of the options table whose EngineConfig fields do not show the code's defaults.

    A row names its options in backticks in the first cell (`window_tokens`, `window_overlap_tokens`)
    and their defaults, comma-separated in the same order, in the second. Rows that name no
    EngineConfig field (rerank arguments such as `deadline_ms`) are not checked.
    """
    if OPTIONS_HEADER not in lines:
        return [f"no options table (header {OPTIONS_HEADER!r})"]
    fields, defaults = set(option_names()), EngineConfig()
    errors = []
    start = lines.index(OPTIONS_HEADER) + 2  # past the header and the |---| line
    for number, line in enumerate(lines[start:], start + 1):
        if not TABLE_ROW.match(line):
            break
        option, default = (cell.strip() for cell in line.strip().strip("|").split("|")[:2])
        names, cells = OPTION_NAME.findall(option), [cell.strip() for cell in default.split(",")]
        if not fields & set(names):
            continue
        if not set(names) <= fields or len(names) != len(cells):
            errors.append(f"line {number}: options {names} and defaults {cells} do not pair up "
                          "(EngineConfig fields only, one default each)")
            continue
        for name, cell in zip(names, cells, strict=True):
            code = getattr(defaults, name)
            literal, value = documented_default(cell)
            if literal and (value != code or type(value) is not type(code)) or (
                    not literal and code is not None):
                errors.append(f"line {number}: {name}: the doc says {cell}, "
                              f"EngineConfig's default is {code!r}")
    return errors


def test_engine_options_table_shows_the_code_defaults() -> None:
    errors = option_default_errors(ENGINE_DOC.read_text("utf-8").splitlines())
    assert not errors, "docs/engine.md options table:\n" + "\n".join(errors)


def test_the_defaults_checker_catches_what_it_is_for() -> None:
    table = [OPTIONS_HEADER, "| --- | --- | --- |",
             "| `max_batch_tokens` | 4096 | padded tokens |",
             "| `sort_by_length` | 1 | sort rows |",
             "| `long_documents` | `\"truncate\"` | first window |",
             "| `max_length` | manifest (512) | tokens per row |",
             "| `window_tokens`, `window_overlap_tokens` | fill the row | windows |",
             "| `cache_size` | the manifest's | LRU |",
             "| `deadline_ms` (rerank) | None | not a field |"]
    assert option_default_errors(table) == [
        "line 3: max_batch_tokens: the doc says 4096, EngineConfig's default is 8192",
        "line 4: sort_by_length: the doc says 1, EngineConfig's default is True",
        "line 7: options ['window_tokens', 'window_overlap_tokens'] and defaults ['fill the row'] "
        "do not pair up (EngineConfig fields only, one default each)",
        "line 8: cache_size: the doc says the manifest's, EngineConfig's default is 0",
    ]


def test_the_checker_catches_what_it_is_for() -> None:
    """Lines like the two the docs once had (an unknown flag, an invalid value) fail to parse."""
    parser = build_parser()
    for argv in (["query", "x", "--index", "i", "--max-batch-tokenz", "8"],
                 ["bench", "--scenarios", "everything"]):
        with pytest.raises(SystemExit) as exit_:
            parser.parse_args(argv)
        assert exit_.value.code == 2


def test_console_script_runs() -> None:
    script = shutil.which("onnxrank") or str(Path(sys.executable).parent / "onnxrank")
    result = subprocess.run([script, "--help"], capture_output=True, text=True, timeout=120,
                            check=False)
    assert result.returncode == 0, result.stderr
    for command in ("export", "index", "query", "eval", "bench", "serve", "score", "diagnose"):
        assert f"    {command}" in result.stdout, f"`{command}` missing from onnxrank --help"
    result = subprocess.run([script, "query"], capture_output=True, text=True, timeout=120,
                            check=False)
    assert result.returncode == 2 and "the following arguments are required" in result.stderr


def test_every_page_is_at_most_600_lines() -> None:
    long = [f"{path.relative_to(REPOSITORY)}: {count} lines"
            for path in DOCS if (count := len(path.read_text("utf-8").splitlines())) > MAX_PAGE_LINES]
    assert not long, (f"pages over {MAX_PAGE_LINES} lines (move run records to results/, or split "
                      "the page):\n" + "\n".join(long))


def headings(text: str) -> list[tuple[int, str]]:
    """(line number, text) of each markdown heading outside code blocks."""
    found: list[tuple[int, str]] = []
    in_block = False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line.strip()):
            in_block = not in_block
        elif not in_block and (match := HEADING.match(line)):
            found.append((number, match.group(1)))
    return found


def run_log_headings(text: str) -> list[str]:
    return [f"line {number}: {heading}" for number, heading in headings(text)
            if RUN_LOG_HEADING.search(heading)]


def test_no_heading_is_a_dated_run_log() -> None:
    dated = [f"{path.relative_to(REPOSITORY)}: {found}"
             for path in DOCS for found in run_log_headings(path.read_text("utf-8"))]
    assert not dated, ("headings that date a run (a page keeps the current numbers; a run's "
                       "record goes to results/):\n" + "\n".join(dated))


def test_the_run_log_checker_catches_what_it_is_for() -> None:
    text = "\n".join(["# Benchmarks", "## Results", "### avx512_vnni_bf16", "### 2026-11-27",
                      "### Results, round 3", "### full-r4 on the slower EPYC", "## r4g",
                      "## Session 12", "### First runs", "```bash", "# 2026-11-27: a comment",
                      "```", "### Qwen3-0.6B on a 2-core CPU", "### `POST /v2/rerank`"])
    assert run_log_headings(text) == [
        "line 4: 2026-11-27", "line 5: Results, round 3", "line 6: full-r4 on the slower EPYC",
        "line 7: r4g", "line 8: Session 12", "line 9: First runs"]


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but - and _ dropped, spaces to -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_relative_link_reaches_a_page_and_a_heading() -> None:
    pages = [*DOCS, *sorted(RESULTS.glob("*.md"))]
    broken: list[str] = []
    for path in pages:
        in_block = False
        for number, line in enumerate(path.read_text("utf-8").splitlines(), 1):
            if FENCE.match(line.strip()):
                in_block = not in_block
                continue
            for target in [] if in_block else LINK.findall(line):
                if target.startswith(("http://", "https://", "mailto:")):
                    continue
                file, _, fragment = target.partition("#")
                destination = (path.parent / file).resolve() if file else path
                if not destination.exists():
                    broken.append(f"{path.relative_to(REPOSITORY)}:{number}: {target}: no such file")
                elif fragment and destination.suffix == ".md" and fragment not in {
                        anchor(heading) for _, heading in headings(destination.read_text("utf-8"))}:
                    broken.append(f"{path.relative_to(REPOSITORY)}:{number}: {target}: no such heading")
    assert not broken, "links that lead nowhere:\n" + "\n".join(broken)


def test_results_hold_the_run_records_the_docs_point_to() -> None:
    linked = {match for path in DOCS
              for match in re.findall(r"results/([\w-]+\.md)", path.read_text("utf-8"))}
    assert (RESULTS / "README.md").is_file(), "results/README.md says what the records are"
    assert linked, "the docs link their older runs in results/"
    assert all((RESULTS / name).is_file() for name in linked), linked

