"""Compiles every kernel launched with programmatic dependent launch for sm_90 and reports, per kernel,
where its PTX waits for the previous kernel (griddepcontrol.wait) and which global memory accesses
come before that. Run by test_pdl_launch.py in its own process: the tests' Triton interpreter would
stop the compiler from seeing the kernels.

Each op runs once on small CPU tensors with its kernel replaced by a recorder (nothing launches), so
the compiled specialisation is the one the op's own launch code picks, with USE_PDL on as on Hopper.
"""

from __future__ import annotations

import json
import re

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource, GluonJITFunction
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from qwen3_runtime import sampler
from qwen3_runtime.logprobs import reduce
from qwen3_runtime.ops import (
    attention_inputs,
    decode_attention,
    fp8_linear,
    fused_moe,
    greedy,
    gumbel_sample,
    linear,
    linear_preload,
    logprob_reduce,
    moe_routing,
    norms,
)
from qwen3_runtime.ops.moe_config import default_config

KERNELS = {
    linear: ["_skinny_gemm_kernel"],
    linear_preload: ["_preload_gemm_kernel"],
    greedy: ["_chunk_max_kernel", "row_max_kernel"],
    gumbel_sample: ["_chunk_kernel"],
    norms: ["_add_rms_norm_kernel", "_silu_mul_kernel"],
    attention_inputs: ["_attention_inputs_kernel"],
    decode_attention: ["_decode_attention_kernel"],
    logprob_reduce: ["chunk_stats_kernel", "finish_rows_kernel"],
    moe_routing: ["_route_kernel"],
    fused_moe: ["gate_up_kernel", "down_kernel"],
    fp8_linear: ["quantize_groups_kernel", "w8a8_kernel"],
}
TYPES = {
    torch.bfloat16: "bf16",
    torch.float16: "fp16",
    torch.float32: "fp32",
    torch.int8: "i8",
    torch.uint8: "u8",
    torch.int32: "i32",
    torch.int64: "i64",
    torch.bool: "i1",
    torch.float8_e4m3fn: "fp8e4nv",
}
GLOBAL_ACCESS = re.compile(r"\b(?:ld|st|atom|red)\.global|\bcp\.async\S*global")
launches: list[tuple[triton.JITFunction, tuple, dict]] = []


class Recorder:
    def __init__(self, kernel: triton.JITFunction) -> None:
        self.kernel = kernel

    def __getitem__(self, grid):
        return lambda *args, **kwargs: launches.append((self.kernel, args, kwargs))


def run_ops() -> None:
    for module in (
        linear,
        greedy,
        norms,
        attention_inputs,
        decode_attention,
        reduce,
        sampler,
        moe_routing,
        fused_moe,
        fp8_linear,
    ):
        module.use_triton = lambda t: True
    fp8_linear.fp8_tensor_cores = lambda device: True
    for module, names in KERNELS.items():
        for name in names:
            setattr(module, name, Recorder(getattr(module, name)))
    bf16 = dict(dtype=torch.bfloat16)
    x = torch.randn(2, 256, **bf16)
    linear.linear(x, torch.randn(128, 256, **bf16), dependents_early=True)  # qkv triggers first
    linear.gated_linear(x, torch.randn(256, 256, **bf16))
    linear.linear_partials(torch.randn(2, 1024, **bf16), torch.randn(128, 1024, **bf16))
    linear.mlp_partials(x, torch.randn(256, 256, **bf16), torch.randn(256, 128, **bf16))  # gate/up triggers first
    linear_preload.preloaded_partials(torch.randn(2, 1024, **bf16), torch.randn(128, 1024, **bf16))
    norms.add_rms_norm(torch.randn(2, 3, 64), torch.ones(64, **bf16), 1e-6, torch.randn(3, 64, **bf16))
    norms.silu_mul(torch.randn(3, 128, **bf16))
    greedy.greedy_max(torch.randn(2, 5000))
    seeds = torch.arange(2)
    sampler.sample(
        torch.randn(2, 5000), sampler.SamplingTensors(torch.ones(2), -seeds, seeds + 1.0, seeds, seeds, seeds * 0.0)
    )
    heads, kv_heads, dim, block = 4, 2, 32, 16
    caches = [torch.zeros(4, block, kv_heads, dim, **bf16) for _ in range(2)]
    attention_inputs.attention_inputs(
        torch.randn(2, (heads + 2 * kv_heads) * dim, **bf16),
        heads,
        kv_heads,
        torch.ones(dim, **bf16),
        torch.ones(dim, **bf16),
        1e-6,
        torch.randn(64, dim),
        torch.arange(2),
        *caches,
        torch.arange(2),
    )
    decode_attention.paged_decode_attention(
        torch.randn(2, heads, dim, **bf16),
        *caches,
        torch.arange(4, dtype=torch.int32).view(2, 2),
        torch.tensor([20, 30], dtype=torch.int32),
        dim**-0.5,
        num_splits=2,
    )
    ids, weights = moe_routing.route(torch.randn(2, 8), torch.tensor([True, False]), 2, True)
    experts = (x, torch.randn(8, 128, 256, **bf16), torch.randn(8, 256, 64, **bf16), ids, weights)
    fused_moe.fused_moe(*experts)  # the scan path
    fused_moe.fused_moe_with(*experts, *[default_config(4096, 2)] * 2)  # the sorted path
    (q13, s13), (q2, s2) = (fp8_linear.quantize_blocks(torch.randn(8, *shape)) for shape in ((256, 256), (256, 128)))
    fused_moe.fused_moe(x, q13, q2, ids, weights, w13_scale=s13, w2_scale=s2)  # FP8 experts
    q, s = fp8_linear.quantize_blocks(torch.randn(256, 256))
    fp8_linear.fp8_mlp_partials(x, q, s, *fp8_linear.quantize_blocks(torch.randn(128, 128)))  # FP8 skinny
    fp8_linear.fp8_linear(torch.randn(200, 256, **bf16), q, s)  # W8A8: the activations' quantizer, the GEMM
    reduce.reduce_logprobs(
        torch.randn(2, 5000),
        torch.tensor([1, 2]),
        torch.tensor([3, 0], dtype=torch.int32),
        4,
        row_mask=torch.tensor([True, False]),
    )


def _type(value) -> str:
    if isinstance(value, TensorDescriptor):
        return f"tensordesc<{TYPES[value.base.dtype]}{list(value.block_shape)},{value.layout!r}>"
    if isinstance(value, torch.Tensor):
        return "*" + TYPES[value.dtype]
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -(2**31) <= value < 2**31 else "i64"
    return "fp32"


def compile_for_hopper(kernel: triton.JITFunction, args: tuple, kwargs: dict) -> str:
    values = {**dict(zip(kernel.arg_names, args)), **{k: v for k, v in kwargs.items() if k in kernel.arg_names}}
    # None (an unused optional pointer, as for bf16 weights in a kernel that also takes FP8's scales) is a constexpr
    # at launch too.
    constexprs = {p.name: values[p.name] for p in kernel.params if p.is_constexpr or values.get(p.name, 0) is None}
    constexprs["USE_PDL"] = True  # launched with launch_pdl on Hopper, so it must wait itself
    if "WAIT_PRIOR" in constexprs:
        constexprs["WAIT_PRIOR"] = True
    if "PREFETCH_TILES" in constexprs:  # on Hopper the skinny GEMM requests weight tiles before its wait
        constexprs["PREFETCH_TILES"] = 1
    signature = {name: "constexpr" if name in constexprs else _type(values[name]) for name in kernel.arg_names}
    options = {k: kwargs[k] for k in ("num_warps", "num_stages") if k in kwargs}
    source_type = GluonASTSource if isinstance(kernel, GluonJITFunction) else triton.compiler.ASTSource
    source = source_type(fn=kernel, signature=signature, constexprs=constexprs)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options).asm["ptx"]


def main() -> None:
    run_ops()
    report = []
    for kernel, args, kwargs in launches:
        ptx = compile_for_hopper(kernel, args, kwargs)
        wait = ptx.find("griddepcontrol.wait")
        report.append(
            {
                "kernel": kernel.__name__,
                "wait": wait,
                "before_wait": [a.group(0) for a in GLOBAL_ACCESS.finditer(ptx[: max(wait, 0)])],
            }
        )
    print(json.dumps(report))


if __name__ == "__main__":
    main()
