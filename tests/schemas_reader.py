"""SCHEMAS.md as data: its sections, their tables, and checks of run-folder files against them.

The document's format (its "Conventions" section): one ``### `<path pattern>` `` heading per
artefact (or ``### `{Block}` `` per shared block), then bullets, then at most one table whose
first column holds the key or column name in backticks. A JSON table's columns are
``key | type | req | unit | meaning``, a CSV table's ``column | type | unit | meaning``.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_HEADING = re.compile(r"^### `([^`]+)`\s*$")
_NAME = re.compile(r"^`([^`]+)`$")
_VERSION = re.compile(r"\*\*Schema version:\*\*\s*`(\w+)`\s*=\s*(\d+)")
_BLOCK = re.compile(r"^\{(\w+)\}$")
_SCALARS = {"int", "float", "str", "bool", "null", "list", "dict"}
_CSV_TYPES = {"int", "float", "str", "empty"}
_INT_TEXT = re.compile(r"^-?\d+$")


class SchemaDocError(ValueError):
    """SCHEMAS.md does not follow its own conventions."""


def split_types(text: str) -> tuple[str, ...]:
    return tuple(t.strip() for t in text.replace("`", "").split(" or ") if t.strip())


def _inner(expr: str) -> str | None:
    """T of ``list[T]`` or ``dict[str, T]``; None for other expressions."""
    for head in ("list[", "dict[str, "):
        if expr.startswith(head) and expr.endswith("]"):
            return expr[len(head):-1]
    return None


def _valid_type(expr: str, blocks: set[str]) -> bool:
    inner = _inner(expr)
    if inner is not None:
        return _valid_type(inner, blocks)
    match = _BLOCK.match(expr)
    return expr in _SCALARS or expr == "{}" or (match is not None and match[1] in blocks)


def key_tokens(key: str) -> list[str]:
    """``a.b[].c`` -> ``["a", "b", "[]", "c"]``."""
    out: list[str] = []
    for part in key.split("."):
        if part.endswith("[]"):
            out += [part[:-2], "[]"]
        else:
            out.append(part)
    return out


@dataclass
class Node:
    """One documented key: its types, whether it is always written, and what lies under it."""

    types: tuple[str, ...] = ("dict",)
    required: bool = True
    children: dict[str, Node] = field(default_factory=dict)
    includes: list[str] = field(default_factory=list)  # blocks whose keys sit at this level


@dataclass
class Row:
    name: str
    types: tuple[str, ...]
    required: bool
    unit: str
    meaning: str


@dataclass
class Section:
    heading: str
    body: str
    kind: str | None = None  # "json", "csv" or None (no table: an opaque file)
    rows: list[Row] = field(default_factory=list)
    root: Node = field(default_factory=Node)

    @property
    def is_block(self) -> bool:
        return _BLOCK.match(self.heading) is not None

    @property
    def schema_version(self) -> tuple[str, int] | None:
        match = _VERSION.search(self.body)
        return (match[1], int(match[2])) if match else None

    @property
    def columns(self) -> list[str]:
        return [r.name for r in self.rows]

    def path_regex(self) -> re.Pattern[str]:
        parts = re.split(r"(<[^>]+>)", self.heading)
        out = "".join(
            (".+" if p == "<path>" else "[^/]+") if p.startswith("<") else re.escape(p)
            for p in parts
        )
        return re.compile(f"^{out}$")


def _table(lines: list[str]) -> tuple[list[str], list[list[str]]]:
    rows = [line.strip() for line in lines if line.strip().startswith("|")]
    if not rows:
        return [], []
    cells = [[c.strip() for c in r.strip("|").split("|")] for r in rows]
    return [c.lower() for c in cells[0]], cells[2:]


class Schemas:
    """Every section of SCHEMAS.md, by heading."""

    def __init__(self, text: str) -> None:
        self.sections: dict[str, Section] = {}
        current: list[str] | None = None
        heading = ""
        for line in [*text.splitlines(), "## end"]:
            match = _HEADING.match(line)
            if match or line.startswith("## ") or line.startswith("# "):
                if current is not None:
                    self._add(heading, current)
                current, heading = ([], match[1]) if match else (None, "")
            elif current is not None:
                current.append(line)
        blocks = {s.heading[1:-1] for s in self.sections.values() if s.is_block}
        for section in self.sections.values():
            self._build(section, blocks)

    @classmethod
    def read(cls, path: str | Path) -> Schemas:
        return cls(Path(path).read_text(encoding="utf-8"))

    def _add(self, heading: str, lines: list[str]) -> None:
        if heading in self.sections:
            raise SchemaDocError(f"SCHEMAS.md has two sections `{heading}`")
        section = Section(heading, "\n".join(lines))
        header, cells = _table(lines)
        if header:
            if header[0] not in ("key", "column") or "type" not in header:
                raise SchemaDocError(f"`{heading}`: table header {header} is not key|type|... "
                                     "or column|type|...")
            section.kind = "json" if header[0] == "key" else "csv"
            col = {name: i for i, name in enumerate(header)}
            for row in cells:
                if len(row) != len(header):
                    raise SchemaDocError(f"`{heading}`: row {row} has {len(row)} cells, the "
                                         f"header {len(header)}")
                name = _NAME.match(row[0])
                if name is None:
                    raise SchemaDocError(f"`{heading}`: first cell {row[0]!r} is not `name`")
                req = row[col["req"]] if "req" in col else "yes"
                if req not in ("yes", "no"):
                    raise SchemaDocError(f"`{heading}`.{name[1]}: req {req!r} is not yes/no")
                section.rows.append(Row(name[1], split_types(row[col["type"]]), req == "yes",
                                        row[col["unit"]] if "unit" in col else "",
                                        row[col["meaning"]] if "meaning" in col else ""))
        self.sections[heading] = section

    def _build(self, section: Section, blocks: set[str]) -> None:
        names = [r.name for r in section.rows]
        if len(set(names)) != len(names):
            raise SchemaDocError(f"`{section.heading}` documents a name twice")
        for row in section.rows:
            where = f"`{section.heading}`: `{row.name}`"
            if section.kind == "csv":
                if not row.types or set(row.types) - _CSV_TYPES:
                    raise SchemaDocError(f"{where} has CSV type {row.types}; use {_CSV_TYPES}")
                continue
            tokens = key_tokens(row.name)
            parent = section.root
            for token in tokens[:-1]:
                if token not in parent.children:
                    raise SchemaDocError(f"{where}: its parent is not documented above it")
                parent = parent.children[token]
            last = _BLOCK.match(tokens[-1])
            if last is not None:
                if last[1] not in blocks:
                    raise SchemaDocError(f"{where} includes an undefined block")
                parent.includes.append(last[1])
                continue
            bad = [t for t in row.types if not _valid_type(t, blocks)]
            if not row.types or bad:
                raise SchemaDocError(f"{where} has unknown type(s) {bad or row.types}")
            node = parent.children.setdefault(tokens[-1], Node())
            node.types, node.required = row.types, row.required
            if any(t.startswith("list[") for t in row.types):
                node.children.setdefault("[]", Node(types=()))

    # --- lookups ---------------------------------------------------------------------
    def artefacts(self) -> list[Section]:
        return [s for s in self.sections.values() if not s.is_block]

    def matching(self, relpath: str) -> list[Section]:
        return [s for s in self.artefacts() if s.path_regex().match(relpath)]

    def _fields(self, node: Node) -> dict[str, Node]:
        """The keys documented under `node`: its own, its included blocks', its block type's."""
        out = {k: v for k, v in node.children.items() if k != "[]"}
        names = list(node.includes)
        names += [m[1] for t in node.types if (m := _BLOCK.match(t))]
        for name in names:
            out.update(self._fields(self.sections["{" + name + "}"].root))
        return out

    def documents(self, heading: str, key: str) -> bool:
        """Whether `key` (dotted, ``[]`` for list items; a CSV column) is documented in section
        `heading`."""
        if self.sections[heading].kind == "csv":
            return key in self.sections[heading].columns
        node = self.sections[heading].root
        for token in key_tokens(key):
            if token == "[]":
                nxt = node.children.get("[]")
                inner = [_inner(t) for t in node.types if t.startswith("list[")]
                if nxt is None:
                    return False
                node = Node(types=tuple(i for i in inner if i), children=nxt.children)
                continue
            fields = self._fields(node)
            if token not in fields:
                return False
            node = fields[token]
        return True

    # --- checks ----------------------------------------------------------------------
    def check_json(self, heading: str, doc: Any) -> list[str]:
        """Everything in `doc` that disagrees with section `heading`, as messages."""
        errors: list[str] = []
        self._check_dict(doc, self.sections[heading].root, heading, errors)
        return errors

    def _check_dict(self, value: Any, node: Node, path: str, errors: list[str]) -> None:
        if not isinstance(value, dict):
            errors.append(f"{path}: {value!r} is not an object")
            return
        fields = self._fields(node)
        if not fields:
            return  # opaque
        for key in value:
            if key not in fields:
                errors.append(f"{path}.{key}: key not documented")
        for key, child in fields.items():
            if key in value:
                self._check_value(value[key], child, f"{path}.{key}", errors)
            elif child.required:
                errors.append(f"{path}.{key}: documented as always written, but absent")

    def _check_value(self, value: Any, node: Node, path: str, errors: list[str]) -> None:
        expr = _pick(value, node.types)
        if expr is None:
            errors.append(f"{path}: {value!r} is not {' or '.join(node.types)}")
        elif expr.startswith("list[") or expr == "list":
            item = node.children.get("[]", Node(types=()))
            inner = _inner(expr)
            for i, element in enumerate(value):
                if inner is not None:
                    sub = Node(types=(inner,), children=item.children)
                    self._check_value(element, sub, f"{path}[{i}]", errors)
        elif expr.startswith("dict[str, "):
            for key, element in value.items():
                self._check_value(element, Node(types=(_inner(expr),)), f"{path}.{key}", errors)
        elif expr == "dict" or _BLOCK.match(expr):
            inner_node = Node(types=(expr,), children=node.children, includes=node.includes)
            self._check_dict(value, inner_node, path, errors)

    def check_csv(self, heading: str, path: Path) -> list[str]:
        section = self.sections[heading]
        with path.open(newline="", encoding="utf-8") as handle:
            reader = csv.reader(handle)
            header = next(reader, [])
            if header != section.columns:
                return [f"{path.name}: header {header} is not the documented {section.columns}"]
            errors = []
            for line, cells in enumerate(reader, start=2):
                for row, cell in zip(section.rows, cells, strict=True):
                    if not any(_cell_is(cell, t) for t in row.types):
                        errors.append(f"{path.name} line {line}, {row.name}={cell!r}: "
                                      f"not {' or '.join(row.types)}")
            return errors


def _pick(value: Any, types: tuple[str, ...]) -> str | None:
    """The type expression among `types` that `value` has at its top level."""
    for expr in types:
        if expr == "null" and value is None:
            return expr
        if expr == "{}" and value == {}:
            return expr
    for expr in types:
        if isinstance(value, bool):
            if expr == "bool":
                return expr
        elif isinstance(value, int) and expr in ("int", "float"):
            return expr
        elif isinstance(value, float) and expr == "float":
            return expr
        elif isinstance(value, str) and expr == "str":
            return expr
        elif isinstance(value, list) and (expr == "list" or expr.startswith("list[")):
            return expr
        elif isinstance(value, dict) and (expr.startswith("dict") or _BLOCK.match(expr)):
            return expr
    return None


def _cell_is(cell: str, expr: str) -> bool:
    if expr == "empty":
        return cell == ""
    if expr == "str":
        return cell != ""
    if expr == "int":
        return _INT_TEXT.match(cell) is not None
    try:
        float(cell)
    except ValueError:
        return False
    return True
