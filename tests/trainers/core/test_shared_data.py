"""The shared data code in trainers/core: message parsing, local loading, seeded splits,
tokenisation helpers, and fingerprints of every family's built-in dataset (a change to any
generator's draws fails here before it silently changes what the learning tests train on)."""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import json
from pathlib import Path

import pytest

from trainers.core.datasets import (
    DatasetNotFoundError,
    open_split,
    read_json_rows,
    read_rows,
)
from trainers.core.messages import (
    NoAssistantTurnError,
    as_messages,
    end_at_last_assistant,
    require_last_assistant_split,
    split_at_last_assistant,
    system_and_user,
)
from trainers.core.splits import (
    collect_records,
    hold_out,
    rows_to_read,
    seeded_order,
    shuffled,
    split_seed,
    split_train_eval,
)

TRAINERS = Path(__file__).resolve().parents[3] / "trainers"
FAMILIES = ("direct_alignment", "policy_gradients", "rejection_sampling", "reward_models", "sft")

# ---- message parsing --------------------------------------------------------------------------


def test_as_messages_reads_strings_lists_and_none() -> None:
    assert as_messages(None) == []
    assert as_messages("hi") == [{"role": "user", "content": "hi"}]
    got = as_messages([{"role": "system", "content": None}, {"role": "user", "content": 3}])
    assert got == [{"role": "system", "content": ""}, {"role": "user", "content": "3"}]
    extra = as_messages([{"role": "user", "content": "q", "name": "x"}])
    assert extra == [{"role": "user", "content": "q"}]  # extra keys are dropped


@pytest.mark.parametrize(
    "value, fragment",
    [
        ([{"content": "no role"}], "'role'"),
        (["plain string in a list"], "'role'"),
        (42, "int"),
        ({"role": "user"}, "dict"),
    ],
)
def test_as_messages_rejects_what_is_not_a_conversation(value: object, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        as_messages(value)


def test_cutting_at_the_last_assistant_turn() -> None:
    conv = as_messages(
        [
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": "b"},
            {"role": "user", "content": "c"},
            {"role": "assistant", "content": "d"},
            {"role": "user", "content": "trailing"},
        ]
    )
    prompt, response = split_at_last_assistant(conv)
    assert response == "d" and [m["content"] for m in prompt] == ["a", "b", "c"]
    assert [m["content"] for m in end_at_last_assistant(conv)] == ["a", "b", "c", "d"]


def test_a_conversation_without_an_assistant_turn() -> None:
    conv = system_and_user("sys", "question")
    assert conv == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "question"},
    ]
    assert split_at_last_assistant(conv) is None
    assert end_at_last_assistant(conv) is None
    with pytest.raises(NoAssistantTurnError, match=r"no assistant turn \(roles: \['system'"):
        require_last_assistant_split(conv)
    assert require_last_assistant_split([*conv, {"role": "assistant", "content": "x"}]) == (
        conv,
        "x",
    )


# ---- local loading ----------------------------------------------------------------------------


def test_read_rows_from_json_and_jsonl_files(tmp_path: Path) -> None:
    rows = [{"a": 1, "nested": {"b": [1, 2]}}, {"a": 2, "nested": {"b": []}}]
    jsonl = tmp_path / "rows.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    as_list = tmp_path / "rows.json"
    as_list.write_text(json.dumps(rows))
    assert read_rows(str(jsonl), "train", "hint") == rows
    assert read_rows(str(as_list), "train", "hint") == rows
    assert read_json_rows(as_list) == rows


def test_bad_json_lines_name_the_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"a": 1}\n{not json}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: not valid JSON"):
        read_json_rows(bad)
    scalars = tmp_path / "scalars.json"
    scalars.write_text("[1, 2]")
    with pytest.raises(ValueError, match="every row must be a JSON object"):
        read_json_rows(scalars)


def test_a_missing_file_says_so_and_ends_with_the_hint(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.jsonl")
    for reader in (read_rows, open_split):
        with pytest.raises(DatasetNotFoundError, match="does not exist") as info:
            reader(missing, "train", "Use builtin:x offline.")
        assert str(info.value).endswith("Use builtin:x offline.")


def test_an_unsupported_file_type_is_named(tmp_path: Path) -> None:
    odd = tmp_path / "rows.txt"
    odd.write_text("x")
    with pytest.raises(ValueError, match="unsupported data file"):
        read_rows(str(odd), "train", "hint")


# ---- splits and seeded orders -----------------------------------------------------------------


def test_seeded_orders_are_permutations_that_depend_only_on_the_seed() -> None:
    assert sorted(seeded_order(30, 1)) == list(range(30))
    assert seeded_order(30, 1) == seeded_order(30, 1)
    assert seeded_order(30, 1) != seeded_order(30, 2)
    assert shuffled("abcdef", 4) == ["abcdef"[i] for i in seeded_order(6, 4)]


def test_split_train_eval_is_deterministic_disjoint_and_ordered() -> None:
    records = list(range(40))
    train, evals = split_train_eval(records, eval_fraction=0.25, seed=9)
    assert (train, evals) == split_train_eval(records, eval_fraction=0.25, seed=9)
    assert len(evals) == 10 and sorted(train + evals) == records
    assert train == sorted(train) and evals == sorted(evals)  # input order kept
    assert split_train_eval(records, eval_fraction=0.25, seed=10)[1] != evals
    assert split_train_eval(records, eval_size=3, seed=9)[1] == hold_out(records, 3, 9)[1]
    assert len(split_train_eval([1, 2], eval_fraction=0.01)[1]) == 1  # at least one held out
    with pytest.raises(ValueError, match="eval_size"):
        split_train_eval(records, eval_size=41)


def test_named_splits_of_a_generated_set_get_distant_seeds() -> None:
    assert split_seed(5, "train") == 5
    test_seed, val_seed = split_seed(5, "test"), split_seed(5, "validation")
    assert test_seed != val_seed and min(test_seed, val_seed) - 5 >= 1_000_003
    assert split_seed(5, "test") == test_seed


def test_rows_to_read_and_collect_records() -> None:
    rows = list(range(10))
    in_order, limit = rows_to_read(rows, None, 0)
    assert list(in_order) == rows and limit == 10
    sampled, limit = rows_to_read(rows, 4, 0)
    assert list(sampled) == shuffled(rows, 0) and limit == 4
    records, n_rows, skipped = collect_records(rows, lambda r: r if r % 3 else None, 4)
    assert records == [1, 2, 4, 5] and (n_rows, skipped) == (6, 2)


# ---- tokenisation helpers ---------------------------------------------------------------------


class _CharTokenizer:
    """A tokenizer stand-in: one id per character, eos = 0."""

    eos_token_id = 0

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict:
        return {"input_ids": [ord(c) for c in text]}


def test_response_ids_follow_the_prompt_or_fall_back_to_text_and_eos() -> None:
    from trainers.core.tokenization import require_chat_template, response_ids

    tok = _CharTokenizer()
    assert response_ids(tok, [1, 2], [1, 2, 7, 8], "zz") == ([7, 8], False)
    assert response_ids(tok, [1, 2], [1, 3, 7], "ab") == ([97, 98, 0], True)
    assert response_ids(tok, [1, 2], [1, 2], "a") == ([97, 0], True)  # nothing after the prompt
    with pytest.raises(ValueError, match="no chat template; X needs one"):
        require_chat_template(tok, "X needs one")


def test_right_pad() -> None:
    from trainers.core.tokenization import right_pad

    ids, mask = right_pad([[5, 6, 7], [8]], pad_id=1)
    assert ids.tolist() == [[5, 6, 7], [8, 1, 1]]
    assert mask.tolist() == [[1, 1, 1], [1, 0, 0]]


# ---- one place per thing ----------------------------------------------------------------------


def _imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_no_family_data_module_imports_another_family() -> None:
    for family in FAMILIES:
        data_modules = [TRAINERS / family / "data.py"]
        if family == "reward_models":
            data_modules += [
                TRAINERS / family / f"{name}.py"
                for name in ("outcome", "preference", "sources", "steps")
            ]
        for path in (p for p in data_modules if p.exists()):
            others = {
                module
                for module in _imported_modules(path)
                if any(module.startswith(f"trainers.{f}.") for f in FAMILIES if f != family)
            }
            assert not others, f"{path.relative_to(TRAINERS)} imports {sorted(others)}"


def test_the_builtin_preference_name_is_the_one_the_configs_use() -> None:
    from trainers.core.preferences import BUILTIN_PREFERENCES
    from trainers.direct_alignment.config import BUILTIN_DATASET
    from trainers.reward_models.config import BUILTIN_PREFERENCES as RM_PREFERENCES

    assert BUILTIN_PREFERENCES == BUILTIN_DATASET == RM_PREFERENCES


def test_old_import_paths_name_the_same_objects() -> None:
    from trainers.core import builtin_data, preferences, records, splits
    from trainers.direct_alignment import data as da_data
    from trainers.reward_models import data as rm_data

    assert da_data.PreferenceRecord is records.PreferenceRecord
    assert da_data.load_preference_records is preferences.load_preference_records
    assert rm_data.tokenize_records is da_data.tokenize_records
    assert rm_data.split_train_eval is da_data.split_train_eval is splits.split_train_eval
    assert rm_data.builtin_step_records is builtin_data.builtin_step_records
    assert rm_data.StepRecord is records.StepRecord


# ---- fingerprints of the built-in datasets ----------------------------------------------------


def _fingerprint(records: list) -> str:
    """SHA-256 over each record's fields as sorted JSON, one line per record, in order."""
    digest = hashlib.sha256()
    for record in records:
        fields = dataclasses.asdict(record)
        digest.update(json.dumps(fields, sort_keys=True, default=str).encode() + b"\n")
    return digest.hexdigest()


def _sft() -> list:
    from trainers.sft.data import builtin_sft_records

    return builtin_sft_records(6, 3)


def _preferences() -> list:
    from trainers.core.builtin_data import builtin_preference_records

    return builtin_preference_records(6, 3)


def _outcomes() -> list:
    from trainers.core.builtin_data import builtin_outcome_records

    return builtin_outcome_records(4, 3, 3)


def _steps() -> list:
    from trainers.core.builtin_data import builtin_step_records

    return builtin_step_records(6, 3)


def _pg_prompts() -> list:
    from trainers.core.config import DatasetSpecSection
    from trainers.core.prompts import composite_prompts as load_prompts

    spec = DatasetSpecSection(name="chain_sum", config={"min_terms": 2, "max_terms": 3})
    train, held_out = load_prompts([spec], 5, 2, 3)
    return train + held_out


@pytest.mark.parametrize(
    "make, expected",
    [
        (_sft, "942c0d54e27422df329940ea3fc1443b8c4130252a81727785a1dad9bcc10659"),
        (_preferences, "52a9841edaa14ef00be1c0c6e28efad2ba969c42b6be9f13e3231623d9382f16"),
        (_outcomes, "c18a92382a093bd30ee785de58ea67b3f4fab991fb42d0c0f9eb384dc31cb4f5"),
        (_steps, "c0dafbbcfe31263bc63766b960be50e8d7cb450556e9b6b51c33b62447a8bdbb"),
        (_pg_prompts, "78f039fd77513aadad5568cc4fb8395b631dff6f6e9ca62d241b921967e37135"),
    ],
    ids=["sft", "preferences", "outcomes", "steps", "pg-prompts"],
)
def test_builtin_datasets_keep_their_fingerprint(make, expected: str) -> None:
    """Pinned on the generators as they were before the data code was shared; a new value means
    the built-in data changed, so every learning test and ledger trained on other data."""
    assert _fingerprint(make()) == expected
