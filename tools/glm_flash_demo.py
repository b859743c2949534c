"""Main job: apply the backports at job start, report, and run a GLM-5.3-Flash-shaped call.

GLM-5.3-Flash-style DSA layers use NoPE MLA (q/k width 512), a k-pool top-k of
2048 + 3 = 2051 and 16 heads per TP rank. Stock megatron-core 0.19.2 declines that call
and falls back to a dense [b, heads, sq, sk] softmax; with the backport it reaches the
fused TileLang kernel. Where CUDA or TileLang is missing, ``FakeSparseMLA`` (from
backports.megatron.testing: an FP32 sparse attention with the kernel's contract) stands in
for the kernel, and says so.
"""

import argparse
import json
import sys

import backports.megatron as backports  # before megatron, as a job would

TILELANG_DSA = "megatron.core.transformer.experimental_attention_variant.ops.tilelang_dsa"
WIDTH, TOPK, HEADS, V_CHANNELS, SCALE = 512, 2051, 16, 512, 0.0625


class _Config:
    attention_backend = "auto"
    dsa_kernel_backend = "tilelang"


def _print_reports(title, reports):
    print(f"\n== {title}")
    for r in reports:
        print(f"  {r.id}: verdict={r.verdict} action={r.action}\n    {r.reason}")


def _causal_topk(torch, tokens, device):
    """Row s picks up to TOPK keys in [0, s]; the rest are -1 (what the indexer emits)."""
    indices = torch.full((1, tokens, TOPK), -1, dtype=torch.int64, device=device)
    for s in range(tokens):
        picks = torch.randperm(s + 1, device=device)[:TOPK]
        indices[0, s, : picks.numel()] = picks
    return indices


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=None, help="sequence length")
    parser.add_argument("--json", action="store_true", help="print the reports as JSON too")
    parser.add_argument(
        "--via-hook",
        action="store_true",
        help="call no apply() before megatron's import: `backports apply`'s start-up hook must",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="show import notices")
    args = parser.parse_args()

    if not args.via_hook:
        _print_reports("apply() at job start, before megatron is imported", backports.apply())

    import importlib
    from contextlib import nullcontext

    from backports.megatron.commands.output import import_notices_hidden as hidden

    # Without CUDA, Transformer Engine, Apex or absl, torch and megatron print ~11 lines of
    # notices on import that bury the result: hidden, as by `backports`; -v shows them.
    with nullcontext() if args.verbose else hidden():
        import torch

        tilelang_dsa = importlib.import_module(TILELANG_DSA)  # the post-import hook fires here
        from megatron.core.transformer.experimental_attention_variant import dsa, dsa_kernels

    if args.via_hook:
        from backports.megatron.job.ranks import installed_backports

        # Those whose target modules this import brought in (#6793 waits for recompute's).
        hooked = ", ".join(installed_backports()) or "nothing"
        print("\n== a new interpreter that called no apply() imported megatron:")
        print(f"  installed by the start-up hook: {hooked}")

    reports = backports.apply()
    _print_reports("after megatron imported the target", reports)
    if args.json:
        print(json.dumps([r.to_dict() for r in reports], indent=2))

    cuda = torch.cuda.is_available() and tilelang_dsa.SparseMLA is not None
    device = "cuda" if cuda else "cpu"
    if not cuda:
        from backports.megatron.testing.fake_kernel import FakeSparseMLA

        tilelang_dsa.SparseMLA = kernel = FakeSparseMLA()
        print("\nNo CUDA/TileLang here: backports.megatron.testing's FakeSparseMLA stands in.")
    tokens = args.tokens or (4096 if cuda else 128)

    torch.manual_seed(0)
    query = torch.randn(tokens, 1, HEADS, WIDTH, device=device).to(torch.bfloat16)
    key = torch.randn(tokens, 1, 1, WIDTH, device=device).to(torch.bfloat16)
    indices = _causal_topk(torch, tokens, device)

    stock = tilelang_dsa.fused_sparse_mla_absorbed
    stock = getattr(stock, "__wrapped__", stock)
    print(
        f"\n== GLM-5.3-Flash-shaped call: {tokens} tokens, width {WIDTH}, top-k {TOPK}, "
        f"{HEADS} heads, on {device}"
    )
    declined = stock(query, key, indices, SCALE, V_CHANNELS) is None
    verdict = "declines (None -> dense fallback)" if declined else "runs"
    print(f"  stock megatron-core function: {verdict}")
    fused = dsa_kernels.run_fused_absorbed_sparse_attention(
        _Config(), query, key, indices, SCALE, V_CHANNELS
    )
    if fused is None:
        print("  with the backport: still declined -- the backport is not active here")
        return 1
    if not cuda:
        call = kernel.calls[-1]
        print(
            f"  fused kernel reached: q {tuple(call.q.shape)}, kv {tuple(call.kv.shape)}, "
            f"indices {tuple(call.indices.shape)} {call.indices.dtype}"
        )
    dense = dsa._unfused_absorbed_dsa_fn(query, key, indices, SCALE, V_CHANNELS)
    err = float((fused.float() - dense.float()).norm() / dense.float().norm())
    print(
        f"  fused output {tuple(fused.shape)}; relative difference to megatron's dense "
        f"fallback: {err:.2e}"
    )
    gib = 31 * HEADS * 14336**2 / 2**30
    print(
        f"  (the dense fallback needs about 31 B x heads x sq x sk for fwd+bwd: {gib:.0f} GiB "
        "at 14k tokens and 16 heads -- an estimate, see benchmarks/ for measurements)"
    )
    return 0 if err < 2e-2 else 1


if __name__ == "__main__":
    sys.exit(main())
