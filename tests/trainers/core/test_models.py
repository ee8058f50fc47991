"""Model presets, name resolution and loading (offline, CPU)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from trainers.core import models, tiny
from trainers.core.models import (
    DeviceError,
    ModelNotAvailableError,
    ModelNotFoundError,
    ModelSource,
    count_parameters,
    load_causal_lm,
    load_tokenizer,
    model_fingerprint,
    pick_attn_implementation,
    pick_device,
    pick_dtype,
    resolve_model,
)

REPO = Path(__file__).resolve().parents[3]
MESSAGES = [
    {"role": "user", "content": "Spell this word backward (example: sun -> nus): cat"},
    {"role": "assistant", "content": "<think>Reverse the letters.</think><answer>tac</answer>"},
]


@pytest.fixture(scope="session")
def preset_cache(tmp_path_factory) -> Path:
    """One cache folder for this module's tests; ``tiny`` and ``tiny-llama`` built once."""
    cache = tmp_path_factory.mktemp("rlhf-lab-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RLHF_LAB_CACHE", str(cache))
        mp.setenv("HF_HUB_OFFLINE", "1")
        start = time.perf_counter()
        tiny.ensure_preset("tiny")
        print(f"\n[test_models] tiny preset built in {time.perf_counter() - start:.1f}s")
        tiny.ensure_preset("tiny-llama")
    return cache


@pytest.fixture(autouse=True)
def _env(preset_cache, monkeypatch):
    monkeypatch.setenv("RLHF_LAB_CACHE", str(preset_cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def tiny_dir(preset_cache) -> Path:
    return preset_cache / "models" / f"tiny-v{tiny.BUILDER_VERSION}"


# ------------------------------------------------------------------------------ presets


def test_cache_root_follows_env(preset_cache, monkeypatch):
    assert tiny.cache_root() == preset_cache
    assert tiny.preset_dir("tiny") == preset_cache / "models" / f"tiny-v{tiny.BUILDER_VERSION}"
    monkeypatch.delenv("RLHF_LAB_CACHE")
    assert tiny.cache_root() == Path.home() / ".cache" / "rlhf-lab"


def test_presets_table():
    assert {"tiny", "tiny-llama", "small"} <= set(tiny.PRESETS)
    assert tiny.PRESETS["tiny"].architecture == "qwen2"
    assert tiny.PRESETS["tiny-llama"].architecture == "llama"
    assert tiny.PRESETS["small"].vocab_size == 16384
    with pytest.raises(tiny.PresetError, match="tiny-llama"):
        tiny.get_spec("nope")


def test_preset_builds_and_loads_with_auto_classes(tiny_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert tiny.is_complete(tiny_dir)
    assert tiny.ensure_preset("tiny") == tiny_dir  # second call: no rebuild
    info = json.loads((tiny_dir / "build_info.json").read_text())
    assert info["builder_version"] == tiny.BUILDER_VERSION

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    assert model.config.model_type == "qwen2"
    assert model.config.tie_word_embeddings
    assert model.config.max_position_embeddings >= 1024
    assert 0.8e6 <= count_parameters(model) <= 1.3e6
    assert len(tok) == model.config.vocab_size == 2048
    assert tok.eos_token == "<|im_end|>"
    assert tok.pad_token == "<|endoftext|>"
    assert tok.padding_side == "right"
    assert model.generation_config.eos_token_id == tok.eos_token_id
    assert model.generation_config.pad_token_id == tok.pad_token_id


def test_tiny_llama_preset(preset_cache):
    model = load_causal_lm("tiny-llama", device="cpu")
    assert model.config.model_type == "llama"
    assert 0.8e6 <= count_parameters(model) <= 1.3e6


def test_rebuild_is_deterministic(tiny_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    again = tiny.build_preset(tiny.PRESETS["tiny"], tmp_path / "again")
    tok_a = AutoTokenizer.from_pretrained(tiny_dir)
    tok_b = AutoTokenizer.from_pretrained(again)
    assert tok_a.get_vocab() == tok_b.get_vocab()
    assert (tiny_dir / "tokenizer.json").read_bytes() == (again / "tokenizer.json").read_bytes()
    sd_a = AutoModelForCausalLM.from_pretrained(tiny_dir).state_dict()
    sd_b = AutoModelForCausalLM.from_pretrained(again).state_dict()
    assert sd_a.keys() == sd_b.keys()
    assert all(torch.equal(sd_a[k], sd_b[k]) for k in sd_a)
    assert (tiny_dir / "model.safetensors").read_bytes() == (
        again / "model.safetensors"
    ).read_bytes()


@pytest.mark.slow
def test_rebuild_in_another_process_is_identical(tiny_dir, tmp_path):
    """A fresh interpreter with another hash seed builds the same bytes."""
    env = dict(os.environ, RLHF_LAB_CACHE=str(tmp_path), PYTHONHASHSEED="4321")
    code = "from trainers.core.tiny import ensure_preset; print(ensure_preset('tiny'))"
    out = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", code],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    other = Path(out.stdout.strip().splitlines()[-1])
    for name in ("tokenizer.json", "model.safetensors", "config.json", "generation_config.json"):
        assert (other / name).read_bytes() == (tiny_dir / name).read_bytes(), name


def test_incomplete_preset_is_rebuilt(preset_cache, tmp_path, monkeypatch):
    monkeypatch.setenv("RLHF_LAB_CACHE", str(tmp_path))
    folder = tiny.preset_dir("tiny")
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")  # leftover of a killed build
    assert not tiny.is_complete(folder)
    assert tiny.ensure_preset("tiny") == folder
    assert tiny.is_complete(folder)
    assert not [p for p in folder.parent.iterdir() if ".tmp-" in p.name]


def test_special_tokens_are_single_ids(preset_cache):
    tok = load_tokenizer("tiny")
    ids = {}
    for token in tiny.SPECIAL_TOKENS:
        encoded = tok.encode(token, add_special_tokens=False)
        assert len(encoded) == 1, token
        ids[token] = encoded[0]
    assert len(set(ids.values())) == len(ids)
    assert ids["<|im_end|>"] == tok.eos_token_id
    assert ids["<|endoftext|>"] == tok.pad_token_id
    # tags survive skip_special_tokens (reward functions parse them); control tokens do not
    text = "<|im_start|>assistant\n<think>a</think><answer>42</answer><|im_end|>"
    decoded = tok.decode(tok.encode(text, add_special_tokens=False), skip_special_tokens=True)
    assert "<answer>42</answer>" in decoded and "<think>" in decoded
    assert "<|im_end|>" not in decoded and "<|im_start|>" not in decoded
    # plain text round-trips through encode/decode
    plain = "Calculate 12 + 345.  Then sort: banana, Apple\n\tdone"
    assert tok.decode(tok.encode(plain, add_special_tokens=False)) == plain


def test_chat_template_round_trip(preset_cache):
    tok = load_tokenizer("tiny")
    full = tok.apply_chat_template(MESSAGES, tokenize=False)
    prompt = tok.apply_chat_template(MESSAGES[:1], add_generation_prompt=True, tokenize=False)
    assert full.startswith(prompt)
    assert (
        prompt == f"<|im_start|>user\n{MESSAGES[0]['content']}<|im_end|>\n<|im_start|>assistant\n"
    )
    assert full == prompt + MESSAGES[1]["content"] + "<|im_end|>\n"
    assert full == tiny.render_chat(MESSAGES)
    # token level too
    full_ids = tok(full, add_special_tokens=False)["input_ids"]
    prompt_ids = tok(prompt, add_special_tokens=False)["input_ids"]
    assert full_ids[: len(prompt_ids)] == prompt_ids
    # assistant mask from the {% generation %} markers covers the completion + <|im_end|>
    out = tok.apply_chat_template(
        MESSAGES, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    mask = out["assistant_masks"]
    assert sum(mask) == len(full_ids) - len(prompt_ids) - 1  # all but the final "\n"
    assert mask[len(prompt_ids)] == 1 and mask[len(prompt_ids) - 1] == 0


def test_forward_and_generate(preset_cache):
    tok = load_tokenizer("tiny")
    model = load_causal_lm("tiny", device="cpu", dtype="fp32", attn_implementation="auto")
    assert model.training and all(p.requires_grad for p in model.parameters())
    assert model.config._attn_implementation == "sdpa"
    batch = tok(
        [tiny.render_chat(MESSAGES), "hello world"],
        return_tensors="pt",
        padding=True,
        add_special_tokens=False,
    )
    out = model(**batch, labels=batch["input_ids"])
    assert out.logits.shape == (*batch["input_ids"].shape, model.config.vocab_size)
    assert torch.isfinite(out.loss)
    out.loss.backward()

    frozen = load_causal_lm("tiny", device="cpu", trainable=False)
    assert not frozen.training and not any(p.requires_grad for p in frozen.parameters())
    prompt = tok.apply_chat_template(MESSAGES[:1], add_generation_prompt=True, tokenize=False)
    enc = tok(prompt, return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        gen = frozen.generate(**enc, max_new_tokens=4, do_sample=False)
    assert gen.shape[0] == 1
    assert enc["input_ids"].shape[1] < gen.shape[1] <= enc["input_ids"].shape[1] + 4


def test_pad_token_falls_back_to_eos(tiny_dir, tmp_path):
    folder = tmp_path / "nopad"
    shutil.copytree(tiny_dir, folder)
    cfg_path = folder / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["pad_token"] = None
    cfg_path.write_text(json.dumps(cfg))
    tok = load_tokenizer(str(folder))
    assert tok.pad_token == tok.eos_token == "<|im_end|>"


# ------------------------------------------------------------------------------ resolution


def test_resolve_preset_does_not_build(tmp_path, monkeypatch):
    monkeypatch.setenv("RLHF_LAB_CACHE", str(tmp_path))
    src = resolve_model("small")
    assert src == ModelSource("preset", tiny.preset_dir("small"), None, None, "small")
    assert not src.path.exists()


def test_resolve_local_folder(tiny_dir):
    src = resolve_model(str(tiny_dir))
    assert src.kind == "local" and src.path == tiny_dir.absolute()
    assert src.hub_id is None and src.gguf_file is None
    model = load_causal_lm(str(tiny_dir), device="cpu")
    assert model.config.model_type == "qwen2"
    assert load_tokenizer(str(tiny_dir)).eos_token == "<|im_end|>"


def test_resolution_errors(tmp_path):
    with pytest.raises(ModelNotFoundError, match="No such file or folder"):
        resolve_model(str(tmp_path / "does-not-exist"))
    with pytest.raises(ModelNotFoundError, match="No such file or folder"):
        resolve_model("./nowhere/model")
    config_file = tmp_path / "m" / "config.json"
    config_file.parent.mkdir()
    config_file.write_text("{}")
    with pytest.raises(ModelNotFoundError, match="pass its folder"):
        resolve_model(str(config_file))

    empty = tmp_path / "not-a-model"
    empty.mkdir()
    (empty / "notes.txt").write_text("hi")
    with pytest.raises(ModelNotFoundError, match="no config.json"):
        resolve_model(str(empty))

    stray = tmp_path / "weights.bin"
    stray.write_bytes(b"x")
    with pytest.raises(ModelNotFoundError, match="not a .gguf"):
        resolve_model(str(stray))

    for garbage in ("definitely not a model!!", "tiny2", "org/name/extra/"):
        with pytest.raises(ModelNotFoundError) as err:
            resolve_model(garbage)
        assert "tiny" in str(err.value)
    with pytest.raises(ModelNotFoundError) as err:
        resolve_model("tiny2")
    for preset in tiny.PRESETS:
        assert preset in str(err.value)
    with pytest.raises(ModelNotFoundError, match="Empty"):
        resolve_model("  ")


def test_resolve_hub_id_shape():
    src = resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct")
    assert src.kind == "hub" and src.hub_id == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert src.path is None and src.gguf_file is None


def test_hub_id_offline_fails_fast_with_choices(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.perf_counter()
    for loader in (load_tokenizer, load_causal_lm):
        with pytest.raises(ModelNotAvailableError) as err:
            loader("rlhf-lab-test-org/no-such-model-xyz")
        message = str(err.value)
        assert "HF_HUB_OFFLINE" in message
        assert "tiny" in message and ".gguf" in message and "local folder" in message
        assert "rlhf-lab models pull smollm2-135m-instruct" in message
    assert time.perf_counter() - start < 5


def test_unreachable_hub_fails_fast(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens on discard
    assert models.hub_endpoint() == ("127.0.0.1", 9)
    start = time.perf_counter()
    with pytest.raises(ModelNotAvailableError, match="cannot be reached") as err:
        load_causal_lm("rlhf-lab-test-org/no-such-model-xyz", device="cpu")
    assert "rlhf-lab models pull smollm2-135m-instruct" in str(err.value)
    assert time.perf_counter() - start < 5


def test_hub_reachable_is_bounded(monkeypatch):
    # 192.0.2.0/24 is reserved for documentation: connects hang or fail, never succeed
    monkeypatch.setenv("HF_ENDPOINT", "https://192.0.2.1")
    start = time.perf_counter()
    assert models.hub_reachable(timeout=0.5) is False
    assert time.perf_counter() - start < 2


# ------------------------------------------------------------------------------ GGUF


@pytest.fixture(scope="session")
def tiny_llama_gguf(preset_cache, tmp_path_factory) -> Path:
    folder = preset_cache / "models" / f"tiny-llama-v{tiny.BUILDER_VERSION}"
    out = tmp_path_factory.mktemp("gguf") / "tiny-llama-f32.gguf"
    return tiny.export_gguf(folder, out)


def test_gguf_resolution(tiny_llama_gguf, tmp_path):
    src = resolve_model(str(tiny_llama_gguf))
    assert src.kind == "gguf"
    assert src.path == tiny_llama_gguf.parent and src.gguf_file == tiny_llama_gguf.name
    assert src.gguf_path == tiny_llama_gguf
    # a symlink keeps its own name (hub-cache snapshot files link to hash-named blobs)
    link = tmp_path / "linked.gguf"
    link.symlink_to(tiny_llama_gguf)
    assert resolve_model(str(link)).gguf_file == "linked.gguf"
    # a folder holding exactly one .gguf
    folder_src = resolve_model(str(tiny_llama_gguf.parent))
    assert (folder_src.kind, folder_src.gguf_file) == ("gguf", tiny_llama_gguf.name)
    # two .gguf files: ambiguous
    two = tmp_path / "two"
    two.mkdir()
    (two / "a.gguf").write_bytes(b"")
    (two / "b.gguf").write_bytes(b"")
    with pytest.raises(ModelNotFoundError, match="2 .gguf files"):
        resolve_model(str(two))
    with pytest.raises(ModelNotFoundError, match="No such file"):
        resolve_model(str(tmp_path / "missing.gguf"))


def test_gguf_round_trip(tiny_llama_gguf, preset_cache):
    """The exported GGUF loads (tokenizer and model) and matches the safetensors preset."""
    ref_tok, tok = load_tokenizer("tiny-llama"), load_tokenizer(str(tiny_llama_gguf))
    text = tiny.render_chat(MESSAGES) + "Calculate 12 + 345 = 357."
    ids = ref_tok(text, add_special_tokens=False)["input_ids"]
    assert tok(text, add_special_tokens=False)["input_ids"] == ids
    assert tok.eos_token == "<|im_end|>"
    assert tok.apply_chat_template(MESSAGES, tokenize=False) == tiny.render_chat(MESSAGES)

    ref = load_causal_lm("tiny-llama", device="cpu", trainable=False)
    model = load_causal_lm(str(tiny_llama_gguf), device="cpu", trainable=False)
    assert count_parameters(model) == count_parameters(ref)
    x = torch.tensor([ids])
    with torch.no_grad():
        torch.testing.assert_close(model(x).logits, ref(x).logits, rtol=1e-5, atol=1e-5)


def test_load_passes_gguf_file(tiny_llama_gguf, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    seen = {}

    def fake(kind):
        def from_pretrained(first, **kwargs):
            seen[kind] = (first, kwargs)
            raise RuntimeError("stop here")

        return from_pretrained

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", fake("model"))
    monkeypatch.setattr(AutoTokenizer, "from_pretrained", fake("tokenizer"))
    for loader in (load_causal_lm, load_tokenizer):
        with pytest.raises(RuntimeError, match="stop here"):
            loader(str(tiny_llama_gguf))
    for kind in ("model", "tokenizer"):
        first, kwargs = seen[kind]
        assert first == str(tiny_llama_gguf.parent)
        assert kwargs["gguf_file"] == tiny_llama_gguf.name


# ------------------------------------------------------------------------------ fingerprints


def test_fingerprints(tiny_dir, tiny_llama_gguf, tmp_path):
    fp = model_fingerprint("tiny")
    assert fp == model_fingerprint("tiny") and len(fp) == 16
    assert fp != model_fingerprint("tiny-llama")

    local = tmp_path / "local"
    shutil.copytree(tiny_dir, local)
    before = model_fingerprint(str(local))
    assert before == model_fingerprint(str(local))
    cfg = json.loads((local / "config.json").read_text())
    cfg["rms_norm_eps"] = 1e-5
    (local / "config.json").write_text(json.dumps(cfg))
    after_config = model_fingerprint(str(local))
    assert after_config != before
    weights = local / "model.safetensors"
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))
    assert model_fingerprint(str(local)) != after_config

    g = model_fingerprint(str(tiny_llama_gguf))
    assert g == model_fingerprint(str(tiny_llama_gguf.parent))
    assert model_fingerprint("some-org/some-model") != model_fingerprint("some-org/other")


# ------------------------------------------------------------------------------ device helpers


def test_pick_device_dtype_attn_on_cpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert pick_device("auto") == torch.device("cpu")
    assert pick_device("cpu") == torch.device("cpu")
    for pref in ("cuda", "cuda:0"):
        with pytest.raises(DeviceError, match="device=cpu or device=auto"):
            pick_device(pref)
    with pytest.raises(DeviceError, match="Unknown device"):
        pick_device("tpu")

    cpu = torch.device("cpu")
    assert pick_dtype("auto", cpu) == torch.float32
    assert pick_dtype("bf16", cpu) == torch.bfloat16
    assert pick_dtype("fp16", cpu) == torch.float16
    assert pick_dtype("fp32", cpu) == torch.float32
    assert pick_dtype(torch.float64, cpu) == torch.float64
    with pytest.raises(ValueError, match="Unknown dtype"):
        pick_dtype("int3", cpu)

    assert pick_attn_implementation("auto", cpu) == "sdpa"
    assert pick_attn_implementation("eager", cpu) == "eager"
    assert pick_attn_implementation("flash_attention_2", cpu) == "flash_attention_2"

    with pytest.raises(DeviceError):
        load_causal_lm("tiny", device="cuda")


def test_pick_attn_auto_rules():
    cuda = torch.device("cuda")
    installed = {"flash_attn": True}
    assert (
        pick_attn_implementation("auto", cuda, torch.bfloat16, **installed) == "flash_attention_2"
    )
    assert pick_attn_implementation("auto", cuda, "fp16", **installed) == "flash_attention_2"
    assert pick_attn_implementation("auto", cuda, torch.float32, **installed) == "sdpa"
    assert (
        pick_attn_implementation("auto", torch.device("cpu"), torch.bfloat16, **installed) == "sdpa"
    )
    assert pick_attn_implementation("auto", cuda, torch.bfloat16, flash_attn=False) == "sdpa"
    # not said: whether flash-attn is installed here
    here = "flash_attention_2" if models.flash_attn_available() else "sdpa"
    assert pick_attn_implementation("auto", cuda, torch.bfloat16) == here


def test_models_module_imports_no_torch():
    code = (
        "import sys, trainers.core.models as m; "
        "m.resolve_model('tiny'); m.model_fingerprint('tiny'); "
        "heavy = [k for k in ('torch', 'transformers', 'tokenizers') if k in sys.modules]; "
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)
