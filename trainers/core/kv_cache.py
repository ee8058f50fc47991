"""A preallocated KV cache for the rollout engine (trainers/core/decoding.py).

transformers' ``DynamicCache`` grows every layer's keys and values by ``torch.cat`` at each
token: a copy of the whole cache per step, which on a 135M model with 32 rows is a sixth of the
decode time. Here each layer owns one buffer of shape (row slots, kv heads, capacity, head dim),
allocated at the first write; a forward over ``n`` rows writes its new keys/values in place at
the current length, in slots ``[0, n)``, and the attention reads the view of the filled
positions. The engine keeps the rows it is decoding in the first slots (:meth:`arrange` moves
rows between slots, copying only the slots that change), so a row that leaves the batch costs
nothing more afterwards.

**Fixed-shape steps.** A CUDA graph replays the kernels it recorded with the same shapes and
addresses, so a decode step it captures cannot slice the cache at a length that grows by one
each token. Between :meth:`BufferCache.begin_fixed_steps` and :meth:`BufferCache.end_fixed_steps`
a layer writes the step's keys/values at the position held in a one-element device tensor
(``index_copy_``, no host value involved) and returns the whole capacity of the rows' slots; the
caller's attention mask hides the positions not yet written, and the caller advances the host
length after each step (:meth:`BufferCache.advance`), since a replayed graph runs no Python.

It is a ``transformers.Cache`` (the models call ``update``, ``get_seq_length`` and
``get_mask_sizes``) holding full-attention layers only: the engine refuses models whose layers
are sliding-window, chunked or linear attention (their caches keep other state).
"""

from __future__ import annotations

import torch
from torch import Tensor
from transformers.cache_utils import Cache, CacheLayerMixin

SUPPORTED_LAYER_TYPES = ("full_attention",)


class BufferLayer(CacheLayerMixin):
    """One decoder layer's keys and values, written in place into preallocated buffers."""

    is_compileable = False
    is_sliding = False

    def __init__(self, slots: int, capacity: int):
        super().__init__()
        self.slots, self.capacity, self.length = slots, capacity, 0
        self.write_at: Tensor | None = None  # set during fixed-shape steps (module doc)

    def lazy_initialization(self, key_states: Tensor, value_states: Tensor) -> None:
        kv_heads = key_states.shape[1]
        shape = (self.slots, kv_heads, self.capacity)
        self.keys = key_states.new_zeros((*shape, key_states.shape[-1]))
        self.values = value_states.new_zeros((*shape, value_states.shape[-1]))
        self.is_initialized = True

    def update(self, key_states: Tensor, value_states: Tensor, *args, **kwargs):
        """Write the new positions of rows ``[0, n)`` and return their filled keys/values."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        rows, new = key_states.shape[0], key_states.shape[-2]
        if self.write_at is not None:  # a fixed-shape step: device-side position, whole capacity
            self.keys[:rows].index_copy_(2, self.write_at, key_states)
            self.values[:rows].index_copy_(2, self.write_at, value_states)
            return self.keys[:rows], self.values[:rows]
        end = self.length + new
        if end > self.capacity:
            raise RuntimeError(f"KV cache full: {end} positions, capacity {self.capacity}")
        self.keys[:rows, :, self.length : end] = key_states
        self.values[:rows, :, self.length : end] = value_states
        self.length = end
        return self.keys[:rows, :, :end], self.values[:rows, :, :end]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        if self.write_at is not None:
            return self.capacity, 0
        return self.length + query_length, 0

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return self.capacity

    def arrange(self, order: Tensor) -> None:
        """Slot ``i`` takes the row that was in slot ``order[i]`` (filled positions only)."""
        if not self.is_initialized or self.length == 0:
            return
        moved = (order != torch.arange(len(order), device=order.device)).nonzero().squeeze(-1)
        if len(moved) == 0:
            return
        source = order[moved]
        for buffer in (self.keys, self.values):
            filled = buffer[:, :, : self.length]
            filled[moved] = filled[source]  # the right side is gathered first: no aliasing

    def grow(self, capacity: int) -> None:
        """Room for ``capacity`` positions, the filled ones kept."""
        if capacity <= self.capacity:
            return
        if self.is_initialized:
            for name in ("keys", "values"):
                old = getattr(self, name)
                new = old.new_zeros((*old.shape[:2], capacity, old.shape[-1]))
                new[:, :, : self.length] = old[:, :, : self.length]
                setattr(self, name, new)
        self.capacity = capacity

    def reset(self) -> None:
        self.length = 0


class BufferCache(Cache):
    """A ``transformers.Cache`` of :class:`BufferLayer` s: ``slots`` rows, ``capacity``
    positions (grown on request); rows ``[0, n)`` are the ones a forward over ``n`` rows sees."""

    def __init__(self, num_layers: int, slots: int, capacity: int):
        super().__init__(layers=[BufferLayer(slots, capacity) for _ in range(num_layers)])
        self.slots = slots

    @property
    def length(self) -> int:
        """Positions filled (shared by every row: a row's unused positions are masked out)."""
        return self.layers[0].length

    @property
    def capacity(self) -> int:
        return self.layers[0].capacity

    def arrange(self, order: Tensor) -> None:
        """Put the rows of slots ``order`` into slots ``0 .. len(order)-1`` (other slots: free)."""
        for layer in self.layers:
            layer.arrange(order)

    def grow(self, capacity: int) -> None:
        for layer in self.layers:
            layer.grow(capacity)

    def begin_fixed_steps(self, write_at: Tensor) -> None:
        """From now on each forward writes one position, ``write_at`` (a one-element long tensor
        on the cache's device, updated in place by the caller), and attends over the whole
        capacity (module doc)."""
        if write_at.shape != (1,):
            raise ValueError(f"write_at must hold one position, got shape {tuple(write_at.shape)}")
        for layer in self.layers:
            layer.write_at = write_at

    def end_fixed_steps(self) -> None:
        for layer in self.layers:
            layer.write_at = None

    def advance(self, positions: int = 1) -> None:
        """Count ``positions`` more as filled (after fixed-shape steps, which do not)."""
        end = self.length + positions
        if end > self.capacity:
            raise RuntimeError(f"KV cache full: {end} positions, capacity {self.capacity}")
        for layer in self.layers:
            layer.length = end


def cache_layer_types(config) -> list[str]:
    """The attention kind of each decoder layer (``full_attention`` unless the config says)."""
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    types = getattr(text, "layer_types", None)
    if types is None:
        sliding = getattr(text, "sliding_window", None) is not None and getattr(
            text, "use_sliding_window", True
        )
        types = ["sliding_attention" if sliding else "full_attention"] * text.num_hidden_layers
    return list(types)


def buffer_cache_for(model, slots: int, capacity: int) -> BufferCache:
    """A :class:`BufferCache` for ``model``'s decoder layers; a clear error for layer kinds it
    does not hold."""
    types = cache_layer_types(model.config)
    unsupported = sorted(set(types) - set(SUPPORTED_LAYER_TYPES))
    if unsupported:
        raise ValueError(
            f"the rollout engine's KV cache holds full-attention layers only; this model has "
            f"{', '.join(unsupported)} layers"
        )
    return BufferCache(len(types), slots, capacity)
