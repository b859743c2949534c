"""Training steps through real megatron-core 0.19.2 modules with DSA on absorbed MLA.

The model is megatron's own ``GPTModel`` whose layers are ``TransformerLayer`` with
``AbsorbedMLASelfAttention`` -> ``DSAttention`` (+ ``DSAIndexer``) built by megatron's
``get_dsa_module_spec_for_backend``, RMSNorm and a SwiGLU MLP: GLM-5.3-Flash's DSA
attention shape per TP rank (16 heads, NoPE MLA: q/k width ``kv_lora_rank`` 512 with no
rope channels, k-pool top-k 2048 + 3 = 2051), ``dsa_kernel_backend="tilelang"``. The loss
is megatron's own LM cross-entropy on synthetic tokens; the optimizer torch's AdamW with
gradient clipping (the clip returns the norm that is logged).

Nearest real stack (what 0.19.2 cannot build without Transformer Engine): megatron's
experimental-attention block spec asserts ``transformer_impl == "transformer_engine"`` and
takes every linear from ``TESpecProvider``; the GPU image has no Transformer Engine. So the
layer list is built here from the same parts, with megatron's local backend
(``LocalSpecProvider``: ``ColumnParallelLinear`` / ``RowParallelLinear``, torch norms);
``TELinear`` in "duplicated" mode (the indexer's and MLA's down projections) becomes a
``ColumnParallelLinear`` at TP 1, the same matrix product. DSAttention, the indexer and the
sparse-attention dispatch are megatron's, unchanged.

Which attention ran is counted, not assumed: ``tilelang_dsa.SparseMLA.apply`` (the fused
kernel) and ``dsa._unfused_absorbed_dsa_fn`` (the dense fallback) are wrapped with
counters, and the first step logs both counts.

    torchrun --nproc_per_node 1 benchmarks/dsa_training.py --shapes 1x4096,1x32768,2x16384 \\
        --json benchmarks/results/dsa_training_backport.json
    MEGATRON_BACKPORTS=0 torchrun ... --json .../dsa_training_stock.json

The script calls no ``apply()``: in a job it is the start-up hook that ``backports apply``
wrote (or nothing, under ``MEGATRON_BACKPORTS=0``) that decides which function runs.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import importlib.metadata
import json
import os
import platform
import socket
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

TILELANG_DSA = "megatron.core.transformer.experimental_attention_variant.ops.tilelang_dsa"
GIB = 2**30
HEADS, KV_LORA_RANK, TOPK = 16, 512, 2051


def log(*args: Any) -> None:
    print("[dsa_training]", *args, flush=True)


# -- what ran ------------------------------------------------------------------------------


class Counters:
    """Counts calls of the fused kernel and of the dense fallback, in the live modules."""

    def __init__(self) -> None:
        self.kernel = 0
        self.dense = 0
        self.naive_indexer = 0
        self._undo: list[Callable[[], None]] = []

    def attach(self, tilelang_dsa: Any, dsa: Any) -> Counters:
        kernel = tilelang_dsa.SparseMLA
        if kernel is not None:
            counters = self

            class CountingSparseMLA:
                """The kernel, counted: both stock and the backport read it at call time."""

                @staticmethod
                def apply(*args: Any, **kwargs: Any) -> Any:
                    counters.kernel += 1
                    return kernel.apply(*args, **kwargs)

            tilelang_dsa.SparseMLA = CountingSparseMLA
            self._undo.append(lambda: setattr(tilelang_dsa, "SparseMLA", kernel))
        dense = dsa._unfused_absorbed_dsa_fn

        def counting_dense(*args: Any, **kwargs: Any) -> Any:
            self.dense += 1
            return dense(*args, **kwargs)

        dsa._unfused_absorbed_dsa_fn = counting_dense  # read as a global at call time
        self._undo.append(lambda: setattr(dsa, "_unfused_absorbed_dsa_fn", dense))
        naive = dsa.fused_qk_topk_naive  # the indexer's own dense fallback, O(L^2 x heads)

        def counting_naive(*args: Any, **kwargs: Any) -> Any:
            self.naive_indexer += 1
            return naive(*args, **kwargs)

        dsa.fused_qk_topk_naive = counting_naive
        self._undo.append(lambda: setattr(dsa, "fused_qk_topk_naive", naive))
        return self

    def as_dict(self) -> dict[str, int]:
        return {"kernel": self.kernel, "dense": self.dense, "naive_indexer": self.naive_indexer}

    def detach(self) -> None:
        while self._undo:
            self._undo.pop()()


# -- the model -----------------------------------------------------------------------------


def duplicated_linear_class() -> type:
    """TELinear's "duplicated" mode at TP 1, from megatron's own ColumnParallelLinear."""
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import ColumnParallelLinear

    class DuplicatedLinear(ColumnParallelLinear):  # type: ignore[misc]
        def __init__(self, input_size: int, output_size: int, **kwargs: Any) -> None:
            kwargs.pop("parallel_mode", None)
            if kwargs.get("tp_group") is None:
                kwargs["tp_group"] = parallel_state.get_tensor_model_parallel_group()
            super().__init__(input_size, output_size, gather_output=False, **kwargs)

    return DuplicatedLinear


def build_config(args: argparse.Namespace, device: str) -> Any:
    from megatron.core.transformer.transformer_config import MLATransformerConfig

    config = MLATransformerConfig(
        num_layers=args.layers,
        hidden_size=args.hidden,
        ffn_hidden_size=args.ffn,
        num_attention_heads=HEADS,
        multi_latent_attention=True,
        q_lora_rank=args.q_lora_rank,
        kv_lora_rank=KV_LORA_RANK,
        qk_head_dim=args.qk_head_dim,
        qk_pos_emb_head_dim=0,  # NoPE: q/k reach the kernel 512 wide
        v_head_dim=args.v_head_dim,
        rope_type="rope",
        experimental_attention_variant="dsa",
        dsa_indexer_n_heads=args.indexer_heads,
        dsa_indexer_head_dim=args.indexer_head_dim,
        dsa_indexer_topk=args.topk,
        # The Hadamard rotation of the indexer's q/k needs fast_hadamard_transform, which
        # neither host has; it only changes which keys the indexer picks, not the dispatch.
        dsa_indexer_rotate_activation=False,
        # On CPU config validation refuses TileLang (it needs CUDA); set below instead.
        dsa_kernel_backend="tilelang" if device == "cuda" else "none",
        normalization="RMSNorm",
        gated_linear_unit=True,
        activation_func=torch.nn.functional.silu,
        add_bias_linear=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        bf16=True,
        params_dtype=torch.bfloat16,
        transformer_impl="local",
        use_cpu_initialization=device == "cpu",
        apply_rope_fusion=False,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        gradient_accumulation_fusion=False,
    )
    if device == "cpu":
        # The same dispatch as on the GPU: megatron asks the TileLang backend first (the
        # test's fake kernel stands in for SparseMLA), then falls back to dense.
        config.dsa_kernel_backend = "tilelang"
    return config


def build_model(config: Any, args: argparse.Namespace, max_seq: int, device: str) -> Any:
    from megatron.core.models.backends import LocalSpecProvider
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    linear = duplicated_linear_class()

    class LocalDSABackend(LocalSpecProvider):  # type: ignore[misc]
        def linear(self) -> type:
            return linear

        def layer_norm(self, rms_norm: bool = False, for_qk: bool = False, **_: Any) -> Any:
            return WrappedTorchNorm  # RMSNorm or LayerNorm by config / for the indexer's k

    backend = LocalDSABackend()
    return _build(config, args, max_seq, device, backend, linear)


@contextlib.contextmanager
def _cpu_rotary_tables() -> Iterator[None]:
    """On CPU only: megatron's RotaryEmbedding (built by DSAIndexer without
    ``use_cpu_initialization``, and in its forward) asks CUDA for its device."""
    real = torch.cuda.current_device
    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.cuda.current_device = real  # type: ignore[assignment]


def _build(
    config: Any, args: argparse.Namespace, max_seq: int, device: str, backend: Any, linear: type
) -> Any:
    from megatron.core.fusions.fused_bias_dropout import get_bias_dropout_add
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.experimental_attention_variant_module_specs import (
        get_dsa_module_spec_for_backend,
    )
    from megatron.core.models.gpt.gpt_layer_specs import get_mlp_module_spec_for_backend
    from megatron.core.tensor_parallel import ColumnParallelLinear
    from megatron.core.transformer.module import Float16Module
    from megatron.core.transformer.spec_utils import ModuleSpec
    from megatron.core.transformer.torch_norm import WrappedTorchNorm
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules
    from megatron.core.transformer.transformer_layer import (
        TransformerLayer,
        TransformerLayerSubmodules,
    )

    attention = get_dsa_module_spec_for_backend(config, backend=backend)
    # AbsorbedMLA accepts exactly TELinear (duplicated) or a column-parallel class for its
    # down projections; at TP 1 megatron's own ColumnParallelLinear is that product.
    attention.submodules.linear_q_down_proj = ColumnParallelLinear
    attention.submodules.linear_kv_down_proj = ColumnParallelLinear
    mlp = get_mlp_module_spec_for_backend(backend)
    layer = ModuleSpec(
        module=TransformerLayer,
        submodules=TransformerLayerSubmodules(
            input_layernorm=WrappedTorchNorm,
            self_attention=attention,
            self_attn_bda=get_bias_dropout_add,
            pre_mlp_layernorm=WrappedTorchNorm,
            mlp=mlp,
            mlp_bda=get_bias_dropout_add,
        ),
    )
    block = TransformerBlockSubmodules(
        layer_specs=[layer] * config.num_layers, layer_norm=WrappedTorchNorm
    )
    model = GPTModel(
        config=config,
        transformer_layer_spec=block,
        vocab_size=args.vocab,
        max_sequence_length=max_seq,
        position_embedding_type="none",  # NoPE attention; the indexer keeps its own rope
        share_embeddings_and_output_weights=False,
    )
    # As megatron's training loop wraps a bf16 model: every parameter (norms included) bf16.
    return Float16Module(config, model.to(device))


# -- data ----------------------------------------------------------------------------------


def batch(step: int, b: int, s: int, vocab: int, device: str) -> tuple[Any, Any, Any]:
    """Synthetic tokens a model can learn from attention: a random 256-token motif repeated
    (a copy task), a new motif per step and row; labels are the next token."""
    gen = torch.Generator().manual_seed(1000 + step)
    motif = torch.randint(0, vocab, (b, 256), generator=gen)
    seq = motif.repeat(1, -(-(s + 1) // 256))[:, : s + 1]
    tokens, labels = seq[:, :-1].contiguous(), seq[:, 1:].contiguous()
    positions = torch.arange(s).unsqueeze(0).expand(b, s).contiguous()
    return tokens.to(device), positions.to(device), labels.to(device)


# -- one shape -----------------------------------------------------------------------------


def train_shape(
    args: argparse.Namespace, b: int, s: int, device: str, tilelang_dsa: Any, dsa: Any
) -> dict[str, Any]:
    from megatron.core import tensor_parallel

    cuda = device == "cuda"
    torch.manual_seed(args.seed)
    if cuda:
        tensor_parallel.model_parallel_cuda_manual_seed(args.seed)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    result: dict[str, Any] = {"batch": b, "seq": s, "tokens_per_step": b * s, "steps": []}
    counters = Counters().attach(tilelang_dsa, dsa)
    model = optimizer = None
    try:
        config = build_config(args, device)
        model = build_model(config, args, s, device)
        params = [p for p in model.parameters() if p.requires_grad]
        result["parameters"] = sum(p.numel() for p in params)
        optimizer = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
        model.train()
        for step in range(args.steps):
            tokens, positions, labels = batch(step, b, s, args.vocab, device)
            if cuda:
                torch.cuda.synchronize()
            started = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            per_token = model(tokens, positions, attention_mask=None, labels=labels)
            loss = per_token.float().mean()
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(params, args.clip)
            optimizer.step()
            if cuda:
                torch.cuda.synchronize()
            seconds = time.perf_counter() - started
            entry = {
                "step": step + 1,
                "loss": loss.item(),
                "grad_norm": grad_norm.item(),
                "seconds": seconds,
            }
            result["steps"].append(entry)
            if step == 0:
                result["first_step_calls"] = counters.as_dict()
                ran = "fused" if counters.kernel and not counters.dense else "dense fallback"
                log(
                    f"{b}x{s} step 1: attention ran {ran}: SparseMLA.apply (fused TileLang "
                    f"kernel) {counters.kernel} calls, dense _unfused_absorbed_dsa_fn "
                    f"{counters.dense} calls, over {config.num_layers} layers (fwd); indexer "
                    f"dense fallback {counters.naive_indexer} calls"
                )
            if step == 0 or (step + 1) % args.log_every == 0 or step + 1 == args.steps:
                log(
                    f"{b}x{s} step {step + 1}: loss {entry['loss']:.4f} grad-norm "
                    f"{entry['grad_norm']:.4f} {seconds * 1e3:.0f} ms"
                )
        result["status"] = "ok"
    except torch.OutOfMemoryError as exc:
        result["status"] = "out of memory"
        result["error"] = str(exc).splitlines()[0]
        log(f"{b}x{s}: out of memory at step {len(result['steps']) + 1}: {result['error']}")
    except Exception as exc:  # one shape's failure is a result; the other shapes still run
        result["status"] = "failed"
        result["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        log(f"{b}x{s}: failed at step {len(result['steps']) + 1}:")
        traceback.print_exc()
    finally:
        counters.detach()
        result["calls"] = counters.as_dict()
        del model, optimizer
        gc.collect()
        if cuda:
            result["peak_bytes"] = torch.cuda.max_memory_allocated()
            torch.cuda.empty_cache()
    timed = [e["seconds"] for e in result["steps"][args.warmup :]]
    if timed:
        median = statistics.median(timed)
        result["median_step_s"] = median
        result["tokens_per_s"] = b * s / median
    return result


# -- the job -------------------------------------------------------------------------------


def environment(device: str) -> dict[str, Any]:
    def version(name: str) -> str | None:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return None

    env: dict[str, Any] = {
        "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
        "torch": torch.__version__,
        "tilelang": version("tilelang"),
        "megatron_core": version("megatron-core"),
        "python": platform.python_version(),
        "commit": os.environ.get("BENCHMARK_COMMIT"),
        "MEGATRON_BACKPORTS": os.environ.get("MEGATRON_BACKPORTS"),
    }
    if device == "cuda":
        env["gpu_memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / GIB, 1)
    return env


def init_distributed(device: str) -> None:
    """One rank: torchrun's variables, or a local rendezvous where none is set (tests)."""
    from megatron.core import parallel_state

    if not torch.distributed.is_initialized():
        if "MASTER_PORT" not in os.environ:
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                os.environ["MASTER_PORT"] = str(sock.getsockname()[1])
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("RANK", "0")
        os.environ.setdefault("WORLD_SIZE", "1")
        if device == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        torch.distributed.init_process_group("nccl" if device == "cuda" else "gloo")
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1)


def shutdown_distributed() -> None:
    from megatron.core import parallel_state

    parallel_state.destroy_model_parallel()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", required=True)
    parser.add_argument("--shapes", default="1x4096,1x32768,2x16384", help="BATCHxSEQ,...")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3, help="steps left out of tokens/s")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--ffn", type=int, default=5632)
    parser.add_argument("--q-lora-rank", type=int, default=768)
    parser.add_argument("--qk-head-dim", type=int, default=192)
    parser.add_argument("--v-head-dim", type=int, default=128)
    parser.add_argument("--indexer-heads", type=int, default=32)
    parser.add_argument("--indexer-head-dim", type=int, default=128)
    parser.add_argument("--topk", type=int, default=TOPK)
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--clip", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--log-every", type=int, default=5)
    parser.add_argument("--device", choices=["cuda", "cpu"], default=None)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse(argv)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    tilelang_dsa = importlib.import_module(TILELANG_DSA)  # the start-up hook fires here
    from megatron.core.transformer.experimental_attention_variant import dsa

    from backports.megatron.job.ranks import installed_backports

    fused = tilelang_dsa.fused_sparse_mla_absorbed
    report: dict[str, Any] = {
        "environment": environment(device),
        "args": vars(args),
        "installed_backports": sorted(installed_backports()),
        "fused_sparse_mla_absorbed": f"{fused.__module__}.{fused.__qualname__}",
        "kernel_available": tilelang_dsa.SparseMLA is not None,
        "shapes": [],
    }
    log(
        f"backports installed in this process: {', '.join(report['installed_backports']) or 'none'}"
        f"; tilelang_dsa.fused_sparse_mla_absorbed is {report['fused_sparse_mla_absorbed']}"
    )
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    init_distributed(device)
    try:
        with _cpu_rotary_tables() if device == "cpu" else contextlib.nullcontext():
            run_shapes(args, device, tilelang_dsa, dsa, report, out)
    finally:
        shutdown_distributed()
    return report


def run_shapes(
    args: argparse.Namespace,
    device: str,
    tilelang_dsa: Any,
    dsa: Any,
    report: dict[str, Any],
    out: Path,
) -> None:
    for shape in filter(None, args.shapes.split(",")):
        b, s = (int(v) for v in shape.split("x"))
        result = train_shape(args, b, s, device, tilelang_dsa, dsa)
        report["shapes"].append(result)
        out.write_text(json.dumps(report, indent=1))
        if "tokens_per_s" in result:
            peak = result.get("peak_bytes")
            log(
                f"{shape}: {result['status']}, {result['tokens_per_s']:.0f} tokens/s, "
                f"peak {peak / GIB if peak is not None else float('nan'):.2f} GiB"
            )


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    main()
