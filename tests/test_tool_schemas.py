"""Input schemas read as JSON Schema 2020-12 says: patterns as ECMA-262 reads
them, numbers exactly as written, and a schema that can never validate refused
when the tool is registered."""

from __future__ import annotations

import json

import pytest

from agentrt.driver.tools import check_args, compile_schema


def _check(schema: object, args: str) -> str | None:
    return check_args(compile_schema(json.dumps(schema).encode()), args.encode())


# -- patterns ------------------------------------------------------------------


def test_a_dollar_matches_only_at_the_very_end_not_before_a_final_newline():
    schema = {"type": "string", "pattern": "^[a-z0-9-]+$"}
    assert _check(schema, '"main"') is None
    assert _check(schema, '"main\\n"') is not None


@pytest.mark.parametrize(("pattern", "text"), [
    ("^\\d+$", "\u0663\u0664"),      # Arabic-Indic digits
    ("^\\w+$", "\u00e9t\u00e9"),     # accented letters
    ("^[\\w]+$", "\u00e9t\u00e9"),
])
def test_digit_word_and_boundary_classes_are_ascii_as_in_ecma_262(pattern, text):
    assert _check({"type": "string", "pattern": pattern}, json.dumps(text)) is not None


@pytest.mark.parametrize(("pattern", "text"), [
    ("^\\d{3}-\\d{4}$", "555-1234"),
    ("^[A-Za-z_]\\w*$", "snake_case9"),
    ("^\\D+$", "\u0663x"),           # a non-ASCII digit is not \d, so it is \D
    ("^[^\\W]+$", "abc"),
    ("^a\\$b$", "a$b"),              # an escaped dollar is a dollar
    ("^[$]$", "$"),                  # so is one in a class
    ("\\bcat\\b", "a cat sat"),
    ("^x\\b", "x\u00e9"),            # é is no word character: a boundary after x
    ("^\\s+$", "\u00a0\u2003"),      # \s stays Unicode, as in ECMA-262
])
def test_ordinary_patterns_still_match(pattern, text):
    assert _check({"type": "string", "pattern": pattern}, json.dumps(text)) is None


def test_pattern_properties_and_the_properties_they_leave_use_the_same_reading():
    schema = {"type": "object", "patternProperties": {"^[a-z]+$": {"type": "integer"}},
              "additionalProperties": False}
    assert _check(schema, '{"ab": 1}') is None
    assert _check(schema, '{"ab": "x"}') is not None
    # "ab\n" is not matched by the pattern, so it is an additional property.
    assert _check(schema, '{"ab\\n": "x"}') is not None
    with_schema = {"type": "object", "patternProperties": {"^\\d+$": {"type": "string"}}}
    assert _check(with_schema, '{"12": 1}') is not None
    assert _check(with_schema, '{"\u0663": 1}') is None  # not an ASCII digit: unchecked


def test_a_pattern_python_cannot_read_is_refused_at_registration():
    with pytest.raises(ValueError, match="input schema is invalid"):
        compile_schema(b'{"type":"string","pattern":"^\\\\p{L}+$"}')


def test_unevaluated_properties_beside_a_pattern_python_reads_otherwise_is_refused():
    schema = {"patternProperties": {"^[a-z]+$": {}}, "unevaluatedProperties": False}
    with pytest.raises(ValueError, match="unevaluatedProperties with the property pattern"):
        compile_schema(json.dumps(schema).encode())
    plain = {"patternProperties": {"^[a-z]+": {}}, "unevaluatedProperties": False}
    assert _check(plain, '{"ab": 1}') is None
    assert _check(plain, '{"1": 1}') is not None


# -- numbers -------------------------------------------------------------------


@pytest.mark.parametrize(("schema", "value"), [
    ({"multipleOf": 0.01}, "19.99"),
    ({"multipleOf": 0.01}, "0.07"),
    ({"multipleOf": 0.1}, "0.3"),
    ({"multipleOf": 0.5}, "1e400"),
    ({"type": "integer"}, "1e400"),
    ({"type": "integer"}, "2.0"),
    ({"type": "number", "maximum": 0.1}, "0.1"),
    ({"minLength": 2.0}, '"ab"'),
])
def test_numbers_are_checked_exactly_as_written(schema, value):
    assert _check(schema, value) is None


@pytest.mark.parametrize(("schema", "value"), [
    ({"multipleOf": 0.01}, "19.991"),
    ({"maximum": 0.1}, "0.10000000000000001"),
    ({"exclusiveMaximum": 1}, "1.0000000000000001"),
    ({"maximum": 100}, "100.00000000000001"),
    ({"type": "integer"}, "1.5e-400"),
    ({"type": "integer"}, "1.0000000000000001"),
])
def test_a_number_just_past_a_bound_is_refused_not_rounded_onto_it(schema, value):
    assert _check(schema, value) is not None


def test_a_schema_naming_its_dialect_keeps_these_readings_through_a_reference_to_its_root():
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema",
              "anyOf": [{"type": "string", "pattern": "^[a-z]+$"},
                        {"type": "array", "items": {"$ref": "#"}}]}
    assert _check(schema, '["ab"]') is None
    assert _check(schema, '["ab\\n"]') is not None
    numbers = {"$schema": "https://json-schema.org/draft/2020-12/schema",
               "anyOf": [{"multipleOf": 0.1}, {"type": "array", "items": {"$ref": "#"}}]}
    assert _check(numbers, "[0.3]") is None


# -- a schema that can never validate ------------------------------------------


@pytest.mark.parametrize(("schema", "said"), [
    ({"$ref": "#/$defs/a/type", "$defs": {"a": {"type": "object"}}},
     "refers to #/$defs/a/type, which is a string, not a schema"),
    ({"$ref": "#/$defs/a/required", "$defs": {"a": {"required": ["x"]}}},
     "refers to #/$defs/a/required, which is an array, not a schema"),
    ({"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}},
     "refers to #/$defs/a in a loop"),
    ({"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#"}}},
     "in a loop"),
    ({"allOf": [{"$ref": "#"}]}, "refers to # in a loop"),
    ({"properties": {"x": {"$ref": "#/$defs/a"}},
      "$defs": {"a": {"anyOf": [{"not": {"$ref": "#/$defs/a"}}]}}}, "in a loop"),
])
def test_a_reference_that_can_never_validate_is_refused_at_registration(schema, said):
    with pytest.raises(ValueError, match="input schema ") as caught:
        compile_schema(json.dumps(schema).encode())
    assert said in str(caught.value)


def test_a_reference_that_descends_into_the_arguments_is_no_loop():
    tree = {"type": "object", "properties": {"children": {
        "type": "array", "items": {"$ref": "#"}}}}
    assert _check(tree, '{"children": [{"children": []}]}') is None
    assert _check(tree, '{"children": [{"children": 1}]}') is not None


def test_a_tool_with_a_looping_schema_is_refused_when_the_driver_is_built():
    from agentrt.driver import FuncTool
    from agentrt.driver.errors import ConfigError
    from agentrt.driver.tools import register_tools
    schema = b'{"$ref":"#/$defs/a","$defs":{"a":{"$ref":"#/$defs/a"}}}'
    with pytest.raises(ConfigError, match='tool "t": input schema refers to #/\\$defs/a in a loop'):
        register_tools([FuncTool("t", lambda c: b"{}", input_schema=schema)])


def test_a_schema_the_library_fails_on_is_refused_at_registration(monkeypatch):
    import jsonschema

    from agentrt.driver import tools

    def broken(validator, value, instance, schema):
        raise AttributeError("'str' object has no attribute 'items'")

    monkeypatch.setattr(tools, "_OURS", {})
    monkeypatch.setitem(jsonschema.Draft202012Validator.VALIDATORS, "required", broken)
    with pytest.raises(ValueError, match=r"^input schema cannot be applied: checking \{\} "
                       r"against it failed in the schema library \(AttributeError: "):
        compile_schema(b'{"required":["x"]}')


def test_a_schema_nested_past_what_the_library_can_check_is_refused_in_words():
    deep = b'{"not":' * 250 + b"{}" + b"}" * 250
    with pytest.raises(ValueError, match="nests too deeply"):
        compile_schema(deep)


# -- what a refusal says -------------------------------------------------------


def test_a_refusal_names_the_value_and_the_keyword_as_json():
    schema = {"type": "object", "properties": {"ok": {"enum": [True]},
                                               "v": {"type": "null"},
                                               "a/b": {"maximum": 0.1}}}
    assert _check(schema, '{"ok":false}') == (
        'arguments do not match schema: at /ok: false does not satisfy "enum": [true]')
    assert _check(schema, '{"v":{"a":null}}') == (
        'arguments do not match schema: at /v: {"a":null} does not satisfy "type": "null"')
    assert _check(schema, '{"a/b":0.10000000000000001}') == (
        "arguments do not match schema: at /a~1b: 0.10000000000000001 does not satisfy "
        '"maximum": 0.1')
    assert _check({"properties": {"x": False}}, '{"x":[1]}').endswith(
        ": [1] is not allowed (the schema there is false)")
    assert _check({"properties": {"a": {}}, "additionalProperties": False},
                  '{"a":1,"b\u00e9":2}') == ("arguments do not match schema: at /: Additional "
                                              'properties are not allowed ("bé" was unexpected)')


def test_a_refusal_of_large_arguments_shows_only_the_start_of_them():
    args = "[" + '"x",' * 250_000 + '"x"]'
    said = _check({"type": "object"}, args)
    assert said.startswith('arguments do not match schema: at /: ["x","x",')
    assert len(said) < 400 and "characters)" in said


@pytest.mark.parametrize("constant", [b"NaN", b"Infinity", b"-Infinity"])
def test_a_schema_holding_nan_or_infinity_is_not_valid_json(constant):
    with pytest.raises(ValueError, match="^input schema is not valid JSON$"):
        compile_schema(b'{"maximum":' + constant + b"}")


# -- review of the schema fixes ---------------------------------------------------


@pytest.mark.parametrize("pattern", ["^[#-\\d]+$", "^[\\w-a]+$", "^[%-\\w]+$"])
def test_a_range_to_or_from_a_class_escape_is_refused_as_ecma_and_re2_refuse_it(pattern):
    """Written as ranges, [#-\\d] took in '/' and '.', [\\w-a] a backquote."""
    with pytest.raises(ValueError, match="input schema is invalid"):
        compile_schema(json.dumps({"pattern": pattern}).encode())


@pytest.mark.parametrize("pattern", ["^[\\w-]+$", "^[-\\w]+$", "^[a\\-\\w]+$"])
def test_a_hyphen_at_a_class_edge_or_escaped_beside_a_class_escape_is_literal(pattern):
    v = compile_schema(json.dumps({"pattern": pattern}).encode())
    assert check_args(v, b'"a-b_c"') is None and check_args(v, b'"a`b"') is not None


def test_draft_3_divisible_by_is_checked_exactly_too():
    v = compile_schema(b'{"$schema":"http://json-schema.org/draft-03/schema#",'
                       b'"divisibleBy":0.5}')
    assert check_args(v, b"1e40") is None
    assert check_args(v, b"123456789012345678901234567890") is None
    assert "does not satisfy" in (check_args(v, b"0.3") or "")


def test_a_registration_refusal_shows_numbers_as_json_not_python():
    with pytest.raises(ValueError) as info:
        compile_schema(b'{"minLength":1.5}')
    assert str(info.value) == ('input schema is invalid: at /minLength: 1.5 does not satisfy '
                               '"type": "integer"')


@pytest.mark.parametrize("schema", [
    b'{"pattern":"a{4294967296}"}',
    b'{"$schema":"http://json-schema.org/draft-04/schema#","patternProperties":{"(":{}}}',
])
def test_a_pattern_python_cannot_compile_is_refused_at_registration_in_any_dialect(schema):
    """A count past 2**32 raised OverflowError out of registration; draft 4's
    metaschema does not check patternProperties' names, so every call failed."""
    with pytest.raises(ValueError, match="input schema"):
        compile_schema(schema)


def test_a_reference_loop_through_draft_7_dependencies_is_refused_at_registration():
    with pytest.raises(ValueError, match="in a loop that never reaches into the arguments"):
        compile_schema(b'{"$schema":"http://json-schema.org/draft-07/schema#",'
                       b'"dependencies":{"a":{"$ref":"#"}}}')


@pytest.mark.parametrize(("pattern", "takes", "refuses"), [
    ("^[a-z-\\d]+$", ["a-1", "-"], ["Z"]),
    ("^[0-9-\\w]+$", ["a-_9"], ["."]),
    ("^[^-\\d]+$", ["ab"], ["-", "5"]),
    ("^[+--\\d]+$", ["+,-5"], ["a"]),
    ("^[-a-c]+$", ["-abc"], ["d"]),
])
def test_a_hyphen_after_a_range_or_a_negation_beside_a_class_escape_is_a_literal(
        pattern, takes, refuses):
    """The range check took any '-' before \\d or \\w for a range (review of
    89bb724); these are all valid ECMA-262, and read here as node reads them."""
    v = compile_schema(json.dumps({"pattern": pattern}).encode())
    assert all(check_args(v, json.dumps(t).encode()) is None for t in takes)
    assert all(check_args(v, json.dumps(r).encode()) is not None for r in refuses)


def test_patterns_under_keywords_no_dialect_knows_are_data_not_checked():
    """A UI hint's "pattern" is not the schema's: refusing it refused valid tools."""
    for schema in (b'{"type":"object","x-ui":{"pattern":"\\\\p{L}"}}',
                   b'{"type":"object","x-form":{"patternProperties":{"(":{}}}}'):
        compile_schema(schema)
