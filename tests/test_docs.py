"""The documentation holds: README.md's links into docs/ land on a page and a heading (mkdocs
checks the pages' own links, but does not build the root README), and the configuration
reference names every key the settings define."""

import re
import types
import typing
import unicodedata
from pathlib import Path

import msgspec

from herder.core.settings.fields import DURATION
from herder.core.settings.sections import Settings

ROOT = Path(__file__).resolve().parent.parent
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")  # images too
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def slug(heading: str) -> str:
    """The anchor mkdocs (Python-Markdown's toc) gives a heading."""
    text = re.sub(r"`([^`]*)`", r"\1", heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+?)\s*#*$", text, re.M)}


def links(page: Path) -> list[str]:
    return LINK.findall(FENCE.sub("", page.read_text()))


def test_the_slug_matches_mkdocs_for_code_and_punctuation() -> None:
    assert slug("Local hosts under `herder server`") == "local-hosts-under-herder-server"
    assert slug("Running jobs as another user: `[runtime] run_as`") == (
        "running-jobs-as-another-user-runtime-run_as")
    assert slug("Job types (`herder.toml`)") == "job-types-herdertoml"


def test_every_readme_link_resolves_to_a_file_and_heading() -> None:
    readme = ROOT / "README.md"
    relative = [t for t in links(readme) if not re.match(r"[a-z]+:", t)]
    assert any(t.startswith("docs/") for t in relative), "the README links into docs/"
    broken = []
    for target in relative:
        path, _, anchor = target.partition("#")
        page = (readme.parent / path) if path else readme
        if not page.exists():
            broken.append(f"{target}: no such file")
        elif anchor and anchor not in anchors(page):
            broken.append(f"{target}: no heading with that anchor in {path or 'README.md'}")
    assert not broken, broken


def test_every_page_in_docs_is_in_the_site_navigation() -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert pages and {p for p in pages if p not in nav} == set()


def _struct(annotation: typing.Any) -> tuple[type[msgspec.Struct] | None, str]:
    """The settings section a field holds: itself, a table of them by name, or a list."""
    origin = typing.get_origin(annotation)
    arguments = typing.get_args(annotation)
    if origin is typing.Annotated:
        return _struct(arguments[0])
    if isinstance(annotation, type) and issubclass(annotation, msgspec.Struct):
        return annotation, ""
    if origin is dict:
        inner, kind = _struct(arguments[1])
        return inner, ".NAME" + kind
    if origin is list:
        inner, kind = _struct(arguments[0])
        return inner, "[]" + kind
    if origin in (typing.Union, types.UnionType):
        for argument in arguments:
            inner, kind = _struct(argument)
            if inner is not None:
                return inner, kind
    return None, ""


def _is_duration(annotation: typing.Any) -> bool:
    if typing.get_origin(annotation) is typing.Annotated:
        return DURATION in typing.get_args(annotation)[1:]
    return any(_is_duration(argument) for argument in typing.get_args(annotation))


def _shown(field: msgspec.structs.FieldInfo, annotation: typing.Any) -> str | None:
    """How the reference shows a plain default (None for lists and tables: not compared)."""
    value = field.default
    if value is msgspec.NODEFAULT:
        return "required" if field.default_factory is msgspec.NODEFAULT else None
    if value is None:
        return "(not set)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, int | float) and _is_duration(annotation):
        seconds = float(value)
        unit, size = next(((u, s) for u, s in (("h", 3600), ("m", 60), ("s", 1))
                           if seconds >= s and seconds % s == 0), ("s", 1))
        return f'"{seconds / size:g}{unit}"'
    if isinstance(value, int | float):
        return repr(value)
    return None


def _keys(section: type[msgspec.Struct], name: str) -> list[tuple[str, str, str | None]]:
    hints = typing.get_type_hints(section, include_extras=True)
    found: list[tuple[str, str, str | None]] = []
    for field in msgspec.structs.fields(section):
        inner, kind = _struct(hints[field.name])
        if inner is None:
            found.append((name, field.name, _shown(field, hints[field.name])))
        else:
            path = f"{name}.{field.name}{kind}".lstrip(".")
            found += _keys(inner, path.replace("[]", "") + ("[]" if path.endswith("[]") else ""))
    return found


def test_the_configuration_reference_lists_every_key_with_its_default() -> None:
    page = (ROOT / "docs" / "configuration.md").read_text()
    sections = {m.group(1): m.group(2) for m in re.finditer(
        r"^## `\[+([^\]]+)\]+`\n(.*?)(?=^## |\Z)", page, re.S | re.M)}
    wrong = []
    for section, key, default in _keys(Settings, ""):
        if section == "":  # a top-level table of plain values: [weights]
            if key not in sections:
                wrong.append(f"[{key}]: no section")
            continue
        heading = section.removesuffix("[]")
        row = f"| `{key}` | `{default}` |" if default is not None else f"| `{key}` |"
        if row not in sections.get(heading, ""):
            wrong.append(f"[{heading}] {key}: no row {row!r}")
    assert not wrong, f"docs/configuration.md: {wrong}"
