"""Tools: what a tool is, how its input schema is compiled, and how arguments are checked.

A bad tool is refused when the driver is built, not when a run first needs it.
Schemas compile as JSON Schema 2020-12 (unless they name another known
dialect) with no loader: a ``$ref`` to a file or URL is refused, because a
schema that fetches at run time is not the one that was reviewed.
"""

from __future__ import annotations

import functools
import json
import re
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from fractions import Fraction
from typing import Any, Protocol, runtime_checkable

import jsonschema
import orjson
import referencing
import referencing.exceptions
import referencing.jsonschema
from jsonschema.exceptions import ValidationError, best_match
from referencing._core import Resolver

from agentrt.canonical import check_json, keys_and_floats
from agentrt.driver.cancel import CancelToken
from agentrt.driver.checks import check_callable, check_method, check_text, wait_duration
from agentrt.driver.errors import ConfigError
from agentrt.errors import described, exception_text, raised_text
from agentrt.records import SideEffect, ToolSpec

__all__ = [
    "FuncTool",
    "RegisteredTool",
    "Tool",
    "ToolCall",
    "ToolResult",
    "check_args",
    "compile_schema",
    "register_tools",
]

_SIDE_EFFECTS = frozenset(s.value for s in SideEffect)
_MAX_NUMBER = 10_000


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One invocation: the run and step it belongs to, the agent's argument bytes,
    and a token cancelled at the tool's timeout or when the caller cancels."""

    run_id: str
    step_id: str
    args: bytes
    cancel: CancelToken


@dataclass(frozen=True, slots=True)
class ToolResult:
    """What a tool produced: JSON content (``{}`` when empty) and a one-line summary."""

    content: bytes | str | None = None
    summary: str = ""


@runtime_checkable
class Tool(Protocol):
    """A capability the agent may ask for. ``spec`` is read at every step."""

    def spec(self) -> ToolSpec: ...

    def call(self, call: ToolCall) -> ToolResult | bytes | str | None: ...


_NOT_UTF8 = "the spec would be stored with U+FFFD in its place"


def _schema_bytes(where: str, v: object) -> bytes:
    if isinstance(v, bytes):
        return v
    if isinstance(v, str):
        check_text(f"{where}: input_schema", v, utf8=_NOT_UTF8)
        return v.encode("utf-8")
    raise ConfigError(f"{where}: input_schema is {described(v)}, not JSON as bytes or str "
                      "(encode a dict with json.dumps)")


def _timeout(where: str, v: object) -> timedelta:
    timeout = wait_duration(f"{where}: timeout", v)
    if timeout <= timedelta(0):
        raise ConfigError(f"{where}: timeout is required")
    return timeout


class FuncTool:
    """A tool made of a spec and a function ``fn(call) -> ToolResult | bytes | str | None``.

    Raise :class:`~agentrt.driver.errors.ToolError` for an expected failure and
    :class:`~agentrt.driver.errors.AbortRun` to end the run.
    """

    __slots__ = ("_fn", "_spec")

    def __init__(
        self,
        name: str,
        fn: Callable[[ToolCall], ToolResult | bytes | str | None],
        *,
        description: str = "",
        input_schema: bytes | str = b'{"type":"object"}',
        side_effect: str = SideEffect.READ_ONLY.value,
        timeout: timedelta | float = timedelta(seconds=30),
        terminal: bool = False,
    ) -> None:
        check_text("FuncTool name", name, utf8=_NOT_UTF8)
        where = f'tool "{name}"'
        check_callable(f"{where}: fn", fn, "a function fn(call)")
        check_text(f"{where}: description", description, utf8=_NOT_UTF8)
        check_text(f"{where}: side_effect", side_effect)
        if not isinstance(terminal, bool):
            raise ConfigError(f"{where}: terminal is {described(terminal)}, not a bool")
        self._fn = fn
        self._spec = ToolSpec(
            name=name,
            description=description,
            input_schema=_schema_bytes(where, input_schema),
            side_effect=str(side_effect),
            timeout=_timeout(where, timeout),
            terminal=terminal,
        )

    def spec(self) -> ToolSpec:
        s = self._spec
        return ToolSpec(s.name, s.description, s.input_schema, s.side_effect, s.timeout,
                        s.terminal)

    def call(self, call: ToolCall) -> ToolResult | bytes | str | None:
        return self._fn(call)

    def __repr__(self) -> str:
        return f"FuncTool({self._spec.name!r}, {self._spec.side_effect})"


# -- schemas -------------------------------------------------------------------


def _number_problem(text: str) -> str | None:
    if len(text) > _MAX_NUMBER:
        return f"number {text[:24]}... is longer than {_MAX_NUMBER} characters"
    m = re.search(r"[eE][+-]?0*(\d+)\Z", text)
    if m is not None and (len(m.group(1)) > 5 or int(m.group(1)) > _MAX_NUMBER):
        shown = text if len(text) <= 24 else text[:24] + "..."
        return f"number {shown} has an exponent beyond ±{_MAX_NUMBER}"
    return None


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")  # json.loads takes NaN and Infinity


def _decode_schema(data: bytes) -> Any:
    """Parse a schema, holding it to the depth and number bounds (duplicates: last wins)."""
    problem = check_json(data)
    if problem is not None and problem.startswith("nested deeper"):
        raise ValueError(f"input schema is {problem}")
    found: list[str] = []

    def number(text: str) -> Any:
        p = _number_problem(text)
        if p is not None and not found:
            found.append(p)
        try:
            return Decimal(text) if any(c in text for c in ".eE") else int(text)
        except ValueError:  # past Python's 4,300-digit bound (docs/compatibility.md)
            if not found:
                found.append(f"number {text[:24]}... of {len(text)} digits, more than "
                             "Python converts (4300)")
            return 0

    try:
        # UTF-8 only: given bytes, json.loads would guess UTF-16 or -32 as well.
        value = json.loads(data.decode("utf-8"), parse_int=number, parse_float=number,
                           parse_constant=_not_json)
    except (ValueError, RecursionError) as exc:
        raise ValueError("input schema is not valid JSON") from exc
    if found:
        raise ValueError(f"input schema holds a {found[0]}")
    return value


# -- patterns as ECMA-262 reads them ---------------------------------------------
#
# JSON Schema's patterns are ECMA-262 regular expressions (as RE2's are, on these
# points); Python's differ where a pattern most often relies on them: "$" also
# matches before a final newline, and \d, \w, \b take in every Unicode digit or
# letter. A pattern is translated for those before Python compiles it.

_WORD = "A-Za-z0-9_"
_IS_WORD, _NOT_WORD = f"(?<=[{_WORD}])", f"(?<![{_WORD}])"
_OUTSIDE_CLASS = {
    "d": "[0-9]", "D": "[^0-9]", "w": f"[{_WORD}]", "W": f"[^{_WORD}]",
    "b": f"(?:{_IS_WORD}(?![{_WORD}])|{_NOT_WORD}(?=[{_WORD}]))",
    "B": f"(?:{_IS_WORD}(?=[{_WORD}])|{_NOT_WORD}(?![{_WORD}]))",
}
#: Inside a class a negated set is written as the ranges it leaves (\b stays a backspace).
_INSIDE_CLASS = {
    "d": "0-9", "D": "\\x00-/:-\\U0010ffff", "w": _WORD,
    "W": "\\x00-/:-@\\[-^`{-\\U0010ffff",
}


def _ecma(pattern: str) -> str:
    """``pattern`` rewritten so that Python reads ``$``, ``\\d``, ``\\w``, ``\\b``
    (and their negations) as ECMA-262 does. In a class, a ``-`` is a range
    only between two single characters (a literal one is written escaped); a
    range to or from a set (``[#-\\d]``, ``[\\w-a]``) is refused, as ECMA-262
    and RE2 refuse it: written as ranges it would take in other characters."""
    out: list[str] = []
    i, n, in_class = 0, len(pattern), False
    last = ""  # in a class: "start", "char" (may begin a range), "set" or "range"
    ranging = False  # a "-" after a single character: the next item ends a range
    while i < n:
        c = pattern[i]
        i += 1
        if c == "\\" and i < n:
            e = pattern[i]
            i += 1
            if not in_class:
                out.append(_OUTSIDE_CLASS.get(e, c + e))
                continue
            is_set = e in _INSIDE_CLASS
            if is_set and (ranging or (pattern.startswith("-", i)
                                       and not pattern.startswith("-]", i))):
                raise re.error(f"a range to or from \\{e} in a class")
            out.append(_INSIDE_CLASS.get(e, c + e))
            last = "set" if is_set else ("range" if ranging else "char")
            ranging = False
            continue
        if in_class:
            if c == "]":
                in_class = False
            elif ranging:  # this character ends the range
                c = "\\-" if c == "-" else c
                last, ranging = "range", False
            elif c == "-" and last == "char" and not pattern.startswith("]", i):
                ranging = True
            else:
                c = "\\-" if c == "-" else c  # a literal hyphen, said so to Python
                last = "char"
        elif c == "[":
            in_class, last, ranging = True, "start", False
            # Python reads a "]" first in a class (after any "^") as a literal.
            if pattern.startswith("^", i):
                c, i = c + "^", i + 1
            if pattern.startswith("]", i):
                c, i, last = c + "]", i + 1, "char"
        elif c == "$":
            c = "\\Z"  # the very end of the text, never before a final newline
        out.append(c)
    return "".join(out)


@functools.lru_cache(maxsize=1024)
def _regex(pattern: str) -> re.Pattern[str]:
    """``pattern`` compiled as ECMA-262 reads it (re.error when Python cannot read it)."""
    return re.compile(_ecma(pattern))


def _pattern(validator: Any, patrn: str, instance: Any, schema: Any) -> Iterator[Any]:
    if validator.is_type(instance, "string") and not _regex(patrn).search(instance):
        yield ValidationError(f"{instance!r} does not match {patrn!r}")


def _pattern_properties(validator: Any, patterns: dict[str, Any], instance: Any,
                        schema: Any) -> Iterator[Any]:
    if not validator.is_type(instance, "object"):
        return
    for patrn, subschema in patterns.items():
        for k, v in instance.items():
            if _regex(patrn).search(k):
                yield from validator.descend(v, subschema, path=k, schema_path=patrn)


def _additional_properties(validator: Any, extra: Any, instance: Any,
                           schema: Any) -> Iterator[Any]:
    """jsonschema's keyword, with the properties patternProperties leaves found by
    the same reading of its patterns."""
    if not validator.is_type(instance, "object"):
        return
    named = schema.get("properties", {})
    patterns = [_regex(p) for p in schema.get("patternProperties", {})]
    extras = sorted((k for k in instance
                     if k not in named and not any(r.search(k) for r in patterns)), key=str)
    if validator.is_type(extra, "object"):
        for k in extras:
            yield from validator.descend(instance[k], extra, path=k)
    elif not extra and extras:
        verb = "was" if len(extras) == 1 else "were"
        shown = _clip(", ".join(json.dumps(k, ensure_ascii=False) for k in extras))
        yield ValidationError(f"Additional properties are not allowed ({shown} {verb} "
                              "unexpected)")


# -- numbers as written ------------------------------------------------------------
#
# Schemas and arguments are decoded with every non-integer as a Decimal, so a
# bound or a multipleOf is checked against the number written, not the nearest
# binary float (0.3 is a multiple of 0.1; 0.10000000000000001 is above 0.1; 1e400
# is an integer, not inf).


def _is_number(checker: Any, instance: Any) -> bool:
    return isinstance(instance, (int, float, Decimal)) and not isinstance(instance, bool)


def _is_integer(checker: Any, instance: Any) -> bool:
    if isinstance(instance, Decimal):
        return instance.is_finite() and instance == instance.to_integral_value()
    if isinstance(instance, float):
        return instance.is_integer()
    return isinstance(instance, int) and not isinstance(instance, bool)


def _multiple_of(validator: Any, factor: Any, instance: Any, schema: Any) -> Iterator[Any]:
    if validator.is_type(instance, "number") and (
            Fraction(instance) / Fraction(factor)).denominator != 1:
        yield ValidationError(f"{instance!r} is not a multiple of {factor}")


_OURS: dict[Any, Any] = {}


def _validator_class(base: Any) -> Any:
    """``base`` (a jsonschema validator class) reading patterns as ECMA-262 does
    and numbers as Decimals."""
    if base in _OURS.values():
        return base
    cls = _OURS.get(base)
    if cls is None:
        types = base.TYPE_CHECKER.redefine_many({"number": _is_number,
                                                 "integer": _is_integer})
        ours = {
            "pattern": _pattern,
            "patternProperties": _pattern_properties,
            "additionalProperties": _additional_properties,
            "multipleOf": _multiple_of,
        }
        if "divisibleBy" in base.VALIDATORS:  # draft 3's name for it
            ours["divisibleBy"] = _multiple_of
        cls = jsonschema.validators.extend(base, ours, type_checker=types)
        cls.evolve = _evolve
        cls = _OURS.setdefault(base, cls)
    return cls


def _evolve(self: Any, **changes: Any) -> Any:
    """jsonschema's evolve, which moves to the class a subschema's "$schema" names
    (a "$ref" to a root that has one, say), keeping to this module's readings."""
    schema = changes.setdefault("schema", self.schema)
    cls = _validator_class(jsonschema.validators.validator_for(schema, default=type(self)))
    for field in type(self).__attrs_attrs__:  # as jsonschema's own evolve does
        if field.init and field.alias not in changes:
            changes[field.alias] = getattr(self, field.name)
    return cls(**changes)


@functools.cache
def _meta_formats(base: Any) -> jsonschema.FormatChecker:
    """``base``'s format checks with "regex" read as a pattern is matched."""
    checker = jsonschema.FormatChecker(())
    checker.checkers = dict(base.FORMAT_CHECKER.checkers)
    checker.checks("regex", raises=(re.error, OverflowError))(
        lambda v: not isinstance(v, str) or _regex(v) is not None)
    return checker


def _refuse(uri: str) -> referencing.Resource[Any]:
    # mypy does not see the attrs-generated __init__ of referencing's classes.
    raise referencing.exceptions.NoSuchResource(ref=uri)  # type: ignore[call-arg]


#: Keywords whose values are data, not schemas: a "$ref" inside one is not a reference.
_NOT_SCHEMAS = frozenset(("const", "enum", "examples", "default"))
#: Keywords whose values map names to schemas: a schema named "default" is still a schema.
_NAMED_SCHEMAS = frozenset(("properties", "patternProperties", "$defs", "definitions",
                            "dependentSchemas", "dependencies"))


def _refs(node: Any, resolver: Resolver[Any], *,
          named: bool = False) -> Iterator[tuple[str, Resolver[Any]]]:
    """Every reference in ``node`` with the resolver it is looked up with;
    ``named``: ``node`` maps names to schemas, whatever the names."""
    if isinstance(node, list):
        for item in node:
            yield from _refs(item, resolver)
        return
    if not isinstance(node, dict):
        return
    if named:
        for value in node.values():
            yield from _refs(value, resolver)
        return
    if isinstance(node.get("$id"), str):
        resolver = resolver.in_subresource(
            referencing.Resource.from_contents(
                node, default_specification=referencing.jsonschema.DRAFT202012))
    for key in ("$ref", "$dynamicRef"):
        ref = node.get(key)
        if isinstance(ref, str):
            yield ref, resolver
    for key, value in node.items():
        if key in _NAMED_SCHEMAS:
            yield from _refs(value, resolver, named=True)
        elif key not in _NOT_SCHEMAS:
            yield from _refs(value, resolver)


def _schemas(node: Any, *, named: bool = False) -> Iterator[dict[str, Any]]:
    """Every schema object in ``node`` (``named``: ``node`` maps names to schemas)."""
    if isinstance(node, list):
        for item in node:
            yield from _schemas(item)
    elif isinstance(node, dict):
        if named:
            for value in node.values():
                yield from _schemas(value)
            return
        yield node
        for key, value in node.items():
            if key not in _NOT_SCHEMAS:
                yield from _schemas(value, named=key in _NAMED_SCHEMAS)


def _schema_problem(error: ValidationError) -> str:
    """What the metaschema found, its values in JSON (a bound written 1.5 is a
    Decimal here, which the library's own message would show in Python's)."""
    where = "/" + "/".join(str(p).replace("~", "~0").replace("/", "~1")
                           for p in error.absolute_path)
    if error.validator is None or not isinstance(error.validator, str):
        return str(error.message)
    return (f"at {where}: {_shown(error.instance)} does not satisfy "
            f"{_shown(error.validator)}: {_shown(error.validator_value)}")


#: Keywords whose value is a schema, or a list of schemas (the others hold data).
_SUBSCHEMAS = frozenset((
    "additionalProperties", "additionalItems", "items", "prefixItems", "contains",
    "propertyNames", "unevaluatedProperties", "unevaluatedItems", "not", "if", "then",
    "else", "allOf", "anyOf", "oneOf", "extends"))


def _applied_schemas(node: Any) -> Iterator[dict[str, Any]]:
    """Every schema object the validator may apply: ``node`` and what its
    schema keywords hold (the values of unknown keywords are data)."""
    if isinstance(node, list):
        for item in node:
            yield from _applied_schemas(item)
        return
    if not isinstance(node, dict):
        return
    yield node
    for key, value in node.items():
        if key in _NAMED_SCHEMAS and isinstance(value, dict):
            for sub in value.values():
                yield from _applied_schemas(sub)
        elif key in _SUBSCHEMAS:
            yield from _applied_schemas(value)


def _check_patterns(schema: Any) -> None:
    """Compile every pattern now, whatever the dialect's metaschema checks (draft
    4's does not check patternProperties' names): one Python cannot read would
    fail every call instead. Data under a keyword no dialect knows is left be."""
    for node in _applied_schemas(schema):
        patterns = [node["pattern"]] if isinstance(node.get("pattern"), str) else []
        if isinstance(node.get("patternProperties"), dict):
            patterns += list(node["patternProperties"])
        for p in patterns:
            try:
                _regex(p)
            except (re.error, OverflowError) as exc:
                raise ValueError(f"input schema has the pattern {_shown(p)}, which cannot be "
                                 f"read as a regular expression ({exc})") from None


def _check_unevaluated(schema: Any) -> None:
    """Refuse unevaluatedProperties beside a property pattern read differently by
    Python: jsonschema finds the properties it leaves with Python's reading."""
    nodes = list(_schemas(schema))
    if not any("unevaluatedProperties" in n for n in nodes):
        return
    for n in nodes:
        patterns = n.get("patternProperties")
        for p in patterns if isinstance(patterns, dict) else ():
            if _ecma(p) != p:
                raise ValueError(
                    f"input schema uses unevaluatedProperties with the property pattern "
                    f"{json.dumps(p)}, whose $, \\d, \\w or \\b Python reads otherwise; "
                    "write it without them (say [0-9] for \\d)")


def compile_schema(data: bytes) -> jsonschema.protocols.Validator:
    """A validator for ``data``; ValueError (with the reason) when it is refused."""
    if not data.strip():
        raise ValueError("input schema is required")
    schema = _decode_schema(data)
    dialect = schema.get("$schema") if isinstance(schema, dict) else None
    if dialect is not None:
        if not isinstance(dialect, str):
            raise ValueError("input schema is invalid: $schema is not a string")
        try:
            referencing.jsonschema.specification_with(dialect)
        except referencing.jsonschema.UnknownDialect as exc:
            raise ValueError(f"input schema refers to {dialect}, outside itself") from exc
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    # Checked by the class it will validate with: a bound written 2.0 is a Decimal.
    meta = jsonschema.validators.validator_for(cls.META_SCHEMA, default=cls)
    checker = _validator_class(meta)(meta.META_SCHEMA, format_checker=_meta_formats(meta))
    try:
        error = next(checker.iter_errors(schema), None)
    except RecursionError:
        raise ValueError("input schema nests too deeply for the schema library to "
                         "check it") from None
    if error is not None:
        raise ValueError(f"input schema is invalid: {_schema_problem(error)}")
    _check_patterns(schema)
    _check_unevaluated(schema)
    resource = referencing.Resource.from_contents(
        schema, default_specification=referencing.jsonschema.DRAFT202012)
    registry: referencing.Registry[Any] = referencing.Registry(
        retrieve=_refuse)  # type: ignore[call-arg]  # attrs __init__, see _refuse
    registry = registry.with_resource(resource.id() or "", resource)
    combined = referencing.jsonschema.EMPTY_REGISTRY.combine(registry)
    root = combined.resolver(base_uri=resource.id() or "")
    for ref, resolver in _refs(schema, root):
        try:
            target = resolver.lookup(ref).contents
        except referencing.exceptions.Unresolvable as exc:
            if ref.startswith("#"):
                raise ValueError(
                    f"input schema refers to {ref}, which it does not define") from exc
            raise ValueError(f"input schema refers to {ref}, outside itself") from exc
        if not isinstance(target, (dict, bool)):
            raise ValueError(f"input schema refers to {ref}, which is {_json_kind(target)}, "
                             "not a schema")
        error = next(checker.iter_errors(target), None)
        if error is not None:
            raise ValueError(f"input schema refers to {ref}, which is not a valid schema: "
                             f"{_schema_problem(error)}")
    try:
        loop = _ref_loop(schema, root)
    except RecursionError:
        raise ValueError("input schema's references nest too deeply to follow") from None
    if loop is not None:
        raise ValueError(f"input schema refers to {loop} in a loop that never reaches into "
                         "the arguments, which the schema library would follow without end "
                         "wherever it applies it; break the loop")
    validator = _validator_class(cls)(schema, registry=registry)
    try:  # once, on {}: a schema the library cannot apply is refused now, not per call
        for _ in validator.iter_errors({}):
            pass
    except Exception as exc:  # noqa: BLE001 - the library failing is the refusal
        text = _clip(exception_text(exc))
        raise ValueError(f"input schema cannot be applied: checking {{}} against it "
                         f"failed in the schema library ({type(exc).__name__}: {text})") from exc
    return validator


_SHOWN = 200


def _clip(text: str) -> str:
    """``text`` cut to about 200 characters: an error names a value, it does not echo it."""
    return text if len(text) <= _SHOWN else f"{text[:_SHOWN]}... ({len(text)} characters)"


def _json_kind(value: Any) -> str:
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "null" if value is None else "a number"


#: Keywords that apply subschemas to the instance itself, not to a part of it.
_IN_PLACE_LISTS = ("allOf", "anyOf", "oneOf")
_IN_PLACE = ("not", "if", "then", "else")


def _ref_loop(schema: Any, root: Resolver[Any]) -> str | None:
    """A reference that leads back to a schema it started from without moving
    into a part of the instance (the library would recurse without end), or None."""
    done: set[int] = set()
    active: set[int] = set()

    def visit(node: Any, resolver: Resolver[Any]) -> str | None:
        if not isinstance(node, dict) or id(node) in done:
            return None
        if isinstance(node.get("$id"), str):
            resolver = resolver.in_subresource(referencing.Resource.from_contents(
                node, default_specification=referencing.jsonschema.DRAFT202012))
        active.add(id(node))
        children: list[tuple[Any, Resolver[Any]]] = []
        for key in ("$ref", "$dynamicRef"):
            ref = node.get(key)
            if isinstance(ref, str):
                try:
                    resolved = resolver.lookup(ref)
                except referencing.exceptions.Unresolvable:  # said by compile_schema
                    continue
                if id(resolved.contents) in active:
                    return ref
                found = visit(resolved.contents, resolved.resolver)
                if found is not None:
                    return found
        for key in _IN_PLACE_LISTS:
            value = node.get(key)
            children += [(v, resolver) for v in value] if isinstance(value, list) else []
        children += [(node.get(key), resolver) for key in _IN_PLACE]
        for key in ("dependentSchemas", "dependencies"):  # the latter: drafts 4-7
            dependent = node.get(key)
            if isinstance(dependent, dict):
                children += [(v, resolver) for v in dependent.values() if isinstance(v, dict)]
        for child, child_resolver in children:
            found = visit(child, child_resolver)
            if found is not None:
                return found
        active.discard(id(node))
        done.add(id(node))
        return None

    # From every schema: one reached only through "properties" still runs on a part.
    for node in _schemas(schema):
        found = visit(node, root)
        if found is not None:
            return found
    return None


def _instance(args: bytes) -> Any:
    """The arguments as the schema sees them: every number exact (a non-integer
    as a Decimal)."""
    try:
        value = orjson.loads(args)
    except orjson.JSONDecodeError:
        return json.loads(args, parse_float=Decimal)  # numbers orjson will not hold
    if keys_and_floats(value)[1]:  # a float, or an integer past 64 bits orjson rounded
        return json.loads(args, parse_float=Decimal)
    return value


_ANY_OBJECT = {"type": "object"}


def check_args(validator: jsonschema.protocols.Validator, args: bytes | None, *,
               checked: bool = False) -> str | None:
    """Why the arguments are refused (JSON boundary check, then the schema), or None.

    Empty arguments validate as ``{}``. A failure inside the schema library is
    a refusal, never an acceptance. ``checked``: the boundary check already passed.
    """
    if args is None or not args.strip():
        args = b"{}"
    problem = None if checked else check_json(args)
    if problem is not None:
        return f"arguments are not usable JSON: {problem}"
    try:
        # The default schema, and the usual one: valid exactly when the
        # arguments are an object, which jsonschema would find at some ten
        # times the cost. They are one JSON value by now, so an object is one
        # that starts with "{" after whitespace: no need to decode it.
        any_object = validator.schema == _ANY_OBJECT
        if any_object and args.lstrip().startswith(b"{"):
            return None
        instance = _instance(args)
        if not any_object and validator.is_valid(instance):
            return None
        err = best_match(validator.iter_errors(instance))
    except Exception as exc:  # noqa: BLE001 - the library failing is a refusal
        return f"arguments do not match schema: the validator failed: {_clip(str(exc))}"
    if err is None:  # pragma: no cover - is_valid said no
        return "arguments do not match schema"
    # In JSON, not the library's Python repr, and clipped: a refusal is recorded
    # several times over and must not echo a megabyte of arguments each time.
    where = "/" + "/".join(str(p).replace("~", "~0").replace("/", "~1")
                           for p in err.absolute_path)
    if err.validator is None:  # the schema there is false
        detail = f"{_shown(err.instance)} is not allowed (the schema there is false)"
    elif err.validator == "additionalProperties" and err.validator_value is False:
        detail = err.message  # ours, naming the properties in JSON
    else:
        detail = (f"{_shown(err.instance)} does not satisfy {_shown(err.validator)}: "
                  f"{_shown(err.validator_value)}")
    return f"arguments do not match schema: at {where}: {detail}"


def _fragment(value: Any) -> Any:
    if isinstance(value, Decimal):  # written as the number it is
        return orjson.Fragment(str(value))
    raise TypeError


def _shown(value: Any) -> str:
    """``value`` as JSON, clipped."""
    try:
        text = orjson.dumps(value, default=_fragment).decode("utf-8")
    except orjson.JSONEncodeError:  # an integer past 64 bits
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)
    return _clip(text)


# -- registration --------------------------------------------------------------


class RegisteredTool:
    """A tool as the driver keeps it: its spec re-read per step, the spec's recorded
    form (hash and canonical text) and its compiled schema, cached by value."""

    __slots__ = ("_entries", "name", "tool")

    def __init__(self, tool: Tool, name: str) -> None:
        self.tool = tool
        self.name = name
        self._entries: dict[tuple[Any, ...], tuple[str, bytes, Any]] = {}

    def current(self) -> tuple[ToolSpec, str, bytes, jsonschema.protocols.Validator]:
        """(spec, spec hash, canonical spec text, validator) as the tool states it now.

        Raises ValueError when the spec the tool now returns fails a check it
        would fail at registration (a side effect, a timeout, a schema), names
        the tool differently, or when ``spec()`` itself raises (the loop then
        treats the tool as it treats one with a broken spec, instead of
        stopping mid-step or running it under a spec no one registered).
        """
        try:
            spec = self.tool.spec()
        except Exception as exc:  # noqa: BLE001 - consumer code; said in the record
            raise ValueError(raised_text("spec()", exc)) from exc
        if not isinstance(spec, ToolSpec):
            raise ValueError(f"spec() returned {described(spec)}, not a ToolSpec")
        key = (spec.name, spec.description, spec.input_schema, spec.side_effect,
               spec.timeout, spec.terminal)
        try:
            entry = self._entries.get(key)
        except TypeError:  # an unhashable field: a mistyped spec, refused below
            entry = None
        if entry is None:  # a spec not seen before: checked as at registration
            try:
                check_spec_types(spec, "its spec")
                _check_values(spec, "its spec")
            except ConfigError as exc:
                raise ValueError(exc.detail) from None
            if spec.name != self.name:  # the loop finds the tool by its registered name
                raise ValueError(f'spec() now names the tool "{spec.name}"; it was '
                                 f'registered as "{self.name}"')
            validator = compile_schema(spec.input_schema)
            spec_hash, text = spec.spec_hash()
            entry = (spec_hash, text, validator)
            if len(self._entries) > 64:
                self._entries.clear()
            self._entries[key] = entry
        return spec, entry[0], entry[1], entry[2]


def check_spec_types(spec: ToolSpec, where: str = "") -> None:
    """Refuse a spec whose fields are not of the types its record holds; ``where``
    prefixes each field's name (the tool's, by default)."""
    name = spec.name
    check_text(f"{where}: name" if where else "tool name", name, utf8=_NOT_UTF8)
    where = where or f'tool "{name}"'
    check_text(f"{where}: description", spec.description, utf8=_NOT_UTF8)
    if not isinstance(spec.input_schema, bytes):
        raise ConfigError(f"{where}: input_schema is {described(spec.input_schema)}, "
                          "not JSON as bytes")
    check_text(f"{where}: side_effect", spec.side_effect)
    wait_duration(f"{where}: timeout", spec.timeout, seconds=False)
    if not isinstance(spec.terminal, bool):
        raise ConfigError(f"{where}: terminal is {described(spec.terminal)}, not a bool")


def _check_values(spec: ToolSpec, where: str) -> None:
    """Refuse a side effect the runtime does not know and a timeout no wait can keep."""
    if spec.side_effect not in _SIDE_EFFECTS:
        raise ConfigError(f'{where}: invalid side effect "{spec.side_effect}"')
    if spec.timeout <= timedelta(0):
        raise ConfigError(f"{where}: timeout is required")


def _check_spec(spec: ToolSpec) -> None:
    if not spec.name:
        raise ConfigError("tool with empty name")
    where = f'tool "{spec.name}"'
    _check_values(spec, where)
    try:
        compile_schema(spec.input_schema)
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from exc


_TOOL = "a Tool (an object with spec() and call(call) methods)"


def register_tools(tools: object) -> dict[str, RegisteredTool]:
    """Check every tool, in the order given, and key them by name in name order."""
    if not isinstance(tools, Sequence) or isinstance(tools, (str, bytes, bytearray)):
        hint = ("; pass a list of tools" if callable(getattr(tools, "spec", None))
                else "")
        raise ConfigError(f"tools is {described(tools)}, not a list of tools{hint}")
    out: dict[str, RegisteredTool] = {}
    for i, tool in enumerate(tools):
        check_method(f"tools[{i}]", tool, ("spec", "call"), _TOOL,
                     "wrap a function in FuncTool")
        try:
            spec = tool.spec()
        except Exception as exc:  # noqa: BLE001 - consumer code; said in one sentence
            raise ConfigError(raised_text(f"tools[{i}].spec()", exc)) from exc
        if not isinstance(spec, ToolSpec):
            raise ConfigError(f"tools[{i}].spec() returned {described(spec)}, not a ToolSpec")
        check_spec_types(spec)
        if spec.name and spec.name in out:
            raise ConfigError(f'duplicate tool "{spec.name}"')
        _check_spec(spec)
        registered = RegisteredTool(tool, spec.name)
        try:
            registered.current()  # read again: a spec that changes at once is refused now
        except ValueError as exc:
            raise ConfigError(f'tool "{spec.name}": {exc}') from exc
        out[spec.name] = registered
    return {name: out[name] for name in sorted(out, key=lambda n: n.encode("utf-8"))}
