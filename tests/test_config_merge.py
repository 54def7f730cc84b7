"""configs/train.toml merged key by key: the plan's values, the owner's own, no needless
conflicts."""

from __future__ import annotations

import tomllib

from scaffold.config_merge import LABELS, merge_config
from scaffold.tools import merge_texts

BASE = """\
# --- data ---
text_path = ""                   # a UTF-8 text file
# plan: the example's corpus
corpus_bytes = 300_000           # bytes read from the corpus
# plan: the example's context
block_size = 64                  # tokens per sequence

# --- optimisation ---
epochs = 4
# plan: the largest micro-batch that fits
micro_batch_size = 32            # sequences per pass
min_lr_ratio = 0.1               # cosine floor
"""
NEW_PLAN = (
    BASE.replace("the example's corpus\ncorpus_bytes = 300_000", "all of it\ncorpus_bytes = 32e6")
    .replace("block_size = 64", "block_size = 2048")
    .replace("the largest micro-batch that fits\nmicro_batch_size = 32", "x\nmicro_batch_size = 16")
)


def merge(mine: str, base: str = BASE, theirs: str = NEW_PLAN):
    return merge_config(mine, base, theirs, lambda *texts: merge_texts(*texts, LABELS))


def test_the_owners_value_next_to_a_planned_line_survives_a_new_plan():
    """text_path sits right above corpus_bytes, which the new plan changes with its comment:
    a line-based merge conflicts there."""
    mine = BASE.replace('text_path = ""', 'text_path = "data/mine.txt"')
    line_based = merge_texts(mine, BASE, NEW_PLAN, LABELS)
    assert "<<<<<<<" in line_based, "the case copier's merge gets wrong"
    merged = merge(mine)
    assert not merged.conflicted and "<<<<<<<" not in merged.text
    values = tomllib.loads(merged.text)
    assert values["text_path"] == "data/mine.txt"
    assert (values["corpus_bytes"], values["block_size"], values["micro_batch_size"]) == (
        32e6,
        2048,
        16,
    )
    assert "# plan: all of it\ncorpus_bytes = 32e6" in merged.text
    assert merged.notes == ()


def test_an_owners_planned_value_stays_unless_the_new_plan_changes_it():
    mine = BASE.replace("micro_batch_size = 32 ", "micro_batch_size = 8  ")
    same_plan = merge(mine, theirs=BASE.replace("min_lr_ratio = 0.1", "min_lr_ratio = 0.05"))
    values = tomllib.loads(same_plan.text)
    assert (values["micro_batch_size"], values["min_lr_ratio"]) == (8, 0.05)
    replanned = merge(mine)
    assert tomllib.loads(replanned.text)["micro_batch_size"] == 16
    assert not replanned.conflicted
    assert replanned.notes == (
        "micro_batch_size: the new plan's 16 replaces your 8 (the old plan's value changed too)",
    )


def test_both_sides_changing_an_unplanned_value_differently_is_a_conflict_on_that_key_only():
    mine = BASE.replace("epochs = 4", "epochs = 10")
    theirs = NEW_PLAN.replace("epochs = 4", "epochs = 2")
    merged = merge(mine, theirs=theirs)
    assert merged.conflicted
    assert "<<<<<<< before updating\nepochs = 10\n=======\nepochs = 2\n>>>>>>> after updating" in (
        merged.text
    )
    assert "block_size = 2048" in merged.text, "the rest merged"


def test_added_and_removed_keys_and_comments_merge_line_by_line():
    mine = BASE.replace("epochs = 4\n", "epochs = 4\nmy_flag = true   # mine\n")
    mine = mine.replace("# --- data ---", "# --- data (my corpus) ---")
    theirs = NEW_PLAN.replace("min_lr_ratio = 0.1               # cosine floor\n", "")
    theirs = theirs.replace("epochs = 4\n", "epochs = 4\nlog_every = 10\n")
    merged = merge(mine, theirs=theirs)
    assert not merged.conflicted, merged.text
    values = tomllib.loads(merged.text)
    assert values["my_flag"] is True and values["log_every"] == 10
    assert "min_lr_ratio" not in values and "# --- data (my corpus) ---" in merged.text
