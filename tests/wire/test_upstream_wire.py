"""Our protos against spec/upstream-wire.md, the wire table read from Danube 0.15.1.

The spec's code blocks are parsed into the same flat form the `our_wire` fixture builds from
protoc's FileDescriptorSet, and the two must be equal for the three upstream packages: nothing
missing, nothing different, nothing extra. The parser rejects any line it does not understand,
because a lenient parser would let a mistyped or newly added upstream line pass unchecked.
"""

from __future__ import annotations

import pathlib
import re
from typing import Any

import pytest

SPEC = pathlib.Path(__file__).parent.parent.parent / "spec" / "upstream-wire.md"
PACKAGES = {"danube", "danube_admin", "danube_schema"}
SCALARS = {
    "double",
    "float",
    "int32",
    "int64",
    "uint32",
    "uint64",
    "sint32",
    "sint64",
    "fixed32",
    "fixed64",
    "sfixed32",
    "sfixed64",
    "bool",
    "string",
    "bytes",
}

SECTION = re.compile(r"^## (?P<file>\w+\.proto) — package `(?P<package>\w+)`$")
SERVICE = re.compile(r"^service (?P<name>[\w.]+)$")
RPC = re.compile(
    r"^  rpc (?P<name>\w+)\((?P<client_stream>stream )?(?P<input>[\w.]+)\)"
    r" returns \((?P<server_stream>stream )?(?P<output>[\w.]+)\)$"
)
MESSAGE = re.compile(r"^message (?P<name>\w+)$")
FIELD = re.compile(
    r"^ +(?P<number>\d+) (?:(?P<label>repeated|optional) )?(?P<type>[\w.]+) (?P<name>\w+)"
    r"(?: \(oneof (?P<oneof>\w+)\))?$"
)
ENUM = re.compile(r"^(?P<nested>  )?enum (?P<name>\w+): (?P<values>\w+=\d+(?:, \w+=\d+)*)$")
MAP_ENTRY = re.compile(r"^  map entry (?P<name>[\w.]+): key (?P<key>\w+), value (?P<value>\w+)$")

Entry = dict[str, Any]


class SpecParseError(Exception):
    """The spec has a line or reference this parser cannot account for."""


def _field(number: int, type_: str, label: str = "LABEL_OPTIONAL", optional: bool = False) -> Entry:
    """A field whose `type` is still the spec's spelling; _resolve_types turns it into protoc's."""
    return {
        "kind": "field",
        "number": number,
        "type": type_,
        "type_name": "",
        "label": label,
        "proto3_optional": optional,
        "oneof": None,
    }


def parse_spec(text: str) -> dict[str, Entry]:
    """Turns the spec's code blocks into `{full name: entry}`, the shape of `flatten`'s output.

    Only lines inside ``` blocks carry data, and every such block must sit under a
    `## File.proto — package \\`pkg\\`` heading, because that heading supplies the package.
    """
    out: dict[str, Entry] = {}
    problems: list[str] = []
    section: tuple[str, str] | None = None
    in_block = False
    service: str | None = None
    message: str | None = None

    def add(name: str, entry: Entry, lineno: int) -> None:
        if name in out:
            problems.append(f"line {lineno}: {name} defined twice")
        out[name] = entry

    for lineno, line in enumerate(text.splitlines(), start=1):
        if line.startswith("```"):
            in_block = not in_block
            service = message = None
            if in_block and section is None:
                problems.append(f"line {lineno}: code block outside a `## X.proto` section")
            continue
        if not in_block:
            if line.startswith("## "):
                heading = SECTION.match(line)
                section = (heading["file"], heading["package"]) if heading else None
                if heading:
                    add(heading["file"], {"kind": "file", "package": heading["package"]}, lineno)
            continue
        if not line.strip() or section is None:
            continue
        package = section[1]

        if m := SERVICE.match(line):
            service, message = m["name"], None
            if not service.startswith(f"{package}."):
                problems.append(f"line {lineno}: service {service} outside package {package}")
            add(service, {"kind": "service"}, lineno)
        elif (m := RPC.match(line)) and service is not None:
            add(
                f"{service}.{m['name']}",
                {
                    "kind": "method",
                    "input_type": m["input"],
                    "output_type": m["output"],
                    "client_streaming": m["client_stream"] is not None,
                    "server_streaming": m["server_stream"] is not None,
                },
                lineno,
            )
        elif m := MESSAGE.match(line):
            message, service = f"{package}.{m['name']}", None
            add(message, {"kind": "message", "map_entry": False}, lineno)
        elif (m := FIELD.match(line)) and message is not None:
            label = "LABEL_REPEATED" if m["label"] == "repeated" else "LABEL_OPTIONAL"
            field = _field(int(m["number"]), m["type"], label, m["label"] == "optional")
            field["oneof"] = m["oneof"]
            add(f"{message}.{m['name']}", field, lineno)
        elif (m := ENUM.match(line)) and (message is not None or not m["nested"]):
            if not m["nested"]:
                message = service = None
            enum = f"{message if m['nested'] else package}.{m['name']}"
            add(enum, {"kind": "enum"}, lineno)
            for pair in m["values"].split(", "):
                value, number = pair.split("=")
                add(f"{enum}.{value}", {"kind": "enum_value", "number": int(number)}, lineno)
        elif (m := MAP_ENTRY.match(line)) and message is not None:
            entry = f"{package}.{m['name']}"
            if not entry.startswith(f"{message}."):
                problems.append(f"line {lineno}: map entry {entry} is not nested in {message}")
            add(entry, {"kind": "message", "map_entry": True}, lineno)
            add(f"{entry}.key", _field(1, m["key"]), lineno)
            add(f"{entry}.value", _field(2, m["value"]), lineno)
        else:
            problems.append(f"line {lineno}: cannot parse {line!r}")

    if in_block:
        problems.append("unterminated code block")
    problems += _resolve_types(out)
    if problems:
        raise SpecParseError("\n".join(problems))
    return out


def _resolve_types(out: dict[str, Entry]) -> list[str]:
    """The spec writes message and enum types alike as full names; which one a name is follows
    from the definitions in the spec, and a name defined nowhere is an error."""
    problems = []
    for name, entry in out.items():
        if entry["kind"] == "method":
            for key in ("input_type", "output_type"):
                if out.get(entry[key], {}).get("kind") != "message":
                    problems.append(f"{name}: {key} {entry[key]} is not a message in the spec")
        if entry["kind"] != "field":
            continue
        spelled = entry["type"]
        target = out.get(spelled, {}).get("kind")
        if spelled in SCALARS:
            entry["type"] = f"TYPE_{spelled.upper()}"
        elif target in ("message", "enum"):
            entry["type"] = f"TYPE_{target.upper()}"
            entry["type_name"] = spelled
        else:
            problems.append(f"{name}: type {spelled} is neither a scalar nor defined in the spec")
    return problems


def _in_upstream_packages(name: str, entry: Entry) -> bool:
    package = entry["package"] if entry["kind"] == "file" else name.split(".", 1)[0]
    return package in PACKAGES


def test_spec_parses_completely() -> None:
    upstream = parse_spec(SPEC.read_text())
    files = {e["package"] for e in upstream.values() if e["kind"] == "file"}
    assert files == PACKAGES
    kinds = {e["kind"] for e in upstream.values()}
    assert kinds == {"file", "service", "method", "message", "field", "enum", "enum_value"}


def test_parser_rejects_unknown_lines() -> None:
    spec = "## A.proto — package `a`\n```\nmessage M\n    1 uint64 id\n    two string x\n```\n"
    with pytest.raises(SpecParseError, match="cannot parse"):
        parse_spec(spec)


def test_parser_rejects_undefined_types() -> None:
    spec = "## A.proto — package `a`\n```\nmessage M\n    1 a.Missing thing\n```\n"
    with pytest.raises(SpecParseError, match="neither a scalar nor defined"):
        parse_spec(spec)


def test_our_protos_match_upstream_exactly(our_wire: dict[str, Entry]) -> None:
    upstream = parse_spec(SPEC.read_text())
    ours = {name: e for name, e in our_wire.items() if _in_upstream_packages(name, e)}

    problems = [f"missing in ours: {n} {upstream[n]}" for n in sorted(upstream.keys() - ours)]
    problems += [f"not upstream: {n} {ours[n]}" for n in sorted(ours.keys() - upstream)]
    problems += [
        f"{n}:\n  upstream {upstream[n]}\n  ours     {ours[n]}"
        for n in sorted(upstream.keys() & ours.keys())
        if upstream[n] != ours[n]
    ]
    assert not problems, "proto/ differs from spec/upstream-wire.md:\n" + "\n".join(problems)
