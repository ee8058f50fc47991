"""What a launch asks for: :class:`RunRequest`, built once by a surface (the CLI's ``launch``, the
MCP tool ``launch_run``, a sweep, a pipeline stage, the demo), validated once when it is built,
and handed to :func:`rlhf_lab.api.launch`. Its overrides are typed pairs
(:class:`~rlhf_lab.planning.overrides.Override`, parsed from ``key=value`` the way the trainer's
``--set`` parses them), handed as such to planning's resolve and shrink. Building one with a malformed field raises a :class:`~rlhf_lab.errors.LabError`, never
a raw pydantic error (:class:`LabModel`). Torch-free.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, Field, ValidationError
from pydantic.json_schema import SkipJsonSchema

from rlhf_lab.api._operation import lab_error
from rlhf_lab.planning.overrides import FIX_OVERRIDES, Override

__all__ = ["FIX_OVERRIDES", "LabModel", "Override", "RunRequest", "SweepRequest"]


class LabModel(BaseModel):
    """A model whose malformed fields are a :class:`~rlhf_lab.errors.LabError` when it is built
    from Python (the LabError a validator raised, else one line per field)."""

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as err:
            properties = type(self).model_json_schema().get("properties", {})
            raise lab_error(err.errors(include_url=False), properties) from None


def _override_item(value: Any) -> Any:
    """A ``key=value`` string parsed into an :class:`Override`; anything else is left to the
    model's validation (an Override, a mapping of its fields, or a wrong type)."""
    return Override.parse(value) if isinstance(value, str) else value


OverrideItem = Annotated[Override, BeforeValidator(_override_item, json_schema_input_type=str)]

# the arguments a launch and a sweep (and the operations' argument models) share, described once
OverrideItems = Annotated[
    list[OverrideItem], Field(description="key=value, e.g. train.max_steps=20")
]
RecipeArg = Annotated[str, Field(description="recipe, algorithm (dpo, grpo, ...) or YAML")]
ModelArg = Annotated[str | None, Field(description="tiny, run:<id>, a folder, .gguf or hub id")]
CampaignArg = Annotated[str | None, Field(description="campaign slug")]
DeviceName = Annotated[str, Field(description="auto, cpu, cuda or cuda:N")]


class RunRequest(LabModel):
    """One launch: which recipe, with what changes, where, in which campaign, after what.
    Every surface builds one and hands it to :func:`rlhf_lab.api.launch`; the resolved config it
    leads to is written once, as the run's ``config.yaml``."""

    recipe: RecipeArg
    overrides: OverrideItems = []
    shrink: Annotated[bool, Field(description="false: the full recipe")] = True
    model: ModelArg = None
    campaign: CampaignArg = None
    question: Annotated[str | None, Field(description="the question of a new campaign")] = None
    device: DeviceName = "auto"
    queue: Annotated[bool, Field(description="wait for the device")] = False
    force: Annotated[bool, Field(description="start on a busy device")] = False
    after: Annotated[list[str], Field(description="run ids to wait for")] = []
    gpus: Annotated[str | int | None, Field(description="GPU ids 0,1 or a count")] = None
    nproc: Annotated[int | None, Field(description="CPU ranks")] = None
    slurm: Annotated[
        dict[str, Any] | None,
        Field(description="Slurm job options (nodes, gpus_per_node, ...)"),
    ] = None
    calibrate: Annotated[bool, Field(description="false: no difficulty probe")] = True
    # set by the lab, not offered to a client: a sweep's seed, a pipeline's stage
    seed: SkipJsonSchema[int | None] = Field(
        default=None, description="the run's seed, applied after the overrides (None: theirs)"
    )
    pipeline: SkipJsonSchema[str | None] = Field(default=None, description="its pipeline")
    stage: SkipJsonSchema[str | None] = Field(default=None, description="its pipeline stage")

    def override_pairs(self) -> list[Override]:
        """The overrides as pairs, the seed last."""
        seed = [] if self.seed is None else [Override.of("seed", self.seed)]
        return [*self.overrides, *seed]

    def override_texts(self) -> list[str]:
        """The overrides as ``key=value`` items (as written), the seed last."""
        return [o.text for o in self.override_pairs()]


class SweepRequest(LabModel):
    """Matched runs of several recipes in one campaign: one :class:`RunRequest` per recipe and
    seed, with the same overrides and shrink (:func:`rlhf_lab.api.sweep`)."""

    recipes: Annotated[list[str], Field(description="recipes, e.g. ['dpo','ipo']")]
    overrides: OverrideItems = []
    shrink: Annotated[bool, Field(description="shrink each to a sanity run")] = True
    model: ModelArg = None
    campaign: CampaignArg = None
    device: DeviceName = "auto"
    seeds: Annotated[int, Field(description="runs per recipe")] = 1
    base_seed: Annotated[int | None, Field(description="first seed (null: the first recipe's)")] = (
        None
    )
