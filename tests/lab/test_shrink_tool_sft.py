"""The shrink of an SFT recipe on the built-in tool-use demonstrations (``builtin:tool-sft``)
onto a preset: the set is kept, its length fits the tool demonstrations, and ``train_on=final``
is refused with the fix."""

from __future__ import annotations

import pytest

from rlhf_lab.paths import LabError
from rlhf_lab.planning.overrides import as_overrides
from rlhf_lab.planning.shrink import shrink_config

TOOL_SFT = ["data.dataset=builtin:tool-sft:chain_sum", "data.train_on=all_assistant"]


def test_a_tool_sft_shrink_keeps_the_set_and_a_length_that_holds_it():
    data = shrink_config("sft", as_overrides(TOOL_SFT), model="tiny").config["data"]
    assert data["dataset"] == "builtin:tool-sft:chain_sum"
    assert data["max_length"] == 320  # the tool demonstrations are up to ~255 tokens on tiny
    plain = shrink_config("sft", [], model="tiny").config["data"]
    assert plain["dataset"] == "builtin:reasoning-sft" and plain["max_length"] == 160
    mine = shrink_config("sft", as_overrides([*TOOL_SFT, "data.max_length=400"]), model="tiny")
    assert mine.config["data"]["max_length"] == 400  # the user's own value wins


def test_a_tool_sft_shrink_with_train_on_final_says_what_to_set():
    with pytest.raises(LabError, match="data.train_on=all_assistant"):
        shrink_config("sft", as_overrides(["data.dataset=builtin:tool-sft"]), model="tiny")
