"""FlexAttention with block masks beside SDPA, on the shape of `bench --flex`'s
block-mask rows: batch 1, 16 heads, head_dim 128, f16, seq S (16384): causal SDPA; flex
causal; prefix-LM with a prefix of S/16 rows; documents of S/8 rows given as ids; and
`create_block_mask`'s own time for each; and each backward, timed as forward + backward
less the forward. CUDA events, median of 20 after 5 warm-up calls.
Run on the device machine: python3 flex_block_mask.py [S]"""
import sys
import torch
from torch.nn.attention.flex_attention import flex_attention, create_block_mask
torch.manual_seed(0)
S = int(sys.argv[1]) if len(sys.argv) > 1 else 16384
H, D = 16, 128
q, k, v = (torch.randn(1, H, S, D, device="cuda", dtype=torch.float16) for _ in range(3))
def timed(f, n=20):
    for _ in range(5): f()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts = []
    for _ in range(n):
        e0.record(); f(); e1.record(); torch.cuda.synchronize(); ts.append(e0.elapsed_time(e1))
    ts.sort(); return ts[len(ts)//2]
qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
g = torch.randn_like(q)
def forward_backward(f):
    qg.grad = kg.grad = vg.grad = None  # each call's gradients fresh, not added to the last
    f(qg, kg, vg).backward(g)
def backward_ms(f):
    return timed(lambda: forward_backward(f)) - timed(lambda: f(q, k, v))
sdpa = lambda a, b, c: torch.nn.functional.scaled_dot_product_attention(a, b, c, is_causal=True)
print(f"seq {S}: sdpa causal {timed(lambda: sdpa(q, k, v)):.3f} ms, "
      f"backward {backward_ms(sdpa):.3f} ms")
try:
    fa = torch.compile(flex_attention)
    prefix = torch.tensor([S // 16], device="cuda")
    doc = torch.arange(S, device="cuda") // (S // 8)
    def causal(b, h, qi, ki): return ki <= qi
    def prefix_lm(b, h, qi, ki): return (ki <= qi) | (ki < prefix[b])
    def documents(b, h, qi, ki): return (ki <= qi) & (doc[qi] == doc[ki])
    for name, m in [("causal", causal), ("prefix-lm", prefix_lm), ("documents", documents)]:
        make = lambda: create_block_mask(m, 1, 1, S, S)
        bm = make()
        f = lambda a, b, c: fa(a, b, c, block_mask=bm)
        print(f"flex {name} {timed(lambda: f(q, k, v)):.3f} ms, "
              f"backward {backward_ms(f):.3f} ms, create_block_mask {timed(make, 5):.3f} ms")
except Exception as e:
    print("flex attention unavailable:", repr(e)[:300])
