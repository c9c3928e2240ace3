"""The scripted model's supersession judgement (the offline demo's and the pipeline tests'): plain functions."""

import pytest

from familiar_pipeline.projectors.supersede.scripted import claim_subjects, retires


@pytest.mark.parametrize(
    ("new", "prior"),
    [
        ("Cass said: Actually I moved to Madrid this spring instead", "Cass said: I moved to Lisbon last week"),
        ("Sam said: I hate hiking now", "Sam said: I love hiking in the mountains"),
        ("Sam said: I no longer work at the bakery", "Sam said: I work at the bakery."),
        ("Sam said: Recently I started working as a nurse", "Sam said: I work as a teacher."),
    ],
)
def test_a_newer_value_for_the_same_subjects_slot_retires_the_older(new, prior):
    assert retires(new, prior)


@pytest.mark.parametrize(
    ("new", "prior"),
    [
        ("Sam said: my friend Bob lives in Berlin", "Sam said: I moved to Porto"),
        ("Sam said: I also work as a tutor", "Sam said: I work as a teacher."),
        ("Sam said: I love hiking in the mountains", "Sam said: I love hiking"),
        ("Sam said: I moved to Porto", "Sam said: I love hiking"),
    ],
)
def test_another_subject_slot_or_an_addition_retires_nothing(new, prior):
    assert not retires(new, prior)


def test_a_capitalised_adverb_opening_the_sentence_is_not_a_name():
    text = "Cass said: Actually I moved to Madrid"
    assert claim_subjects(text, text.index("moved")) == {"cass"}
    text = "Cass said: Still Bob lives in Rome"
    assert claim_subjects(text, text.index("lives")) == {"bob"}
