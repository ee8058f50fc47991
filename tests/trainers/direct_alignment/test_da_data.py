"""Direct-alignment data: loading, built-in set, tokenisation, truncation, collation."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

from tests._helpers.paths import FIXTURES
from trainers.direct_alignment.data import (
    BUILTIN_DATASET,
    MIN_PROMPT_TOKENS,
    SYSTEM_PROMPT,
    DatasetNotFoundError,
    PreferenceRecord,
    TokenizedExample,
    attach_kl_responses,
    builtin_preference_records,
    collate,
    collate_split,
    fingerprint_examples,
    load_preference_records,
    parse_hh_conversation,
    split_train_eval,
    tokenize_records,
)

UF = FIXTURES / "ultrafeedback_cleaned.jsonl"
HH = FIXTURES / "hh_rlhf.jsonl"
PLAIN = FIXTURES / "plain_pairs.jsonl"
KTO = FIXTURES / "kto_unpaired.jsonl"

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _read_as(path: Path, fmt: str, detected: str) -> tuple[list, list[dict]]:
    """The fixture at ``path`` loaded with ``fmt``: read as the ``detected`` format, one record
    a row. Its records and its rows as written."""
    stats: dict = {}
    recs = load_preference_records(str(path), fmt=fmt, stats=stats)
    rows = _rows(path)
    assert stats["format"] == detected and len(recs) == len(rows)
    return recs, rows


# ---------------------------------------------------------------------------------------------
# A throwaway ChatML tokenizer (byte-level BPE trained on the fixture text)
# ---------------------------------------------------------------------------------------------


def _make_tokenizer(chat_template: str = CHATML):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    corpus = [p.read_text() for p in (UF, HH, PLAIN, KTO)]
    corpus += [SYSTEM_PROMPT, "Spell this word backward <think> </think> <answer> </answer>"]
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(corpus * 3, trainer=trainer)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    tok.chat_template = chat_template
    return tok


@pytest.fixture(scope="module", autouse=True)
def _datasets_cache(tmp_path_factory):
    """Keep `datasets`' arrow cache of the fixture files out of the user's home."""
    import datasets

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path_factory.mktemp("hf_datasets"))
        yield


@pytest.fixture(scope="module")
def tokenizer():
    return _make_tokenizer()


def _template_ids(tok, messages, add_generation_prompt):
    return list(
        tok.apply_chat_template(
            messages, add_generation_prompt=add_generation_prompt, tokenize=True, return_dict=False
        )
    )


# ---------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["auto", "ultrafeedback"])
def test_ultrafeedback_fixture(fmt):
    stats: dict = {}
    recs = load_preference_records(str(UF), fmt=fmt, stats=stats)
    rows = _rows(UF)
    assert stats["format"] == "ultrafeedback" and stats["n_records"] == len(rows) == len(recs)
    for rec, row in zip(recs, rows, strict=True):
        assert rec.prompt == [{"role": "user", "content": row["prompt"]}]
        assert rec.chosen == row["chosen"][-1]["content"]
        assert rec.rejected == row["rejected"][-1]["content"]
        assert rec.paired


@pytest.mark.parametrize("fmt", ["auto", "hh"])
def test_hh_fixture_multi_turn(fmt):
    stats: dict = {}
    recs = load_preference_records(str(HH), fmt=fmt, stats=stats)
    assert stats["format"] == "hh" and len(recs) == 5
    # Row 4: three human turns; the prompt keeps the whole history.
    rec = recs[3]
    assert [m["role"] for m in rec.prompt] == ["user", "assistant", "user", "assistant", "user"]
    assert rec.prompt[0]["content"] == "Can you help me pick a houseplant?"
    assert rec.prompt[3]["content"].startswith("A snake plant or a ZZ plant")
    assert rec.prompt[-1]["content"] == "Which one needs less water?"
    assert rec.chosen == "The ZZ plant; water it only when the soil is fully dry."
    assert rec.rejected == ""  # real HH has empty final assistant turns
    # Row 2: two human turns.
    assert [m["role"] for m in recs[1].prompt] == ["user", "assistant", "user"]
    assert recs[1].rejected == "Buy bread at the shop instead."
    # Row 5: chosen and rejected prompts differ -> chosen's prompt, counted.
    assert stats["prompt_mismatch"] == 1
    assert recs[4].prompt == [{"role": "user", "content": "What should I pack for a day hike?"}]
    assert recs[4].rejected == "Nothing at all."


def test_parse_hh_conversation_roles_and_whitespace():
    msgs = parse_hh_conversation("\n\nHuman: hi there \n\nAssistant:  hello\n\nHuman: bye")
    assert msgs == [
        {"role": "user", "content": "hi there"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "bye"},
    ]


@pytest.mark.parametrize("fmt", ["auto", "plain"])
def test_plain_fixture(fmt):
    recs, rows = _read_as(PLAIN, fmt, "plain")
    assert recs[0].prompt == [{"role": "user", "content": rows[0]["prompt"]}]
    assert (recs[0].chosen, recs[0].rejected) == (rows[0]["chosen"], rows[0]["rejected"])


@pytest.mark.parametrize("fmt", ["auto", "unpaired"])
def test_unpaired_fixture(fmt):
    recs, rows = _read_as(KTO, fmt, "unpaired")
    for rec, row in zip(recs, rows, strict=True):
        assert not rec.paired
        if row["label"]:
            assert rec.chosen == row["completion"] and rec.rejected is None
        else:
            assert rec.rejected == row["completion"] and rec.chosen is None


def test_forced_format_that_does_not_fit_names_columns():
    with pytest.raises(ValueError, match=r"missing columns \['completion', 'label'\]") as info:
        load_preference_records(str(PLAIN), fmt="unpaired")
    assert "chosen" in str(info.value) and "prompt" in str(info.value)
    with pytest.raises(ValueError, match="unknown preference format"):
        load_preference_records(str(PLAIN), fmt="sharegpt")


def test_unknown_schema_names_columns(tmp_path):
    path = tmp_path / "qa.jsonl"
    path.write_text(json.dumps({"question": "2+2?", "answer": "4"}) + "\n")
    with pytest.raises(ValueError, match="unrecognised preference schema") as info:
        load_preference_records(str(path))
    msg = str(info.value)
    assert "'answer'" in msg and "'question'" in msg and "chosen" in msg and "completion" in msg


def test_missing_local_file_is_clear():
    for missing in ("tests/fixtures/nope.jsonl", "/no/such/dir/data", "missing.parquet"):
        with pytest.raises(DatasetNotFoundError) as info:
            load_preference_records(missing)
        assert isinstance(info.value, ValueError)
        assert missing in str(info.value) and "does not exist" in str(info.value)
        assert BUILTIN_DATASET in str(info.value)


def test_hub_offline_is_clear():
    import datasets
    import huggingface_hub.constants

    # the suite runs offline (tests/conftest.py sets HF_HUB_OFFLINE=1 before any import)
    assert datasets.config.HF_HUB_OFFLINE and huggingface_hub.constants.HF_HUB_OFFLINE
    with pytest.raises(DatasetNotFoundError) as info:
        load_preference_records("no-such-org/no-such-preferences-xyz")
    msg = str(info.value)
    assert "no-such-org/no-such-preferences-xyz" in msg and BUILTIN_DATASET in msg
    assert "HF_HUB_OFFLINE is set" in msg


def test_hub_connection_error_is_clear():
    """An unreachable hub is the same clear error as offline mode (the path of a hub id to it is
    the test above), naming the built-in preference set."""
    from trainers.core.datasets import hub_dataset_error, is_hub_error
    from trainers.core.preferences import _builtin_hint

    failure = ConnectionError("network is unreachable")
    assert is_hub_error(failure) and not is_hub_error(KeyError("chosen"))
    err = hub_dataset_error(
        "argilla/ultrafeedback-binarized-preferences-cleaned", failure, _builtin_hint()
    )
    assert isinstance(err, DatasetNotFoundError)
    assert "network is unreachable" in str(err) and "builtin:reasoning-preferences" in str(err)


def test_parquet_csv_and_folder(tmp_path):
    import datasets

    rows = _rows(PLAIN)
    ds = datasets.Dataset.from_list(rows)
    ds.to_parquet(str(tmp_path / "pairs.parquet"))
    ds.to_csv(str(tmp_path / "pairs.csv"), index=False)
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "train.jsonl").write_text(PLAIN.read_text())
    for source in (tmp_path / "pairs.parquet", tmp_path / "pairs.csv", folder):
        recs = load_preference_records(str(source))
        assert [r.chosen for r in recs] == [r["chosen"] for r in rows], source


def test_conversational_trl_formats(tmp_path):
    pref = tmp_path / "conv_pref.jsonl"
    pref.write_text(
        json.dumps(
            {
                "prompt": [
                    {"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "Capital of France?"},
                ],
                "chosen": [{"role": "assistant", "content": "Paris."}],
                "rejected": [{"role": "assistant", "content": "Lyon."}],
            }
        )
        + "\n"
    )
    (rec,) = load_preference_records(str(pref))
    assert [m["role"] for m in rec.prompt] == ["system", "user"]
    assert (rec.chosen, rec.rejected) == ("Paris.", "Lyon.")

    kto = tmp_path / "conv_kto.jsonl"
    kto.write_text(
        json.dumps(
            {
                "prompt": [{"role": "user", "content": "Say hi."}],
                "completion": [{"role": "assistant", "content": "Hi!"}],
                "label": False,
            }
        )
        + "\n"
    )
    (rec,) = load_preference_records(str(kto))
    assert rec.chosen is None and rec.rejected == "Hi!"


def test_max_samples_shuffles_deterministically():
    full = load_preference_records(str(UF))
    a = load_preference_records(str(UF), max_samples=3, seed=1)
    b = load_preference_records(str(UF), max_samples=3, seed=1)
    assert a == b and len(a) == 3
    assert all(r in full for r in a)
    heads = {
        tuple(r.chosen for r in load_preference_records(str(UF), max_samples=3, seed=s))
        for s in range(6)
    }
    assert len(heads) > 1  # the seed matters
    assert heads != {tuple(r.chosen for r in full[:3])}  # not simply the first N rows
    assert len(load_preference_records(str(UF), max_samples=100)) == len(full)


def test_split_train_eval():
    items = list(range(50))
    train, evals = split_train_eval(items, eval_fraction=0.2, seed=3)
    assert len(evals) == 10 and len(train) == 40
    assert sorted(train + evals) == items and not set(train) & set(evals)
    assert train == sorted(train) and evals == sorted(evals)  # input order kept
    assert split_train_eval(items, eval_fraction=0.2, seed=3) == (train, evals)
    assert split_train_eval(items, eval_fraction=0.2, seed=4) != (train, evals)
    train, evals = split_train_eval(items, eval_size=7, seed=3)
    assert len(evals) == 7 and len(train) == 43
    assert len(split_train_eval([1, 2], eval_fraction=0.1)[1]) == 1
    with pytest.raises(ValueError):
        split_train_eval(items, eval_fraction=1.0)


# ---------------------------------------------------------------------------------------------
# Built-in offline set
# ---------------------------------------------------------------------------------------------


def _rg():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import reasoning_gym
        import reasoning_gym.utils
    return reasoning_gym


def test_builtin_deterministic_and_scored():
    rg = _rg()
    recs = builtin_preference_records(90, seed=7)
    assert recs == builtin_preference_records(90, seed=7)
    assert recs != builtin_preference_records(90, seed=8)
    assert len(recs) == 90
    kinds = {r.meta["rejected_kind"] for r in recs}
    assert kinds == {"wrong_answer", "no_tags", "answer_outside_tags"}
    assert {r.meta["task"] for r in recs} == {"spell_backward", "chain_sum", "letter_counting"}
    score_fns = {}
    for rec in recs:
        assert rec.prompt[0] == {"role": "system", "content": SYSTEM_PROMPT}
        assert rec.prompt[1]["role"] == "user"
        assert rec.prompt[1]["content"] == rec.meta["entry"]["question"]
        for tag in ("<think>", "</think>", "<answer>", "</answer>"):
            assert tag in rec.chosen
        task = rec.meta["task"]
        score = score_fns.setdefault(task, rg.get_score_answer_fn(task))
        entry = rec.meta["entry"]
        assert score(rg.utils.extract_answer(rec.chosen), entry) == 1.0
        assert score(rg.utils.extract_answer(rec.rejected), entry) < 1.0
        assert rec.chosen != rec.rejected


def test_builtin_task_choice_and_loader():
    recs = builtin_preference_records(12, seed=0, tasks=["spell_backward"])
    assert {r.meta["task"] for r in recs} == {"spell_backward"}
    via_loader = load_preference_records(BUILTIN_DATASET, max_samples=12, seed=0)
    assert via_loader == builtin_preference_records(12, seed=0)
    only_sums = load_preference_records(f"{BUILTIN_DATASET}:chain_sum", max_samples=5)
    assert {r.meta["task"] for r in only_sums} == {"chain_sum"}
    test_split = load_preference_records(BUILTIN_DATASET, split="test", max_samples=12, seed=0)
    assert test_split != via_loader
    with pytest.raises(DatasetNotFoundError):
        load_preference_records("builtin:no-such-set")
    with pytest.raises(ValueError, match="no_such_task"):
        builtin_preference_records(3, seed=0, tasks=["no_such_task"])


# ---------------------------------------------------------------------------------------------
# Tokenisation and truncation
# ---------------------------------------------------------------------------------------------


def test_tokenize_matches_chat_template(tokenizer):
    recs = load_preference_records(str(HH))
    examples, stats = tokenize_records(recs, tokenizer, max_length=4096)
    assert stats["n_in"] == stats["n_out"] == 5
    assert (
        stats["dropped_identical"] == stats["truncated_prompt"] == stats["truncated_response"] == 0
    )
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    for rec, ex in zip(recs, examples, strict=True):
        assert ex.prompt_ids == _template_ids(tokenizer, rec.prompt, True)
        full = _template_ids(
            tokenizer, rec.prompt + [{"role": "assistant", "content": rec.chosen}], False
        )
        assert ex.prompt_ids + ex.chosen_ids == full
        assert im_end in ex.chosen_ids[-2:] and im_end in ex.rejected_ids[-2:]
        assert tokenizer.decode(ex.chosen_ids).startswith(rec.chosen)
    # The empty rejected response still carries the end-of-turn tokens.
    assert 0 < len(examples[3].rejected_ids) <= 2


def test_tokenize_unpaired(tokenizer):
    recs = load_preference_records(str(KTO))
    examples, stats = tokenize_records(recs, tokenizer, max_length=256)
    assert stats["n_out"] == len(recs)
    for rec, ex in zip(recs, examples, strict=True):
        assert (ex.chosen_ids is None) == (rec.chosen is None)
        assert (ex.rejected_ids is None) == (rec.rejected is None)


def test_truncation_keeps_response_and_cuts_prompt_left(tokenizer):
    long_prompt = " ".join(["the cat sat on the mat"] * 40)
    rec = PreferenceRecord(
        prompt=[{"role": "user", "content": long_prompt}],
        chosen="The capital of Italy is Rome.",
        rejected="Milan.",
    )
    (full,), _ = tokenize_records([rec], tokenizer, max_length=10_000)
    max_length = len(full.chosen_ids) + 20
    (ex,), stats = tokenize_records([rec], tokenizer, max_length=max_length)
    assert stats["truncated_prompt"] == 1 and stats["truncated_response"] == 0
    assert ex.chosen_ids == full.chosen_ids and ex.rejected_ids == full.rejected_ids
    assert ex.prompt_ids == full.prompt_ids[-len(ex.prompt_ids) :]  # left cut: the tail survives
    assert len(ex.prompt_ids) + len(ex.chosen_ids) == max_length
    # The generation header (the prompt's end) is intact.
    assert ex.prompt_ids[-3:] == full.prompt_ids[-3:]

    # max_prompt_length is honoured on its own.
    (ex,), stats = tokenize_records([rec], tokenizer, max_length=10_000, max_prompt_length=16)
    assert ex.prompt_ids == full.prompt_ids[-16:] and stats["truncated_prompt"] == 1

    # A response longer than the whole budget: the prompt keeps a few tokens, the response is
    # cut on the right.
    long_resp = PreferenceRecord(prompt=rec.prompt, chosen=long_prompt, rejected="No.")
    (ex,), stats = tokenize_records([long_resp], tokenizer, max_length=40)
    assert len(ex.prompt_ids) == MIN_PROMPT_TOKENS
    assert len(ex.prompt_ids) + len(ex.chosen_ids) == 40
    assert stats["truncated_response"] == 1
    (uncut,), _ = tokenize_records([long_resp], tokenizer, max_length=10_000)
    assert ex.chosen_ids == uncut.chosen_ids[: len(ex.chosen_ids)]
    assert ex.rejected_ids == uncut.rejected_ids


def test_identical_after_truncation_dropped(tokenizer):
    prompt = [{"role": "user", "content": "Tell me a story."}]
    shared = " ".join(["the cat sat on the mat"] * 20)
    recs = [
        PreferenceRecord(prompt=prompt, chosen=shared + " The end.", rejected=shared + " Bye."),
        PreferenceRecord(prompt=prompt, chosen="same", rejected="same"),
        PreferenceRecord(prompt=prompt, chosen="Rome.", rejected="Milan."),
    ]
    examples, stats = tokenize_records(recs, tokenizer, max_length=10_000)
    assert stats["dropped_identical"] == 1 and stats["n_out"] == 2
    examples, stats = tokenize_records(recs, tokenizer, max_length=40)
    assert stats["dropped_identical"] == 2 and stats["n_out"] == 1
    assert stats["n_in"] == 3
    assert examples[0].chosen_ids != examples[0].rejected_ids


def test_prefix_fallback_when_template_rewrites_prompt(tokenizer):
    # This template opens the generation prompt with an empty think block that the rendered
    # conversation does not contain, so the prompt is not a prefix of the full conversation.
    odd = _make_tokenizer(
        CHATML.replace(
            "'<|im_start|>assistant\n'", "'<|im_start|>assistant\n<think>\n\n</think>\n\n'"
        )
    )
    rec = PreferenceRecord(
        prompt=[{"role": "user", "content": "hi"}], chosen="Rome.", rejected="Milan."
    )
    (ex,), stats = tokenize_records([rec], odd, max_length=256)
    assert stats["prefix_fallback"] == 2
    assert ex.chosen_ids == odd("Rome.", add_special_tokens=False)["input_ids"] + [odd.eos_token_id]


def test_tokenizer_without_template_is_clear(tokenizer):
    bare = _make_tokenizer()
    bare.chat_template = None
    rec = PreferenceRecord(prompt=[{"role": "user", "content": "hi"}], chosen="a", rejected="b")
    with pytest.raises(ValueError, match="chat template"):
        tokenize_records([rec], bare, max_length=64)


# ---------------------------------------------------------------------------------------------
# Collation, KL responses, fingerprint
# ---------------------------------------------------------------------------------------------


def _ex(p, c, r, kl=None):
    return TokenizedExample(prompt_ids=p, chosen_ids=c, rejected_ids=r, kl_response_ids=kl)


def test_collate_paired_layout():
    examples = [_ex([1, 2, 3], [4, 5], [6]), _ex([7], [8, 9, 10, 11], [12, 13])]
    batch = collate(examples, pad_id=0)
    assert batch["paired"] is True
    ids, attn, mask = batch["input_ids"], batch["attention_mask"], batch["loss_mask"]
    assert ids.shape == attn.shape == mask.shape == (4, 5)  # longest row: 1 + 4 tokens
    assert ids.dtype == torch.long
    assert ids.tolist() == [
        [1, 2, 3, 4, 5],
        [7, 8, 9, 10, 11],
        [1, 2, 3, 6, 0],
        [7, 12, 13, 0, 0],
    ]
    assert attn.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 1], [1, 1, 1, 1, 0], [1, 1, 1, 0, 0]]
    assert mask.tolist() == [[0, 0, 0, 1, 1], [0, 1, 1, 1, 1], [0, 0, 0, 1, 0], [0, 1, 1, 0, 0]]
    assert batch["chosen_index"].tolist() == [0, 1]
    assert batch["rejected_index"].tolist() == [2, 3]
    assert batch["kl_index"].tolist() == []
    assert batch["row_example"].tolist() == [0, 1, 0, 1]


def test_collate_pads_to_batch_longest_not_max_length(tokenizer):
    recs = load_preference_records(str(PLAIN))
    examples, _ = tokenize_records(recs, tokenizer, max_length=1024)
    batch = collate(examples[:2], pad_id=tokenizer.pad_token_id)
    longest = max(
        len(e.prompt_ids) + len(r) for e in examples[:2] for r in (e.chosen_ids, e.rejected_ids)
    )
    assert batch["input_ids"].shape == (4, longest) and longest < 1024
    n_response = sum(len(e.chosen_ids) + len(e.rejected_ids) for e in examples[:2])
    assert int(batch["loss_mask"].sum()) == n_response
    assert bool((batch["loss_mask"] <= batch["attention_mask"]).all())
    pad = batch["input_ids"][batch["attention_mask"] == 0]
    assert bool((pad == tokenizer.pad_token_id).all())


def test_collate_unpaired_and_kl():
    examples = [_ex([1], [2], None), _ex([3], None, [4, 5]), _ex([6, 7], [8], None)]
    batch = collate(examples, pad_id=-1)
    assert batch["paired"] is False
    assert batch["chosen_index"].tolist() == [0, 1]
    assert batch["rejected_index"].tolist() == [2]
    assert batch["row_example"].tolist() == [0, 2, 1]
    with pytest.raises(ValueError, match="kl_response_ids"):
        collate(examples, pad_id=0, with_kl=True)

    with_kl = attach_kl_responses(examples)
    batch = collate(with_kl, pad_id=0, with_kl=True)
    assert batch["kl_index"].tolist() == [3, 4, 5]
    assert batch["input_ids"][3].tolist()[:2] == [1, 4]  # prompt 0 + rejected of example 1
    assert batch["loss_mask"][5].tolist() == [0, 0, 1]  # prompt of example 2, response of 0


def test_collate_split_holds_the_same_rows_prompt_left_response_right():
    examples = attach_kl_responses(
        [_ex([1, 2, 3], [4, 5], [6]), _ex([7], [8, 9, 10, 11], [12, 13]), _ex([14, 15], [16], None)]
    )
    right, split = collate(examples, 0, with_kl=True), collate_split(examples, 0, with_kl=True)
    for key in ("chosen_index", "rejected_index", "kl_index", "row_example"):
        assert torch.equal(right[key], split[key]), key
    assert split["paired"] is right["paired"] is False
    width_p = split["prompt_width"]
    assert width_p == 3 and split["completion_mask"].shape == (8, 4)
    assert split["input_ids"][1].tolist() == [0, 0, 7, 8, 9, 10, 11]
    assert split["attention_mask"][1].tolist() == [0, 0, 1, 1, 1, 1, 1]
    assert split["input_ids"][3].tolist() == [1, 2, 3, 6, 0, 0, 0]
    for row in range(8):  # the same tokens, in the same order
        kept = split["input_ids"][row][split["attention_mask"][row].bool()]
        assert (
            kept.tolist() == right["input_ids"][row][right["attention_mask"][row].bool()].tolist()
        )
        assert split["completion_mask"][row].sum() == right["loss_mask"][row].sum()


def test_attach_kl_responses_mismatches_prompts(tokenizer):
    recs = load_preference_records(str(KTO))
    examples, _ = tokenize_records(recs, tokenizer, max_length=256)
    with_kl = attach_kl_responses(examples)
    n = len(examples)
    for i, ex in enumerate(with_kl):
        nxt = examples[(i + 1) % n]
        expected = nxt.chosen_ids if nxt.chosen_ids is not None else nxt.rejected_ids
        assert ex.kl_response_ids == expected
        assert ex.prompt_ids == examples[i].prompt_ids
        assert (ex.chosen_ids, ex.rejected_ids) == (
            examples[i].chosen_ids,
            examples[i].rejected_ids,
        )
    # Example 5 ("cat" prompt) is paired with the answer about planets: a mismatched pair.
    assert tokenizer.decode(with_kl[4].kl_response_ids).startswith("Mercury")
    assert all(e.kl_response_ids is None for e in examples)  # inputs untouched
    capped = attach_kl_responses(examples, max_length=len(examples[0].prompt_ids) + 2)
    assert len(capped[0].kl_response_ids) == 2
    assert attach_kl_responses([]) == []
    (single,) = attach_kl_responses(examples[:1])  # allowed (with a warning), not mismatched
    assert single.kl_response_ids == examples[0].chosen_ids


def test_fingerprint_stable_and_sensitive():
    examples = [_ex([1, 2, 3], [4, 5], [6]), _ex([7], None, [8, 9])]
    fp = fingerprint_examples(examples)
    # Pinned value: the digest must not depend on the process (no Python hash()).
    assert fp == "da4d32b8df5d28004e77b899774405254a8924351cd4d80ecf5f0fe2841f6da2"
    assert fp == fingerprint_examples([_ex([1, 2, 3], [4, 5], [6]), _ex([7], None, [8, 9])])
    changed = [
        [_ex([1, 2, 3], [4, 5], [7]), examples[1]],
        [examples[1], examples[0]],
        [examples[0]],
        [_ex([1, 2, 3], [4, 5], [6]), _ex([7], [8, 9], None)],
        attach_kl_responses(examples),
        [_ex([1, 2], [3, 4, 5], [6]), examples[1]],
    ]
    digests = {fingerprint_examples(c) for c in changed}
    assert fp not in digests and len(digests) == len(changed)


def test_builtin_task_settings_reach_the_prompts():
    """data.builtin_task_configs narrows a task (here one-digit, two-term chain sums, the tiny
    warm start's own task) for the built-in preference set; without it the defaults hold."""
    import re

    from trainers.core.preferences import configured_preference_records
    from trainers.direct_alignment.config import DirectAlignmentConfig

    def operands(recs) -> list[list[str]]:
        return [re.findall(r"\d+", r.meta["entry"]["question"].split(":")[-1]) for r in recs]

    narrow = {"chain_sum": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}}
    cfg = DirectAlignmentConfig.model_validate(
        {
            "model": {"name": "tiny"},
            "data": {
                "dataset": BUILTIN_DATASET,
                "max_samples": 40,
                "builtin_tasks": ["chain_sum"],
                "builtin_task_configs": narrow,
            },
        }
    )
    recs = configured_preference_records(cfg.data, cfg.seed)
    assert recs == builtin_preference_records(40, seed=42, tasks=["chain_sum"], settings=narrow)
    assert all(len(ops) == 2 and all(len(o) == 1 for o in ops) for ops in operands(recs))
    default = builtin_preference_records(40, seed=42, tasks=["chain_sum"])
    assert any(len(ops) == 3 or any(len(o) == 2 for o in ops) for ops in operands(default))
