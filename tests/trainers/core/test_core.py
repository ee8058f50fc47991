"""trainers/core: config loading, run directory, log-probs, schedule, aggregation, checkpoints."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from trainers.core.config import (
    ConfigError,
    OptimSection,
    apply_overrides,
    config_diff,
    load_config,
    parse_override,
)
from trainers.core.logprobs import (
    completion_logps,
    hidden_to_logps,
    padding_sees_itself,
    selective_log_softmax,
    split_completion_logps,
    split_rows,
)
from trainers.core.rundir import RunDir, append_jsonl, atomic_write_json, read_jsonl
from trainers.core.training import (
    StepMetrics,
    build_optimizer,
    clip_and_measure,
    epoch_order,
    list_checkpoints,
    load_checkpoint,
    lr_multiplier,
    optimizer_step,
    save_checkpoint,
)
from trainers.direct_alignment.config import DirectAlignmentConfig

# --------------------------------------------------------------------------------- config


def test_override_parsing_types():
    assert parse_override("train.learning_rate=1e-5") == (["train", "learning_rate"], 1e-5)
    assert parse_override("a=true") == (["a"], True)
    assert parse_override("a=null") == (["a"], None)
    assert parse_override("a=[1, 2]") == (["a"], [1, 2])
    assert parse_override("model.name=tiny") == (["model", "name"], "tiny")
    with pytest.raises(ConfigError, match="key=value"):
        parse_override("no_equals_sign")
    with pytest.raises(ConfigError, match="dotted identifiers"):
        parse_override("../etc=1")


def test_apply_overrides_nested_and_copy():
    base = {"train": {"batch_size": 4}}
    out = apply_overrides(base, ["train.batch_size=8", "data.max_samples=64"])
    assert out == {"train": {"batch_size": 8}, "data": {"max_samples": 64}}
    assert base == {"train": {"batch_size": 4}}
    with pytest.raises(ConfigError, match="is a value"):
        apply_overrides({"seed": 1}, ["seed.x=2"])


def test_unknown_key_suggests_closest(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("loss: dpo\ntrain:\n  learning_rat: 1.0e-5\n")
    with pytest.raises(ConfigError) as err:
        load_config(path, DirectAlignmentConfig)
    msg = str(err.value)
    assert "train.learning_rat" in msg and "Did you mean: learning_rate" in msg


def test_wrong_type_and_unknown_loss_named(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("loss: dpx\n")
    with pytest.raises(ConfigError, match="'loss'"):
        load_config(path, DirectAlignmentConfig)
    path.write_text("loss: dpo\n")
    with pytest.raises(ConfigError, match="train.batch_size"):
        load_config(path, DirectAlignmentConfig, ["train.batch_size=many"])
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.yaml", DirectAlignmentConfig)


def test_beta_defaults_per_loss():
    assert DirectAlignmentConfig(loss="simpo").beta == 2.0
    assert DirectAlignmentConfig(loss="dpo").beta == 0.1
    assert DirectAlignmentConfig(loss="dpo_norm").beta == 2.0
    assert DirectAlignmentConfig(loss="dpo", beta=0.3).beta == 0.3


def test_config_diff():
    d = config_diff({"a": 1, "b": {"c": 2, "d": 3}}, {"a": 1, "b": {"c": 5, "d": 3}, "e": 0})
    assert d == {"b.c": (2, 5), "e": (None, 0)}


# ------------------------------------------------------------------------------ run dir


def test_atomic_json_and_whole_lines(tmp_path):
    atomic_write_json(tmp_path / "x.json", {"a": float("nan"), "b": torch.tensor(2.5)})
    assert json.loads((tmp_path / "x.json").read_text()) == {"a": "nan", "b": 2.5}
    assert not list(tmp_path.glob(".x.json.*"))  # no temp file left
    p = tmp_path / "m.jsonl"
    append_jsonl(p, {"step": 1})
    with open(p, "a") as fh:
        fh.write('{"step": 2, "lo')  # a torn last line, as after a kill
    assert read_jsonl(p) == [{"step": 1}]


def test_rundir_truncate_on_resume(tmp_path):
    run = RunDir(tmp_path / "run")
    for s in range(1, 5):
        run.log_metrics(s, "train", {"loss": s})
    run.truncate_metrics_after(2)
    assert [r["step"] for r in read_jsonl(run.metrics_path)] == [1, 2]
    run.write_summary("failed", error="boom")
    assert json.loads((run.path / "summary.json").read_text())["outcome"] == "failed"


# ----------------------------------------------------------------------------- log-probs


def test_selective_log_softmax_matches_naive():
    torch.manual_seed(0)
    logits = torch.randn(3, 37, 101, dtype=torch.bfloat16)
    labels = torch.randint(0, 101, (3, 37))
    naive = torch.log_softmax(logits.float(), -1).gather(-1, labels[..., None]).squeeze(-1)
    for chunk in (1, 5, 37, 256):
        got = selective_log_softmax(logits, labels, chunk_size=chunk)
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, naive, rtol=0, atol=1e-5)


def test_hidden_to_logps_matches_naive_with_gradients():
    torch.manual_seed(0)
    head = torch.nn.Linear(16, 50, bias=False)
    hidden = torch.randn(2, 23, 16, requires_grad=True)
    labels = torch.randint(0, 50, (2, 23))
    naive = torch.log_softmax(head(hidden), -1).gather(-1, labels[..., None]).squeeze(-1)
    g_naive = torch.autograd.grad(naive.sum(), [hidden, head.weight])
    chunked = hidden_to_logps(hidden, head, labels, chunk_size=4)
    torch.testing.assert_close(chunked, naive, rtol=0, atol=1e-5)
    g_chunked = torch.autograd.grad(chunked.sum(), [hidden, head.weight])
    for a, b in zip(g_naive, g_chunked, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def _tiny_qwen(seed: int = 0):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    return Qwen2ForCausalLM(cfg).train()


def test_completion_logps_masks_prompt_and_padding():
    model = _tiny_qwen().eval()
    ids = torch.randint(1, 64, (2, 10))
    attn = torch.ones_like(ids)
    attn[1, 7:] = 0  # padding
    loss_mask = torch.zeros_like(ids)
    loss_mask[0, 4:] = 1
    loss_mask[1, 5:7] = 1
    sums, counts = completion_logps(model, ids, attn, loss_mask, chunk_size=3)
    logits = model(input_ids=ids, attention_mask=attn).logits.float()
    tok = F.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    m = loss_mask[:, 1:].float()
    torch.testing.assert_close(sums, (tok * m).sum(-1), rtol=1e-5, atol=1e-5)
    assert counts.tolist() == [6.0, 2.0]


class HeadRows(TorchFunctionMode):
    """Within the block, the number of positions of every ``F.linear`` through ``weight`` (the
    LM head) is appended to ``rows``."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.weight, self.rows = weight, []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is F.linear and args[1] is self.weight:
            self.rows.append(args[0].shape[:-1].numel())
        return func(*args, **(kwargs or {}))


def test_completion_logps_projects_only_completion_positions():
    """The LM head sees exactly the positions that predict a completion token, and the sums and
    gradients still equal the full-logits computation; a batch with no completion token gives
    zeros that backward accepts."""
    model = _tiny_qwen().train()
    ids = torch.randint(1, 64, (3, 12))
    attn = torch.ones_like(ids)
    attn[2, 9:] = 0
    loss_mask = torch.zeros_like(ids)
    loss_mask[0, 6:] = 1
    loss_mask[1, 10:] = 1
    loss_mask[2, 4:9] = 1

    with HeadRows(model.lm_head.weight) as head:
        sums, counts = completion_logps(model, ids, attn, loss_mask, chunk_size=4)
    scored = int(loss_mask[:, 1:].sum())
    assert counts.tolist() == [6.0, 2.0, 5.0]
    assert head.rows and sum(head.rows) == scored  # no prompt or padding position reached it
    grads = torch.autograd.grad(sums.sum(), [model.lm_head.weight, model.model.embed_tokens.weight])

    logits = model(input_ids=ids, attention_mask=attn).logits.float()
    tok = F.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    naive = (tok * loss_mask[:, 1:].float()).sum(-1)
    torch.testing.assert_close(sums, naive, rtol=1e-5, atol=1e-5)
    naive_grads = torch.autograd.grad(
        naive.sum(), [model.lm_head.weight, model.model.embed_tokens.weight]
    )
    for got, want in zip(grads, naive_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)

    empty, n = completion_logps(model, ids, attn, torch.zeros_like(ids))
    assert empty.tolist() == [0.0, 0.0, 0.0] and n.tolist() == [0.0, 0.0, 0.0]
    empty.sum().backward()  # stays connected to the graph, like a sum over nothing


def test_split_rows_layout():
    ids, attn, cmask, width_p = split_rows([[1, 2, 3], [4]], [[5], [6, 7, 8]], pad_id=0)
    assert width_p == 3
    assert ids.tolist() == [[1, 2, 3, 5, 0, 0], [0, 0, 4, 6, 7, 8]]
    assert attn.tolist() == [[1, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1]]
    assert cmask.tolist() == [[1, 0, 0], [1, 1, 1]]


@pytest.mark.parametrize("checkpointing", [False, True])
def test_split_completion_logps_share_prompts_and_equal_naive_full_rows(
    record_forward_shapes, checkpointing
):
    """Chosen / rejected / KL-style rows of three prompts (two repeated): each distinct prompt
    runs through the decoder once, and the sums and gradients equal the naive full-logits
    computation on right-padded [prompt + response] rows."""

    model = _tiny_qwen()
    prompts = [[3, 4, 5, 6, 7], [8, 9], [3, 4, 5, 6, 7], [8, 9], [10, 11, 12], [3, 4, 5, 6, 7]]
    responses = [[20, 21, 22], [23], [24, 25], [26, 27, 28, 29], [30], [31, 32]]
    ids, attn, cmask, width_p = split_rows(prompts, responses, pad_id=0)
    decoder = model.get_decoder()
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    forwards = record_forward_shapes(decoder)
    sums, counts = split_completion_logps(model, ids, attn, width_p, cmask, chunk_size=2)
    if checkpointing:  # a cache cannot live through recomputation: full rows
        assert forwards[0] == (6, ids.shape[1] - 1)
    else:  # 3 distinct prompts once, then the responses of all 6 rows (the last token predicts
        # nothing, so it is not fed)
        assert forwards == [(3, width_p), (6, ids.shape[1] - 1 - width_p)]
    params = [
        model.lm_head.weight,
        model.model.embed_tokens.weight,
        model.model.layers[0].mlp.up_proj.weight,
    ]
    grads = torch.autograd.grad(sums.sum(), params)

    rows = [p + r for p, r in zip(prompts, responses, strict=True)]
    width = max(len(r) for r in rows)
    full = torch.zeros((len(rows), width), dtype=torch.long)
    full_attn = torch.zeros_like(full)
    for i, r in enumerate(rows):
        full[i, : len(r)] = torch.tensor(r)
        full_attn[i, : len(r)] = 1
    logits = model(input_ids=full, attention_mask=full_attn).logits.float()
    tok = F.log_softmax(logits[:, :-1], -1).gather(-1, full[:, 1:, None]).squeeze(-1)
    mask = torch.zeros_like(tok)
    for i, (p, r) in enumerate(zip(prompts, responses, strict=True)):
        mask[i, len(p) - 1 : len(p) + len(r) - 1] = 1
    naive = (tok * mask).sum(-1)
    torch.testing.assert_close(sums, naive, rtol=1e-5, atol=1e-5)
    assert counts.tolist() == [float(len(r)) for r in responses]
    for got, want in zip(grads, torch.autograd.grad(naive.sum(), params), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def _effective_masks(masks: list) -> list[torch.Tensor]:
    """What each recorded ``attention_mask`` lets a query see: a 4-D boolean mask as given; a
    2-D padding mask as sdpa's causal mask over its keys (B, 1, L, L)."""
    out = []
    for mask in masks:
        if mask.dim() == 2:
            width = mask.shape[1]
            causal = torch.ones(width, width, dtype=torch.bool).tril()
            mask = (causal & mask.bool()[:, None, :])[:, None]
        out.append(mask)
    return out


@pytest.mark.parametrize("shared", [True, False])
def test_no_query_row_is_fully_masked_in_a_left_padded_forward(shared):
    """A left-padding position with no key to attend to gave NaN gradients under sdpa's cuDNN
    kernel on an H100 (bench/gpu/padding_nan.py: 301 of 310 parameter gradients NaN); every
    decoder pass over left-padded rows must give each query at least one key, with the real
    positions' mask unchanged."""
    model = _tiny_qwen()
    assert model.config._attn_implementation == "sdpa"
    prompts = [[3, 4, 5, 6, 7], [8, 9], [3, 4, 5, 6, 7], [10]]
    if not shared:  # distinct prompts: the full-row pass
        prompts[2] = [11, 12, 13]
    responses = [[20, 21, 22], [23], [24, 25], [26, 27, 28]]
    ids, attn, cmask, width_p = split_rows(prompts, responses, pad_id=0)
    decoder = model.get_decoder()
    calls: list = []

    def recording(_module, _args, kwargs) -> None:
        calls.append((kwargs["input_ids"], kwargs["attention_mask"]))

    hook = decoder.register_forward_pre_hook(recording, with_kwargs=True)
    try:
        split_completion_logps(model, ids, attn, width_p, cmask)
    finally:
        hook.remove()
    first_ids, first_mask = calls[0]  # the pass whose queries include the left padding
    seen = _effective_masks([first_mask])[0]
    assert bool(seen.any(-1).all()), "a query row sees no key"
    real = first_ids != 0  # no prompt or response uses the pad id 0
    width = real.shape[1]
    causal_over_real = torch.ones(width, width, dtype=torch.bool).tril() & real[:, None, :]
    assert torch.equal(seen[:, 0][real], causal_over_real[real])  # real queries: unchanged


def test_padding_sees_itself_only_for_sdpa_and_left_padding():
    left = torch.tensor([[0, 1, 1], [1, 1, 1]])
    right = torch.tensor([[1, 1, 0], [1, 1, 1]])
    sdpa = _tiny_qwen()
    mask = padding_sees_itself(sdpa, left)
    assert mask.shape == (2, 1, 3, 3)
    assert mask[0, 0].tolist() == [[True, False, False], [False, True, False], [False, True, True]]
    assert mask[1, 0].tolist() == torch.ones(3, 3, dtype=torch.bool).tril().tolist()
    assert padding_sees_itself(sdpa, right) is right  # every row starts with a real token
    sdpa.config._attn_implementation = "eager"  # adds a finite minimum: rows never empty
    assert padding_sees_itself(sdpa, left) is left


# ------------------------------------------------------------------ schedule and metrics


def test_lr_schedule_warmup_then_linear_decay():
    mult = [lr_multiplier(s, total_steps=10, warmup_steps=2, schedule="linear") for s in range(10)]
    assert mult[0] == pytest.approx(1 / 3) and mult[1] == pytest.approx(2 / 3)
    assert mult[2] == pytest.approx(1.0)
    assert mult[9] == pytest.approx(1 / 8)
    assert all(a >= b for a, b in zip(mult[2:], mult[3:], strict=False))
    assert lr_multiplier(7, 10, 0, "constant") == 1.0


def test_step_metrics_weighted_over_micro_batches():
    agg = StepMetrics()
    agg.add({"accuracy": 1.0, "loss": 0.2}, weight=3)
    agg.add({"accuracy": 0.0, "loss": 0.6}, weight=1)
    agg.add({"kl": 0.5}, weight=2)  # a key only some micro-batches report
    out = agg.mean()
    assert out["accuracy"] == pytest.approx(0.75)
    assert out["loss"] == pytest.approx(0.3)
    assert out["kl"] == pytest.approx(0.5)


def test_grad_norm_is_pre_clip_norm():
    w = torch.nn.Parameter(torch.zeros(2))
    w.grad = torch.tensor([3.0, 4.0])
    assert clip_and_measure([w], max_norm=1.0) == pytest.approx(5.0)
    assert torch.linalg.norm(w.grad).item() == pytest.approx(1.0, rel=1e-4)
    w.grad = torch.tensor([3.0, 4.0])
    assert clip_and_measure([w], max_norm=None) == pytest.approx(5.0)
    assert w.grad.tolist() == [3.0, 4.0]


def test_fused_adamw_takes_the_same_steps_as_the_loop():
    """optim fused_adamw switches the kernel, not the algorithm: five steps with weight decay,
    warm-up and a linear schedule land on the same weights up to float rounding."""
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    fused = copy.deepcopy(ref)
    start = torch.cat([p.detach().flatten() for p in ref.parameters()])
    batches = [torch.randn(4, 8) for _ in range(5)]
    cfg = dict(learning_rate=0.05, weight_decay=0.1, warmup_ratio=0.2)
    runs = []
    for model, flag in ((ref, False), (fused, True)):
        opt, sched = build_optimizer(model.parameters(), OptimSection(**cfg, fused_adamw=flag), 5)
        assert opt.defaults["fused"] is (True if flag else None)
        for x in batches:
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            opt.step()
            sched.step()
        runs.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    assert (runs[0] - start).abs().max() > 1e-2  # the steps really moved the weights
    torch.testing.assert_close(runs[1], runs[0], rtol=1e-5, atol=1e-6)


def test_fused_adamw_is_the_default_and_falls_back_where_no_kernel_exists():
    """The fused kernel is the default; parameters it has no kernel for (here the meta device)
    get the per-tensor loop instead of an error."""
    assert OptimSection().fused_adamw is True
    opt, _ = build_optimizer(torch.nn.Linear(2, 2).parameters(), OptimSection(), 4)
    assert opt.defaults["fused"] is True
    meta = torch.nn.Linear(2, 2, device="meta")
    opt, _ = build_optimizer(meta.parameters(), OptimSection(), 4)
    assert not opt.defaults["fused"]


def test_epoch_order_depends_only_on_seed_and_epoch():
    assert epoch_order(50, 1, 0) == epoch_order(50, 1, 0)
    assert epoch_order(50, 1, 0) != epoch_order(50, 1, 1)
    assert sorted(epoch_order(50, 1, 3)) == list(range(50))


def test_checkpoint_roundtrip_restores_everything(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt, sched = build_optimizer(model.parameters(), OptimSection(learning_rate=0.1), 10)
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    sched.step()
    path = save_checkpoint(tmp_path, 1, model, opt, sched, {"epoch": 0, "batch": 1})
    expected_next = torch.rand(3)
    weights = {k: v.clone() for k, v in model.state_dict().items()}

    other = torch.nn.Linear(4, 2)
    opt2, sched2 = build_optimizer(other.parameters(), OptimSection(learning_rate=0.1), 10)
    state = load_checkpoint(path, other, opt2, sched2)
    assert state["data_position"] == {"epoch": 0, "batch": 1} and state["step"] == 1
    for k, v in other.state_dict().items():
        assert torch.equal(v, weights[k])
    assert sched2.get_last_lr() == sched.get_last_lr()
    assert torch.equal(torch.rand(3), expected_next)  # RNG restored
    # keep_last prunes older checkpoints
    save_checkpoint(tmp_path, 2, model, opt, sched, {"epoch": 0, "batch": 2}, keep_last=1)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-0000002"]
    assert not math.isnan(sched2.get_last_lr()[0])


# ------------------------------------------------------------------ dataset opening


def test_open_split_reads_files_and_names_missing_paths_and_offline_hub(tmp_path, monkeypatch):
    from trainers.core.datasets import DatasetNotFoundError, looks_like_path, open_split

    assert (
        looks_like_path("data/pairs.jsonl") and looks_like_path("~/x") and looks_like_path("a/b/c")
    )
    assert not looks_like_path("HuggingFaceH4/no_robots") and not looks_like_path("gsm8k")
    rows = [
        {"prompt": "p", "chosen": "a", "rejected": "b"},
        {"prompt": "q", "chosen": "c", "rejected": "d"},
    ]
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert [dict(r) for r in open_split(str(path), "train", "HINT")] == rows
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ValueError, match="unsupported data file"):
        open_split(str(tmp_path / "notes.txt"), "train", "HINT")
    with pytest.raises(DatasetNotFoundError, match=r"does not exist .*HINT$"):
        open_split(str(tmp_path / "missing.jsonl"), "train", "HINT")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DatasetNotFoundError, match="HF_HUB_OFFLINE is set") as info:
        open_split("someone/not-cached-dataset", "train", "HINT")
    assert str(info.value).endswith("HINT")


def test_a_step_with_a_non_finite_gradient_leaves_the_weights_finite():
    """One NaN in one gradient would make every AdamW-updated weight NaN; the step is skipped
    and its NaN norm returned (the metrics row shows it), the next finite step updates."""
    from trainers.core.config import OptimSection

    layer = torch.nn.Linear(3, 2)
    before = [p.detach().clone() for p in layer.parameters()]
    optimizer, scheduler = build_optimizer(
        list(layer.parameters()), OptimSection(learning_rate=0.1), total_steps=4
    )
    layer(torch.ones(1, 3)).sum().backward()
    layer.weight.grad[0, 0] = float("nan")
    norm, _ = optimizer_step(list(layer.parameters()), optimizer, scheduler, 1.0)
    assert math.isnan(norm)
    assert all(torch.equal(p, b) for p, b in zip(layer.parameters(), before, strict=True))
    assert all(p.grad is None for p in layer.parameters())
    layer(torch.ones(1, 3)).sum().backward()
    norm, _ = optimizer_step(list(layer.parameters()), optimizer, scheduler, 1.0)
    assert math.isfinite(norm)
    assert not torch.equal(layer.weight, before[0]) and torch.isfinite(layer.weight).all()
