"""llmcore: the algebra of a GPT, from loops to matrices, proved equal and measured.

Each operation comes in a loop form (``*_loop``, the per-token and per-key loops), a matrix form
(what the model runs, on any device), and a NumPy float64 twin in :mod:`llmcore.reference`.
Importing llmcore has no side effects: it prints nothing and picks no device.
"""

from .attention import attention, attention_loop
from .batching import pad_batch
from .block_allocator import BlockAllocator, OutOfBlocks
from .checkpoint import load_gpt2, save_gpt2
from .device import describe_machine, pick_device
from .ffn import ffn, ffn_loop, gelu
from .generate import decode_steps, generate, generate_batch, make_step
from .sampling import sample
from .kvcache import KVCache, kv_bytes_per_token
from .matmul import dot_loop, linear, linear_loop, matmul, matmul_loop
from .model import GPT, GPTConfig
from .multihead import (fuse_qkv, merge_heads, multihead_attention, multihead_attention_loop,
                        multihead_attention_qkv, qkv_projection, split_heads)
from .norm import layer_norm, layer_norm_loop
from .peak_memory import peak_memory
from .paged import PagedKVCache
from .parallel import shard_attention_weights, tensor_parallel_attention
from .prefix import SharedPrefixCache
from .pretrained import load_pretrained
from .serving import Request, Scheduler, serve
from .masks import NEG_INF, causal_mask
from .softmax import softmax, softmax_loop
from .tiled import online_softmax, online_softmax_loop, tiled_attention

__version__ = "0.1.0"

__all__ = [
    "BlockAllocator", "GPT", "GPTConfig", "KVCache", "OutOfBlocks", "PagedKVCache", "Request",
    "Scheduler", "SharedPrefixCache", "generate_batch", "pad_batch", "serve", "NEG_INF", "attention", "attention_loop", "causal_mask",
    "decode_steps", "describe_machine", "make_step", "dot_loop", "ffn", "ffn_loop", "fuse_qkv", "gelu",
    "generate", "kv_bytes_per_token", "layer_norm", "layer_norm_loop", "linear", "linear_loop",
    "load_gpt2", "load_pretrained", "matmul", "matmul_loop", "merge_heads", "multihead_attention",
    "multihead_attention_loop", "multihead_attention_qkv", "pick_device", "qkv_projection",
    "online_softmax", "online_softmax_loop", "peak_memory", "sample", "save_gpt2",
    "shard_attention_weights", "softmax", "softmax_loop", "split_heads", "tensor_parallel_attention",
    "tiled_attention",
]
