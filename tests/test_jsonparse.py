"""Tolerant JSON parsing of model replies (familiar_pipeline.models.jsonparse)."""

from __future__ import annotations

import json

import pytest

from familiar_pipeline.models.jsonparse import as_int, as_int_list, coerce_json, coerce_json_array


# --- plain and fenced -------------------------------------------------------


def test_plain_array_and_object():
    assert coerce_json('[{"text": "a"}, 2]', "array") == [{"text": "a"}, 2]
    assert coerce_json('{"superseded_ids": [1, 2]}', "object") == {"superseded_ids": [1, 2]}


@pytest.mark.parametrize("text", ["", "   \n\t ", None])
def test_empty_reply_is_none(text):
    assert coerce_json(text, "array") is None
    assert coerce_json(text, "object") is None


@pytest.mark.parametrize(
    "text",
    [
        '```json\n[{"text": "x"}]\n```',
        '```JSON\n[{"text": "x"}]\n```',
        '```\n[{"text": "x"}]\n```',
        '``` Json\n[{"text": "x"}]```',
        'Here you go:\n```json\n[{"text": "x"}]\n```\nHope that helps!',
        '```json\n[{"text": "x"}]',  # the closing fence never came
    ],
)
def test_fences_are_stripped(text):
    assert coerce_json(text, "array") == [{"text": "x"}]


def test_leading_and_trailing_prose():
    text = 'Sure! Based on the turns, the facts are:\n[{"text": "Cass likes tea"}]\nLet me know.'
    assert coerce_json(text, "array") == [{"text": "Cass likes tea"}]
    obj = 'Decision: {"superseded_ids": [3]} -- done'
    assert coerce_json(obj, "object") == {"superseded_ids": [3]}


def test_nested_structures_survive_the_greedy_span():
    text = 'x [{"a": [1, [2, 3]], "b": {"c": [4]}}, {"d": "]"}] y'
    assert coerce_json(text, "array") == [{"a": [1, [2, 3]], "b": {"c": [4]}}, {"d": "]"}]


def test_greedy_span_runs_first_to_last_bracket():
    # The greedy span keeps the whole outer array, not the first inner one.
    assert coerce_json("note: [[1, 2], [3]] ok", "array") == [[1, 2], [3]]
    assert coerce_json("noise [1, 2] noise", "array") == [1, 2]
    # Two sibling arrays: the greedy span "[1, 2], [3]" is not JSON, so the
    # first complete array wins rather than a guess at merging them.
    assert coerce_json("[1, 2], [3]", "array") == [1, 2]


def test_first_complete_value_when_prose_after_it_has_brackets():
    # Greedy span "[1, 2] (see [note])" is invalid; the first complete array is kept.
    assert coerce_json("[1, 2] (see [note])", "array") == [1, 2]
    assert coerce_json('{"a": 1} and {"b": 2}', "object") == {"a": 1}


def test_brackets_inside_strings_do_not_confuse_anything():
    text = '[{"text": "she wrote \\"[x]\\" and {y}", "ids": [1]}]'
    assert coerce_json(text, "array") == [{"text": 'she wrote "[x]" and {y}', "ids": [1]}]


# --- wrong shape and garbage ------------------------------------------------


def test_wrong_shape_is_none():
    assert coerce_json('{"facts": [1, 2]}', "array") == [1, 2]  # the inner array is a valid span
    assert coerce_json('{"facts": "none"}', "array") is None
    assert coerce_json("[1, 2, 3]", "object") is None
    assert coerce_json("42", "array") is None
    assert coerce_json('"just a string"', "object") is None
    assert coerce_json("null", "array") is None


@pytest.mark.parametrize(
    "text",
    [
        "I could not find any facts.",
        "[this is not json]",
        "{not: json}",
        "]][[",
        "}{",
        "[" * 50_000,
        "{" * 50_000,
        "\x00\x01\x02[",
    ],
)
def test_garbage_is_none(text):
    assert coerce_json(text, "array") is None
    assert coerce_json(text, "object") is None


def test_bad_expect_is_a_programming_error():
    with pytest.raises(ValueError, match="expect"):
        coerce_json("[]", "list")  # type: ignore[arg-type]


# --- repair pass ------------------------------------------------------------


def test_trailing_commas_are_repaired():
    assert coerce_json('[{"a": 1,}, {"b": [1, 2,],},]', "array") == [{"a": 1}, {"b": [1, 2]}]
    assert coerce_json('{"superseded_ids": [4, 5, ], }', "object") == {"superseded_ids": [4, 5]}


def test_commas_inside_strings_are_not_repaired():
    assert coerce_json('[{"text": "a, ]"},]', "array") == [{"text": "a, ]"}]


def test_truncated_array_keeps_complete_items():
    text = '[{"text": "one", "ids": [1]}, {"text": "two", "ids": [2, 3]}, {"text": "thr'
    assert coerce_json(text, "array") == [
        {"text": "one", "ids": [1]},
        {"text": "two", "ids": [2, 3]},
    ]


def test_truncated_array_inside_an_unclosed_fence():
    text = '```json\n[\n  {"text": "one"},\n  {"text": "two"},\n  {"text": "th'
    assert coerce_json(text, "array") == [{"text": "one"}, {"text": "two"}]


def test_truncated_array_cut_right_after_an_item():
    assert coerce_json('[{"a": 1}, {"b": 2}', "array") == [{"a": 1}, {"b": 2}]
    assert coerce_json('[{"a": 1}, {"b": 2},', "array") == [{"a": 1}, {"b": 2}]


def test_truncated_array_with_no_complete_item_is_none():
    assert coerce_json('[{"text": "only half', "array") is None


def test_truncated_object_is_not_guessed():
    assert coerce_json('{"superseded_ids": [1, 2', "object") is None


# --- size and unicode -------------------------------------------------------


def test_one_megabyte_of_junk_is_fast_and_safe():
    # Brackets, commas and an escaped quote in every chunk: the worst case for
    # the repair scanner. Linear work keeps this well under a second.
    junk = ('lorem [ipsum {dolor, "sit\\" amet ] } , ' * 30_000)[: 1_000_000]
    assert coerce_json(junk, "array") is None
    assert coerce_json(junk, "object") is None


def test_large_truncated_array_is_cut_back_once_not_per_item():
    items = [{"text": f"fact {i}", "ids": [i]} for i in range(20_000)]
    text = json.dumps(items)[:-30]  # cut inside the last item
    assert coerce_json(text, "array") == items[:-1]


def test_large_valid_reply_with_prose():
    items = [{"text": f"fact {i}", "ids": [i]} for i in range(5_000)]
    text = "Here:\n```json\n" + json.dumps(items) + "\n```"
    assert coerce_json(text, "array") == items


def test_unicode_survives():
    text = '[{"text": "Zoë liebt Käse 🧀", "who": "日本語"}, {"text": "\\u00e9t\\u00e9"}]'
    assert coerce_json(text, "array") == [
        {"text": "Zoë liebt Käse 🧀", "who": "日本語"},
        {"text": "été"},
    ]


# --- typed helpers ----------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (7, 7),
        (-3, -3),
        ("42", 42),
        (" 12 ", 12),
        ("-5", -5),
        (3.9, 3),
        (-2.5, -2),
        (True, None),
        (False, None),
        ("3.5", None),
        ("#4", None),
        ("", None),
        (None, None),
        ([1], None),
        (float("nan"), None),
        (float("inf"), None),
        ("٣", None),  # non-ASCII digits are not ids
        ("9" * 10_000, None),  # beyond Python's int-from-str limit
    ],
)
def test_as_int(value, expected):
    assert as_int(value) == expected


def test_as_int_list():
    assert as_int_list([1, "2", " 3 ", "-4", 5.0, "6.5", True, None, [7], "x", 8]) == [1, 2, 3, -4, 8]
    assert as_int_list((1, 2)) == [1, 2]
    assert as_int_list("1, 2") == []
    assert as_int_list(None) == []
    assert as_int_list({"a": 1}) == []


def test_truncation_repair_counts_what_it_discarded():
    cut_inside = '[{"text": "one"}, {"text": "two"}, {"text": "thr'
    assert coerce_json_array(cut_inside) == ([{"text": "one"}, {"text": "two"}], 1)
    assert coerce_json_array('[{"a": 1}, {"b": 2},') == ([{"a": 1}, {"b": 2}], 0)  # nothing after the comma
    assert coerce_json_array('[{"a": 1}, {"b": 2}') == ([{"a": 1}, {"b": 2}], 0)  # only the "]" was missing
    assert coerce_json_array('[{"a": 1}]') == ([{"a": 1}], 0)
    assert coerce_json_array("no json") == (None, 0)


def test_a_fact_cut_off_by_the_token_limit_is_counted_as_malformed():
    from familiar_pipeline.projectors.facts.prompt import parse_reply

    facts, malformed = parse_reply('[{"text": "Ana moved to Lisbon", "source_turn_ids": [1]}, {"text": "Ana is allerg')
    assert [f.text for f in facts] == ["Ana moved to Lisbon"] and malformed == 1
