"""The two typed shapes a config travels in through the lab: :class:`Override` pairs and the
read-only :class:`TrainerConfig` view of a resolved config."""

from __future__ import annotations

import pytest

from rlhf_lab.errors import InvalidArgument, LabError
from rlhf_lab.planning.configs import resolve_config
from rlhf_lab.planning.overrides import FIX_OVERRIDES, Override, as_overrides, texts
from rlhf_lab.planning.trainer_config import TrainerConfig

DATA = {
    "model": {"name": "tiny", "lora": {"enabled": False}},
    "data": {"specs": [{"name": "chain_sum"}], "eval_size": None},
    "selection": {"top_k": 8},
}


def test_the_view_reads_by_dotted_key_and_hands_out_copies():
    view = TrainerConfig("policy_gradients", DATA)
    assert view.get("model.name") == "tiny" and view.get("model.missing", 3) == 3
    assert view.has("data.eval_size") and not view.has("data.missing")
    specs = view.get("data.specs")
    specs.append({"name": "other"})  # a copy: the view is unchanged
    assert view.get("data.specs") == [{"name": "chain_sum"}]
    written = view.to_data()
    written["model"]["name"] = "changed"
    assert view.get("model.name") == "tiny"


def test_the_view_finds_leaves_wherever_a_family_keeps_them():
    view = TrainerConfig("rejection_sampling", DATA)
    assert view.find_key("top_k") == "selection.top_k"
    assert view.leaf("top_k") == 8 and view.leaf("eval_size", 5) == 5  # null counts as absent
    assert ("model.lora.enabled", False) in view.leaves()


def test_the_view_of_a_resolved_config_carries_its_validated_model():
    resolved = resolve_config("dpo", [Override.parse("train.learning_rate=1e-5")])
    view = resolved.config
    assert view.family == "direct_alignment" and view.get("train.learning_rate") == 1e-5
    assert view.model.train.learning_rate == 1e-5
    assert TrainerConfig("direct_alignment", resolved.data) == view  # data from disk: same view


def test_a_view_built_from_data_validates_its_model_on_first_use():
    view = TrainerConfig("direct_alignment", {"model": {"name": "tiny"}, "bogus": 1})
    assert view.get("bogus") == 1  # reading needs no validation
    with pytest.raises(LabError):
        _ = view.model


def test_overrides_parse_once_and_keep_their_text():
    item = Override.parse("data.specs=[{name: chain_sum}]")
    assert item.key == "data.specs" and item.value == [{"name": "chain_sum"}]
    assert item.text == "data.specs=[{name: chain_sum}]"
    assert Override.of("model.lora.enabled", True).text == "model.lora.enabled=true"
    pairs = as_overrides(["seed=3", item])
    assert pairs[1] is item and texts(pairs) == ["seed=3", item.text]


def test_a_malformed_override_names_the_fix_only_at_the_edge():
    with pytest.raises(InvalidArgument) as at_edge:
        Override.parse("no-equals-sign")
    assert at_edge.value.next_steps == (FIX_OVERRIDES,)
    with pytest.raises(InvalidArgument) as inside:
        as_overrides(["no-equals-sign"])  # as resolving refused it before: the message alone
    assert inside.value.message == at_edge.value.message and not inside.value.next_steps
